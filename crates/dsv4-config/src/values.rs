//! Closed sets of values used by the schema (scheduling policy, output parsers, disaggregation mode,
//! fault names): each is an enum that serializes as the spelling written in profiles.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Implements `NAMES`, `Display`, `FromStr` and serde for an enum from `Variant => "spelling"` pairs.
macro_rules! spelled {
    ($ty:ident, $what:literal, $($variant:ident => $text:literal),+ $(,)?) => {
        impl $ty {
            /// The accepted spellings, in display order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// The spelling of this value.
            pub fn as_str(&self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err(format!(
                        "unknown {} `{}` (allowed: {})", $what, other, Self::NAMES.join(", ")
                    )),
                }
            }
        }
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// The order in which waiting requests are admitted (`scheduler.schedule_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SchedulePolicy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// Longest prefix match first: requests sharing the most cached prefix run first.
    Lpm,
}
spelled!(SchedulePolicy, "schedule_policy", Fcfs => "fcfs", Lpm => "lpm");

/// What the server does with a request's `priority` field (`server.request_priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RequestPriority {
    /// The request runs at the priority it asks for.
    #[default]
    Use,
    /// The field is accepted and ignored: every request runs at the server's own priorities
    /// (0, and -1 for batch lines).
    Ignore,
    /// A request that sets the field is refused (400).
    Refuse,
}
spelled!(RequestPriority, "request_priority", Use => "use", Ignore => "ignore", Refuse => "refuse");

/// How tool calls are parsed out of generated text (`server.tool_call_parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ToolCallParser {
    /// No parsing: tool-call markup stays in the content.
    None,
    /// The DeepSeek-V4 DSML tool-call format.
    #[default]
    DeepseekV4,
}
spelled!(ToolCallParser, "tool_call_parser", None => "none", DeepseekV4 => "deepseek-v4");

/// How reasoning is split from the answer (`server.reasoning_parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReasoningParser {
    /// No splitting: reasoning stays in the content.
    None,
    /// DeepSeek-V4 thinking blocks go to `reasoning_content`.
    #[default]
    DeepseekV4,
}
spelled!(ReasoningParser, "reasoning_parser", None => "none", DeepseekV4 => "deepseek-v4");

/// The role of a server in prefill/decode disaggregation (`disagg.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DisaggMode {
    /// One server runs both prefill and decode.
    #[default]
    None,
    /// Prefill only; finished KV caches are handed to decode servers.
    Prefill,
    /// Decode only; KV caches arrive from prefill servers.
    Decode,
}
spelled!(DisaggMode, "disagg mode", None => "none", Prefill => "prefill", Decode => "decode");

/// How the CUDA kernels sum dot products (`backend.cuda_sums`; cuda-sm120 and cuda-emu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CudaSums {
    /// The backend chooses: f64 on devices with full-rate FP64 (sm_80, sm_90, sm_100) and on the
    /// emulator, f32 elsewhere.
    #[default]
    Auto,
    /// f64 sums of exact f32 products: the reference's bits.
    F64,
    /// f32 sums: within the f32 tolerances.
    F32,
}
spelled!(CudaSums, "cuda_sums", Auto => "auto", F64 => "f64", F32 => "f32");

impl CudaSums {
    /// Some(true) for f64, Some(false) for f32, None when the backend chooses.
    pub fn f64_sums(self) -> Option<bool> {
        match self {
            CudaSums::Auto => None,
            CudaSums::F64 => Some(true),
            CudaSums::F32 => Some(false),
        }
    }
}

/// What the cpu backend sums its linear layers' products in (`backend.cpu_sums`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CpuSums {
    /// f64 sums of exact f32 products: the reference's bits but for rare ties.
    #[default]
    F64,
    /// f32 multiply-adds in the same fixed order: batch-invariant, within f32 tolerance of the
    /// reference, up to twice as fast.
    F32,
}
spelled!(CpuSums, "cpu_sums", F64 => "f64", F32 => "f32");

/// Where the CUDA backends run a piece of a step that has a device form and a host form
/// with the same bits: MoE routing (`backend.cuda_routing`), attention
/// (`backend.cuda_attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceOrHost {
    /// The backend chooses (today on the device).
    #[default]
    Auto,
    /// On the device: its operands are never read back (`DeviceOps::route_experts`,
    /// `DeviceOps::paged_attention`).
    Device,
    /// On the host's side: its operands are read back (and its results written) around it.
    Host,
}
spelled!(DeviceOrHost, "placement", Auto => "auto", Device => "device", Host => "host");

impl DeviceOrHost {
    /// Some(true) on the device, Some(false) on the host, None when the backend chooses.
    pub fn on_device(self) -> Option<bool> {
        match self {
            DeviceOrHost::Auto => None,
            DeviceOrHost::Device => Some(true),
            DeviceOrHost::Host => Some(false),
        }
    }
}

/// Which executor runs a step's plan (`exec.executor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ExecutorChoice {
    /// Serial without side streams; with them, the backend kind's overlap executor
    /// ([`crate::caps::BackendCaps::overlap_executor`]).
    #[default]
    Auto,
    /// One launch at a time; on a device, its host launches as late as their readers allow
    /// (one wait per run of them), each launch on its own plan stream.
    Serial,
    /// One launch at a time in a seeded order that respects only stream order and events:
    /// cross-stream races reproduce exactly (rehearsals).
    Interleaved,
    /// One thread per stream, synchronised only by events; runs only verified plans.
    Threaded,
}
spelled!(ExecutorChoice, "executor", Auto => "auto", Serial => "serial",
    Interleaved => "interleaved", Threaded => "threaded");

/// Which kernels run the linears on the CUDA backends (`backend.cuda_linear`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CudaLinear {
    /// The backend chooses (today the SIMT kernels).
    #[default]
    Auto,
    /// SIMT kernels, sums as `cuda_sums` says.
    Simt,
    /// Tensor cores (mma.sync bf16 tiles, f32 sums) for bf16, fp8 and MXFP4 weights.
    Mma,
}
spelled!(CudaLinear, "cuda_linear", Auto => "auto", Simt => "simt", Mma => "mma");

impl CudaLinear {
    /// Some(true) for tensor cores, Some(false) for SIMT, None when the backend chooses.
    pub fn tensor_cores(self) -> Option<bool> {
        match self {
            CudaLinear::Auto => None,
            CudaLinear::Simt => Some(false),
            CudaLinear::Mma => Some(true),
        }
    }
}

/// `"auto"` (the component's own choice) or a count: device memory for the CUDA backends'
/// cache pages (`backend.cuda_page_cache_mib`, MiB; 0 keeps none) and the default thinking
/// budget (`server.thinking_token_budget`, tokens; auto: the model ends its reasoning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AutoOrCount {
    /// The component's own choice.
    #[default]
    Auto,
    /// This many (MiB, tokens: the key says).
    Count(u64),
}

impl AutoOrCount {
    /// Some(count) when pinned, None when the component chooses.
    pub fn count(self) -> Option<u64> {
        match self {
            AutoOrCount::Auto => None,
            AutoOrCount::Count(n) => Some(n),
        }
    }
}

impl fmt::Display for AutoOrCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AutoOrCount::Auto => f.write_str("auto"),
            AutoOrCount::Count(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for AutoOrCount {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(AutoOrCount::Auto),
            n => n
                .parse()
                .map(AutoOrCount::Count)
                .map_err(|_| format!("`{n}`: expected \"auto\" or a non-negative integer")),
        }
    }
}

impl Serialize for AutoOrCount {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AutoOrCount::Auto => s.serialize_str("auto"),
            AutoOrCount::Count(n) => s.serialize_u64(*n),
        }
    }
}

impl<'de> Deserialize<'de> for AutoOrCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = AutoOrCount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"auto\" or a non-negative integer")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<AutoOrCount, E> {
                Ok(AutoOrCount::Count(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<AutoOrCount, E> {
                u64::try_from(n).map(AutoOrCount::Count).map_err(|_| {
                    E::custom(format!(
                        "{n} is negative: expected \"auto\" or a non-negative integer"
                    ))
                })
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<AutoOrCount, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A named fault that deliberately breaks one component, to rehearse an incident class (`debug.inject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The arena allocator of captured plans computes buffer lifetimes as if all streams were one,
    /// so a side stream's scratch aliases buffers still in use on another stream (the incident's
    /// aliasing race).
    ArenaIgnoresStreams,
    /// Host-tier load-back skips the wait on the index-K read path.
    SkipIndexKTransferWait,
    /// The overlap scheduler frees a finished request's pages one step early.
    StalePageReuse,
    /// Overlap plans drop the MoE sum's wait for the shared-expert stream, so the sum may read
    /// the shared expert's output before it is written (a missing stream synchronisation).
    MissingStreamEvent,
}
spelled!(
    Fault,
    "fault",
    ArenaIgnoresStreams => "arena-ignores-streams",
    SkipIndexKTransferWait => "skip-index-k-transfer-wait",
    StalePageReuse => "stale-page-reuse",
    MissingStreamEvent => "missing-stream-event",
);

/// A class of cache pools the canary watches (`debug.canary`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CanaryPool {
    /// Index-K pages of the lightning indexer.
    IndexK,
    /// SWA, C4 and C128 KV pages.
    Kv,
    /// Compressor ring (state) pages.
    State,
}
spelled!(
    CanaryPool,
    "canary pool",
    IndexK => "index_k",
    Kv => "kv",
    State => "state",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_knobs_say_what_the_backend_options_get() {
        assert_eq!(CudaSums::Auto.f64_sums(), None);
        assert_eq!(CudaSums::F64.f64_sums(), Some(true));
        assert_eq!(CudaSums::F32.f64_sums(), Some(false));
        assert_eq!(CudaLinear::Auto.tensor_cores(), None);
        assert_eq!(CudaLinear::Simt.tensor_cores(), Some(false));
        assert_eq!(CudaLinear::Mma.tensor_cores(), Some(true));
        assert_eq!(AutoOrCount::Auto.count(), None);
        assert_eq!(AutoOrCount::Count(0).count(), Some(0));
        assert_eq!(
            "f16".parse::<CudaSums>().unwrap_err(),
            "unknown cuda_sums `f16` (allowed: auto, f64, f32)"
        );
        assert_eq!("f32".parse::<CpuSums>(), Ok(CpuSums::F32));
        assert_eq!(
            "auto".parse::<CpuSums>().unwrap_err(),
            "unknown cpu_sums `auto` (allowed: f64, f32)"
        );
    }

    #[test]
    fn spellings_round_trip_through_text_and_serde() {
        for name in Fault::NAMES {
            let f: Fault = name.parse().unwrap();
            assert_eq!(f.to_string(), *name);
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), f);
        }
        for name in CudaSums::NAMES {
            let v: CudaSums = name.parse().unwrap();
            assert_eq!(v.to_string(), *name);
        }
        for name in CudaLinear::NAMES {
            let v: CudaLinear = name.parse().unwrap();
            assert_eq!(v.to_string(), *name);
        }
        for (text, json, v) in [
            ("auto", "\"auto\"", AutoOrCount::Auto),
            ("512", "512", AutoOrCount::Count(512)),
            ("0", "0", AutoOrCount::Count(0)),
        ] {
            assert_eq!(text.parse::<AutoOrCount>().unwrap(), v);
            assert_eq!(v.to_string(), text);
            assert_eq!(serde_json::to_string(&v).unwrap(), json);
            assert_eq!(serde_json::from_str::<AutoOrCount>(json).unwrap(), v);
        }
        for bad in ["-1", "\"-1\"", "1.5", "\"big\"", "true"] {
            let e = serde_json::from_str::<AutoOrCount>(bad).unwrap_err();
            assert!(e.to_string().contains("\"auto\""), "{bad}: {e}");
        }
        assert_eq!(
            "deepseek-v4".parse::<ToolCallParser>(),
            Ok(ToolCallParser::DeepseekV4)
        );
        for name in CanaryPool::NAMES {
            assert_eq!(name.parse::<CanaryPool>().unwrap().as_str(), *name);
        }
        let e = "arena-ignores-stream-lifetimes"
            .parse::<Fault>()
            .unwrap_err();
        assert!(
            e.contains("allowed: arena-ignores-streams, skip-index-k-transfer-wait"),
            "{e}"
        );
        let e = "lifo".parse::<SchedulePolicy>().unwrap_err();
        assert!(e.contains("allowed: fcfs, lpm"), "{e}");
        assert!(serde_json::from_str::<DisaggMode>("\"both\"").is_err());
    }
}

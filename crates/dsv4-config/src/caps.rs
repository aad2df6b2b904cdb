//! What each backend kind can do, as far as configuration validation needs to know.
//!
//! The backends live below this crate, so their facts are restated here as a table keyed by
//! `backend.kind`. It states each backend's design, not what is implemented today: a knob a backend
//! is designed for but does not implement yet passes validation and is rejected by the engine with
//! "not supported by backend X yet". A change to a backend's design updates its row here, and the
//! rules in [`crate::validate`] follow.

use crate::values::ExecutorChoice;
use dsv4_core::numerics::{IndexKDtype, KvCacheDtype};
use serde::Serialize;

/// Where a backend's side streams exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Streams {
    /// One stream only: plans run in order.
    Single,
    /// Side streams exist only inside captured plans (eager steps run on one stream).
    CaptureOnly,
    /// Side streams exist in eager and captured plans.
    Always,
}

/// The capabilities of one backend kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BackendCaps {
    /// The `backend.kind` this row describes.
    pub kind: &'static str,
    /// Its device memory is host memory (a host tier then copies host memory to host memory).
    pub host_memory: bool,
    /// What `backend.device` selects on it (`None`: it has no device to select).
    pub device_selector: Option<&'static str>,
    /// It runs captured plans (`exec.cuda_graph`).
    pub captured_plans: bool,
    /// Where its side streams exist (`exec.multi_stream_overlap`).
    pub streams: Streams,
    /// The executor `exec.executor = "auto"` takes with side streams on: interleaved where
    /// the executor's issue order is what makes them streams (the host backends, one queue),
    /// serial where they are the device's own streams (its host-last order waits least).
    pub overlap_executor: ExecutorChoice,
    /// The KV cache formats it stores.
    pub kv_cache_dtypes: &'static [KvCacheDtype],
    /// The indexer key formats it stores.
    pub index_k_dtypes: &'static [IndexKDtype],
    /// Why the row is what it is, in a sentence.
    pub note: &'static str,
}

/// Every backend kind of [`crate::schema::BACKEND_KINDS`], in the same order.
pub const BACKEND_CAPS: &[BackendCaps] = &[
    BackendCaps {
        kind: "reference",
        host_memory: true,
        device_selector: None,
        captured_plans: false,
        streams: Streams::Single,
        overlap_executor: ExecutorChoice::Interleaved,
        kv_cache_dtypes: &[KvCacheDtype::Bf16, KvCacheDtype::Fp8],
        index_k_dtypes: &[IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4],
        note: "the oracle: every format of spec §5, eager plans on one stream, so that its \
               output never depends on an execution mode",
    },
    BackendCaps {
        kind: "cpu",
        host_memory: true,
        device_selector: None,
        captured_plans: true,
        streams: Streams::Always,
        overlap_executor: ExecutorChoice::Interleaved,
        kv_cache_dtypes: &[KvCacheDtype::Bf16, KvCacheDtype::Fp8],
        index_k_dtypes: &[IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4],
        note: "every format; captured plans and side streams run on the deterministic \
               interleaving executor, which reproduces cross-stream races exactly",
    },
    BackendCaps {
        kind: "wgpu",
        host_memory: false,
        device_selector: Some("an adapter: its index or part of its name"),
        captured_plans: true,
        streams: Streams::Single,
        overlap_executor: ExecutorChoice::Interleaved,
        kv_cache_dtypes: &[KvCacheDtype::Bf16, KvCacheDtype::Fp8],
        index_k_dtypes: &[IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4],
        note: "one queue (no side streams); activations stay on the device, a captured plan's \
               buffers are one device arena per bucket whose bind groups are reused on every \
               replay; wgpu cannot resubmit a command buffer, so each replay re-encodes its \
               dispatches",
    },
    BackendCaps {
        kind: "cuda-sm120",
        host_memory: false,
        device_selector: Some("a GPU by its CUDA index"),
        captured_plans: true,
        streams: Streams::CaptureOnly,
        overlap_executor: ExecutorChoice::Serial,
        kv_cache_dtypes: &[KvCacheDtype::Bf16, KvCacheDtype::Fp8],
        index_k_dtypes: &[IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4],
        note: "as in SGLang's DeepSeek-V4 attention, side streams are used only while a CUDA \
               graph is captured (sgl-project/sglang python/sglang/srt/models/deepseek_v4.py, \
               MQALayer.forward: enable_multi_stream requires get_is_capture_mode())",
    },
    BackendCaps {
        kind: "cuda-emu",
        host_memory: true,
        device_selector: None,
        captured_plans: true,
        streams: Streams::CaptureOnly,
        overlap_executor: ExecutorChoice::Serial,
        kv_cache_dtypes: &[KvCacheDtype::Bf16, KvCacheDtype::Fp8],
        index_k_dtypes: &[IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4],
        note: "the cuda-sm120 kernels on a CPU emulator (tests and CI without a GPU): the same \
               design as cuda-sm120, its device memory is host memory",
    },
];

/// The capabilities of a backend kind, if the kind exists.
pub fn caps_of(kind: &str) -> Option<&'static BackendCaps> {
    BACKEND_CAPS.iter().find(|c| c.kind == kind)
}

/// The capability table as Markdown (printed in docs/profiles.md).
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| backend | captured plans | side streams | KV cache | index keys | memory | \
         `backend.device` | note |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let list = |names: Vec<String>| names.join(", ");
    for c in BACKEND_CAPS {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
            c.kind,
            if c.captured_plans { "yes" } else { "no" },
            match c.streams {
                Streams::Single => "none",
                Streams::CaptureOnly => "only in captured plans",
                Streams::Always => "eager and captured",
            },
            list(c.kv_cache_dtypes.iter().map(|d| d.to_string()).collect()),
            list(c.index_k_dtypes.iter().map(|d| d.to_string()).collect()),
            if c.host_memory { "host" } else { "device" },
            c.device_selector.unwrap_or("(none: ignored)"),
            c.note
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::BACKEND_KINDS;

    #[test]
    fn one_row_per_backend_kind_in_order() {
        let kinds: Vec<&str> = BACKEND_CAPS.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, BACKEND_KINDS);
        assert!(caps_of("cuda-sm120").is_some());
        assert!(caps_of("tpu").is_none());
    }

    #[test]
    fn every_backend_stores_the_default_formats() {
        for c in BACKEND_CAPS {
            assert!(
                c.kv_cache_dtypes.contains(&KvCacheDtype::default()),
                "{}",
                c.kind
            );
            assert!(
                c.index_k_dtypes.contains(&IndexKDtype::default()),
                "{}",
                c.kind
            );
        }
    }
}

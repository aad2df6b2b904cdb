//! The resolved configuration of one run: [`Profile`] and its sections, with the built-in defaults.
//!
//! Every section denies unknown fields, so a value can never be silently ignored. The sections of later
//! subsystems (cache, scheduler, server, debug, disaggregation) live in [`crate::sections`]. Adding a
//! knob means a field here or there plus a row in [`crate::schema::KEYS`] and in the SGLang mapping
//! ([`crate::export::mapping::SGLANG_MAP`]).

use crate::sections::{CacheSection, DebugSection, DisaggSection, SchedulerSection, ServerSection};
use crate::values::{AutoOrCount, CpuSums, CudaLinear, CudaSums, DeviceOrHost, ExecutorChoice};
use dsv4_core::numerics::{ActQuant, IndexKDtype, KvCacheDtype, Numerics};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The value of `model.path` that selects the embedded tiny model.
pub const TINY_MODEL: &str = "tiny";

/// The fully resolved configuration of a run (defaults < profile files < environment < `--set`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Which model to load.
    #[serde(default)]
    pub model: ModelSection,
    /// Which backend runs the ops.
    #[serde(default)]
    pub backend: BackendSection,
    /// The numerics knobs of spec §5.
    #[serde(default)]
    pub numerics: NumericsSection,
    /// Execution settings.
    #[serde(default)]
    pub exec: ExecSection,
    /// KV cache pools, prefix cache and host tier.
    #[serde(default)]
    pub cache: CacheSection,
    /// Admission and batching of requests.
    #[serde(default)]
    pub scheduler: SchedulerSection,
    /// The HTTP server.
    #[serde(default)]
    pub server: ServerSection,
    /// Run-time checks and fault injection.
    #[serde(default)]
    pub debug: DebugSection,
    /// Prefill/decode disaggregation.
    #[serde(default)]
    pub disagg: DisaggSection,
}

impl Profile {
    /// The numerics knobs as the type the model and kernels take.
    pub fn numerics(&self) -> Numerics {
        self.numerics.into()
    }
}

/// `[model]`: the checkpoint to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// `"tiny"` for the embedded tiny model, otherwise a checkpoint directory.
    pub path: String,
    /// Seed of the embedded tiny model's weights (ignored for checkpoint directories).
    pub seed: u64,
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: TINY_MODEL.to_string(),
            seed: 0,
        }
    }
}

/// Where the model of a profile comes from, as decoded from `model.path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// The embedded tiny model, generated from this seed.
    Tiny {
        /// Weight seed.
        seed: u64,
    },
    /// A checkpoint directory (config.json + safetensors + tokenizer.json).
    Dir(PathBuf),
}

impl ModelSection {
    /// Decode `path`: `"tiny"` selects the embedded model, anything else is a directory.
    pub fn source(&self) -> ModelSource {
        if self.path == TINY_MODEL {
            ModelSource::Tiny { seed: self.seed }
        } else {
            ModelSource::Dir(PathBuf::from(&self.path))
        }
    }
}

/// `[backend]`: which registered backend runs the ops, and on which device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    /// Registry name of the backend (see [`crate::schema::BACKEND_KINDS`]).
    pub kind: String,
    /// Backend-specific device selector (e.g. a GPU index); `None` lets the backend choose.
    #[serde(default)]
    pub device: Option<String>,
    /// What the cpu backend sums its linear layers' products in (other backends ignore it).
    #[serde(default)]
    pub cpu_sums: CpuSums,
    /// How the CUDA kernels sum dot products (cuda-sm120, cuda-emu; other backends ignore it).
    #[serde(default)]
    pub cuda_sums: CudaSums,
    /// Which kernels run the CUDA backends' linears (cuda-sm120, cuda-emu).
    #[serde(default)]
    pub cuda_linear: CudaLinear,
    /// Where the CUDA backends route a MoE layer's tokens (cuda-sm120, cuda-emu).
    #[serde(default)]
    pub cuda_routing: DeviceOrHost,
    /// Where the CUDA backends run attention: on device-resident queries, or host copies.
    #[serde(default)]
    pub cuda_attention: DeviceOrHost,
    /// Device memory for cache pages kept across calls, per entry layout (cuda-sm120, cuda-emu).
    #[serde(default)]
    pub cuda_page_cache_mib: AutoOrCount,
    /// Shapes of the CUDA backends' one-row linear kernels: `auto` (the backend's defaults) or
    /// `fp8=c2w8p3,mxfp4=c1w8p3`; speed only, never bits.
    #[serde(default = "auto")]
    pub cuda_decode: String,
}

/// `"auto"`: a text knob's default that leaves the choice to the code that reads it.
fn auto() -> String {
    "auto".to_string()
}

impl Default for BackendSection {
    fn default() -> Self {
        BackendSection {
            kind: "reference".to_string(),
            device: None,
            cpu_sums: CpuSums::default(),
            cuda_sums: CudaSums::default(),
            cuda_linear: CudaLinear::default(),
            cuda_routing: DeviceOrHost::default(),
            cuda_attention: DeviceOrHost::default(),
            cuda_page_cache_mib: AutoOrCount::default(),
            cuda_decode: auto(),
        }
    }
}

/// `[numerics]`: storage and rounding formats (spec §5); mirrors [`Numerics`] field by field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NumericsSection {
    /// KV cache storage format.
    pub kv_cache_dtype: KvCacheDtype,
    /// Indexer key/query format.
    pub index_k_dtype: IndexKDtype,
    /// Activation quantization in front of fp8/fp4-weight linears.
    pub act_quant: ActQuant,
}

impl From<NumericsSection> for Numerics {
    fn from(n: NumericsSection) -> Numerics {
        Numerics {
            kv_cache_dtype: n.kv_cache_dtype,
            index_k_dtype: n.index_k_dtype,
            act_quant: n.act_quant,
        }
    }
}

impl From<Numerics> for NumericsSection {
    fn from(n: Numerics) -> NumericsSection {
        NumericsSection {
            kv_cache_dtype: n.kv_cache_dtype,
            index_k_dtype: n.index_k_dtype,
            act_quant: n.act_quant,
        }
    }
}

/// `[exec]`: how the work is executed: captured plans, streams, scheduling overlap, threads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ExecSection {
    /// Decode steps run as captured plans (fixed buffers per batch-size bucket, replayed).
    pub cuda_graph: bool,
    /// Largest batch size with a captured plan; 0 lets the backend choose.
    pub cuda_graph_max_bs: u64,
    /// The KV, compressor and indexer chains run on side streams, overlapping the main stream.
    pub multi_stream_overlap: bool,
    /// Which executor runs a step's plan (`auto`: [`ExecSection::executor_for`]).
    #[serde(default)]
    pub executor: ExecutorChoice,
    /// Activations stay in host memory even on a backend with device memory.
    pub host_activations: bool,
    /// The scheduler prepares the next step while the current one runs.
    pub overlap_schedule: bool,
    /// Worker threads; 0 means one per available core.
    pub threads: usize,
}

impl ExecSection {
    /// The executor that runs a step's plan on a backend of kind `kind`: `executor` when it
    /// names one; for `auto`, serial without side streams, and with them the kind's overlap
    /// executor ([`crate::caps::BackendCaps::overlap_executor`]; interleaved for an unknown
    /// kind). Never `Auto`.
    pub fn executor_for(&self, kind: &str) -> ExecutorChoice {
        match self.executor {
            ExecutorChoice::Auto if !self.multi_stream_overlap => ExecutorChoice::Serial,
            ExecutorChoice::Auto => crate::caps::caps_of(kind)
                .map_or(ExecutorChoice::Interleaved, |c| c.overlap_executor),
            chosen => chosen,
        }
    }

    /// The thread count to use: `threads`, or the number of available cores when it is 0.
    pub fn effective_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_executor_is_serial_on_one_stream_and_the_kinds_own_with_side_streams() {
        use ExecutorChoice::*;
        let on = |executor, overlap| ExecSection {
            executor,
            multi_stream_overlap: overlap,
            ..ExecSection::default()
        };
        for kind in ["reference", "cpu", "wgpu", "cuda-sm120", "cuda-emu", "tpu"] {
            assert_eq!(on(Auto, false).executor_for(kind), Serial, "{kind}");
            // A named executor is taken as named, side streams or not.
            for chosen in [Serial, Interleaved, Threaded] {
                for overlap in [false, true] {
                    assert_eq!(on(chosen, overlap).executor_for(kind), chosen, "{kind}");
                }
            }
        }
        // With side streams: the device's own streams keep the serial host-last order; where the
        // executor's issue order makes the streams, it interleaves (and for an unknown kind).
        for (kind, want) in [
            ("cuda-sm120", Serial),
            ("cuda-emu", Serial),
            ("cpu", Interleaved),
            ("reference", Interleaved),
            ("wgpu", Interleaved),
            ("tpu", Interleaved),
        ] {
            assert_eq!(on(Auto, true).executor_for(kind), want, "{kind}");
        }
    }

    #[test]
    fn model_source_decodes_tiny_and_dirs() {
        let mut m = ModelSection {
            seed: 7,
            ..ModelSection::default()
        };
        assert_eq!(m.source(), ModelSource::Tiny { seed: 7 });
        m.path = "/ckpt/flash".into();
        assert_eq!(m.source(), ModelSource::Dir(PathBuf::from("/ckpt/flash")));
    }

    #[test]
    fn numerics_round_trip_through_core_type() {
        for n in Numerics::all() {
            let s = NumericsSection::from(n);
            assert_eq!(Numerics::from(s), n);
        }
    }

    #[test]
    fn sections_reject_unknown_fields() {
        let e = toml::from_str::<Profile>("[exec]\nthreads = 1\nthread = 2\n").unwrap_err();
        assert!(e.to_string().contains("thread"), "{e}");
    }

    #[test]
    fn effective_threads_is_positive() {
        let mut exec = ExecSection {
            threads: 3,
            ..ExecSection::default()
        };
        assert_eq!(exec.effective_threads(), 3);
        exec.threads = 0;
        assert!(exec.effective_threads() >= 1);
    }
}

//! The backend registry: each backend crate `inventory::submit!`s a [`BackendFactory`]; the binary
//! links every backend crate so their factories are present.

use crate::{Backend, KernelError};
use std::sync::Arc;

/// Options a backend is created with (from the profile's `[backend]`/`[exec]` sections).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendOptions {
    /// Worker threads (0 = all cores); backends without threads ignore it.
    pub threads: usize,
    /// Device selector (GPU index or adapter name); None = the default device.
    pub device: Option<String>,
    /// Sums of dot products where a backend offers a choice (`backend.cuda_sums`: cuda-sm120,
    /// cuda-emu): Some(true) f64, Some(false) f32, None the backend's choice.
    pub f64_sums: Option<bool>,
    /// The cpu backend sums its linear layers' products in f32, not f64
    /// (`backend.cpu_sums = "f32"`).
    pub cpu_f32_sums: bool,
    /// Tensor-core linears where a backend offers them (`backend.cuda_linear`): Some(true) on,
    /// Some(false) off, None the backend's choice.
    pub tensor_core_linears: Option<bool>,
    /// MoE routing on the device where a backend offers it (`backend.cuda_routing`): Some(true)
    /// on the device, Some(false) on the host, None the backend's choice.
    pub device_routing: Option<bool>,
    /// Attention on device-resident queries where a backend offers it
    /// (`backend.cuda_attention`): Some(true) on the device, Some(false) from host copies, None
    /// the backend's choice.
    pub device_attention: Option<bool>,
    /// MiB of device memory for cache pages kept across calls, per entry layout, where a backend
    /// keeps them (`backend.cuda_page_cache_mib`): Some(0) none, None the backend's choice.
    pub page_cache_mib: Option<u64>,
    /// Shapes of the one-row linear kernels where a backend has several
    /// (`backend.cuda_decode`, e.g. `fp8=c2w8p3,mxfp4=c1w8p3`); None the backend's defaults.
    pub decode_shapes: Option<String>,
    /// Where a backend keeps copies of cache pages on its device, check each call's copies
    /// against the host pages (set when `debug.canary` watches the KV or index-K pools).
    pub check_cached_pages: bool,
}

/// A registered backend: its name, an availability probe, and a constructor.
pub struct BackendFactory {
    /// Registry name, as used in `[backend] kind`.
    pub name: &'static str,
    /// One line on what the backend is.
    pub summary: &'static str,
    /// Ok when the backend can run on this machine, else the reason it cannot.
    pub probe: fn() -> Result<(), String>,
    /// Build a backend instance.
    pub create: fn(&BackendOptions) -> Result<Arc<dyn Backend>, KernelError>,
}

inventory::collect!(BackendFactory);

/// Every registered backend factory, sorted by name.
pub fn factories() -> Vec<&'static BackendFactory> {
    let mut v: Vec<_> = inventory::iter::<BackendFactory>.into_iter().collect();
    v.sort_by_key(|f| f.name);
    v
}

/// Names of the registered backends, sorted.
pub fn names() -> Vec<&'static str> {
    factories().into_iter().map(|f| f.name).collect()
}

/// Create the backend registered under `name`, after checking it can run here.
pub fn create(name: &str, opts: &BackendOptions) -> Result<Arc<dyn Backend>, KernelError> {
    let f = factories()
        .into_iter()
        .find(|f| f.name == name)
        .ok_or_else(|| KernelError::UnknownBackend {
            name: name.to_string(),
            known: names().join(", "),
        })?;
    (f.probe)().map_err(|reason| KernelError::Unavailable {
        name: name.to_string(),
        reason,
    })?;
    (f.create)(opts)
}

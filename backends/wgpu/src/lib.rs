//! dsv4-backend-wgpu: the forward pass's ops as WGSL compute shaders through wgpu (Vulkan,
//! Metal, DX12; Mesa lavapipe on CPU-only Linux). See docs/wgpu.md.
//!
//! Every op of [`Backend`] runs as a compute kernel; the host only uploads inputs, encodes the
//! op's dispatches into one command buffer, submits it once and reads the result back (the
//! trait passes host slices). Linear weights are uploaded once, kept in their stored format
//! (f32, bf16, e4m3 + ue8m0, e2m1 + ue8m0) and decoded in-shader. Where the adapter has
//! SHADER_F64 every sum is accumulated in f64 in the reference's order, so results match the
//! reference backend bit for bit up to the last f64 ulp of exp/log/sin/cos; without f64 the same
//! kernels accumulate in f32.
//!
//! The backend also implements [`DeviceOps`] (resident.rs, resident_ops.rs): the same kernels
//! over device-resident buffers, recorded into one pending encoder and submitted only by a
//! read or a flush, with bind groups reused across identical dispatches (setup.rs).

mod error;
pub mod gpu;
mod ops;
mod ops_attn;
mod ops_cache;
mod ops_indexer;
mod resident;
mod resident_ops;
pub mod setup;
pub mod shaders;
mod weights;

pub use error::WgpuError;
pub use gpu::AdapterReport;

use dsv4_core::IndexKDtype;
use dsv4_core::cache::CacheLayoutError;
use dsv4_kernels::registry::{BackendFactory, BackendOptions};
use dsv4_kernels::{
    Backend, DeviceOps, HcParams, KernelError, Linear, MhcPre, RopeTable, RowFormat, WeightKey,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use weights::DeviceWeight;

/// Registry name of this backend.
pub const NAME: &str = "wgpu";

/// Environment variable that forces the f32 accumulation path (`DSV4_WGPU_F32=1`), to exercise
/// what a device without SHADER_F64 computes.
pub const FORCE_F32_ENV: &str = "DSV4_WGPU_F32";

/// The wgpu backend: one device, its compiled kernels, the weights resident on it, and the
/// device-resident activation buffers of its [`DeviceOps`].
pub struct WgpuBackend {
    gpu: gpu::Gpu,
    weights: Mutex<HashMap<WeightKey, Arc<DeviceWeight>>>,
    resident: resident::Resident,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuBackend")
            .field("adapter", self.gpu.report())
            .finish()
    }
}

impl WgpuBackend {
    /// Open the adapter chosen by `device` (an index or part of a name; None = the first
    /// discrete GPU, else the first adapter). `allow_f64 = false` forces f32 accumulation.
    pub fn new(device: Option<&str>, allow_f64: bool) -> Result<Self, WgpuError> {
        let adapter = gpu::select_adapter(device)?;
        Ok(Self {
            gpu: gpu::Gpu::open(&adapter, allow_f64)?,
            weights: Mutex::new(HashMap::new()),
            resident: resident::Resident::default(),
        })
    }

    /// The adapter this backend runs on (name, driver, accumulation type, binding limit).
    pub fn adapter(&self) -> &AdapterReport {
        self.gpu.report()
    }

    /// Use storage bindings of at most `bytes` from now on (weights uploaded later are split
    /// into chunks of at most that size); see [`gpu::Gpu::cap_binding_bytes`].
    pub fn cap_binding_bytes(&mut self, bytes: u64) {
        self.gpu.cap_binding_bytes(bytes)
    }

    /// Bytes of linear weights resident on the device.
    pub fn resident_weight_bytes(&self) -> usize {
        self.lock_weights().values().map(|w| w.bytes).sum()
    }

    /// Upload `w` now (it is otherwise uploaded on first use); an error says why the device
    /// cannot hold it.
    pub fn prepare(&self, w: &Linear) -> Result<(), WgpuError> {
        self.weight(w).map(|_| ())
    }

    fn lock_weights(&self) -> std::sync::MutexGuard<'_, HashMap<WeightKey, Arc<DeviceWeight>>> {
        self.weights.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn weight(&self, w: &Linear) -> Result<Arc<DeviceWeight>, WgpuError> {
        let key = WeightKey::of(w);
        if let Some(d) = self.lock_weights().get(&key) {
            return Ok(d.clone());
        }
        let d = Arc::new(weights::upload(&self.gpu, w)?);
        self.lock_weights().insert(key, d.clone());
        Ok(d)
    }
}

/// Whether an adapter exists here (cached): Ok, or the reason the backend cannot run.
pub fn probe() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            if gpu::adapters().is_empty() {
                Err(WgpuError::NoAdapter.to_string())
            } else {
                Ok(())
            }
        })
        .clone()
}

fn create(opts: &BackendOptions) -> Result<Arc<dyn Backend>, KernelError> {
    let allow_f64 = std::env::var(FORCE_F32_ENV).map_or(true, |v| v.is_empty() || v == "0");
    let b = WgpuBackend::new(opts.device.as_deref(), allow_f64).map_err(|e| {
        KernelError::Unavailable {
            name: NAME.to_string(),
            reason: e.to_string(),
        }
    })?;
    Ok(Arc::new(b))
}

inventory::submit! {
    BackendFactory {
        name: NAME,
        summary: "WGSL compute shaders through wgpu (Vulkan/Metal/DX12; lavapipe on CPU-only Linux), f64 sums where the device has them",
        probe,
        create,
    }
}

/// Call from a binary or test so the linker keeps this crate's registry entry.
pub fn link() {}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn linear(&self, w: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
        let dw = self
            .weight(w)
            .unwrap_or_else(|e| panic!("wgpu backend: {e}"));
        ops::linear(&self.gpu, w, &dw, x, rows, out)
    }

    fn act_quant_fp8(&self, x: &mut [f32], dim: usize) {
        ops::act_quant_fp8(&self.gpu, x, dim)
    }

    fn rms_norm(&self, x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
        ops::rms_norm(&self.gpu, x, weight, dim, eps, out)
    }

    fn rope(
        &self,
        x: &mut [f32],
        dim: usize,
        positions: &[usize],
        table: &RopeTable,
        inverse: bool,
    ) {
        ops::rope(&self.gpu, x, dim, positions, table, inverse)
    }

    fn mhc_pre(&self, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
        ops_attn::mhc_pre(&self.gpu, p, x, t)
    }

    fn mhc_post(&self, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
        ops_attn::mhc_post(&self.gpu, x, y, pre, m, d, out)
    }

    fn hc_head(&self, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
        ops_attn::hc_head(&self.gpu, p, x, t, out)
    }

    fn softmax_pool(&self, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
        ops_attn::softmax_pool(&self.gpu, a, z, rows, width, out)
    }

    fn softmax_pool_rows(
        &self,
        a: &[f32],
        z: &[f32],
        windows: usize,
        rows: usize,
        width: usize,
        out: &mut [f32],
    ) {
        ops_attn::softmax_pool_rows(&self.gpu, a, z, windows, rows, width, out)
    }

    fn hadamard(&self, x: &mut [f32], dim: usize) {
        ops::hadamard(&self.gpu, x, dim)
    }

    fn indexer_scores(&self, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
        ops_indexer::indexer_scores(&self.gpu, q, w, dim, keys, out)
    }

    fn topk(&self, scores: &[f32], k: usize) -> Vec<usize> {
        ops_indexer::topk(&self.gpu, scores, k)
    }

    fn indexer_scores_rows(
        &self,
        q: &[f32],
        w: &[f32],
        dim: usize,
        keys: &[f32],
        key_starts: &[usize],
        out: &mut [f32],
    ) {
        ops_indexer::indexer_scores_rows(&self.gpu, q, w, dim, keys, key_starts, out)
    }

    fn topk_rows(&self, scores: &[f32], starts: &[usize], k: usize) -> Vec<Vec<usize>> {
        ops_indexer::topk_rows(&self.gpu, scores, starts, k)
    }

    fn indexer_topk_rows(
        &self,
        q: &[f32],
        w: &[f32],
        dim: usize,
        keys: &[f32],
        key_starts: &[usize],
        k: usize,
    ) -> Vec<Vec<usize>> {
        ops_indexer::indexer_topk_rows(&self.gpu, q, w, dim, keys, key_starts, k)
    }

    fn sparse_attention(
        &self,
        q: &[f32],
        dim: usize,
        keys: &[f32],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) {
        ops_attn::sparse_attention(&self.gpu, q, dim, keys, sink, scale, out)
    }

    fn sparse_attention_rows(
        &self,
        q: &[f32],
        dim: usize,
        keys: &[f32],
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) {
        ops_attn::sparse_attention_rows(&self.gpu, q, dim, keys, key_starts, sink, scale, out)
    }

    fn paged_indexer_topk_rows(
        &self,
        q: &[f32],
        w: &[f32],
        fmt: &RowFormat,
        pages: &[&[u8]],
        rows: &[(usize, usize)],
        key_starts: &[usize],
        k: usize,
    ) -> Result<Vec<Vec<usize>>, CacheLayoutError> {
        ops_indexer::paged_indexer_topk_rows(&self.gpu, q, w, fmt, pages, rows, key_starts, k)
    }

    fn paged_attention_rows(
        &self,
        q: &[f32],
        fmt: &RowFormat,
        pages: &[&[u8]],
        rows: &[(usize, usize)],
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        ops_attn::paged_attention_rows(&self.gpu, q, fmt, pages, rows, key_starts, sink, scale, out)
    }

    fn router_scores(&self, logits: &[f32], out: &mut [f32]) {
        ops::router_scores(&self.gpu, logits, out)
    }

    fn swiglu(&self, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
        ops::swiglu(&self.gpu, g, u, limit, weight, out)
    }

    fn cache_store(
        &self,
        fmt: &RowFormat,
        page: &mut [u8],
        slot: usize,
        values: &[f32],
    ) -> Result<(), CacheLayoutError> {
        ops_cache::cache_store(&self.gpu, fmt, page, slot, values)
    }

    fn cache_encode_rows(
        &self,
        fmt: &RowFormat,
        values: &[f32],
    ) -> Result<Vec<u8>, CacheLayoutError> {
        ops_cache::cache_encode_rows(&self.gpu, fmt, values)
    }

    fn cache_load(
        &self,
        fmt: &RowFormat,
        page: &[u8],
        slot: usize,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        ops_cache::cache_load(&self.gpu, fmt, page, slot, out)
    }

    fn cache_load_rows(
        &self,
        fmt: &RowFormat,
        pages: &[&[u8]],
        rows: &[(usize, usize)],
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        ops_cache::cache_load_rows(&self.gpu, fmt, pages, rows, out)
    }

    fn round_index_rows(&self, dtype: IndexKDtype, x: &mut [f32], dim: usize) {
        ops::round_index_rows(&self.gpu, dtype, x, dim)
    }

    fn device(&self) -> Option<&dyn DeviceOps> {
        Some(self)
    }
}

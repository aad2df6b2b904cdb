//! dsv4-backend-cuda: the optimized NVIDIA backend (registry name `cuda-sm120`). Kernels are
//! CUDA C++ in `kernels/*.cu`, compiled at run time by NVRTC for the device's own compute
//! capability (sm_80 … sm_120) and launched through cudarc, loaded dynamically so the binary
//! builds and runs without CUDA. The same sources also run on a CPU emulator (registry name
//! `cuda-emu`, needs a host C++ compiler), which is how CI diffs these kernels against the
//! reference without a GPU. See docs/cuda.md.
//!
//! The host ops (the `Backend` trait) take host slices: linear weights are uploaded once and stay
//! resident in their stored format; each op uploads its inputs, launches its kernels and reads its
//! output back, one synchronisation each (the batched `cache_encode_rows`, `cache_load_rows`,
//! `indexer_scores_rows`, `topk_rows` and `sparse_attention_rows` do a whole batch in one). The device-resident op set ([`DeviceOps`], `Backend::device`) runs the
//! same kernels on activations kept in device buffers for a whole step (`resident/`); its
//! `stats` include the host ops' traffic.

pub mod bench;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
mod disk_cache;
#[cfg(feature = "cuda")]
mod driver_lib;
pub mod emu;
mod error;
pub mod graphs;
#[cfg(feature = "cuda")]
pub mod kernel_cache;
pub mod kernels;
#[cfg(feature = "cuda")]
pub mod nvrtc;
mod ops;
mod registry;
mod resident;
mod temp;

pub use registry::{link, open_backend};

pub use device::{DevBuf, DevPtr, Device, DeviceInfo, KArg};
pub use error::CudaError;
pub use ops::decode_shape::{DECODE_ENV, DecodeShape, DecodeShapes};
pub use ops::linear::LinearPath;
pub use ops::page_cache::PAGE_CACHE_ENV;

use dsv4_core::IndexKDtype;
use dsv4_core::cache::CacheLayoutError;
use dsv4_kernels::{
    Backend, DeviceOps, EntryOrigin, HcParams, Linear, MhcPre, PageTag, RopeTable, RowFormat,
};

/// Registry name of the CUDA backend.
pub const NAME: &str = "cuda-sm120";
/// Registry name of the same kernels on the CPU emulator.
pub const EMU_NAME: &str = "cuda-emu";

/// The device and what the ops keep on it (resident weights), shared by the host ops and the
/// device-resident ones.
#[derive(Clone)]
pub(crate) struct Core {
    pub(crate) dev: Device,
    pub(crate) weights: std::sync::Arc<ops::linear::WeightCache>,
    /// Which kernels `linear` and `grouped_linear` run.
    pub(crate) linear: LinearPath,
    /// The shapes of their one-row SIMT kernels.
    pub(crate) decode: ops::decode_shape::DecodeShapes,
    /// Cache pages the paged ops keep on the device across calls.
    pub(crate) pages: std::sync::Arc<ops::page_cache::PageCache>,
}

/// The CUDA backend over one device (a GPU, or the emulator).
pub struct CudaBackend {
    name: &'static str,
    core: Core,
    resident: resident::Resident,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("name", &self.name)
            .field("device", &self.core.dev.info())
            .finish()
    }
}

impl CudaBackend {
    /// A backend named `name` ([`NAME`] or [`EMU_NAME`]) over `dev`, with the SIMT linear
    /// kernels.
    pub fn new(name: &'static str, dev: Device) -> Self {
        Self::with_linear(name, dev, LinearPath::Simt)
    }

    /// A backend named `name` over `dev` whose linears run on the `linear` kernels.
    pub fn with_linear(name: &'static str, dev: Device, linear: LinearPath) -> Self {
        // The host ops count their traffic through their own handle of the device; the
        // resident ops count theirs themselves, and `stats` reports both.
        let host_traffic = std::sync::Arc::default();
        let pages = std::sync::Arc::new(ops::page_cache::PageCache::with_default_budget(
            name == EMU_NAME,
            dev.info().memory_bytes,
        ));
        let resident = Core {
            dev: dev.clone(),
            weights: Default::default(),
            linear,
            decode: Default::default(),
            pages: std::sync::Arc::clone(&pages),
        };
        let core = Core {
            dev: dev.counted(std::sync::Arc::clone(&host_traffic)),
            weights: resident.weights.clone(),
            linear,
            decode: Default::default(),
            pages,
        };
        Self {
            name,
            resident: resident::Resident::new(resident, host_traffic),
            core,
        }
    }

    /// The same backend with cache pages kept on the device in arenas of up to `bytes` each
    /// (0: never kept; see `ops::page_cache`), each starting at 16 MiB at most.
    pub fn with_page_cache(self, bytes: usize) -> Self {
        self.with_pages(ops::page_cache::PageCache::with_budget(bytes))
    }

    /// [`Self::with_page_cache`] with arenas that start at `first` bytes (or what a call needs)
    /// and double up to `bytes`.
    pub fn with_growing_page_cache(self, first: usize, bytes: usize) -> Self {
        self.with_pages(ops::page_cache::PageCache::growing(first, bytes))
    }

    /// The same backend routing MoE layers on the device (`on`, the default) or on the host
    /// (`DeviceOps::routes_on_device` false: the router's scores are read back).
    pub fn with_device_routing(mut self, on: bool) -> Self {
        self.resident.set_routing(on);
        self
    }

    /// The same backend attending into device memory (`on`, the default) or from host copies
    /// (`DeviceOps::attends_on_device` false: the queries are read back, the output written).
    pub fn with_device_attention(mut self, on: bool) -> Self {
        self.resident.set_attention(on);
        self
    }

    /// The same backend with one-row linear kernels of `shapes` (`DSV4_CUDA_DECODE`): the same
    /// bits, at the speed of those shapes on this GPU.
    pub fn with_decode_shapes(mut self, shapes: DecodeShapes) -> Self {
        self.core.decode = shapes;
        self.resident.set_decode_shapes(shapes);
        self
    }

    /// The shapes of the one-row linear kernels.
    pub fn decode_shapes(&self) -> DecodeShapes {
        self.core.decode
    }

    fn with_pages(mut self, cache: ops::page_cache::PageCache) -> Self {
        // A new size keeps the memory reserve.
        cache.set_reserve(self.core.pages.reserve());
        let pages = std::sync::Arc::new(cache);
        self.core.pages = std::sync::Arc::clone(&pages);
        self.resident.set_page_cache(pages);
        self
    }

    /// Bytes of device memory each entry layout's page arena may take.
    pub fn page_cache_budget(&self) -> usize {
        self.core.pages.budget()
    }

    /// With `on`, every paged call checks the cached entries it reads against its pages and
    /// fails on a difference (`backend.check_cached_pages`, from `debug.canary`).
    pub fn check_page_cache(&self, on: bool) {
        self.core.pages.set_check(on);
    }

    /// Bytes of device memory the page arenas hold now (they grow as calls need).
    pub fn page_cache_held(&self) -> usize {
        self.core.pages.held()
    }

    /// Leave at least `bytes` of device memory free when a page arena is made or grows (the
    /// default: a sixteenth of a GPU's memory, none on the emulator; see `ops::page_cache`).
    pub fn set_page_cache_reserve(&self, bytes: usize) {
        self.core.pages.set_reserve(bytes);
    }

    /// The page arenas' memory reserve, bytes ([`Self::set_page_cache_reserve`]).
    pub fn page_cache_reserve(&self) -> usize {
        self.core.pages.reserve()
    }

    /// Times a page arena was not made, or grew less than it would have (or not at all), to
    /// keep the memory reserve free.
    pub fn page_cache_short_of_memory(&self) -> u64 {
        self.core.pages.short_of_memory()
    }

    /// The device the kernels run on.
    pub fn device(&self) -> &Device {
        &self.core.dev
    }

    /// Which kernels the linears run on.
    pub fn linear_path(&self) -> LinearPath {
        self.core.linear
    }

    /// Upload `w` now (it is otherwise uploaded on first use); an error says why the device
    /// cannot hold it.
    pub fn prepare(&self, w: &Linear) -> Result<(), CudaError> {
        self.core.weights.get(&self.core.dev, w).map(|_| ())
    }

    /// Bytes of linear weights resident on the device.
    pub fn resident_weight_bytes(&self) -> usize {
        self.core.weights.resident_bytes()
    }

    /// The canary's checksum ([`dsv4_core::cache::page_checksum`]) of each of the `pages`
    /// pages of `page_bytes` bytes in `bytes`, computed by the checksum kernel.
    pub fn page_checksums(&self, bytes: &[u8], page_bytes: usize) -> Result<Vec<u64>, CudaError> {
        ops::checksum::page_checksums(&self.core, bytes, page_bytes)
    }
}

fn fail(name: &str, e: CudaError) -> ! {
    panic!("{name} backend: {e}")
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn linear(&self, w: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
        ops::linear::linear(&self.core, w, x, rows, out).unwrap_or_else(|e| fail(self.name, e))
    }

    fn act_quant_fp8(&self, x: &mut [f32], dim: usize) {
        ops::rows::act_quant_fp8(&self.core, x, dim).unwrap_or_else(|e| fail(self.name, e))
    }

    fn rms_norm(&self, x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
        ops::rows::rms_norm(&self.core, x, weight, dim, eps, out)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn rope(
        &self,
        x: &mut [f32],
        dim: usize,
        positions: &[usize],
        table: &RopeTable,
        inverse: bool,
    ) {
        ops::rows::rope(&self.core, x, dim, positions, table, inverse)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn mhc_pre(&self, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
        ops::mhc::mhc_pre(&self.core, p, x, t).unwrap_or_else(|e| fail(self.name, e))
    }

    fn mhc_post(&self, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
        ops::mhc::mhc_post(&self.core, x, y, pre, m, d, out).unwrap_or_else(|e| fail(self.name, e))
    }

    fn hc_head(&self, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
        ops::mhc::hc_head(&self.core, p, x, t, out).unwrap_or_else(|e| fail(self.name, e))
    }

    fn softmax_pool(&self, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
        ops::attention::softmax_pool(&self.core, a, z, rows, width, out)
            .unwrap_or_else(|e| fail(self.name, e))
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
        ops::attention::softmax_pool_rows(&self.core, a, z, windows, rows, width, out)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn hadamard(&self, x: &mut [f32], dim: usize) {
        ops::rows::hadamard(&self.core, x, dim).unwrap_or_else(|e| fail(self.name, e))
    }

    fn indexer_scores(&self, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
        ops::indexer::indexer_scores(&self.core, q, w, dim, keys, out)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn topk(&self, scores: &[f32], k: usize) -> Vec<usize> {
        ops::indexer::topk(&self.core, scores, k).unwrap_or_else(|e| fail(self.name, e))
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
        ops::indexer::indexer_scores_rows(&self.core, q, w, dim, keys, key_starts, out)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn topk_rows(&self, scores: &[f32], starts: &[usize], k: usize) -> Vec<Vec<usize>> {
        ops::indexer::topk_rows(&self.core, scores, starts, k)
            .unwrap_or_else(|e| fail(self.name, e))
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
        ops::indexer::indexer_topk_rows(&self.core, q, w, dim, keys, key_starts, k)
            .unwrap_or_else(|e| fail(self.name, e))
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
        ops::indexer::paged_indexer_topk_rows(&self.core, q, w, fmt, pages, rows, key_starts, k)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn paged_indexer_topk_ranges(
        &self,
        q: &[f32],
        w: &[f32],
        fmt: &RowFormat,
        pages: &[&[u8]],
        page_tags: &[PageTag],
        rows: &[(usize, usize)],
        key_ranges: &[(usize, usize)],
        k: usize,
    ) -> Result<Vec<Vec<usize>>, CacheLayoutError> {
        ops::indexer::paged_indexer_topk_ranges(
            &self.core, q, w, fmt, pages, page_tags, rows, key_ranges, k,
        )
        .unwrap_or_else(|e| fail(self.name, e))
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
        ops::attention::sparse_attention(&self.core, q, dim, keys, sink, scale, out)
            .unwrap_or_else(|e| fail(self.name, e))
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
        ops::attention::sparse_attention_rows(
            &self.core, q, dim, keys, key_starts, sink, scale, out,
        )
        .unwrap_or_else(|e| fail(self.name, e))
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
        ops::paged_attention::paged_attention_rows(
            &self.core, q, fmt, pages, rows, key_starts, sink, scale, out,
        )
        .unwrap_or_else(|e| fail(self.name, e))
    }

    fn paged_attention_indexed(
        &self,
        q: &[f32],
        fmt: &RowFormat,
        pages: &[&[u8]],
        page_tags: &[PageTag],
        page_origins: &[&[EntryOrigin]],
        rows: &[(usize, usize)],
        key_ids: &[usize],
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        let keys = dsv4_kernels::PagedAttention {
            fmt,
            pages,
            tags: page_tags,
            origins: page_origins,
            rows,
            key_ids,
            key_starts,
            sink,
            scale,
        };
        ops::paged_attention::paged_attention_indexed(&self.core, q, &keys, out)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn router_scores(&self, logits: &[f32], out: &mut [f32]) {
        ops::rows::router_scores(&self.core, logits, out).unwrap_or_else(|e| fail(self.name, e))
    }

    fn swiglu(&self, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
        ops::rows::swiglu(&self.core, g, u, limit, weight, out)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn cache_store(
        &self,
        fmt: &RowFormat,
        page: &mut [u8],
        slot: usize,
        values: &[f32],
    ) -> Result<(), CacheLayoutError> {
        ops::cache::cache_store(&self.core, fmt, page, slot, values)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn cache_encode_rows(
        &self,
        fmt: &RowFormat,
        values: &[f32],
    ) -> Result<Vec<u8>, CacheLayoutError> {
        ops::cache::cache_encode_rows(&self.core, fmt, values)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn cache_load(
        &self,
        fmt: &RowFormat,
        page: &[u8],
        slot: usize,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        ops::cache::cache_load(&self.core, fmt, page, slot, out)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn cache_load_rows(
        &self,
        fmt: &RowFormat,
        pages: &[&[u8]],
        rows: &[(usize, usize)],
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        ops::cache::cache_load_rows(&self.core, fmt, pages, rows, out)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn round_index_rows(&self, dtype: IndexKDtype, x: &mut [f32], dim: usize) {
        ops::rows::round_index_rows(&self.core, dtype, x, dim)
            .unwrap_or_else(|e| fail(self.name, e))
    }

    fn device(&self) -> Option<&dyn DeviceOps> {
        Some(&self.resident)
    }
}

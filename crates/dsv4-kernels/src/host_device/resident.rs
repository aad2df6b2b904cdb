//! [`HostResident`]: a host backend whose [`DeviceOps`] is a [`HostDevice`] over it; every
//! host op delegates to the wrapped backend.

use super::HostDevice;
use crate::device::DeviceOps;
use crate::{Backend, HcParams, Linear, MhcPre, RopeTable, RowFormat};
use dsv4_core::IndexKDtype;
use dsv4_core::cache::CacheLayoutError;
use std::sync::Arc;

/// A host backend plus a [`DeviceOps`] over host-memory buffers that runs its host ops.
pub struct HostResident {
    inner: Arc<dyn Backend>,
    dev: HostDevice,
}

impl HostResident {
    /// Wrap `inner`: host ops delegate to it, and so do the device ops after copying.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        let dev = HostDevice::new(inner.clone());
        Self { inner, dev }
    }

    /// The same wrapper with MoE routing on its "device" ([`DeviceOps::routes_on_device`]):
    /// the routing ops' executable specification, and the model's device-routing path on CPU.
    pub fn with_device_routing(self) -> Self {
        Self {
            dev: self.dev.with_device_routing(),
            ..self
        }
    }

    /// The same wrapper with attention on its "device" ([`DeviceOps::attends_on_device`]):
    /// the op's executable specification, and the model's device-attention path on CPU.
    pub fn with_device_attention(self) -> Self {
        Self {
            dev: self.dev.with_device_attention(),
            ..self
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    /// Device buffers currently allocated (leak checks in tests).
    pub fn live_buffers(&self) -> usize {
        self.dev.lock_bufs().len()
    }
}

impl Backend for HostResident {
    fn name(&self) -> &'static str {
        "host-resident"
    }

    fn linear(&self, w: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
        self.inner.linear(w, x, rows, out)
    }

    fn act_quant_fp8(&self, x: &mut [f32], dim: usize) {
        self.inner.act_quant_fp8(x, dim)
    }

    fn rms_norm(&self, x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
        self.inner.rms_norm(x, weight, dim, eps, out)
    }

    fn rope(
        &self,
        x: &mut [f32],
        dim: usize,
        positions: &[usize],
        table: &RopeTable,
        inverse: bool,
    ) {
        self.inner.rope(x, dim, positions, table, inverse)
    }

    fn mhc_pre(&self, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
        self.inner.mhc_pre(p, x, t)
    }

    fn mhc_post(&self, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
        self.inner.mhc_post(x, y, pre, m, d, out)
    }

    fn hc_head(&self, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
        self.inner.hc_head(p, x, t, out)
    }

    fn softmax_pool(&self, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
        self.inner.softmax_pool(a, z, rows, width, out)
    }

    fn hadamard(&self, x: &mut [f32], dim: usize) {
        self.inner.hadamard(x, dim)
    }

    fn indexer_scores(&self, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
        self.inner.indexer_scores(q, w, dim, keys, out)
    }

    fn topk(&self, scores: &[f32], k: usize) -> Vec<usize> {
        self.inner.topk(scores, k)
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
        self.inner.sparse_attention(q, dim, keys, sink, scale, out)
    }

    fn router_scores(&self, logits: &[f32], out: &mut [f32]) {
        self.inner.router_scores(logits, out)
    }

    fn swiglu(&self, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
        self.inner.swiglu(g, u, limit, weight, out)
    }

    fn cache_store(
        &self,
        fmt: &RowFormat,
        page: &mut [u8],
        slot: usize,
        values: &[f32],
    ) -> Result<(), CacheLayoutError> {
        self.inner.cache_store(fmt, page, slot, values)
    }

    fn cache_load(
        &self,
        fmt: &RowFormat,
        page: &[u8],
        slot: usize,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        self.inner.cache_load(fmt, page, slot, out)
    }

    fn round_index_rows(&self, dtype: IndexKDtype, x: &mut [f32], dim: usize) {
        self.inner.round_index_rows(dtype, x, dim)
    }

    fn device(&self) -> Option<&dyn DeviceOps> {
        Some(&self.dev)
    }
}

//! [`PerRow`]: a backend's single-row ops with the trait's default batched forms — the
//! row-by-row definitions a backend's batched overrides (`cache_load_rows`,
//! `softmax_pool_rows`, `sparse_attention_rows`, `indexer_scores_rows`, `topk_rows`,
//! `indexer_topk_rows`, `paged_indexer_topk_rows`, `paged_attention_rows`) must equal. Tests
//! compare the two.

use crate::{Backend, HcParams, Linear, MhcPre, RopeTable, RowFormat};
use dsv4_core::IndexKDtype;
use dsv4_core::cache::CacheLayoutError;

/// `self.0`'s single-row ops, with every batched op left to the trait's per-row loop.
pub struct PerRow<'a>(pub &'a dyn Backend);

impl Backend for PerRow<'_> {
    fn name(&self) -> &'static str {
        "per-row"
    }
    fn linear(&self, w: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
        self.0.linear(w, x, rows, out)
    }
    fn act_quant_fp8(&self, x: &mut [f32], dim: usize) {
        self.0.act_quant_fp8(x, dim)
    }
    fn rms_norm(&self, x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
        self.0.rms_norm(x, weight, dim, eps, out)
    }
    fn rope(&self, x: &mut [f32], dim: usize, pos: &[usize], t: &RopeTable, inverse: bool) {
        self.0.rope(x, dim, pos, t, inverse)
    }
    fn mhc_pre(&self, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
        self.0.mhc_pre(p, x, t)
    }
    fn mhc_post(&self, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
        self.0.mhc_post(x, y, pre, m, d, out)
    }
    fn hc_head(&self, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
        self.0.hc_head(p, x, t, out)
    }
    fn softmax_pool(&self, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
        self.0.softmax_pool(a, z, rows, width, out)
    }
    fn hadamard(&self, x: &mut [f32], dim: usize) {
        self.0.hadamard(x, dim)
    }
    fn indexer_scores(&self, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
        self.0.indexer_scores(q, w, dim, keys, out)
    }
    fn topk(&self, scores: &[f32], k: usize) -> Vec<usize> {
        self.0.topk(scores, k)
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
        self.0.sparse_attention(q, dim, keys, sink, scale, out)
    }
    fn router_scores(&self, logits: &[f32], out: &mut [f32]) {
        self.0.router_scores(logits, out)
    }
    fn swiglu(&self, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
        self.0.swiglu(g, u, limit, weight, out)
    }
    fn cache_store(
        &self,
        fmt: &RowFormat,
        page: &mut [u8],
        slot: usize,
        values: &[f32],
    ) -> Result<(), CacheLayoutError> {
        self.0.cache_store(fmt, page, slot, values)
    }
    fn cache_load(
        &self,
        fmt: &RowFormat,
        page: &[u8],
        slot: usize,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        self.0.cache_load(fmt, page, slot, out)
    }
    fn round_index_rows(&self, dtype: IndexKDtype, x: &mut [f32], dim: usize) {
        self.0.round_index_rows(dtype, x, dim)
    }
}

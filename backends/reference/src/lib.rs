//! dsv4-backend-reference: the oracle. Plain loops, f64 accumulation of every dot product and
//! sum, f32 activations, no rounding except where spec §5 asks. Slow on purpose; every other
//! backend is diffed against it.

mod mhc;
mod ops;

use dsv4_core::IndexKDtype;
use dsv4_core::cache::round_index_vector;
use dsv4_kernels::registry::{BackendFactory, BackendOptions};
use dsv4_kernels::{Backend, HcParams, KernelError, Linear, MhcPre, RopeTable};
use std::sync::Arc;

/// The reference backend (stateless).
#[derive(Debug, Default, Clone, Copy)]
pub struct ReferenceBackend;

/// Registry name of this backend.
pub const NAME: &str = "reference";

fn create(_opts: &BackendOptions) -> Result<Arc<dyn Backend>, KernelError> {
    Ok(Arc::new(ReferenceBackend))
}

inventory::submit! {
    BackendFactory {
        name: NAME,
        summary: "plain loops with f64 accumulation: the oracle every backend is diffed against",
        probe: || Ok(()),
        create,
    }
}

/// Call from a binary or test so the linker keeps this crate's registry entry.
pub fn link() {}

impl Backend for ReferenceBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn linear(&self, w: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
        ops::linear(w, x, rows, out)
    }

    fn act_quant_fp8(&self, x: &mut [f32], dim: usize) {
        ops::act_quant_fp8(x, dim)
    }

    fn rms_norm(&self, x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
        ops::rms_norm(x, weight, dim, eps, out)
    }

    fn rope(
        &self,
        x: &mut [f32],
        dim: usize,
        positions: &[usize],
        table: &RopeTable,
        inverse: bool,
    ) {
        ops::rope(x, dim, positions, table, inverse)
    }

    fn mhc_pre(&self, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
        mhc::pre(p, x, t)
    }

    fn mhc_post(&self, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
        mhc::post(x, y, pre, m, d, out)
    }

    fn hc_head(&self, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
        mhc::head(p, x, t, out)
    }

    fn softmax_pool(&self, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
        ops::softmax_pool(a, z, rows, width, out)
    }

    fn hadamard(&self, x: &mut [f32], dim: usize) {
        ops::hadamard(x, dim)
    }

    fn indexer_scores(&self, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
        ops::indexer_scores(q, w, dim, keys, out)
    }

    fn topk(&self, scores: &[f32], k: usize) -> Vec<usize> {
        ops::topk(scores, k)
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
        ops::sparse_attention(q, dim, keys, sink, scale, out)
    }

    fn router_scores(&self, logits: &[f32], out: &mut [f32]) {
        ops::router_scores(logits, out)
    }

    fn swiglu(&self, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
        ops::swiglu(g, u, limit, weight, out)
    }

    fn round_index_rows(&self, dtype: IndexKDtype, x: &mut [f32], dim: usize) {
        for row in x.chunks_mut(dim) {
            let r = round_index_vector(dtype, row);
            row.copy_from_slice(&r);
        }
    }
}

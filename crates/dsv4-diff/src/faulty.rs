//! Deliberately wrong backends that show the diff catches and names what they break. They wrap
//! the reference backend and perturb exactly one op. Compiled for this crate's tests and behind
//! the `faulty-backend` feature, which also registers [`FAULTY_NAME`] (rms_norm off by 1%).

use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::IndexKDtype;
use dsv4_core::cache::CacheLayoutError;
use dsv4_kernels::registry::{BackendFactory, BackendOptions};
use dsv4_kernels::{Backend, HcParams, KernelError, Linear, MhcPre, RopeTable, RowFormat};
use std::sync::Arc;

/// Registry name of the faulty backend (rms_norm off by 1%).
pub const FAULTY_NAME: &str = "faulty-reference";

/// The relative error [`Fault::RmsNormScale`] puts on every rms_norm output.
pub const RMS_NORM_ERROR: f32 = 1e-2;

/// What a [`FaultyBackend`] gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// rms_norm outputs are multiplied by 1 + [`RMS_NORM_ERROR`].
    RmsNormScale,
    /// rms_norm leaves the last output element unwritten.
    RmsNormSkipLast,
    /// hadamard panics with an "unsupported" message.
    HadamardUnsupported,
    /// The indexer's top-k (`indexer_topk_rows`) swaps its best entry for the worst one it
    /// left out, whenever it has a choice (MoE routing's top-k stays right).
    IndexerWorstForBest,
    /// `topk_rows` (the router's biased top-k) swaps each row's best expert for the worst one
    /// it left out (the indexer's top-k stays right).
    RouterWorstForBest,
    /// `linear` sums differently (one f32 ulp more, relatively) when it has more than one row:
    /// a kernel whose reduction depends on the batch, so a decode step's bits depend on what
    /// else is in it.
    BatchVariantLinear,
}

/// Swap the best-scoring index of each row's `chosen` for the worst-scoring one it left out.
fn worst_for_best(chosen: &mut [Vec<usize>], scores: &[f32], starts: &[usize]) {
    for (sel, r) in chosen.iter_mut().zip(starts.windows(2)) {
        let s = &scores[r[0]..r[1]];
        let worst_left = (0..s.len())
            .filter(|j| !sel.contains(j))
            .min_by(|a, b| s[*a].total_cmp(&s[*b]));
        let best = sel.iter().copied().max_by(|a, b| s[*a].total_cmp(&s[*b]));
        if let (Some(best), Some(worst)) = (best, worst_left) {
            sel.retain(|&j| j != best);
            sel.push(worst);
            sel.sort_unstable();
        }
    }
}

/// The reference backend with one fault.
#[derive(Debug, Clone, Copy)]
pub struct FaultyBackend {
    fault: Fault,
}

impl FaultyBackend {
    /// A backend with `fault`.
    pub fn new(fault: Fault) -> Self {
        FaultyBackend { fault }
    }
}

fn create(_opts: &BackendOptions) -> Result<Arc<dyn Backend>, KernelError> {
    Ok(Arc::new(FaultyBackend::new(Fault::RmsNormScale)))
}

inventory::submit! {
    BackendFactory {
        name: FAULTY_NAME,
        summary: "test only: the reference backend with rms_norm off by 1%",
        probe: || Ok(()),
        create,
    }
}

/// Call from a binary or test so the linker keeps the faulty backend's registry entry.
pub fn link() {}

const R: ReferenceBackend = ReferenceBackend;

impl Backend for FaultyBackend {
    fn name(&self) -> &'static str {
        FAULTY_NAME
    }

    fn linear(&self, w: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
        R.linear(w, x, rows, out);
        if self.fault == Fault::BatchVariantLinear && rows > 1 {
            out.iter_mut().for_each(|v| *v *= 1.0 + f32::EPSILON);
        }
    }

    fn act_quant_fp8(&self, x: &mut [f32], dim: usize) {
        R.act_quant_fp8(x, dim)
    }

    fn rms_norm(&self, x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
        match self.fault {
            Fault::RmsNormScale => {
                R.rms_norm(x, weight, dim, eps, out);
                out.iter_mut().for_each(|v| *v *= 1.0 + RMS_NORM_ERROR);
            }
            Fault::RmsNormSkipLast => {
                let mut full = vec![0f32; out.len()];
                R.rms_norm(x, weight, dim, eps, &mut full);
                let n = out.len().saturating_sub(1);
                out[..n].copy_from_slice(&full[..n]);
            }
            Fault::HadamardUnsupported
            | Fault::IndexerWorstForBest
            | Fault::RouterWorstForBest
            | Fault::BatchVariantLinear => R.rms_norm(x, weight, dim, eps, out),
        }
    }

    fn rope(&self, x: &mut [f32], dim: usize, pos: &[usize], table: &RopeTable, inverse: bool) {
        R.rope(x, dim, pos, table, inverse)
    }

    fn mhc_pre(&self, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
        R.mhc_pre(p, x, t)
    }

    fn mhc_post(&self, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
        R.mhc_post(x, y, pre, m, d, out)
    }

    fn hc_head(&self, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
        R.hc_head(p, x, t, out)
    }

    fn softmax_pool(&self, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
        R.softmax_pool(a, z, rows, width, out)
    }

    fn hadamard(&self, x: &mut [f32], dim: usize) {
        if self.fault == Fault::HadamardUnsupported {
            panic!("unsupported: {FAULTY_NAME} has no hadamard kernel");
        }
        R.hadamard(x, dim)
    }

    fn indexer_scores(&self, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
        R.indexer_scores(q, w, dim, keys, out)
    }

    fn topk(&self, scores: &[f32], k: usize) -> Vec<usize> {
        R.topk(scores, k)
    }

    fn topk_rows(&self, scores: &[f32], starts: &[usize], k: usize) -> Vec<Vec<usize>> {
        let mut chosen = R.topk_rows(scores, starts, k);
        if self.fault == Fault::RouterWorstForBest {
            worst_for_best(&mut chosen, scores, starts);
        }
        chosen
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
        let mut scores = vec![0f32; key_starts.last().copied().unwrap_or(0)];
        R.indexer_scores_rows(q, w, dim, keys, key_starts, &mut scores);
        let mut chosen = R.topk_rows(&scores, key_starts, k);
        if self.fault == Fault::IndexerWorstForBest {
            worst_for_best(&mut chosen, &scores, key_starts);
        }
        chosen
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
        R.sparse_attention(q, dim, keys, sink, scale, out)
    }

    fn router_scores(&self, logits: &[f32], out: &mut [f32]) {
        R.router_scores(logits, out)
    }

    fn swiglu(&self, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
        R.swiglu(g, u, limit, weight, out)
    }

    fn cache_store(
        &self,
        fmt: &RowFormat,
        page: &mut [u8],
        slot: usize,
        values: &[f32],
    ) -> Result<(), CacheLayoutError> {
        R.cache_store(fmt, page, slot, values)
    }

    fn cache_load(
        &self,
        fmt: &RowFormat,
        page: &[u8],
        slot: usize,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        R.cache_load(fmt, page, slot, out)
    }

    fn round_index_rows(&self, dtype: IndexKDtype, x: &mut [f32], dim: usize) {
        R.round_index_rows(dtype, x, dim)
    }
}

//! dsv4-backend-cpu: the fast CPU backend (`cpu` in the registry). A rayon pool owned by the
//! backend (the calling thread works too), AVX-512 / AVX2+FMA kernels with a portable twin,
//! weights decoded on the fly (expert weights stay packed), f64 accumulation like the reference.
//!
//! # Batch invariance by construction
//! Every output element is reduced in one fixed order that does not depend on the number of rows
//! in the call, the thread count, the kernel set, or where the element lands in a tile:
//! - `linear` and the mHC mixing logits: the input dimension is cut into blocks of 256; within a
//!   block, lane l of 8 takes the elements i ≡ l (mod 8) in ascending order as f64 fused
//!   multiply-adds from +0.0 (f32×f32 products are exact in f64); lanes combine as
//!   ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)); blocks add in order in f64; one final rounding;
//! - attention logits and indexer scores: the same 8-lane rule over the whole row;
//! - the attention's weighted sum of keys: sequential over the keys, fused f64 steps;
//! - every other reduction (RMSNorm, softmax sums, pooling, stream sums, Sinkhorn) runs inside
//!   one row/token/column in a fixed sequence, in f64 where the reference uses f64;
//! - threads only ever split independent outputs (rows, output columns, heads, keys); nothing
//!   splits a reduction. All kernel sets use only exactly rounded operations in the same
//!   per-element order, so they agree bitwise too.
//!
//! Because sums are exact-product f64 sums rounded once, results equal the reference backend's
//! f32 values except where two f64 sums round differently (rare), so quantization points
//! downstream (bf16/fp8 caches, e4m3 activations, top-k) make the same choices.
//!
//! [`Sums::F32`] (`backend.cpu_sums = "f32"`) runs `linear` in the same order with f32
//! multiply-adds and adds: still batch-invariant and the same bits on every kernel set, up to
//! twice as fast, but within f32 rounding of the reference rather than on its bits. The mHC
//! logits and the attention stay in f64.

mod attention;
mod dots;
mod exec;
mod gemm;
mod math;
mod mhc;
mod ops;

pub use exec::Isa;
pub use gemm::Sums;

use dsv4_core::IndexKDtype;
use dsv4_core::cache::round_index_vector;
use dsv4_kernels::registry::{BackendFactory, BackendOptions};
use dsv4_kernels::{Backend, HcParams, KernelError, Linear, MhcPre, RopeTable};
use exec::Exec;
use std::sync::Arc;

/// Registry name of this backend.
pub const NAME: &str = "cpu";

/// The cpu backend: its own thread pool and kernel set.
pub struct CpuBackend {
    ex: Exec,
    sums: Sums,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("threads", &self.ex.threads())
            .field("isa", &self.ex.isa)
            .field("sums", &self.sums)
            .finish()
    }
}

impl CpuBackend {
    /// A backend with `threads` workers (0 = one per core) and the best kernels for this CPU.
    pub fn new(threads: usize) -> Result<Self, KernelError> {
        Self::with_isa(threads, Isa::detect())
    }

    /// A backend using the given kernel set, or the best this CPU has when it lacks that one.
    /// Results are bitwise identical whichever runs (for tests and diffs).
    pub fn with_isa(threads: usize, isa: Isa) -> Result<Self, KernelError> {
        let isa = isa.min(Isa::detect());
        let ex = Exec::new(threads, isa).map_err(|e| KernelError::Unavailable {
            name: NAME.to_string(),
            reason: format!("cannot start a thread pool: {e}"),
        })?;
        Ok(Self {
            ex,
            sums: Sums::F64,
        })
    }

    /// The same backend with linear layers summed as `sums` says (f64 by default).
    pub fn with_sums(self, sums: Sums) -> Self {
        Self { sums, ..self }
    }

    /// What the linear layers are summed in.
    pub fn sums(&self) -> Sums {
        self.sums
    }

    /// Worker threads in the pool.
    pub fn threads(&self) -> usize {
        self.ex.threads()
    }

    /// The kernel set in use.
    pub fn isa(&self) -> Isa {
        self.ex.isa
    }
}

fn create(opts: &BackendOptions) -> Result<Arc<dyn Backend>, KernelError> {
    let sums = if opts.cpu_f32_sums {
        Sums::F32
    } else {
        Sums::F64
    };
    Ok(Arc::new(CpuBackend::new(opts.threads)?.with_sums(sums)))
}

inventory::submit! {
    BackendFactory {
        name: NAME,
        summary: "threads + SIMD (AVX2/FMA or portable), weights decoded on the fly, batch-invariant",
        probe: || Ok(()),
        create,
    }
}

/// Call from a binary or test so the linker keeps this crate's registry entry.
pub fn link() {}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn linear(&self, w: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
        assert_eq!(
            x.len(),
            rows * w.in_dim,
            "linear {}: input is not [rows, in]",
            w.name
        );
        assert_eq!(
            out.len(),
            rows * w.out_dim,
            "linear {}: output is not [rows, out]",
            w.name
        );
        gemm::gemm(
            &self.ex,
            self.sums,
            &gemm::Weights::of_linear(w),
            x,
            rows,
            out,
        );
    }

    fn act_quant_fp8(&self, x: &mut [f32], dim: usize) {
        ops::act_quant_fp8(&self.ex, x, dim)
    }

    fn rms_norm(&self, x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
        ops::rms_norm(&self.ex, x, weight, dim, eps, out)
    }

    fn rope(
        &self,
        x: &mut [f32],
        dim: usize,
        positions: &[usize],
        table: &RopeTable,
        inverse: bool,
    ) {
        ops::rope(&self.ex, x, dim, positions, table, inverse)
    }

    fn mhc_pre(&self, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
        mhc::pre(&self.ex, p, x, t)
    }

    fn mhc_post(&self, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
        mhc::post(&self.ex, x, y, pre, m, d, out)
    }

    fn hc_head(&self, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
        mhc::head(&self.ex, p, x, t, out)
    }

    fn softmax_pool(&self, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
        ops::softmax_pool(&self.ex, a, z, rows, width, out)
    }

    fn hadamard(&self, x: &mut [f32], dim: usize) {
        ops::hadamard(&self.ex, x, dim)
    }

    fn indexer_scores(&self, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
        attention::indexer_scores(&self.ex, q, w, dim, keys, out)
    }

    /// Each query's range scored where it lies in `keys` and ranked: what the default's
    /// `indexer_topk_rows` over the ranges laid out computes, without the copies.
    fn indexer_topk_ranges(
        &self,
        q: &[f32],
        w: &[f32],
        dim: usize,
        keys: &[f32],
        key_ranges: &[(usize, usize)],
        k: usize,
    ) -> Vec<Vec<usize>> {
        let heads = w.len() / key_ranges.len().max(1);
        let n = keys.len() / dim.max(1);
        let rows = key_ranges.len();
        let mut picked = vec![Vec::new(); rows];
        let work_per_row = key_ranges
            .iter()
            .map(|&(lo, hi)| hi.saturating_sub(lo))
            .sum::<usize>()
            / rows.max(1)
            * heads
            * dim;
        // Each row's scores and top-k.
        self.ex
            .rows_or_within(&mut picked, 1, work_per_row, |ex, first, slots| {
                let mut scores = Vec::new();
                for (i, slot) in slots.iter_mut().enumerate() {
                    let (r, (lo, hi)) = (first + i, key_ranges[first + i]);
                    assert!(
                        lo <= hi && hi <= n,
                        "key range {r} is {lo}..{hi} of {n} rows"
                    );
                    scores.clear();
                    scores.resize(hi - lo, 0f32);
                    let (qr, wr) = (
                        &q[r * heads * dim..(r + 1) * heads * dim],
                        &w[r * heads..(r + 1) * heads],
                    );
                    let kr = &keys[lo * dim..hi * dim];
                    attention::indexer_scores(ex, qr, wr, dim, kr, &mut scores);
                    *slot = attention::topk(&scores, k);
                }
            });
        picked
    }

    fn topk(&self, scores: &[f32], k: usize) -> Vec<usize> {
        attention::topk(scores, k)
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
        attention::sparse_attention(&self.ex, q, dim, keys, sink, scale, out)
    }

    /// Each query's keys gathered into one buffer reused from query to query (a prefill
    /// chunk's window, decoded once, stays in cache), then the query's [`Self::sparse_attention`]:
    /// what the default's `sparse_attention_rows` computes, without laying out every query's
    /// keys first. With at least as many queries as threads each thread takes whole queries
    /// (gather included); with fewer, each query's heads are split over the threads.
    fn sparse_attention_indexed(
        &self,
        q: &[f32],
        dim: usize,
        keys: &[f32],
        key_ids: &[usize],
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = sink.len() * dim;
        let rows = key_starts.len().saturating_sub(1);
        if hd == 0 || rows == 0 {
            return;
        }
        // Queries first..first + out.len()/hd on `ex`.
        let attend = |ex: &Exec, first: usize, out: &mut [f32]| {
            let mut laid = Vec::new();
            for (i, o) in out.chunks_mut(hd).enumerate() {
                let r = first + i;
                let ids = &key_ids[key_starts[r]..key_starts[r + 1]];
                laid.clear();
                dsv4_kernels::operands::extend_rows_by_id(&mut laid, keys, dim, ids);
                let qr = &q[r * hd..(r + 1) * hd];
                attention::sparse_attention(ex, qr, dim, &laid, sink, scale, o);
            }
        };
        let work_per_row = 2 * hd * (key_ids.len() / rows).max(1);
        self.ex
            .rows_or_within(&mut out[..rows * hd], hd, work_per_row, attend);
    }

    fn router_scores(&self, logits: &[f32], out: &mut [f32]) {
        ops::router_scores(logits, out)
    }

    fn swiglu(&self, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
        ops::swiglu(self.ex.isa, g, u, limit, weight, out)
    }

    fn round_index_rows(&self, dtype: IndexKDtype, x: &mut [f32], dim: usize) {
        if dim == 0 {
            return;
        }
        self.ex.rows_mut(x, dim, dim * 16, |_, rows| {
            for row in rows.chunks_mut(dim) {
                let r = round_index_vector(dtype, row);
                row.copy_from_slice(&r);
            }
        });
    }
}

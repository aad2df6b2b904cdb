//! The batch-invariant matrix product `out[r, o] = Σ_i W[o, i]·x[r, i]` behind `linear`, the
//! attention and indexer products and the mHC mixing logits.
//!
//! Reduction order (the same for every path, row count, thread count and tile): the input
//! dimension is cut into blocks of [`KB`] = 128 (the last one may be shorter). Within a block,
//! each output element accumulates `acc = fma(W[o, i], x[r, i], acc)` for i ascending, starting
//! from +0.0. The block partials are then added in block order: `out = p₀`, `out = out + p₁`, ….
//! Work is split only over rows and output columns, never over the input dimension.
//!
//! The weight side is decoded on the fly, one panel of [`NR`] = 32 outputs × one K-block at a
//! time, into a 16 KiB stack buffer laid out k-major (`panel[k][j]`); quantized weights are never
//! materialised beyond that panel. The microkernel then runs up to three rows at a time against
//! the panel, vectorised across the 32 outputs, each lane a plain sequential fused chain.

mod kernel;
mod pack;

use crate::exec::{Exec, SharedOut};
use dsv4_kernels::{Linear, WeightFormat};

/// Depth of one reduction block (matches the fp8 weight block and divides by the MXFP4 block).
pub(crate) const KB: usize = 128;
/// Output columns per packed panel.
pub(crate) const NR: usize = 32;
/// Rows per microkernel call.
const MR: usize = 3;
/// Rows an item covers when the row count is large.
const MB: usize = 96;

/// How the weight elements are stored.
#[derive(Debug, Clone, Copy)]
pub(crate) enum View<'a> {
    /// Little-endian f32 bytes, [n, k] (a `Linear` in F32).
    F32Bytes(&'a [u8]),
    /// f32 values, [n, k].
    F32Rows(&'a [f32]),
    /// f32 values stored transposed, [k, n].
    F32Cols(&'a [f32]),
    /// bf16 bytes, [n, k].
    Bf16(&'a [u8]),
    /// e4m3 bytes [n, k] with ue8m0 scales per 128×128 block.
    Fp8 { data: &'a [u8], scale: &'a [u8] },
    /// Packed e2m1 pairs [n, k/2] with ue8m0 scales per 32 along a row.
    Mxfp4 { data: &'a [u8], scale: &'a [u8] },
}

/// A weight matrix W [n, k] as the product reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Weights<'a> {
    /// Storage.
    pub view: View<'a>,
    /// Output features.
    pub n: usize,
    /// Input features (the reduction dimension).
    pub k: usize,
}

impl<'a> Weights<'a> {
    /// The view of a checkpoint linear layer.
    pub fn of_linear(w: &'a Linear) -> Self {
        let view = match w.format {
            WeightFormat::F32 => View::F32Bytes(&w.data),
            WeightFormat::Bf16 => View::Bf16(&w.data),
            WeightFormat::Fp8Block => View::Fp8 {
                data: &w.data,
                scale: &w.scale,
            },
            WeightFormat::Mxfp4 => View::Mxfp4 {
                data: &w.data,
                scale: &w.scale,
            },
        };
        Self {
            view,
            n: w.out_dim,
            k: w.in_dim,
        }
    }

    /// f32 rows [n, k].
    pub fn rows(data: &'a [f32], n: usize, k: usize) -> Self {
        debug_assert_eq!(data.len(), n * k);
        Self {
            view: View::F32Rows(data),
            n,
            k,
        }
    }

    /// The transpose of f32 rows `data` [k, n], read as W [n, k].
    pub fn cols(data: &'a [f32], n: usize, k: usize) -> Self {
        debug_assert_eq!(data.len(), n * k);
        Self {
            view: View::F32Cols(data),
            n,
            k,
        }
    }
}

/// out [m, n] = x [m, k] · Wᵀ in the fixed reduction order of this module.
pub(crate) fn gemm(ex: &Exec, w: &Weights<'_>, x: &[f32], m: usize, out: &mut [f32]) {
    let (n, k) = (w.n, w.k);
    assert_eq!(x.len(), m * k, "gemm: input is not [rows, in]");
    assert_eq!(out.len(), m * n, "gemm: output is not [rows, out]");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let panels = n.div_ceil(NR);
    let mb = if m <= MB + MB / 2 { m } else { MB };
    let m_blocks = m.div_ceil(mb);
    let want = ex.threads() * 4;
    let per_item = (panels * m_blocks).div_ceil(want).clamp(1, 16).min(panels);
    let n_items = panels.div_ceil(per_item);
    let dst = SharedOut(out.as_mut_ptr());
    ex.for_each(m_blocks * n_items, m * n * k, |item| {
        let (mi, ni) = (item / n_items, item % n_items);
        let rows = mi * mb..(m.min((mi + 1) * mb));
        let cols = ni * per_item..panels.min((ni + 1) * per_item);
        // SAFETY: items cover disjoint (row block, panel range) rectangles of `out`, which is
        // borrowed mutably for the whole parallel section.
        unsafe { run_item(ex, w, x, rows, cols, dst) };
    });
}

/// The 32-column panel buffer (k-major), aligned for vector loads.
#[repr(C, align(64))]
pub(crate) struct Panel(pub [f32; KB * NR]);

/// One item: rows `rows` × panels `cols`.
///
/// # Safety
/// `dst` points to the [m, n] output and no other thread touches this item's rectangle.
unsafe fn run_item(
    ex: &Exec,
    w: &Weights<'_>,
    x: &[f32],
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    dst: SharedOut,
) {
    let (n, k) = (w.n, w.k);
    let mut panel = Panel([0.0; KB * NR]);
    let block = |p: usize, k0: usize, panel: &mut Panel| {
        let kb = KB.min(k - k0);
        pack::pack(ex.isa, w, p * NR, k0, kb, panel);
        let nv = NR.min(n - p * NR);
        let mut r = rows.start;
        while r < rows.end {
            let mr = MR.min(rows.end - r);
            let xr = &x[r * k + k0..];
            // SAFETY: rows r..r+mr and columns p·NR..p·NR+nv are inside this item's rectangle.
            unsafe {
                kernel::block(
                    ex.isa,
                    mr,
                    panel,
                    kb,
                    xr,
                    k,
                    dst.get().add(r * n + p * NR),
                    n,
                    nv,
                    k0 == 0,
                );
            }
            r += mr;
        }
    };
    if rows.len() <= 4 * MR {
        // Few rows: walk each panel's rows of W front to back (fewer concurrent streams).
        for p in cols {
            for k0 in (0..k).step_by(KB) {
                block(p, k0, &mut panel);
            }
        }
    } else {
        // Many rows: keep the item's K-block of x hot while the panels go by.
        for k0 in (0..k).step_by(KB) {
            for p in cols.clone() {
                block(p, k0, &mut panel);
            }
        }
    }
}

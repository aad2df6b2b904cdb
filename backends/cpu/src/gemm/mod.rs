//! The batch-invariant matrix product `out[r, o] = Σ_i W[o, i]·x[r, i]` behind `linear` and the
//! mHC mixing logits.
//!
//! Reduction order (the same for every kernel set, row count, thread count and tile): the input
//! dimension is cut into blocks of [`KB`] = 256 (the last may be shorter). Within a block, lane
//! l of 8 accumulates the elements i ≡ l (mod 8) in ascending order as f64 fused multiply-adds
//! from +0.0 (the f32×f32 products are exact in f64); the lanes are combined as
//! ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)); the block values are added in block order in f64; the
//! sum is rounded to f32 once. Work is split only over rows and output columns, never over the
//! input dimension. With f64 accumulation the result is, but for rare ties, the f32 rounding of
//! the reference backend's f64 dot product.
//!
//! The weight side is decoded on the fly, [`NB`] = 8 output rows × one K-block at a time: for
//! one or two rows of x (decode) straight into the multiply-adds on AVX2 and AVX-512,
//! otherwise into a small f64 panel that every row of the item reuses. Quantized weights are
//! never materialised beyond that panel.

#[cfg(target_arch = "x86_64")]
mod decode;
mod kernel;
mod pack;

use crate::exec::{Exec, Isa, SharedOut};
use dsv4_kernels::linear::{FP8_BLOCK, MXFP4_BLOCK};
use dsv4_kernels::{Linear, WeightFormat};
use std::cell::RefCell;

/// Depth of one reduction block (two fp8 weight blocks; a multiple of the MXFP4 block).
pub(crate) const KB: usize = 256;
/// Output rows per decoded panel.
pub(crate) const NB: usize = 8;
/// Rows of x an item covers when the row count is large.
const MB: usize = 192;
/// Item rows up to which each panel's blocks run back to back (the GEMV order).
const FEW_ROWS: usize = 12;

/// How the weight elements are stored.
#[derive(Debug, Clone, Copy)]
pub(crate) enum View<'a> {
    /// Little-endian f32 bytes, [n, k] (a `Linear` in F32).
    F32Bytes(&'a [u8]),
    /// f32 values, [n, k].
    F32Rows(&'a [f32]),
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
}

/// A decoded weight panel: NB rows of one K-block, f64, zero past the block's end.
#[repr(C, align(64))]
pub(crate) struct Panel(pub [f64; NB * KB]);

/// 64 bytes of f64: the unit of [`Scratch::x`], so each widened row starts on a cache line and
/// no 32-byte load of it splits one.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f64; 8]);

/// Per-thread scratch: the panel, the item's f64 running sums, and the item's rows of x
/// widened to f64.
struct Scratch {
    panel: Box<Panel>,
    acc: Vec<f64>,
    x: Vec<Line>,
}

/// `rows` rows of `x` (stride k), columns k0..k0 + kb, widened into `buf` as rows of stride ld
/// (a multiple of 8, ≥ kb) with zeros past kb; the widened values as one slice.
#[allow(clippy::too_many_arguments)]
fn widen_rows<'b>(
    isa: Isa,
    x: &[f32],
    k: usize,
    rows: &std::ops::Range<usize>,
    k0: usize,
    kb: usize,
    ld: usize,
    buf: &'b mut Vec<Line>,
) -> &'b [f64] {
    debug_assert!(ld.is_multiple_of(8) && kb <= ld && k0 + kb <= k);
    // Every value is written below (zeros past kb included), so old contents may stay.
    buf.resize(rows.len() * ld / 8, Line([0.0; 8]));
    // SAFETY: a Line is 8 f64 with no padding (repr(C), size 64), so the buffer is
    // rows·ld f64 values.
    let xs =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<f64>(), rows.len() * ld) };
    for (i, r) in rows.clone().enumerate() {
        let from = &x[r * k + k0..r * k + k0 + kb];
        kernel::widen(isa, from, &mut xs[i * ld..(i + 1) * ld]);
    }
    xs
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        panel: Box::new(Panel([0.0; NB * KB])),
        acc: Vec::new(),
        x: Vec::new(),
    });
}

/// Where an item's finished f64 sums go.
#[derive(Clone, Copy)]
enum Dst {
    /// Rounded to f32.
    F32(SharedOut),
    /// Kept in f64.
    F64(SharedOut64),
}

/// A raw f64 output pointer shared by items that write disjoint elements.
#[derive(Clone, Copy)]
struct SharedOut64(*mut f64);

// SAFETY: items write disjoint elements of a buffer borrowed mutably for the whole call.
unsafe impl Send for SharedOut64 {}
// SAFETY: as above.
unsafe impl Sync for SharedOut64 {}

/// out [m, n] = x [m, k] · Wᵀ in the fixed reduction order of this module, rounded to f32.
pub(crate) fn gemm(ex: &Exec, w: &Weights<'_>, x: &[f32], m: usize, out: &mut [f32]) {
    assert_eq!(out.len(), m * w.n, "gemm: output is not [rows, out]");
    if w.k == 0 {
        out.fill(0.0);
    }
    run(ex, w, x, m, Dst::F32(SharedOut(out.as_mut_ptr())));
}

/// [`gemm`] with the f64 sums kept unrounded (for mHC's logits, which the reference keeps in f64).
pub(crate) fn gemm_f64(ex: &Exec, w: &Weights<'_>, x: &[f32], m: usize, out: &mut [f64]) {
    assert_eq!(out.len(), m * w.n, "gemm: output is not [rows, out]");
    if w.k == 0 {
        out.fill(0.0);
    }
    run(ex, w, x, m, Dst::F64(SharedOut64(out.as_mut_ptr())));
}

/// The parallel product into `dst` ([m, n], checked by the callers).
fn run(ex: &Exec, w: &Weights<'_>, x: &[f32], m: usize, dst: Dst) {
    let (n, k) = (w.n, w.k);
    assert_eq!(x.len(), m * k, "gemm: input is not [rows, in]");
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let panels = n.div_ceil(NB);
    let mb = if m <= MB + MB / 2 { m } else { MB };
    let m_blocks = m.div_ceil(mb);
    let want = ex.threads() * 4;
    // Bound the item's f64 sums to ~256 KiB.
    let max_panels = (32 * 1024 / (mb * NB)).max(1);
    let per_item = (panels * m_blocks)
        .div_ceil(want)
        .clamp(1, max_panels)
        .min(panels);
    let n_items = panels.div_ceil(per_item);
    ex.for_each(m_blocks * n_items, m * n * k, |item| {
        let (mi, ni) = (item / n_items, item % n_items);
        let rows = mi * mb..m.min((mi + 1) * mb);
        let cols = ni * per_item..panels.min((ni + 1) * per_item);
        // SAFETY: items cover disjoint (row block, panel range) rectangles of `out`, which is
        // borrowed mutably for the whole parallel section.
        SCRATCH.with_borrow_mut(|s| unsafe { run_item(ex, w, x, rows, cols, dst, s) });
    });
}

/// One item: rows `rows` × panels `cols`, accumulated in f64 and rounded into `dst` at the end.
///
/// # Safety
/// `dst` points to the [m, n] output and no other thread touches this item's rectangle.
unsafe fn run_item(
    ex: &Exec,
    w: &Weights<'_>,
    x: &[f32],
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    dst: Dst,
    s: &mut Scratch,
) {
    let (n, k) = (w.n, w.k);
    let width = cols.len() * NB;
    s.acc.clear();
    s.acc.resize(rows.len() * width, 0.0);
    let Scratch {
        panel,
        acc,
        x: xbuf,
    } = s;
    // One or two rows: decode and multiply in one pass where the kernel set allows it.
    let fuse = rows.len() <= kernel::FUSED_ROWS && kernel::can_fuse(ex.isa);
    // The block at (panel p, k0) against x64, the widened rows from column k0 on (stride ldx).
    let mut block = |p: usize, k0: usize, x64: &[f64], ldx: usize| {
        let kb = KB.min(k - k0);
        let nv = NB.min(n - p * NB);
        let col = (p - cols.start) * NB;
        let tile = &mut acc[col..];
        let r = rows.len();
        if fuse && kernel::fused(ex.isa, w, p * NB, k0, kb, x64, ldx, r, tile, width, nv) {
            return;
        }
        pack::pack(ex.isa, w, p * NB, k0, kb, panel);
        kernel::block(ex.isa, r, panel, kb, x64, ldx, tile, width, nv, k0 == 0);
    };
    if rows.len() <= FEW_ROWS {
        // Few rows: widen them whole once, then walk each panel's rows of W front to back.
        let ldx = k.div_ceil(KB) * KB;
        let x64 = widen_rows(ex.isa, x, k, &rows, 0, k, ldx, xbuf);
        for p in cols.clone() {
            for k0 in (0..k).step_by(KB) {
                block(p, k0, &x64[k0..], ldx);
            }
        }
    } else {
        // Many rows: widen the item's K-block of x and keep it hot while the panels go by.
        for k0 in (0..k).step_by(KB) {
            let x64 = widen_rows(ex.isa, x, k, &rows, k0, KB.min(k - k0), KB, xbuf);
            for p in cols.clone() {
                block(p, k0, x64, KB);
            }
        }
    }
    for (i, r) in rows.enumerate() {
        for p in cols.clone() {
            let nv = NB.min(n - p * NB);
            let col = (p - cols.start) * NB;
            for j in 0..nv {
                let (at, v) = (r * n + p * NB + j, acc[i * width + col + j]);
                // SAFETY: (r, p·NB + j) is inside this item's rectangle of the [m, n] output.
                unsafe {
                    match dst {
                        Dst::F32(d) => *d.get().add(at) = v as f32,
                        Dst::F64(d) => *d.0.add(at) = v,
                    }
                }
            }
        }
    }
}

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
//! [`Sums::F32`] keeps the same order with every multiply-add and add in f32 ([`kernel32`]): eight
//! lanes fill one 256-bit vector instead of two, and x needs no widening, so the products run
//! up to twice as fast, within f32 rounding of the reference instead of on its bits.
//!
//! The weight side is decoded on the fly, [`NB`] = 8 output rows × one K-block at a time: for
//! one or two rows of x (decode) straight into the multiply-adds on AVX2 and AVX-512,
//! otherwise into a small panel of the sum type that every row of the item reuses. Quantized
//! weights are never materialised beyond that panel.

#[cfg(target_arch = "x86_64")]
mod decode;
mod kernel;
mod kernel32;
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

/// Stored bytes of a weight row up to which the GEMV prefetches the next panel itself.
const SHORT_ROW: usize = 4096;

/// What a linear layer's products are summed in (`backend.cpu_sums`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sums {
    /// f64 sums of the exact f32 products: the reference's bits but for rare ties.
    #[default]
    F64,
    /// f32 multiply-adds in the same order: within f32 rounding of the reference, faster.
    F32,
}

impl Sums {
    /// The profile spelling: "f64" or "f32".
    pub fn name(self) -> &'static str {
        match self {
            Sums::F64 => "f64",
            Sums::F32 => "f32",
        }
    }
}

/// How the weight elements are stored.
#[derive(Debug, Clone, Copy)]
pub(crate) enum View<'a> {
    /// Little-endian f32 bytes, [n, k] (a `Linear` in F32).
    F32Bytes(&'a [u8]),
    /// f32 values, [n, k].
    F32Rows(&'a [f32]),
    /// bf16 bytes, [n, k].
    Bf16(&'a [u8]),
    /// e4m3 bytes [n, k] with ue8m0 scales per 128×128 block, and which of those blocks
    /// hold NaN codes ([`Linear::fp8_nan_blocks`]).
    Fp8 {
        data: &'a [u8],
        scale: &'a [u8],
        nan: &'a [bool],
    },
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
                nan: w.fp8_nan_blocks(),
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

    /// Stored bytes of one row of W (elements only).
    pub fn row_bytes(&self) -> usize {
        match self.view {
            View::F32Bytes(_) | View::F32Rows(_) => self.k * 4,
            View::Bf16(_) => self.k * 2,
            View::Fp8 { .. } => self.k,
            View::Mxfp4 { .. } => self.k / 2,
        }
    }

    /// Ask for the stored bytes (and MXFP4 scales) of rows n0..n0 + NB (clipped to n), columns
    /// k0..k0 + kb, to be brought into cache ahead of their use; a hint that reads nothing.
    pub fn prefetch(&self, n0: usize, k0: usize, kb: usize) {
        let k = self.k;
        let f32_bytes = |d: &'a [f32]| {
            // SAFETY: f32 values read as their bytes.
            unsafe { std::slice::from_raw_parts(d.as_ptr().cast::<u8>(), d.len() * 4) }
        };
        let (data, num, den, scale) = match self.view {
            View::F32Bytes(d) => (d, 4, 1, None),
            View::F32Rows(d) => (f32_bytes(d), 4, 1, None),
            View::Bf16(d) => (d, 2, 1, None),
            View::Fp8 { data, .. } => (data, 1, 1, None),
            View::Mxfp4 { data, scale } => (data, 1, 2, Some(scale)),
        };
        for o in n0..self.n.min(n0 + NB) {
            let at = (o * k + k0) * num / den;
            prefetch_lines(&data[at..at + kb * num / den]);
            if let Some(sc) = scale {
                let at = (o * k + k0) / MXFP4_BLOCK;
                prefetch_lines(&sc[at..at + kb / MXFP4_BLOCK]);
            }
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

/// A prefetch hint for every 64-byte line of `bytes`.
#[inline]
fn prefetch_lines(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let p = bytes.as_ptr();
        for off in (0..bytes.len()).step_by(64) {
            // SAFETY: a prefetch hint reads nothing and cannot fault; the address is in `bytes`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// A decoded weight panel: NB rows of one K-block in the sum type, zero past the block's end.
#[repr(C, align(64))]
pub(crate) struct Panel<T>(pub [T; NB * KB]);

/// 64 bytes: the unit of [`Scratch::x`], so each row of x in the sum type starts on a cache line
/// and no 32-byte load of it splits one.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// Per-thread scratch: the panel, the item's running sums, and the item's rows of x in the sum
/// type.
pub(crate) struct Scratch<T> {
    panel: Box<Panel<T>>,
    acc: Vec<T>,
    x: Vec<Line>,
}

impl<T: Acc> Scratch<T> {
    fn new() -> Self {
        Self {
            panel: Box::new(Panel([T::ZERO; NB * KB])),
            acc: Vec::new(),
            x: Vec::new(),
        }
    }
}

/// A type the products are summed in, with its kernels: f64 ([`kernel`]) or f32 ([`kernel32`]).
/// Both follow the module's reduction order, so every kernel set of one type gives the same bits.
pub(crate) trait Acc: Copy + From<f32> + std::ops::Add<Output = Self> + 'static {
    /// +0.0.
    const ZERO: Self;

    /// Run `f` on this thread's scratch for this type.
    fn with_scratch<R>(f: impl FnOnce(&mut Scratch<Self>) -> R) -> R;

    /// `to` = `from` in this type (exact), zero past `from`'s end.
    fn widen(isa: Isa, from: &[f32], to: &mut [Self]);

    /// The block of W at (n0, k0, width kb) times 1..=FUSED_ROWS rows of x (the block's columns
    /// from its start, stride ldx), decoded and multiplied in one pass into acc, with the bits
    /// of [`Acc::block`]; false when the block must go through a panel instead.
    #[allow(clippy::too_many_arguments)]
    fn fused(
        isa: Isa,
        w: &Weights<'_>,
        n0: usize,
        k0: usize,
        kb: usize,
        x: &[Self],
        ldx: usize,
        rows: usize,
        acc: &mut [Self],
        ld: usize,
        nv: usize,
    ) -> bool {
        assert!((1..=kernel::FUSED_ROWS).contains(&rows) && (1..=NB).contains(&nv) && n0 < w.n);
        assert!(
            k0 + kb <= w.k && x.len() >= (rows - 1) * ldx + kb && acc.len() >= (rows - 1) * ld + nv
        );
        if !kernel::can_fuse(isa) || !kb.is_multiple_of(16) {
            return false;
        }
        // SAFETY: the operands were checked just above.
        unsafe { Self::fused_vec(isa, w, n0, k0, kb, x, ldx, rows, acc, ld, nv) }
    }

    /// [`Acc::fused`] on this type's vector kernels, once its operands are checked; false where
    /// this type has none for `isa`.
    ///
    /// # Safety
    /// As checked by [`Acc::fused`]: `isa` can fuse (detected on this CPU), kb is a multiple of
    /// 16, and rows, columns and the acc tile are inside their buffers.
    #[allow(clippy::too_many_arguments)]
    unsafe fn fused_vec(
        isa: Isa,
        w: &Weights<'_>,
        n0: usize,
        k0: usize,
        kb: usize,
        x: &[Self],
        ldx: usize,
        rows: usize,
        acc: &mut [Self],
        ld: usize,
        nv: usize,
    ) -> bool;

    /// acc[r·ld + j] (= when `first`, else +=) the block value of x row r · panel row j, for r <
    /// rows, j < nv; x holds rows of stride ldx with kb (≤ KB) values and zeros up to the next
    /// multiple of 8 (where the panel is zero too).
    #[allow(clippy::too_many_arguments)]
    fn block(
        isa: Isa,
        rows: usize,
        panel: &Panel<Self>,
        kb: usize,
        x: &[Self],
        ldx: usize,
        acc: &mut [Self],
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        let kb8 = kb.div_ceil(8) * 8;
        assert!(rows > 0 && kb <= KB && (1..=NB).contains(&nv));
        assert!(x.len() >= (rows - 1) * ldx + kb8 && acc.len() >= (rows - 1) * ld + nv);
        // SAFETY: the operands were checked just above.
        if !unsafe { Self::block_vec(isa, rows, panel, kb8, x, ldx, acc, ld, nv, first) } {
            portable_block(rows, panel, kb8, x, ldx, acc, ld, nv, first);
        }
    }

    /// [`Acc::block`] on this type's vector kernels for `isa` (kb8: kb rounded up to 8), once its
    /// operands are checked; false where there are none (the portable loop runs instead).
    ///
    /// # Safety
    /// As checked by [`Acc::block`]: the panel and x rows hold kb8 values, acc holds rows rows
    /// of stride ld with nv values; `isa` was detected on this CPU.
    #[allow(clippy::too_many_arguments)]
    unsafe fn block_vec(
        isa: Isa,
        rows: usize,
        panel: &Panel<Self>,
        kb8: usize,
        x: &[Self],
        ldx: usize,
        acc: &mut [Self],
        ld: usize,
        nv: usize,
        first: bool,
    ) -> bool;

    /// self·a + b with one rounding.
    fn mul_add(self, a: Self, b: Self) -> Self;

    /// Write a finished sum to element `at` of `dst`.
    ///
    /// # Safety
    /// `at` is inside the output and no other thread writes it.
    unsafe fn put(self, dst: Dst, at: usize);

    /// Store 8 decoded f32 weights at `to` in this type (the AVX2 panel decoder).
    ///
    /// # Safety
    /// AVX2 is available; `to` is valid for 8 writes.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store8(to: *mut Self, v: std::arch::x86_64::__m256);
}

/// The fixed combination of eight lane partials.
#[inline(always)]
fn tree<T: Acc>(l: &[T; 8]) -> T {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// [`Acc::block`] in plain Rust (any target): the bits of every vector kernel set.
#[allow(clippy::too_many_arguments)]
fn portable_block<T: Acc>(
    rows: usize,
    panel: &Panel<T>,
    kb8: usize,
    x: &[T],
    ldx: usize,
    acc: &mut [T],
    ld: usize,
    nv: usize,
    first: bool,
) {
    for r in 0..rows {
        let xr = &x[r * ldx..r * ldx + kb8];
        for j in 0..nv {
            let wr = &panel.0[j * KB..j * KB + kb8];
            let mut lanes = [T::ZERO; 8];
            for (xc, wc) in xr.chunks_exact(8).zip(wr.chunks_exact(8)) {
                for l in 0..8 {
                    lanes[l] = wc[l].mul_add(xc[l], lanes[l]);
                }
            }
            let v = tree(&lanes);
            let a = &mut acc[r * ld + j];
            *a = if first { v } else { *a + v };
        }
    }
}

/// `rows` rows of `x` (stride k), columns k0..k0 + kb, converted into `buf` as rows of stride ld
/// (≥ kb, a whole number of 64-byte lines) with zeros past kb; the converted values as one slice.
#[allow(clippy::too_many_arguments)]
fn widen_rows<'b, T: Acc>(
    isa: Isa,
    x: &[f32],
    k: usize,
    rows: &std::ops::Range<usize>,
    k0: usize,
    kb: usize,
    ld: usize,
    buf: &'b mut Vec<Line>,
) -> &'b [T] {
    let size = std::mem::size_of::<T>();
    debug_assert!((ld * size).is_multiple_of(64) && kb <= ld && k0 + kb <= k);
    // Every value is written below (zeros past kb included), so old contents may stay.
    buf.resize(rows.len() * ld * size / 64, Line([0; 8]));
    // SAFETY: a Line is 64 bytes with no padding (repr(C)), aligned to 64, and T is f32 or f64
    // (any bits are a value), so the buffer holds rows·ld values of T.
    let xs =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<T>(), rows.len() * ld) };
    for (i, r) in rows.clone().enumerate() {
        let from = &x[r * k + k0..r * k + k0 + kb];
        T::widen(isa, from, &mut xs[i * ld..(i + 1) * ld]);
    }
    xs
}

thread_local! {
    static SCRATCH64: RefCell<Scratch<f64>> = RefCell::new(Scratch::new());
    static SCRATCH32: RefCell<Scratch<f32>> = RefCell::new(Scratch::new());
}

/// Where an item's finished sums go.
#[derive(Clone, Copy)]
pub(crate) enum Dst {
    /// Rounded to f32.
    F32(SharedOut),
    /// Kept in f64.
    F64(SharedOut<f64>),
}

/// out [m, n] = x [m, k] · Wᵀ in the fixed reduction order of this module, summed as `sums` says
/// and rounded to f32.
pub(crate) fn gemm(ex: &Exec, sums: Sums, w: &Weights<'_>, x: &[f32], m: usize, out: &mut [f32]) {
    assert_eq!(out.len(), m * w.n, "gemm: output is not [rows, out]");
    if w.k == 0 {
        out.fill(0.0);
    }
    let dst = Dst::F32(SharedOut(out.as_mut_ptr()));
    match sums {
        Sums::F64 => run::<f64>(ex, w, x, m, dst),
        Sums::F32 => run::<f32>(ex, w, x, m, dst),
    }
}

/// [`gemm`] with f64 sums kept unrounded (for mHC's logits, which the reference keeps in f64).
pub(crate) fn gemm_f64(ex: &Exec, w: &Weights<'_>, x: &[f32], m: usize, out: &mut [f64]) {
    assert_eq!(out.len(), m * w.n, "gemm: output is not [rows, out]");
    if w.k == 0 {
        out.fill(0.0);
    }
    run::<f64>(ex, w, x, m, Dst::F64(SharedOut(out.as_mut_ptr())));
}

/// The parallel product into `dst` ([m, n], checked by the callers).
fn run<T: Acc>(ex: &Exec, w: &Weights<'_>, x: &[f32], m: usize, dst: Dst) {
    let (n, k) = (w.n, w.k);
    assert_eq!(x.len(), m * k, "gemm: input is not [rows, in]");
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let panels = n.div_ceil(NB);
    let mb = if m <= MB + MB / 2 { m } else { MB };
    let m_blocks = m.div_ceil(mb);
    let want = ex.threads() * 4;
    // Bound the item's running sums to 32 Ki values (256 KiB of f64).
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
        T::with_scratch(|s| unsafe { run_item(ex, w, x, rows, cols, dst, s) });
    });
}

/// One item: rows `rows` × panels `cols`, accumulated in T and written into `dst` at the end.
///
/// # Safety
/// `dst` points to the [m, n] output and no other thread touches this item's rectangle.
unsafe fn run_item<T: Acc>(
    ex: &Exec,
    w: &Weights<'_>,
    x: &[f32],
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    dst: Dst,
    s: &mut Scratch<T>,
) {
    let (n, k) = (w.n, w.k);
    let width = cols.len() * NB;
    s.acc.clear();
    s.acc.resize(rows.len() * width, T::ZERO);
    let Scratch {
        panel,
        acc,
        x: xbuf,
    } = s;
    // One or two rows: decode and multiply in one pass where the kernel set allows it.
    let fuse = rows.len() <= kernel::FUSED_ROWS && kernel::can_fuse(ex.isa);
    // The block at (panel p, k0) against xs, the converted rows from column k0 on (stride ldx).
    let mut block = |p: usize, k0: usize, xs: &[T], ldx: usize| {
        let kb = KB.min(k - k0);
        let nv = NB.min(n - p * NB);
        let col = (p - cols.start) * NB;
        let tile = &mut acc[col..];
        let r = rows.len();
        if fuse && T::fused(ex.isa, w, p * NB, k0, kb, xs, ldx, r, tile, width, nv) {
            return;
        }
        pack::pack(ex.isa, w, p * NB, k0, kb, panel);
        T::block(ex.isa, r, panel, kb, xs, ldx, tile, width, nv, k0 == 0);
    };
    if rows.len() <= FEW_ROWS {
        // Few rows: convert them whole once, then walk each panel's rows of W front to back.
        let ldx = k.div_ceil(KB) * KB;
        let xs = widen_rows::<T>(ex.isa, x, k, &rows, 0, k, ldx, xbuf);
        let panels = n.div_ceil(NB);
        // Short rows are runs too short for the hardware prefetchers to pick up: ask for the
        // next panel's rows while this one is multiplied.
        let prefetch = w.row_bytes() <= SHORT_ROW;
        for p in cols.clone() {
            for k0 in (0..k).step_by(KB) {
                if prefetch && p + 1 < panels {
                    w.prefetch((p + 1) * NB, k0, KB.min(k - k0));
                }
                block(p, k0, &xs[k0..], ldx);
            }
        }
    } else {
        // Many rows: convert the item's K-block of x and keep it hot while the panels go by.
        for k0 in (0..k).step_by(KB) {
            let xs = widen_rows::<T>(ex.isa, x, k, &rows, k0, KB.min(k - k0), KB, xbuf);
            for p in cols.clone() {
                block(p, k0, xs, KB);
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
                unsafe { v.put(dst, at) };
            }
        }
    }
}

//! Microkernels: rows of x (widened to f64 once by [`Acc::widen`]) against one decoded panel of NB = 8
//! weight rows for one K-block. Each (row, output) pair keeps 8 f64 lanes (lane l takes the block's elements
//! ≡ l mod 8, fused, ascending), reduces them in the fixed tree, and stores the block value
//! (first block) or adds it to the running f64 sum. AVX-512, AVX2 and portable kernels compute
//! the same bits.

use super::{Acc, Dst, KB, NB, Panel, SCRATCH64, Scratch, Weights};
use crate::exec::Isa;

/// Most rows of x the fused decode-and-multiply kernel takes.
pub(crate) const FUSED_ROWS: usize = 2;

/// Whether `isa` has the fused decode-and-multiply kernel.
pub(crate) fn can_fuse(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa >= Isa::Avx2Fma
}

/// f64 sums: the reference's bits but for rare ties.
impl Acc for f64 {
    const ZERO: Self = 0.0;

    fn with_scratch<R>(f: impl FnOnce(&mut Scratch<Self>) -> R) -> R {
        SCRATCH64.with_borrow_mut(f)
    }

    /// AVX-512 or AVX2: decode 16 weights at a time and multiply them in f64.
    unsafe fn fused_vec(
        isa: Isa,
        w: &Weights<'_>,
        n0: usize,
        k0: usize,
        kb: usize,
        x: &[f64],
        ldx: usize,
        rows: usize,
        acc: &mut [f64],
        ld: usize,
        nv: usize,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use super::decode::with_decoder;
            let (xp, ap) = (x.as_ptr(), acc.as_mut_ptr());
            // SAFETY: the kernel's features are present (an Isa is only selected when detected:
            // AVX2, FMA and F16C, and AVX-512F for Avx512); rows, columns and the acc tile were
            // checked by the caller.
            with_decoder!(
                w,
                n0,
                k0,
                kb,
                |d| unsafe {
                    match (isa, rows) {
                        (Isa::Avx512, 1) => {
                            x86::fused512::<_, 1>(d, w.n, n0, k0, kb, xp, ldx, ap, ld, nv)
                        }
                        (Isa::Avx512, _) => {
                            x86::fused512::<_, 2>(d, w.n, n0, k0, kb, xp, ldx, ap, ld, nv)
                        }
                        (_, 1) => x86::fused256::<_, 1, 2>(d, w.n, n0, k0, kb, xp, ldx, ap, ld, nv),
                        _ => x86::fused256::<_, 2, 2>(d, w.n, n0, k0, kb, xp, ldx, ap, ld, nv),
                    }
                    true
                },
                false
            )
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, w, n0, k0, kb, x, ldx, rows, acc, ld, nv);
            false
        }
    }

    /// `to` = the f32 values of `from` widened to f64 (exact), zero past `from`'s end: the x side
    /// of every kernel here, widened once per item or K-block instead of once per panel.
    fn widen(isa: Isa, from: &[f32], to: &mut [f64]) {
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx2Fma {
            // SAFETY: AVX is present (an Isa is only selected when detected).
            return unsafe { x86::widen(from, to) };
        }
        let _ = isa;
        for (c, d) in to.iter_mut().enumerate() {
            *d = from.get(c).map_or(0.0, |&v| f64::from(v));
        }
    }

    /// AVX-512 (rows three at a time) or AVX2 tiles.
    unsafe fn block_vec(
        isa: Isa,
        rows: usize,
        panel: &Panel<Self>,
        kb8: usize,
        x: &[f64],
        ldx: usize,
        acc: &mut [f64],
        ld: usize,
        nv: usize,
        first: bool,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        match isa {
            // SAFETY: the features are present (an Isa is only selected when detected); the
            // caller checked every operand's bounds.
            Isa::Avx512 => unsafe { x86::block512(rows, panel, kb8, x, ldx, acc, ld, nv, first) },
            // SAFETY: as above.
            Isa::Avx2Fma => unsafe { x86::block256(rows, panel, kb8, x, ldx, acc, ld, nv, first) },
            Isa::Portable => return false,
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, rows, panel, kb8, x, ldx, acc, ld, nv, first);
            return false;
        }
        true
    }

    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        f64::mul_add(self, a, b)
    }

    unsafe fn put(self, dst: Dst, at: usize) {
        // SAFETY: forwarded (caller).
        unsafe {
            match dst {
                Dst::F32(d) => *d.get().add(at) = self as f32,
                Dst::F64(d) => *d.get().add(at) = self,
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store8(to: *mut Self, v: std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        // SAFETY: 8 writable f64 (caller).
        unsafe {
            _mm256_storeu_pd(to, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
            _mm256_storeu_pd(to.add(4), _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{KB, NB, Panel};
    use crate::gemm::decode::Dec16;
    use std::arch::x86_64::*;

    /// The fused kernel: R rows of x (f64, stride ldx) against W rows n0..n0+NB (clamped)
    /// decoded 16 elements at a time; block values stored (k0 = 0) or added into acc.
    ///
    /// # Safety
    /// AVX-512F, AVX2, FMA and F16C are available; kb is a multiple of 16; the rows, columns
    /// and acc tile are inside their buffers.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn fused512<D: Dec16, const R: usize>(
        dec: D,
        n: usize,
        n0: usize,
        k0: usize,
        kb: usize,
        x: *const f64,
        ldx: usize,
        acc: *mut f64,
        ld: usize,
        nv: usize,
    ) {
        let cur: [_; NB] = std::array::from_fn(|j| dec.cursor((n0 + j).min(n - 1), k0));
        let mut a = [[_mm512_setzero_pd(); NB]; R];
        for c in (0..kb).step_by(16) {
            // SAFETY: x rows hold kb values; panel rows decode inside W (caller).
            unsafe {
                let xv: [[__m512d; 2]; R] = std::array::from_fn(|r| {
                    let p = x.add(r * ldx + c);
                    [_mm512_loadu_pd(p), _mm512_loadu_pd(p.add(8))]
                });
                for j in 0..NB {
                    let v = dec.load16z(cur[j], c);
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
                    let (w0, w1) = (
                        _mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                        _mm512_cvtps_pd(hi),
                    );
                    for (ar, xr) in a.iter_mut().zip(&xv) {
                        ar[j] = _mm512_fmadd_pd(w0, xr[0], ar[j]);
                        ar[j] = _mm512_fmadd_pd(w1, xr[1], ar[j]);
                    }
                }
            }
        }
        // SAFETY: forwarded (the acc tile).
        unsafe { finish::<R>(&a, acc, ld, nv, k0 == 0) };
    }

    /// The fused kernel on AVX2: R rows of x (f64, stride ldx) against W rows n0..n0+NB
    /// (clamped), J of them at a time, each weight row decoded 16 elements at a time once for
    /// all R rows (R ≤ 2). The callers take J = 2: with J = 4 for one row the compiler
    /// spilled decoded weights to the stack and batch-1 decode ran 4% slower. Lanes 0..4 of
    /// an accumulator are its `lo` ymm and 4..8 its `hi`, so elements c..c+4 and c+8..c+12 go
    /// to `lo` in that order and the bits equal [`block256`]'s.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; kb is a multiple of 16; the rows, columns and acc
    /// tile are inside their buffers.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fused256<D: Dec16, const R: usize, const J: usize>(
        dec: D,
        n: usize,
        n0: usize,
        k0: usize,
        kb: usize,
        x: *const f64,
        ldx: usize,
        acc: *mut f64,
        ld: usize,
        nv: usize,
    ) {
        let widen = |v: __m256| {
            [
                _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)),
            ]
        };
        for j0 in (0..nv).step_by(J) {
            let cur: [_; J] = std::array::from_fn(|j| dec.cursor((n0 + j0 + j).min(n - 1), k0));
            let mut a = [[[_mm256_setzero_pd(); 2]; J]; R];
            for c in (0..kb).step_by(16) {
                for (j, &at) in cur.iter().enumerate() {
                    // SAFETY: the 16 elements lie inside W's row (caller); x rows hold kb
                    // values.
                    unsafe {
                        let (lo, hi) = dec.load16(at, c);
                        let (w0, w1) = (widen(lo), widen(hi));
                        for (r, ar) in a.iter_mut().enumerate() {
                            let xp = x.add(r * ldx + c);
                            let aj = &mut ar[j];
                            aj[0] = _mm256_fmadd_pd(w0[0], _mm256_loadu_pd(xp), aj[0]);
                            aj[1] = _mm256_fmadd_pd(w0[1], _mm256_loadu_pd(xp.add(4)), aj[1]);
                            aj[0] = _mm256_fmadd_pd(w1[0], _mm256_loadu_pd(xp.add(8)), aj[0]);
                            aj[1] = _mm256_fmadd_pd(w1[1], _mm256_loadu_pd(xp.add(12)), aj[1]);
                        }
                    }
                }
            }
            // SAFETY: forwarded (the acc tile).
            unsafe { store256(&a, acc.add(j0), ld, nv - j0, k0 == 0) };
        }
    }

    /// Reduce each row's eight accumulators and store (first block) or add them into acc.
    ///
    /// # Safety
    /// AVX-512F is available; acc holds R rows of stride ld with nv values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn finish<const R: usize>(
        a: &[[__m512d; NB]; R],
        acc: *mut f64,
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        let mask: __mmask8 = if nv >= 8 { 0xFF } else { (1u8 << nv) - 1 };
        for (r, ar) in a.iter().enumerate() {
            let v = reduce8(ar);
            // SAFETY: nv values of row r of acc (caller); the mask keeps the rest untouched.
            unsafe {
                let d = acc.add(r * ld);
                let s = if first {
                    v
                } else {
                    _mm512_add_pd(_mm512_maskz_loadu_pd(mask, d), v)
                };
                _mm512_mask_storeu_pd(d, mask, s);
            }
        }
    }

    /// AVX-512: the rows three at a time.
    ///
    /// # Safety
    /// AVX-512F is available; bounds as checked by the caller.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn block512(
        rows: usize,
        panel: &Panel<f64>,
        kb: usize,
        x: &[f64],
        ldx: usize,
        acc: &mut [f64],
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        let (p, xp, ap) = (panel.0.as_ptr(), x.as_ptr(), acc.as_mut_ptr());
        // SAFETY: forwarded; row triples stay below `rows`.
        unsafe {
            let mut r = 0;
            while r + 3 <= rows {
                tile512::<3>(p, kb, xp.add(r * ldx), ldx, ap.add(r * ld), ld, nv, first);
                r += 3;
            }
            match rows - r {
                2 => tile512::<2>(p, kb, xp.add(r * ldx), ldx, ap.add(r * ld), ld, nv, first),
                1 => tile512::<1>(p, kb, xp.add(r * ldx), ldx, ap.add(r * ld), ld, nv, first),
                _ => {}
            }
        }
    }

    /// The tree of eight 8-lane accumulators, as one vector [t(A0), …, t(A7)]:
    /// lanes i and i+4 (256-bit halves), then i and i+2 (128-bit quarters), then the pair.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn reduce8(a: &[__m512d; NB]) -> __m512d {
        let half = |x: __m512d, y: __m512d| {
            _mm512_add_pd(
                _mm512_shuffle_f64x2::<0x44>(x, y),
                _mm512_shuffle_f64x2::<0xEE>(x, y),
            )
        };
        let (b01, b23, b45, b67) = (
            half(a[0], a[1]),
            half(a[2], a[3]),
            half(a[4], a[5]),
            half(a[6], a[7]),
        );
        let quarter = |x: __m512d, y: __m512d| {
            _mm512_add_pd(
                _mm512_shuffle_f64x2::<0x88>(x, y),
                _mm512_shuffle_f64x2::<0xDD>(x, y),
            )
        };
        let (t0, t1) = (quarter(b01, b23), quarter(b45, b67));
        // [A0, A4, A1, A5, A2, A6, A3, A7] → [A0, …, A7].
        let u = _mm512_add_pd(_mm512_unpacklo_pd(t0, t1), _mm512_unpackhi_pd(t0, t1));
        _mm512_permutexvar_pd(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), u)
    }

    /// MR rows × NB outputs, 8·MR zmm accumulators.
    ///
    /// # Safety
    /// AVX-512F is available; panel rows hold kb8 values; x holds MR rows of stride ldx with kb8
    /// values (zero past kb); acc holds MR rows of stride ld with nv values.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile512<const MR: usize>(
        p: *const f64,
        kb: usize,
        x: *const f64,
        ldx: usize,
        acc: *mut f64,
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        let mut a = [[_mm512_setzero_pd(); NB]; MR];
        for c in (0..kb.div_ceil(8) * 8).step_by(8) {
            // SAFETY: every load is inside the x rows and the panel rows (caller); c < kb8 ≤ KB.
            unsafe {
                let xv: [__m512d; MR] =
                    std::array::from_fn(|r| _mm512_loadu_pd(x.add(r * ldx + c)));
                for j in 0..NB {
                    let w = _mm512_loadu_pd(p.add(j * KB + c));
                    for (ar, &xr) in a.iter_mut().zip(&xv) {
                        ar[j] = _mm512_fmadd_pd(w, xr, ar[j]);
                    }
                }
            }
        }
        // SAFETY: forwarded (the acc tile).
        unsafe { finish::<MR>(&a, acc, ld, nv, first) };
    }

    /// Reduce R rows × J outputs of two-ymm accumulators and store (first block) or add the
    /// first `nv` outputs of each row into acc.
    ///
    /// # Safety
    /// AVX2 is available; acc holds R rows of stride ld with min(nv, J) values.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store256<const R: usize, const J: usize>(
        a: &[[[__m256d; 2]; J]; R],
        acc: *mut f64,
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        for (r, ar) in a.iter().enumerate() {
            for (j, aj) in ar.iter().enumerate().take(nv) {
                let v = reduce2x4(aj[0], aj[1]);
                // SAFETY: (r, j < nv) is inside the acc tile (caller).
                unsafe {
                    let d = acc.add(r * ld + j);
                    *d = if first { v } else { *d + v };
                }
            }
        }
    }

    /// The tree of one accumulator held as lanes 0..4 (`lo`) and 4..8 (`hi`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn reduce2x4(lo: __m256d, hi: __m256d) -> f64 {
        let s = _mm256_add_pd(lo, hi); // [l0+l4, l1+l5, l2+l6, l3+l7]
        let t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd::<1>(s));
        _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)))
    }

    /// AVX2: the rows three at a time against four outputs at a time, one half of the lanes at
    /// a time ([`tile3x4`]); a row left over alone takes all eight lanes against four outputs
    /// ([`tile1x4`]), for eight independent chains.
    ///
    /// # Safety
    /// AVX2 and FMA are available; bounds as checked by the caller.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block256(
        rows: usize,
        panel: &Panel<f64>,
        kb: usize,
        x: &[f64],
        ldx: usize,
        acc: &mut [f64],
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        let kb8 = kb.div_ceil(8) * 8;
        let (p, xp, ap) = (panel.0.as_ptr(), x.as_ptr(), acc.as_mut_ptr());
        let mut r = 0;
        while r < rows {
            let rr = (rows - r).min(3);
            // SAFETY: the panel and the x rows hold kb8 values; acc holds rows rows of stride
            // ld with nv values (caller).
            unsafe {
                let (x, a) = (xp.add(r * ldx), ap.add(r * ld));
                match rr {
                    3 => tile3x4::<3>(p, x, ldx, kb8, a, ld, nv, first),
                    2 => tile3x4::<2>(p, x, ldx, kb8, a, ld, nv, first),
                    _ => tile1x4(p, x, kb8, a, nv, first),
                }
            }
            r += rr;
        }
    }

    /// `to` = the f32 values of `from` as f64, zero past `from`'s end.
    ///
    /// # Safety
    /// AVX is available.
    #[target_feature(enable = "avx")]
    pub unsafe fn widen(from: &[f32], to: &mut [f64]) {
        let four = from.len().min(to.len()) / 4 * 4;
        for c in (0..four).step_by(4) {
            // SAFETY: c + 4 ≤ from.len(), to.len().
            unsafe {
                let v = _mm_loadu_ps(from.as_ptr().add(c));
                _mm256_storeu_pd(to.as_mut_ptr().add(c), _mm256_cvtps_pd(v));
            }
        }
        for (c, d) in to.iter_mut().enumerate().skip(four) {
            *d = from.get(c).map_or(0.0, |&v| f64::from(v));
        }
    }

    /// R (2 or 3) rows × the panel's outputs four at a time, in two passes over the block:
    /// lanes 0..4 (elements ≡ 0..4 mod 8), then lanes 4..8. Each lane's chain is the same
    /// ascending sequence of multiply-adds as in one pass, so the bits are [`tile1x4`]'s. A
    /// pass keeps 4·R one-ymm accumulators and per 4 elements loads R x and 4 panel vectors
    /// for 4·R multiply-adds (3 rows: 7 loads for 12), where both halves at once fit only two
    /// rows by two outputs in the 16 ymm registers (8 loads for 8 multiply-adds).
    ///
    /// # Safety
    /// AVX2 and FMA are available; x holds R rows of stride ldx and the panel rows kb8 (≤ KB,
    /// a multiple of 8) values; acc holds R rows of stride ld with nv values.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile3x4<const R: usize>(
        p: *const f64,
        x: *const f64,
        ldx: usize,
        kb8: usize,
        acc: *mut f64,
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        for j0 in (0..nv).step_by(4) {
            let mut halves = [[[0f64; 8]; 4]; R];
            for h in [0, 4] {
                // SAFETY: panel rows j0..j0 + 4 ≤ NB and the x rows hold kb8 values.
                let s = unsafe { half3x4::<R>(p.add(j0 * KB + h), x.add(h), ldx, kb8) };
                for (hr, sr) in halves.iter_mut().zip(&s) {
                    for (hj, &sj) in hr.iter_mut().zip(sr) {
                        // SAFETY: hj holds 8 values.
                        unsafe { _mm256_storeu_pd(hj.as_mut_ptr().add(h), sj) };
                    }
                }
            }
            // SAFETY: halves holds R × 4 × 8 values.
            let a: [[[__m256d; 2]; 4]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|j| unsafe {
                    let l = halves[r][j].as_ptr();
                    [_mm256_loadu_pd(l), _mm256_loadu_pd(l.add(4))]
                })
            });
            // SAFETY: forwarded (the acc tile).
            unsafe { store256(&a, acc.add(j0), ld, nv - j0, first) };
        }
    }

    /// One pass of [`tile3x4`]: for the four panel rows at `p` (stride KB) and R x rows at `x`
    /// (stride ldx), both already offset to the pass's first lane, the 4-lane sums over the
    /// elements c, c + 8, … < kb8. Per step it loads the R x vectors first and then each panel
    /// vector for its R multiply-adds, so 4·R accumulators, R x vectors and one panel vector
    /// (16 ymm for R = 3) are live and nothing spills.
    ///
    /// # Safety
    /// AVX2 and FMA are available; the rows hold kb8 values from the pass's start.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn half3x4<const R: usize>(
        p: *const f64,
        x: *const f64,
        ldx: usize,
        kb8: usize,
    ) -> [[__m256d; 4]; R] {
        let mut s = [[_mm256_setzero_pd(); 4]; R];
        for c in (0..kb8).step_by(8) {
            // SAFETY: c + 4 ≤ kb8 values of every row (caller).
            unsafe {
                let xv: [__m256d; R] = std::array::from_fn(|r| _mm256_loadu_pd(x.add(r * ldx + c)));
                for j in 0..4 {
                    let w = _mm256_loadu_pd(p.add(j * KB + c));
                    for (sr, &xr) in s.iter_mut().zip(&xv) {
                        sr[j] = _mm256_fmadd_pd(w, xr, sr[j]);
                    }
                }
            }
        }
        s
    }

    /// One row × the panel's outputs four at a time, all eight lanes at once (eight
    /// accumulators; panel rows past nv are computed, not stored).
    ///
    /// # Safety
    /// AVX2 and FMA are available; x and the panel rows hold kb8 (≤ KB, a multiple of 8)
    /// values; acc holds nv values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile1x4(
        p: *const f64,
        x: *const f64,
        kb8: usize,
        acc: *mut f64,
        nv: usize,
        first: bool,
    ) {
        for j0 in (0..nv).step_by(4) {
            let mut a = [[[_mm256_setzero_pd(); 2]; 4]; 1];
            for c in (0..kb8).step_by(8) {
                // SAFETY: panel rows j0..j0 + 4 ≤ NB and the x row hold kb8 values.
                unsafe {
                    let (x0, x1) = (_mm256_loadu_pd(x.add(c)), _mm256_loadu_pd(x.add(c + 4)));
                    for (j, aj) in a[0].iter_mut().enumerate() {
                        let at = p.add((j0 + j) * KB + c);
                        aj[0] = _mm256_fmadd_pd(_mm256_loadu_pd(at), x0, aj[0]);
                        aj[1] = _mm256_fmadd_pd(_mm256_loadu_pd(at.add(4)), x1, aj[1]);
                    }
                }
            }
            // SAFETY: forwarded (the acc tile).
            unsafe { store256(&a, acc.add(j0), 0, nv - j0, first) };
        }
    }
}

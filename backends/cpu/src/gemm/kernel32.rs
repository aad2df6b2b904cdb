//! Microkernels of [`Sums::F32`](super::Sums): the order of [`super::kernel`] with every
//! multiply-add and add in f32. Each (row, output) pair keeps 8 f32 lanes, one 256-bit vector
//! (lane l takes the block's elements ≡ l mod 8, fused, ascending), reduces them in the same
//! fixed tree, and stores the block value (first block) or adds it to the running f32 sum. The
//! AVX2 kernels (which AVX-512 machines run too) and the portable ones compute the same bits.

use super::{Acc, Dst, KB, NB, Panel, SCRATCH32, Scratch, Weights};
use crate::exec::Isa;

/// f32 sums: the same order, within f32 rounding of the reference.
impl Acc for f32 {
    const ZERO: Self = 0.0;

    fn with_scratch<R>(f: impl FnOnce(&mut Scratch<Self>) -> R) -> R {
        SCRATCH32.with_borrow_mut(f)
    }

    /// `to` = `from`, zero past its end (a copy: nothing to widen).
    fn widen(_isa: Isa, from: &[f32], to: &mut [Self]) {
        to[..from.len()].copy_from_slice(from);
        to[from.len()..].fill(0.0);
    }

    /// AVX2 (also on AVX-512 machines): decode 16 weights at a time and multiply them in f32.
    unsafe fn fused_vec(
        isa: Isa,
        w: &Weights<'_>,
        n0: usize,
        k0: usize,
        kb: usize,
        x: &[f32],
        ldx: usize,
        rows: usize,
        acc: &mut [f32],
        ld: usize,
        nv: usize,
    ) -> bool {
        let _ = isa;
        #[cfg(target_arch = "x86_64")]
        {
            use super::decode::with_decoder;
            let (xp, ap) = (x.as_ptr(), acc.as_mut_ptr());
            // SAFETY: AVX2, FMA and F16C are present (the caller's isa can fuse); rows, columns
            // and the acc tile were checked by the caller.
            with_decoder!(
                w,
                n0,
                k0,
                kb,
                |d| unsafe {
                    match rows {
                        1 => x86::fused::<_, 1, 4>(d, w.n, n0, k0, kb, xp, ldx, ap, ld, nv),
                        _ => x86::fused::<_, 2, 4>(d, w.n, n0, k0, kb, xp, ldx, ap, ld, nv),
                    }
                    true
                },
                false
            )
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (w, n0, k0, kb, x, ldx, rows, acc, ld, nv);
            false
        }
    }

    /// The AVX2 tiles (also on AVX-512 machines).
    unsafe fn block_vec(
        isa: Isa,
        rows: usize,
        panel: &Panel<Self>,
        kb8: usize,
        x: &[f32],
        ldx: usize,
        acc: &mut [f32],
        ld: usize,
        nv: usize,
        first: bool,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx2Fma {
            // SAFETY: AVX2 and FMA are present (an Isa is only selected when detected); the
            // caller checked every operand's bounds.
            unsafe { x86::block(rows, panel, kb8, x, ldx, acc, ld, nv, first) };
            return true;
        }
        let _ = (isa, rows, panel, kb8, x, ldx, acc, ld, nv, first);
        false
    }

    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        f32::mul_add(self, a, b)
    }

    unsafe fn put(self, dst: Dst, at: usize) {
        // SAFETY: forwarded (caller).
        unsafe {
            match dst {
                Dst::F32(d) => *d.get().add(at) = self,
                Dst::F64(d) => *d.get().add(at) = f64::from(self),
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store8(to: *mut Self, v: std::arch::x86_64::__m256) {
        // SAFETY: 8 writable f32 (caller).
        unsafe { std::arch::x86_64::_mm256_storeu_ps(to, v) }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{KB, NB, Panel};
    use crate::gemm::decode::Dec16;
    use std::arch::x86_64::*;

    /// The tree of one 8-lane accumulator: [l0+l4, l1+l5, l2+l6, l3+l7], then the pairs
    /// (0, 2) and (1, 3), then the two.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn reduce(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)))
    }

    /// Reduce R rows × J outputs and store (first block) or add the first `nv` outputs of each
    /// row into acc.
    ///
    /// # Safety
    /// AVX2 is available; acc holds R rows of stride ld with min(nv, J) values.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store<const R: usize, const J: usize>(
        a: &[[__m256; J]; R],
        acc: *mut f32,
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        for (r, ar) in a.iter().enumerate() {
            for (j, &aj) in ar.iter().enumerate().take(nv) {
                let v = reduce(aj);
                // SAFETY: (r, j < nv) is inside the acc tile (caller).
                unsafe {
                    let d = acc.add(r * ld + j);
                    *d = if first { v } else { *d + v };
                }
            }
        }
    }

    /// The fused kernel: R rows of x (stride ldx) against W rows n0..n0+NB (clamped), J at a
    /// time, each weight row decoded 16 elements at a time once for all R rows. Elements
    /// c..c+8 then c+8..c+16 go into the one accumulator, so each lane's chain is ascending
    /// and the bits equal [`block`]'s.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; kb is a multiple of 16; the rows, columns and acc
    /// tile are inside their buffers.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fused<D: Dec16, const R: usize, const J: usize>(
        dec: D,
        n: usize,
        n0: usize,
        k0: usize,
        kb: usize,
        x: *const f32,
        ldx: usize,
        acc: *mut f32,
        ld: usize,
        nv: usize,
    ) {
        for j0 in (0..nv).step_by(J) {
            let cur: [_; J] = std::array::from_fn(|j| dec.cursor((n0 + j0 + j).min(n - 1), k0));
            let mut a = [[_mm256_setzero_ps(); J]; R];
            for c in (0..kb).step_by(16) {
                // SAFETY: x rows hold kb values; the 16 elements lie inside W's row (caller).
                unsafe {
                    let xv: [[__m256; 2]; R] = std::array::from_fn(|r| {
                        let p = x.add(r * ldx + c);
                        [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]
                    });
                    for (j, &at) in cur.iter().enumerate() {
                        let (lo, hi) = dec.load16(at, c);
                        for (ar, xr) in a.iter_mut().zip(&xv) {
                            ar[j] = _mm256_fmadd_ps(lo, xr[0], ar[j]);
                            ar[j] = _mm256_fmadd_ps(hi, xr[1], ar[j]);
                        }
                    }
                }
            }
            // SAFETY: forwarded (the acc tile).
            unsafe { store(&a, acc.add(j0), ld, nv - j0, k0 == 0) };
        }
    }

    /// The rows three at a time against four outputs at a time ([`tile`]); one row left over
    /// takes all eight outputs at once, for eight independent chains.
    ///
    /// # Safety
    /// AVX2 and FMA are available; the panel rows and the x rows hold kb8 (a multiple of 8, ≤
    /// KB) values; acc holds rows rows of stride ld with nv values.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block(
        rows: usize,
        panel: &Panel<f32>,
        kb8: usize,
        x: &[f32],
        ldx: usize,
        acc: &mut [f32],
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        let (p, xp, ap) = (panel.0.as_ptr(), x.as_ptr(), acc.as_mut_ptr());
        let mut r = 0;
        while r < rows {
            let rr = (rows - r).min(3);
            // SAFETY: forwarded; the rows stay below `rows`.
            unsafe {
                let (x, a) = (xp.add(r * ldx), ap.add(r * ld));
                match rr {
                    3 => tile::<3, 4>(p, x, ldx, kb8, a, ld, nv, first),
                    2 => tile::<2, 4>(p, x, ldx, kb8, a, ld, nv, first),
                    _ => tile::<1, 8>(p, x, ldx, kb8, a, ld, nv, first),
                }
            }
            r += rr;
        }
    }

    /// R rows × the panel's outputs J at a time: R·J accumulators, and per 8 elements R x
    /// loads and J panel loads for R·J multiply-adds (3 × 4: 7 loads for 12, 16 ymm live).
    /// Panel rows past nv are computed, not stored.
    ///
    /// # Safety
    /// AVX2 and FMA are available; x holds R rows of stride ldx and the panel rows kb8 values;
    /// acc holds R rows of stride ld with nv values.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const J: usize>(
        p: *const f32,
        x: *const f32,
        ldx: usize,
        kb8: usize,
        acc: *mut f32,
        ld: usize,
        nv: usize,
        first: bool,
    ) {
        debug_assert!(NB.is_multiple_of(J));
        for j0 in (0..nv).step_by(J) {
            let mut a = [[_mm256_setzero_ps(); J]; R];
            for c in (0..kb8).step_by(8) {
                // SAFETY: panel rows j0..j0 + J ≤ NB and the x rows hold kb8 values (caller).
                unsafe {
                    let xv: [__m256; R] =
                        std::array::from_fn(|r| _mm256_loadu_ps(x.add(r * ldx + c)));
                    for j in 0..J {
                        let w = _mm256_loadu_ps(p.add((j0 + j) * KB + c));
                        for (ar, &xr) in a.iter_mut().zip(&xv) {
                            ar[j] = _mm256_fmadd_ps(w, xr, ar[j]);
                        }
                    }
                }
            }
            // SAFETY: forwarded (the acc tile).
            unsafe { store(&a, acc.add(j0), ld, nv - j0, first) };
        }
    }
}

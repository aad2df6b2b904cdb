//! Microkernels: one K-block of up to three rows against one packed 32-column panel. Each output
//! lane is a sequential fused multiply-add chain over the block from +0.0, then stored (first
//! block) or added to the running output; the AVX2 and portable kernels compute the same bits.

use super::{KB, NR, Panel};
use crate::exec::Isa;

/// out[r·ldo + j] = acc (first block) or out + acc, acc[r][j] = fused chain over kk < kb of
/// panel[kk][j]·x[r·ldx + kk], for r < mr (≤ 3) and j < nv (≤ 32).
///
/// # Safety
/// `out` must be valid for reads and writes of rows r < mr at offsets r·ldo + j, j < nv, and no
/// other thread may access those elements during the call. `x` must hold rows r < mr of width
/// `ldx` from its start, each with at least `kb` elements.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn block(
    isa: Isa,
    mr: usize,
    panel: &Panel,
    kb: usize,
    x: &[f32],
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    nv: usize,
    first: bool,
) {
    debug_assert!((1..=3).contains(&mr) && kb <= KB && nv <= NR && nv > 0);
    debug_assert!(x.len() >= (mr - 1) * ldx + kb);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        if nv == NR {
            // SAFETY: the caller guarantees the output rows; AVX2+FMA is present (Isa).
            unsafe { avx2::block_any(mr, panel, kb, x.as_ptr(), ldx, out, ldo, first) };
        } else {
            // A partial panel: run on a full-width copy, write back the valid columns.
            let mut tmp = [[0f32; NR]; 3];
            for (r, t) in tmp.iter_mut().enumerate().take(mr) {
                for (j, v) in t.iter_mut().enumerate().take(nv) {
                    // SAFETY: inside the caller's rectangle.
                    *v = unsafe { *out.add(r * ldo + j) };
                }
            }
            let tp = tmp.as_mut_ptr().cast::<f32>();
            // SAFETY: `tmp` holds 3 full rows of NR.
            unsafe { avx2::block_any(mr, panel, kb, x.as_ptr(), ldx, tp, NR, first) };
            for (r, t) in tmp.iter().enumerate().take(mr) {
                for (j, v) in t.iter().enumerate().take(nv) {
                    // SAFETY: inside the caller's rectangle.
                    unsafe { *out.add(r * ldo + j) = *v };
                }
            }
        }
        return;
    }
    let _ = isa;
    // SAFETY: forwarded caller guarantees.
    unsafe { portable(mr, panel, kb, x, ldx, out, ldo, nv, first) };
}

/// The reference form of the microkernel: scalar fused multiply-adds.
///
/// # Safety
/// As [`block`].
#[allow(clippy::too_many_arguments)]
unsafe fn portable(
    mr: usize,
    panel: &Panel,
    kb: usize,
    x: &[f32],
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    nv: usize,
    first: bool,
) {
    for r in 0..mr {
        let xr = &x[r * ldx..r * ldx + kb];
        let mut acc = [0f32; NR];
        for (kk, &xv) in xr.iter().enumerate() {
            let prow = &panel.0[kk * NR..(kk + 1) * NR];
            for (a, &w) in acc.iter_mut().zip(prow) {
                *a = w.mul_add(xv, *a);
            }
        }
        for (j, &a) in acc.iter().enumerate().take(nv) {
            // SAFETY: inside the caller's rectangle.
            unsafe {
                let o = out.add(r * ldo + j);
                *o = if first { a } else { *o + a };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{NR, Panel};
    use std::arch::x86_64::*;

    /// Dispatch on the row count.
    ///
    /// # Safety
    /// AVX2 and FMA are available; `out` holds `mr` full rows of NR at stride `ldo`; `x` holds
    /// `mr` rows of at least `kb` elements at stride `ldx`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn block_any(
        mr: usize,
        panel: &Panel,
        kb: usize,
        x: *const f32,
        ldx: usize,
        out: *mut f32,
        ldo: usize,
        first: bool,
    ) {
        // SAFETY: forwarded.
        unsafe {
            match mr {
                1 => block::<1>(panel, kb, x, ldx, out, ldo, first),
                2 => block::<2>(panel, kb, x, ldx, out, ldo, first),
                _ => block::<3>(panel, kb, x, ldx, out, ldo, first),
            }
        }
    }

    /// MR rows × 32 columns, 4·MR ymm accumulators.
    ///
    /// # Safety
    /// As [`block_any`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block<const MR: usize>(
        panel: &Panel,
        kb: usize,
        x: *const f32,
        ldx: usize,
        out: *mut f32,
        ldo: usize,
        first: bool,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 4]; MR];
        let p = panel.0.as_ptr();
        // SAFETY: kk < kb ≤ KB rows of the panel; x rows hold kb elements (caller).
        unsafe {
            for kk in 0..kb {
                let row = p.add(kk * NR);
                let mut xb = [_mm256_setzero_ps(); MR];
                for (r, b) in xb.iter_mut().enumerate() {
                    *b = _mm256_broadcast_ss(&*x.add(r * ldx + kk));
                }
                // One panel vector at a time against every row: 4·MR accumulators, MR
                // broadcasts and one weight register.
                for j in 0..4 {
                    let wj = _mm256_load_ps(row.add(8 * j));
                    for (a, &b) in acc.iter_mut().zip(&xb) {
                        a[j] = _mm256_fmadd_ps(wj, b, a[j]);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                for (j, &aj) in a.iter().enumerate() {
                    let o = out.add(r * ldo + 8 * j);
                    let v = if first {
                        aj
                    } else {
                        _mm256_add_ps(_mm256_loadu_ps(o), aj)
                    };
                    _mm256_storeu_ps(o, v);
                }
            }
        }
    }
}

//! AVX2 panel decoding: each weight row 16 elements at a time through the vector decoder, each
//! value stored in the sum type ([`Acc::store8`]: widened exactly to f64, or kept as f32).

use super::{Acc, KB, NB, Panel, Weights};
use crate::gemm::decode::{Dec16, with_decoder};

/// Decode the panel's leading columns; returns how many were done (the scalar path does the
/// rest: a tail, or the whole block when the vector decoder cannot).
///
/// # Safety
/// AVX2, FMA and F16C are available.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn pack<T: Acc>(
    w: &Weights<'_>,
    n0: usize,
    k0: usize,
    kb: usize,
    panel: &mut Panel<T>,
) -> usize {
    debug_assert!(kb <= KB);
    // SAFETY: AVX2 and F16C are present (caller); rows < n, columns < k0 + kb ≤ k.
    with_decoder!(
        w,
        n0,
        k0,
        kb,
        |d| unsafe { rows(d, w.n, n0, k0, kb, panel) },
        0
    )
}

/// Decode rows n0..n0+NB (clamped to n − 1) over the leading multiple of 16 of kb columns.
///
/// # Safety
/// AVX2 and F16C are available; k0 + kb ≤ k.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<D: Dec16, T: Acc>(
    d: D,
    n: usize,
    n0: usize,
    k0: usize,
    kb: usize,
    panel: &mut Panel<T>,
) -> usize {
    let done = kb / 16 * 16;
    let dst = panel.0.as_mut_ptr();
    for j in 0..NB {
        let at = d.cursor((n0 + j).min(n - 1), k0);
        for c in (0..done).step_by(16) {
            // SAFETY: columns c..c+16 lie inside the row's block and panel row j.
            unsafe {
                let (lo, hi) = d.load16(at, c);
                T::store8(dst.add(j * KB + c), lo);
                T::store8(dst.add(j * KB + c + 8), hi);
            }
        }
    }
    done
}

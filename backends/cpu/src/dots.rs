//! Dot products of rows against rows (attention logits, indexer scores) in f64, in one fixed
//! order: lane l (of 8) accumulates the elements c ≡ l (mod 8) in ascending order with fused
//! multiply-adds from +0.0 (f32 products are exact in f64), and the lanes are combined as
//! ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). The order depends only on the row length, never on
//! how many rows a call holds.

use crate::exec::Isa;

/// The fixed combination of the eight lane partials.
#[inline(always)]
fn tree(l: &[f64; 8]) -> f64 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// One dot product in the module's order (the portable form).
fn dot(a: &[f64], b: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    for (c, (&x, &y)) in a.iter().zip(b).enumerate() {
        lanes[c % 8] = x.mul_add(f64::from(y), lanes[c % 8]);
    }
    tree(&lanes)
}

/// out[i·rb + j] = a_i · b_j for the rows of `a` (f64) and of `b` (f32), each `dim` wide.
pub(crate) fn dots(isa: Isa, a: &[f64], b: &[f32], dim: usize, out: &mut [f64]) {
    assert!(dim > 0, "dots: zero-width rows");
    let (ra, rb) = (a.len() / dim, b.len() / dim);
    assert_eq!(
        out.len(),
        ra * rb,
        "dots: output is not [rows of a, rows of b]"
    );
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2Fma && dim.is_multiple_of(8) {
        // SAFETY: the features are present (an Isa is only selected when detected); shapes
        // checked above.
        unsafe {
            if isa == Isa::Avx512 {
                x86::dots512(a, b, dim, ra, rb, out);
            } else {
                x86::dots256(a, b, dim, ra, rb, out);
            }
        }
        return;
    }
    let _ = isa;
    for (i, ai) in a.chunks_exact(dim).enumerate() {
        for (j, bj) in b.chunks_exact(dim).enumerate() {
            out[i * rb + j] = dot(ai, bj);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The module's lane tree on one 8-lane vector.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn hsum512(v: __m512d) -> f64 {
        let s = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd::<1>(v));
        let t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd::<1>(s));
        _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)))
    }

    /// The module's lane tree on lanes 0..4 (`lo`) and 4..8 (`hi`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum256(lo: __m256d, hi: __m256d) -> f64 {
        let s = _mm256_add_pd(lo, hi);
        let t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd::<1>(s));
        _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)))
    }

    /// AVX-512: blocks of 4 rows of `a` × 4 rows of `b` (16 accumulators, each row of `b`
    /// widened once per block), leftovers one pair at a time.
    ///
    /// # Safety
    /// AVX-512F is available; dim is a multiple of 8; a, b, out hold ra·dim, rb·dim, ra·rb.
    #[target_feature(enable = "avx512f,avx2")]
    pub unsafe fn dots512(a: &[f64], b: &[f32], dim: usize, ra: usize, rb: usize, out: &mut [f64]) {
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (ra4, rb4) = (ra / 4 * 4, rb / 4 * 4);
        // SAFETY (all blocks): rows i < ra of a and j < rb of b hold dim values.
        unsafe {
            for i in (0..ra4).step_by(4) {
                for j in (0..rb4).step_by(4) {
                    let mut acc = [[_mm512_setzero_pd(); 4]; 4];
                    for c in (0..dim).step_by(8) {
                        let y: [__m512d; 4] = std::array::from_fn(|jj| {
                            _mm512_cvtps_pd(_mm256_loadu_ps(pb.add((j + jj) * dim + c)))
                        });
                        for (ii, row) in acc.iter_mut().enumerate() {
                            let x = _mm512_loadu_pd(pa.add((i + ii) * dim + c));
                            for (s, &yj) in row.iter_mut().zip(&y) {
                                *s = _mm512_fmadd_pd(x, yj, *s);
                            }
                        }
                    }
                    for (ii, row) in acc.iter().enumerate() {
                        for (jj, &s) in row.iter().enumerate() {
                            out[(i + ii) * rb + j + jj] = hsum512(s);
                        }
                    }
                }
            }
            let one = |i: usize, j: usize| {
                let mut s = _mm512_setzero_pd();
                for c in (0..dim).step_by(8) {
                    let x = _mm512_loadu_pd(pa.add(i * dim + c));
                    let y = _mm512_cvtps_pd(_mm256_loadu_ps(pb.add(j * dim + c)));
                    s = _mm512_fmadd_pd(x, y, s);
                }
                hsum512(s)
            };
            for i in 0..ra {
                let from = if i < ra4 { rb4 } else { 0 };
                for j in from..rb {
                    out[i * rb + j] = one(i, j);
                }
            }
        }
    }

    /// AVX2: blocks of 4 rows of `a` × 3 rows of `b` (rows past the ends repeat the last one
    /// and are not stored), each block in two passes over the rows, lanes 0..4 then 4..8
    /// ([`half4x3`]): 12 one-ymm accumulators, and each chunk of `b` widened once per 4 rows
    /// of `a`. Every lane's chain is the same ascending sequence of multiply-adds as in one
    /// pass, so the bits are the portable form's.
    ///
    /// # Safety
    /// AVX2 and FMA are available; dim is a multiple of 8; a, b, out hold ra·dim, rb·dim, ra·rb.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dots256(a: &[f64], b: &[f32], dim: usize, ra: usize, rb: usize, out: &mut [f64]) {
        for i in (0..ra).step_by(4) {
            // SAFETY: clamped rows are rows of a (ra ≥ 1 here).
            let pa: [*const f64; 4] =
                std::array::from_fn(|ii| unsafe { a.as_ptr().add((i + ii).min(ra - 1) * dim) });
            for j in (0..rb).step_by(3) {
                // SAFETY: clamped rows are rows of b.
                let pb: [*const f32; 3] =
                    std::array::from_fn(|jj| unsafe { b.as_ptr().add((j + jj).min(rb - 1) * dim) });
                // SAFETY: every row holds dim values (caller).
                let (lo, hi) = unsafe { (half4x3(pa, pb, dim, 0), half4x3(pa, pb, dim, 4)) };
                for ii in 0..4.min(ra - i) {
                    for jj in 0..3.min(rb - j) {
                        out[(i + ii) * rb + j + jj] = hsum256(lo[ii][jj], hi[ii][jj]);
                    }
                }
            }
        }
    }

    /// One pass of [`dots256`]: the 4-lane partial sums of rows `pa` against rows `pb` over the
    /// elements h + c (c = 0, 8, … < dim; h = 0 or 4). Per step it widens the 3 chunks of
    /// `b` first and then loads each row of `a` for its 3 multiply-adds, so 12 accumulators,
    /// 3 widened chunks and one row chunk (16 ymm) are live.
    ///
    /// # Safety
    /// AVX2 and FMA are available; every row holds dim values; dim is a multiple of 8.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn half4x3(
        pa: [*const f64; 4],
        pb: [*const f32; 3],
        dim: usize,
        h: usize,
    ) -> [[__m256d; 3]; 4] {
        let mut s = [[_mm256_setzero_pd(); 3]; 4];
        for c in (h..dim).step_by(8) {
            // SAFETY: c + 4 ≤ dim (caller).
            unsafe {
                let y: [__m256d; 3] =
                    std::array::from_fn(|jj| _mm256_cvtps_pd(_mm_loadu_ps(pb[jj].add(c))));
                for (si, &ai) in s.iter_mut().zip(&pa) {
                    let x = _mm256_loadu_pd(ai.add(c));
                    for (sij, &yj) in si.iter_mut().zip(&y) {
                        *sij = _mm256_fmadd_pd(x, yj, *sij);
                    }
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_core::SplitMix64;

    #[test]
    fn every_kernel_set_gives_the_same_bits_and_accurate_dots() {
        let mut g = SplitMix64::new(1);
        for (ra, rb, dim) in [
            (1, 1, 8),
            (3, 7, 128),
            (8, 9, 256),
            (2, 5, 40),
            (4, 3, 33),
            (5, 4, 16),
        ] {
            let a: Vec<f64> = (0..ra * dim)
                .map(|_| f64::from(g.uniform_sym(1.0)))
                .collect();
            let b: Vec<f32> = (0..rb * dim).map(|_| g.uniform_sym(1.0)).collect();
            let run = |isa| {
                let mut o = vec![0f64; ra * rb];
                dots(isa, &a, &b, dim, &mut o);
                o.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let want = run(Isa::Portable);
            for isa in Isa::available() {
                assert_eq!(run(isa), want, "{isa:?} {ra}x{rb}x{dim}");
            }
            for i in 0..ra {
                for j in 0..rb {
                    let exact: f64 = (0..dim)
                        .map(|c| a[i * dim + c] * f64::from(b[j * dim + c]))
                        .sum();
                    let got = f64::from_bits(want[i * rb + j]);
                    assert!((got - exact).abs() < 1e-13, "{ra}x{rb}x{dim} ({i}, {j})");
                }
            }
        }
    }
}

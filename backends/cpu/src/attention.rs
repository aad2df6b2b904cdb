//! One query's sparse attention (window + compressed entries, K = V, per-head sink) and the
//! lightning indexer's scores and top-k, in f64 like the reference. Logits and scores are row dot
//! products in the fixed lane order of [`dots`](crate::dots); the weighted sum of keys runs over
//! the keys in order for each column; softmax sums run per head in key order.

use crate::dots::dots;
use crate::exec::{Exec, Isa, SharedOut};
use crate::math::{exp_f64, multiversion};
use std::cmp::Ordering;

/// Columns per step of the weighted key sum (a stack buffer of f64 partials).
const COLS: usize = 32;

multiversion! {
    /// Scale one head's logits, exponentiate them against `max` in place and return Σ e (in
    /// key order).
    fn exp_row(row: &mut [f64], scale: f64, max: f64, sum: &mut f64) {
        let mut s = 0f64;
        for v in row.iter_mut() {
            let e = exp_f64(*v * scale - max);
            *v = e;
            s += e;
        }
        *sum = s;
    }
}

/// Heads handled together (their logits and weighted sums share each key's widening).
const GROUP: usize = 4;

/// out[h, c] = (Σ_s p[h, s]·keys[s, c]) / den[h] for the heads of a group, the sum over s in
/// order as fused f64 steps (the portable form; the AVX2 and AVX-512 forms compute the same
/// bits).
fn weighted_keys(isa: Isa, p: &[f64], keys: &[f32], dim: usize, den: &[f64], out: &mut [f32]) {
    let (heads, n) = (den.len(), keys.len() / dim);
    debug_assert!(p.len() == heads * n && out.len() == heads * dim);
    let full = dim / COLS * COLS;
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: AVX-512F is present (Isa); shapes checked above.
        Isa::Avx512 if heads == GROUP => unsafe { x86::weighted4(p, keys, dim, n, full, den, out) },
        // SAFETY: AVX2 and FMA are present (Isa); shapes checked above.
        Isa::Avx2Fma if heads == GROUP => unsafe {
            x86::weighted4_256(p, keys, dim, n, full, den, out)
        },
        _ => weighted_cols(isa, p, keys, dim, 0..full, den, out),
    }
    #[cfg(not(target_arch = "x86_64"))]
    weighted_cols(isa, p, keys, dim, 0..full, den, out);
    weighted_cols(isa, p, keys, dim, full..dim, den, out);
}

multiversion! {
    /// The weighted key sum over columns `cols`, one column at a time.
    fn weighted_cols(
        p: &[f64],
        keys: &[f32],
        dim: usize,
        cols: std::ops::Range<usize>,
        den: &[f64],
        out: &mut [f32],
    ) {
        let n = keys.len() / dim;
        for (h, &d) in den.iter().enumerate() {
            for c in cols.clone() {
                let mut a = 0f64;
                for s in 0..n {
                    a = p[h * n + s].mul_add(f64::from(keys[s * dim + c]), a);
                }
                out[h * dim + c] = (a / d) as f32;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{COLS, GROUP};
    use std::arch::x86_64::*;

    /// Four heads × 32 columns at a time: each key chunk widened once, 16 accumulators.
    ///
    /// # Safety
    /// AVX-512F is available; p holds 4·n, keys n·dim, out 4·dim values; full ≤ dim is a
    /// multiple of 32.
    #[target_feature(enable = "avx512f,avx2")]
    pub unsafe fn weighted4(
        p: &[f64],
        keys: &[f32],
        dim: usize,
        n: usize,
        full: usize,
        den: &[f64],
        out: &mut [f32],
    ) {
        let (pp, pk) = (p.as_ptr(), keys.as_ptr());
        for c0 in (0..full).step_by(COLS) {
            let mut acc = [[_mm512_setzero_pd(); 4]; GROUP];
            for s in 0..n {
                // SAFETY: key row s holds dim ≥ c0 + 32 values; p rows hold n values.
                unsafe {
                    let kv: [__m512d; 4] = std::array::from_fn(|q| {
                        _mm512_cvtps_pd(_mm256_loadu_ps(pk.add(s * dim + c0 + 8 * q)))
                    });
                    for (h, ah) in acc.iter_mut().enumerate() {
                        let ph = _mm512_set1_pd(*pp.add(h * n + s));
                        for (a, &k) in ah.iter_mut().zip(&kv) {
                            *a = _mm512_fmadd_pd(ph, k, *a);
                        }
                    }
                }
            }
            for (h, ah) in acc.iter().enumerate() {
                let d = _mm512_set1_pd(den[h]);
                for (q, &a) in ah.iter().enumerate() {
                    let v = _mm512_cvtpd_ps(_mm512_div_pd(a, d));
                    // SAFETY: columns c0 + 8q .. +8 < dim of head h's output row.
                    unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(h * dim + c0 + 8 * q), v) };
                }
            }
        }
    }

    /// AVX2: four heads × 8 columns at a time, each key chunk widened once, 8 accumulators.
    ///
    /// # Safety
    /// AVX2 and FMA are available; p holds 4·n, keys n·dim, out 4·dim values; full ≤ dim is a
    /// multiple of 8.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn weighted4_256(
        p: &[f64],
        keys: &[f32],
        dim: usize,
        n: usize,
        full: usize,
        den: &[f64],
        out: &mut [f32],
    ) {
        let (pp, pk) = (p.as_ptr(), keys.as_ptr());
        for c0 in (0..full).step_by(8) {
            let mut acc = [[_mm256_setzero_pd(); 2]; GROUP];
            for s in 0..n {
                // SAFETY: key row s holds dim ≥ c0 + 8 values; p rows hold n values.
                unsafe {
                    let at = pk.add(s * dim + c0);
                    let kv = [
                        _mm256_cvtps_pd(_mm_loadu_ps(at)),
                        _mm256_cvtps_pd(_mm_loadu_ps(at.add(4))),
                    ];
                    for (h, ah) in acc.iter_mut().enumerate() {
                        let ph = _mm256_set1_pd(*pp.add(h * n + s));
                        ah[0] = _mm256_fmadd_pd(ph, kv[0], ah[0]);
                        ah[1] = _mm256_fmadd_pd(ph, kv[1], ah[1]);
                    }
                }
            }
            for (h, ah) in acc.iter().enumerate() {
                let d = _mm256_set1_pd(den[h]);
                for (q, &a) in ah.iter().enumerate() {
                    let v = _mm256_cvtpd_ps(_mm256_div_pd(a, d));
                    // SAFETY: columns c0 + 4q .. +4 < dim of head h's output row.
                    unsafe { _mm_storeu_ps(out.as_mut_ptr().add(h * dim + c0 + 4 * q), v) };
                }
            }
        }
    }
}

/// `sparse_attention` for one query: q, out [heads, dim]; keys [n, dim]. Groups of heads run in
/// parallel.
#[allow(clippy::too_many_arguments)]
pub fn sparse_attention(
    ex: &Exec,
    q: &[f32],
    dim: usize,
    keys: &[f32],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let heads = sink.len();
    assert_eq!(
        q.len(),
        heads * dim,
        "sparse_attention: q is not [heads, dim]"
    );
    assert_eq!(
        out.len(),
        heads * dim,
        "sparse_attention: out is not [heads, dim]"
    );
    if dim == 0 || heads == 0 {
        return;
    }
    assert!(
        keys.len().is_multiple_of(dim),
        "sparse_attention: keys are not [n, dim]"
    );
    let n = keys.len() / dim;
    if n == 0 {
        // Only the sink: nothing in the numerator.
        out.fill(0.0);
        return;
    }
    let isa = ex.isa;
    let dst = SharedOut(out.as_mut_ptr());
    let groups = heads.div_ceil(GROUP);
    let scale = f64::from(scale);
    ex.for_each(groups, 2 * heads * n * dim, |g| {
        let hs = g * GROUP..heads.min((g + 1) * GROUP);
        let qg: Vec<f64> = q[hs.start * dim..hs.end * dim]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let mut p = vec![0f64; hs.len() * n];
        dots(isa, &qg, keys, dim, &mut p);
        let mut den = vec![0f64; hs.len()];
        for ((row, d), &sink) in p.chunks_mut(n).zip(&mut den).zip(&sink[hs.clone()]) {
            let max = row.iter().fold(f64::from(sink), |m, &l| m.max(l * scale));
            let mut sum = 0f64;
            exp_row(isa, row, scale, max, &mut sum);
            *d = sum + exp_f64(f64::from(sink) - max);
        }
        // SAFETY: group g owns out[hs·dim]; `out` is borrowed for the whole call.
        let o = unsafe {
            std::slice::from_raw_parts_mut(dst.get().add(hs.start * dim), hs.len() * dim)
        };
        weighted_keys(isa, &p, keys, dim, &den, o);
    });
}

/// `indexer_scores`: out[j] = Σ_h w[h]·ReLU(q[h]·K[j]), heads summed in order in f64; keys in
/// parallel chunks.
pub fn indexer_scores(ex: &Exec, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
    let heads = w.len();
    assert_eq!(
        q.len(),
        heads * dim,
        "indexer_scores: q is not [heads, dim]"
    );
    if dim == 0 {
        out.fill(0.0);
        return;
    }
    assert!(
        keys.len().is_multiple_of(dim),
        "indexer_scores: keys are not [n, dim]"
    );
    let n = keys.len() / dim;
    assert_eq!(out.len(), n, "indexer_scores: out is not [n]");
    if n == 0 || heads == 0 {
        out.fill(0.0);
        return;
    }
    const CHUNK: usize = 128;
    let isa = ex.isa;
    let q64: Vec<f64> = q.iter().map(|&v| f64::from(v)).collect();
    ex.rows_mut(out, CHUNK.min(n), heads * CHUNK * dim, |first, part| {
        let j0 = first * CHUNK.min(n);
        let m = part.len();
        let mut s = vec![0f64; heads * m];
        dots(isa, &q64, &keys[j0 * dim..(j0 + m) * dim], dim, &mut s);
        let mut acc = vec![0f64; m];
        for (h, &wh) in w.iter().enumerate() {
            for (a, &v) in acc.iter_mut().zip(&s[h * m..(h + 1) * m]) {
                *a += f64::from(wh) * v.max(0.0);
            }
        }
        for (o, a) in part.iter_mut().zip(acc) {
            *o = a as f32;
        }
    });
}

/// `topk`: the k largest scores (ties to the lower index, NaN last), ascending indices.
pub fn topk(scores: &[f32], k: usize) -> Vec<usize> {
    let n = scores.len();
    let k = k.min(n);
    if k == 0 {
        return Vec::new();
    }
    let order = |a: &usize, b: &usize| -> Ordering {
        let (sa, sb) = (scores[*a], scores[*b]);
        sb.partial_cmp(&sa)
            .unwrap_or_else(|| sa.is_nan().cmp(&sb.is_nan()))
            .then(a.cmp(b))
    };
    let mut idx: Vec<usize> = (0..n).collect();
    if k < n {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_unstable();
    idx
}

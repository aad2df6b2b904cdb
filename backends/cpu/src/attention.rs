//! One query's sparse attention (window + compressed entries, K = V, per-head sink) and the
//! lightning indexer's scores and top-k. Both products go through the batch-invariant GEMM with
//! the heads as rows and the keys as the weight side; softmax sums run per head in key order.

use crate::exec::Exec;
use crate::gemm::{Weights, gemm};
use crate::math::{exp_f32, multiversion};
use std::cmp::Ordering;

multiversion! {
    /// Scale one head's logits, exponentiate them against `max` in place and return Σ e (f64,
    /// in key order).
    fn exp_row(row: &mut [f32], scale: f32, max: f32, sum: &mut f64) {
        let mut s = 0f64;
        for v in row.iter_mut() {
            let e = exp_f32(*v * scale - max);
            *v = e;
            s += f64::from(e);
        }
        *sum = s;
    }
}

/// `sparse_attention` for one query: q, out [heads, dim]; keys [n, dim].
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
    let mut p = vec![0f32; heads * n];
    gemm(ex, &Weights::rows(keys, n, dim), q, heads, &mut p);
    let mut den = vec![0f64; heads];
    for (h, row) in p.chunks_mut(n).enumerate() {
        let max = row.iter().fold(sink[h], |m, &l| m.max(l * scale));
        let mut sum = 0f64;
        exp_row(ex.isa, row, scale, max, &mut sum);
        den[h] = sum + (f64::from(sink[h]) - f64::from(max)).exp();
    }
    gemm(ex, &Weights::cols(keys, dim, n), &p, heads, out);
    for (o, &d) in out.chunks_mut(dim).zip(&den) {
        for v in o.iter_mut() {
            *v = (f64::from(*v) / d) as f32;
        }
    }
}

/// `indexer_scores`: out[j] = Σ_h w[h]·ReLU(q[h]·K[j]), heads summed in order in f64.
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
    if n == 0 {
        return;
    }
    let mut s = vec![0f32; heads * n];
    gemm(ex, &Weights::rows(keys, n, dim), q, heads, &mut s);
    let chunk = 256.min(n);
    ex.rows_mut(out, chunk, heads * chunk, |first, part| {
        let j0 = first * chunk;
        let mut acc = vec![0f64; part.len()];
        for (h, &wh) in w.iter().enumerate() {
            let row = &s[h * n + j0..h * n + j0 + part.len()];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += f64::from(wh) * f64::from(v.max(0.0));
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

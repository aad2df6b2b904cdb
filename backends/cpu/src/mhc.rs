//! mHC stream mixing (spec §3.1). The mixing logits W_fn·x̂ of all tokens are one batch-invariant
//! GEMM; the per-token rest (1/rms, sigmoids, Sinkhorn, weighted stream sums) is the reference's
//! f64 arithmetic in the reference's order, one token at a time.

use crate::exec::Exec;
use crate::gemm::{Weights, gemm_f64};
use crate::math::multiversion;
use crate::ops::sum_squares_f64;
use dsv4_kernels::mhc::sinkhorn;
use dsv4_kernels::{HcParams, MhcPre};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// m = (W_fn·x̂)·r for every token: [t, n_out] in f64.
fn mix_logits(ex: &Exec, p: &HcParams<'_>, x: &[f32], t: usize) -> (Vec<f64>, usize) {
    let md = p.m * p.d;
    assert_eq!(x.len(), t * md, "mhc: streams are not [T, M, D]");
    assert!(
        md > 0 && p.fn_w.len().is_multiple_of(md),
        "mhc: fn weight is not [n, M·D]"
    );
    let n_out = p.fn_w.len() / md;
    let mut mix = vec![0f64; t * n_out];
    gemm_f64(ex, &Weights::rows(p.fn_w, n_out, md), x, t, &mut mix);
    for ti in 0..t {
        let ms = sum_squares_f64(&x[ti * md..(ti + 1) * md]) / md as f64;
        let r = 1.0 / (ms + f64::from(p.norm_eps)).sqrt();
        for m in &mut mix[ti * n_out..(ti + 1) * n_out] {
            *m *= r;
        }
    }
    (mix, n_out)
}

/// Columns per step of the stream sums (a stack buffer of f64 partials).
const COLS: usize = 64;

multiversion! {
    /// u[c] = Σ_j pre_j·x[j, c] for one token: f64 products summed over the streams in order
    /// (the reference's arithmetic), vectorised across columns.
    fn merge_streams(pre: &[f64], xt: &[f32], d: usize, u: &mut [f32]) {
        for c0 in (0..d).step_by(COLS) {
            let w = COLS.min(d - c0);
            let mut acc = [0f64; COLS];
            for (j, &pj) in pre.iter().enumerate() {
                let xs = &xt[j * d + c0..j * d + c0 + w];
                for (a, &v) in acc.iter_mut().zip(xs) {
                    *a = if j == 0 { pj * f64::from(v) } else { *a + pj * f64::from(v) };
                }
            }
            for (o, &a) in u[c0..c0 + w].iter_mut().zip(&acc) {
                *o = a as f32;
            }
        }
    }
}

multiversion! {
    /// out[k, c] = post_k·y[c] + Σ_j C_{jk}·x[j, c] for one token, in the reference's f64
    /// arithmetic, vectorised across columns.
    fn post_token(xt: &[f32], y: &[f32], comb: &[f32], post: &[f32], d: usize, ot: &mut [f32]) {
        let m = post.len();
        for (k, &pk) in post.iter().enumerate() {
            let pk = f64::from(pk);
            for c0 in (0..d).step_by(COLS) {
                let w = COLS.min(d - c0);
                let mut acc = [0f64; COLS];
                for j in 0..m {
                    let cjk = f64::from(comb[j * m + k]);
                    let xs = &xt[j * d + c0..j * d + c0 + w];
                    for (a, &v) in acc.iter_mut().zip(xs) {
                        *a = if j == 0 { cjk * f64::from(v) } else { *a + cjk * f64::from(v) };
                    }
                }
                let outs = &mut ot[k * d + c0..k * d + c0 + w];
                for ((o, &a), &yv) in outs.iter_mut().zip(&acc).zip(&y[c0..c0 + w]) {
                    *o = (pk * f64::from(yv) + a) as f32;
                }
            }
        }
    }
}

/// `mhc_pre` for T tokens.
pub fn pre(ex: &Exec, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
    let (m, d) = (p.m, p.d);
    let mut out = MhcPre {
        u: vec![0.0; t * d],
        post: vec![0.0; t * m],
        comb: vec![0.0; t * m * m],
    };
    if t == 0 || m == 0 || d == 0 {
        return out;
    }
    let (mix, n_out) = mix_logits(ex, p, x, t);
    assert!(
        n_out >= (2 + m) * m && p.base.len() >= (2 + m) * m && p.scale.len() >= 3,
        "mhc_pre: parameters are not (2+M)·M wide"
    );
    let (s0, s1, s2) = (
        f64::from(p.scale[0]),
        f64::from(p.scale[1]),
        f64::from(p.scale[2]),
    );
    let b = |i: usize| f64::from(p.base[i]);
    let eps = f64::from(p.hc_eps);
    let pre_of =
        |mx: &[f64]| -> Vec<f64> { (0..m).map(|j| sigmoid(mx[j] * s0 + b(j)) + eps).collect() };
    // post_k and the Sinkhorn matrix of every token, [t, m + m·m].
    let width = m + m * m;
    let mut pc = vec![0f32; t * width];
    ex.rows_mut(
        &mut pc,
        width,
        64 * m * m * p.sinkhorn_iters.max(1),
        |first, rows| {
            for (i, row) in rows.chunks_mut(width).enumerate() {
                let mx = &mix[(first + i) * n_out..(first + i + 1) * n_out];
                for k in 0..m {
                    row[k] = (2.0 * sigmoid(mx[m + k] * s1 + b(m + k))) as f32;
                }
                let logits: Vec<f64> = (0..m * m)
                    .map(|i| mx[2 * m + i] * s2 + b(2 * m + i))
                    .collect();
                let c = sinkhorn(&logits, m, eps, p.sinkhorn_iters);
                for (o, v) in row[m..].iter_mut().zip(&c) {
                    *o = *v as f32;
                }
            }
        },
    );
    for (ti, row) in pc.chunks(width).enumerate() {
        out.post[ti * m..(ti + 1) * m].copy_from_slice(&row[..m]);
        out.comb[ti * m * m..(ti + 1) * m * m].copy_from_slice(&row[m..]);
    }
    ex.rows_mut(&mut out.u, d, m * d, |first, rows| {
        for (i, u) in rows.chunks_mut(d).enumerate() {
            let ti = first + i;
            let pre = pre_of(&mix[ti * n_out..(ti + 1) * n_out]);
            merge_streams(ex.isa, &pre, &x[ti * m * d..(ti + 1) * m * d], d, u);
        }
    });
    out
}

/// `mhc_post`: out[t, k] = post_k·y[t] + Σ_j C_{jk}·x[t, j] (f64, as the reference).
pub fn post(ex: &Exec, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
    if m == 0 || d == 0 {
        return;
    }
    let t = y.len() / d;
    assert!(
        x.len() == t * m * d && out.len() == t * m * d,
        "mhc_post: streams are not [T, M, D]"
    );
    assert!(
        pre.post.len() >= t * m && pre.comb.len() >= t * m * m,
        "mhc_post: pre step is for fewer tokens"
    );
    ex.rows_mut(out, m * d, m * m * d, |first, rows| {
        for (i, ot) in rows.chunks_mut(m * d).enumerate() {
            let ti = first + i;
            post_token(
                ex.isa,
                &x[ti * m * d..(ti + 1) * m * d],
                &y[ti * d..(ti + 1) * d],
                &pre.comb[ti * m * m..(ti + 1) * m * m],
                &pre.post[ti * m..(ti + 1) * m],
                d,
                ot,
            );
        }
    });
}

/// `hc_head`: h[t] = Σ_j (σ(m_j·s + b_j) + hc_eps)·x[t, j].
pub fn head(ex: &Exec, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
    let (m, d) = (p.m, p.d);
    assert_eq!(out.len(), t * d, "hc_head: output is not [T, D]");
    if t == 0 || m == 0 || d == 0 {
        return;
    }
    let (mix, n_out) = mix_logits(ex, p, x, t);
    assert!(
        n_out >= m && p.base.len() >= m && !p.scale.is_empty(),
        "hc_head: parameters are not M wide"
    );
    ex.rows_mut(out, d, m * d, |first, rows| {
        for (i, h) in rows.chunks_mut(d).enumerate() {
            let ti = first + i;
            let mx = &mix[ti * n_out..(ti + 1) * n_out];
            let pre: Vec<f64> = (0..m)
                .map(|j| {
                    sigmoid(mx[j] * f64::from(p.scale[0]) + f64::from(p.base[j]))
                        + f64::from(p.hc_eps)
                })
                .collect();
            merge_streams(ex.isa, &pre, &x[ti * m * d..(ti + 1) * m * d], d, h);
        }
    });
}

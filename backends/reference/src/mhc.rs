//! mHC (manifold-constrained hyper-connections, spec §3.1): stream mixing before and after each
//! sublayer, with the Sinkhorn-normalised combination matrix, and the head's stream merge.

use dsv4_kernels::mhc::sinkhorn;
use dsv4_kernels::{HcParams, MhcPre};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// m = (W_fn·x̂)·r for one token's flattened streams x̂ [M·D].
fn mix_logits(p: &HcParams<'_>, xt: &[f32]) -> Vec<f64> {
    let md = p.m * p.d;
    let ms: f64 = xt.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / md as f64;
    let r = 1.0 / (ms + f64::from(p.norm_eps)).sqrt();
    p.fn_w
        .chunks(md)
        .map(|w| {
            w.iter()
                .zip(xt)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>()
                * r
        })
        .collect()
}

pub fn pre(p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
    let (m, d) = (p.m, p.d);
    let (s0, s1, s2) = (
        f64::from(p.scale[0]),
        f64::from(p.scale[1]),
        f64::from(p.scale[2]),
    );
    let b = |i: usize| f64::from(p.base[i]);
    let eps = f64::from(p.hc_eps);
    let mut out = MhcPre {
        u: vec![0.0; t * d],
        post: vec![0.0; t * m],
        comb: vec![0.0; t * m * m],
    };
    for ti in 0..t {
        let xt = &x[ti * m * d..(ti + 1) * m * d];
        let mix = mix_logits(p, xt);
        let pre: Vec<f64> = (0..m).map(|j| sigmoid(mix[j] * s0 + b(j)) + eps).collect();
        for k in 0..m {
            out.post[ti * m + k] = (2.0 * sigmoid(mix[m + k] * s1 + b(m + k))) as f32;
        }
        let logits: Vec<f64> = (0..m * m)
            .map(|i| mix[2 * m + i] * s2 + b(2 * m + i))
            .collect();
        let c = sinkhorn(&logits, m, eps, p.sinkhorn_iters);
        for (o, v) in out.comb[ti * m * m..(ti + 1) * m * m].iter_mut().zip(&c) {
            *o = *v as f32;
        }
        for c in 0..d {
            let s: f64 = (0..m).map(|j| pre[j] * f64::from(xt[j * d + c])).sum();
            out.u[ti * d + c] = s as f32;
        }
    }
    out
}

pub fn post(x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]) {
    let t = y.len() / d;
    for ti in 0..t {
        let xt = &x[ti * m * d..(ti + 1) * m * d];
        let comb = &pre.comb[ti * m * m..(ti + 1) * m * m];
        for k in 0..m {
            let post = f64::from(pre.post[ti * m + k]);
            for c in 0..d {
                let mixed: f64 = (0..m)
                    .map(|j| f64::from(comb[j * m + k]) * f64::from(xt[j * d + c]))
                    .sum();
                out[ti * m * d + k * d + c] = (post * f64::from(y[ti * d + c]) + mixed) as f32;
            }
        }
    }
}

pub fn head(p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
    let (m, d) = (p.m, p.d);
    for ti in 0..t {
        let xt = &x[ti * m * d..(ti + 1) * m * d];
        let mix = mix_logits(p, xt);
        let pre: Vec<f64> = (0..m)
            .map(|j| {
                sigmoid(mix[j] * f64::from(p.scale[0]) + f64::from(p.base[j])) + f64::from(p.hc_eps)
            })
            .collect();
        for c in 0..d {
            out[ti * d + c] = (0..m)
                .map(|j| pre[j] * f64::from(xt[j * d + c]))
                .sum::<f64>() as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_like_mixing_passes_streams_through() {
        // Zero weights: m = 0, so pre_j = σ(b_j) + eps, post = 2σ(b), C from the bias alone.
        let (m, d) = (2, 3);
        let fn_w = vec![0f32; (2 + m) * m * m * d];
        let mut base = vec![0f32; (2 + m) * m];
        base[2 * m] = 20.0; // C_00 large
        base[2 * m + 3] = 20.0; // C_11 large
        let p = HcParams {
            fn_w: &fn_w,
            base: &base,
            scale: &[1.0, 1.0, 1.0],
            m,
            d,
            norm_eps: 1e-6,
            hc_eps: 1e-6,
            sinkhorn_iters: 20,
        };
        let x: Vec<f32> = (0..m * d).map(|i| i as f32 + 1.0).collect();
        let pre_out = pre(&p, &x, 1);
        assert!((pre_out.post[0] - 1.0).abs() < 1e-6);
        // u = Σ (0.5 + eps)·X_j
        assert!((pre_out.u[0] - (0.5 * 1.0 + 0.5 * 4.0)).abs() < 1e-4);
        let mut o = vec![0f32; m * d];
        post(&x, &[0.0; 3], &pre_out, m, d, &mut o);
        for (a, b) in o.iter().zip(&x) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}

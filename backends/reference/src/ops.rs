//! Element-wise, row-wise and reduction ops of the reference backend.

use dsv4_core::codec::{E4M3_MAX, e4m3_to_f32, f32_to_e4m3, pow2_ceil_exponent};
use dsv4_kernels::linear::FP8_BLOCK;
use dsv4_kernels::{Linear, RopeTable};

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

pub fn linear(w: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
    let (o, i) = (w.out_dim, w.in_dim);
    assert_eq!(
        x.len(),
        rows * i,
        "linear {}: input is not [rows, in]",
        w.name
    );
    assert_eq!(
        out.len(),
        rows * o,
        "linear {}: output is not [rows, out]",
        w.name
    );
    let wd = w.dequantized();
    for r in 0..rows {
        let xr = &x[r * i..(r + 1) * i];
        for c in 0..o {
            out[r * o + c] = dot(&wd[c * i..(c + 1) * i], xr) as f32;
        }
    }
}

pub fn act_quant_fp8(x: &mut [f32], dim: usize) {
    for row in x.chunks_mut(dim) {
        for block in row.chunks_mut(FP8_BLOCK) {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let e = pow2_ceil_exponent(f64::from(amax.max(1e-4)) / f64::from(E4M3_MAX));
            let scale = 2f64.powi(e) as f32;
            for v in block.iter_mut() {
                *v = e4m3_to_f32(f32_to_e4m3(*v / scale)) * scale;
            }
        }
    }
}

pub fn rms_norm(x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
    for (xr, or) in x.chunks(dim).zip(out.chunks_mut(dim)) {
        let ms = dot(xr, xr) / dim as f64;
        let r = 1.0 / (ms + f64::from(eps)).sqrt();
        for (c, (o, &v)) in or.iter_mut().zip(xr).enumerate() {
            let wv = weight.map_or(1.0, |w| f64::from(w[c]));
            *o = (f64::from(v) * r * wv) as f32;
        }
    }
}

pub fn rope(x: &mut [f32], dim: usize, positions: &[usize], table: &RopeTable, inverse: bool) {
    let rd = table.rd;
    for (r, row) in x.chunks_mut(dim).enumerate() {
        let p = positions[r] as f64;
        let tail = &mut row[dim - rd..];
        for (i, &theta) in table.freqs.iter().enumerate() {
            let angle = if inverse { -p * theta } else { p * theta };
            let (s, c) = angle.sin_cos();
            let (a, b) = (f64::from(tail[2 * i]), f64::from(tail[2 * i + 1]));
            tail[2 * i] = (a * c - b * s) as f32;
            tail[2 * i + 1] = (a * s + b * c) as f32;
        }
    }
}

pub fn softmax_pool(a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
    for c in 0..width {
        let max = (0..rows)
            .map(|r| z[r * width + c])
            .fold(f32::NEG_INFINITY, f32::max);
        let (mut num, mut den) = (0f64, 0f64);
        for r in 0..rows {
            let zr = z[r * width + c];
            if zr == f32::NEG_INFINITY {
                continue;
            }
            let e = (f64::from(zr) - f64::from(max)).exp();
            num += e * f64::from(a[r * width + c]);
            den += e;
        }
        out[c] = if den > 0.0 { (num / den) as f32 } else { 0.0 };
    }
}

pub fn hadamard(x: &mut [f32], dim: usize) {
    assert!(
        dim.is_power_of_two(),
        "hadamard needs a power-of-two width, got {dim}"
    );
    let norm = 1.0 / (dim as f64).sqrt();
    let mut tmp = vec![0f32; dim];
    for row in x.chunks_mut(dim) {
        for (i, t) in tmp.iter_mut().enumerate() {
            // Sylvester ordering: H[i][j] = (−1)^popcount(i & j).
            let s: f64 = row
                .iter()
                .enumerate()
                .map(|(j, &v)| {
                    if (i & j).count_ones() % 2 == 0 {
                        f64::from(v)
                    } else {
                        -f64::from(v)
                    }
                })
                .sum();
            *t = (s * norm) as f32;
        }
        row.copy_from_slice(&tmp);
    }
}

pub fn indexer_scores(q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
    let heads = w.len();
    for (j, k) in keys.chunks(dim).enumerate() {
        let s: f64 = (0..heads)
            .map(|h| f64::from(w[h]) * dot(&q[h * dim..(h + 1) * dim], k).max(0.0))
            .sum();
        out[j] = s as f32;
    }
}

pub fn topk(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    // Larger score first; equal scores: lower index first. NaN sorts last.
    idx.sort_by(|&a, &b| {
        let (sa, sb) = (scores[a], scores[b]);
        sb.partial_cmp(&sa)
            .unwrap_or_else(|| sa.is_nan().cmp(&sb.is_nan()))
            .then(a.cmp(&b))
    });
    idx.truncate(k.min(scores.len()));
    idx.sort_unstable();
    idx
}

pub fn sparse_attention(
    q: &[f32],
    dim: usize,
    keys: &[f32],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let heads = sink.len();
    let n = keys.len() / dim;
    for h in 0..heads {
        let qh = &q[h * dim..(h + 1) * dim];
        let logits: Vec<f64> = keys
            .chunks(dim)
            .map(|k| dot(qh, k) * f64::from(scale))
            .collect();
        let max = logits.iter().copied().fold(f64::from(sink[h]), f64::max);
        let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let den: f64 = weights.iter().sum::<f64>() + (f64::from(sink[h]) - max).exp();
        for c in 0..dim {
            let num: f64 = (0..n)
                .map(|s| weights[s] * f64::from(keys[s * dim + c]))
                .sum();
            out[h * dim + c] = (num / den) as f32;
        }
    }
}

pub fn router_scores(logits: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(logits) {
        let x = f64::from(x);
        // softplus(x) = log(1 + e^x), computed without overflow.
        let sp = if x > 0.0 {
            x + (-x).exp().ln_1p()
        } else {
            x.exp().ln_1p()
        };
        *o = sp.sqrt() as f32;
    }
}

pub fn swiglu(g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
    for ((o, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
        let gv = f64::from(gv.min(limit));
        let uv = f64::from(uv.clamp(-limit, limit));
        let silu = gv / (1.0 + (-gv).exp());
        *o = (silu * uv * f64::from(weight)) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sink_only_enlarges_the_denominator() {
        // Two keys, one head: without a sink (−∞ → weight 0) the output is the softmax average;
        // with a sink the same numerator is divided by a larger denominator.
        let q = [1.0f32, 0.0];
        let keys = [1.0f32, 2.0, 0.0, 4.0];
        let mut no_sink = [0f32; 2];
        sparse_attention(&q, 2, &keys, &[f32::NEG_INFINITY], 1.0, &mut no_sink);
        let (e1, e0) = (1f64.exp(), 0f64.exp());
        assert!((f64::from(no_sink[1]) - (e1 * 2.0 + e0 * 4.0) / (e1 + e0)).abs() < 1e-6);
        let mut with_sink = [0f32; 2];
        sparse_attention(&q, 2, &keys, &[0.5], 1.0, &mut with_sink);
        let ratio = (e1 + e0) / (e1 + e0 + 0.5f64.exp());
        for c in 0..2 {
            assert!((f64::from(with_sink[c]) - f64::from(no_sink[c]) * ratio).abs() < 1e-6);
        }
    }

    #[test]
    fn topk_over_fewer_entries_than_k_and_ties_to_lower_index() {
        assert_eq!(topk(&[0.3, 0.9], 16), vec![0, 1]);
        assert_eq!(topk(&[], 4), Vec::<usize>::new());
        assert_eq!(topk(&[1.0, 2.0, 2.0, 0.5, 2.0], 2), vec![1, 2]);
        assert_eq!(topk(&[f32::NAN, 1.0, 0.0], 2), vec![1, 2]);
    }

    #[test]
    fn softmax_pool_ignores_minus_infinity_rows() {
        let a = [5.0f32, 1.0, 3.0, 7.0];
        let z = [f32::NEG_INFINITY, 0.0, 0.0, 0.0];
        let mut out = [0f32; 2];
        softmax_pool(&a, &z, 2, 2, &mut out);
        assert_eq!(out[0], 3.0);
        assert!((out[1] - 4.0).abs() < 1e-6);
    }

    #[test]
    fn hadamard_is_orthonormal_and_sylvester_ordered() {
        let mut x = [1.0f32, 0.0, 0.0, 0.0];
        hadamard(&mut x, 4);
        assert_eq!(x, [0.5; 4]);
        let mut y = [0.0f32, 1.0, 0.0, 0.0];
        hadamard(&mut y, 4);
        assert_eq!(y, [0.5, -0.5, 0.5, -0.5]);
        hadamard(&mut y, 4);
        assert!((y[1] - 1.0).abs() < 1e-7 && y[0].abs() < 1e-7);
    }

    #[test]
    fn swiglu_clamps_and_rope_inverts() {
        let mut o = [0f32; 2];
        swiglu(&[100.0, -1.0], &[-50.0, 2.0], 10.0, 1.0, &mut o);
        let silu10 = 10.0 / (1.0 + (-10f64).exp());
        assert!((f64::from(o[0]) - silu10 * -10.0).abs() < 1e-4);
        let t = RopeTable::plain(4, 10000.0);
        let orig = [0.3f32, 1.0, 2.0, -1.0, 0.5, 0.25];
        let mut x = orig;
        rope(&mut x, 6, &[17], &t, false);
        assert_eq!(&x[..2], &orig[..2]);
        assert!(x[2] != orig[2]);
        rope(&mut x, 6, &[17], &t, true);
        for (a, b) in x.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-6);
        }
    }
}

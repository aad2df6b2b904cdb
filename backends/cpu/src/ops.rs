//! Row-wise and element-wise ops: activation quantization, RMSNorm, RoPE, compressor pooling,
//! Hadamard rotation, router scores and the clamped SwiGLU. Every reduction runs inside one row
//! in a fixed order, and rows are independent, so splitting rows over threads changes nothing.

use crate::exec::{Exec, Isa};
use crate::math::{exp_f64, multiversion, round_e4m3};
use dsv4_core::codec::{E4M3_MAX, checked_pow2_ceil_exponent};
use dsv4_kernels::RopeTable;
use dsv4_kernels::linear::FP8_BLOCK;

/// Σ v² in f64 over eight interleaved lanes, combined in a fixed tree.
pub(crate) fn sum_squares_f64(v: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f64::from(x) * f64::from(x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a += f64::from(x) * f64::from(x);
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

multiversion! {
    /// Quantize-dequantize every 1×128 block of a row to e4m3 with a power-of-two scale.
    fn act_quant_row(row: &mut [f32]) {
        for block in row.chunks_mut(FP8_BLOCK) {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let ratio = f64::from(amax.max(1e-4)) / f64::from(E4M3_MAX);
            // A non-finite amax (∞ input) has no exponent; the largest scale keeps it finite.
            let e = checked_pow2_ceil_exponent(ratio).unwrap_or(127).min(127);
            let scale = 2f64.powi(e) as f32;
            for v in block.iter_mut() {
                *v = round_e4m3(*v / scale) * scale;
            }
        }
    }
}

/// `act_quant_fp8`: rows of width `dim`, in place.
pub fn act_quant_fp8(ex: &Exec, x: &mut [f32], dim: usize) {
    if dim == 0 {
        return;
    }
    let isa = ex.isa;
    ex.rows_mut(x, dim, dim * 4, |_, rows| {
        rows.chunks_mut(dim).for_each(|r| act_quant_row(isa, r));
    });
}

/// `rms_norm`: x / sqrt(mean(x²) + eps) · weight, per row (f64 statistics).
pub fn rms_norm(
    ex: &Exec,
    x: &[f32],
    weight: Option<&[f32]>,
    dim: usize,
    eps: f32,
    out: &mut [f32],
) {
    assert_eq!(
        x.len(),
        out.len(),
        "rms_norm: input and output differ in size"
    );
    if let Some(w) = weight {
        assert_eq!(w.len(), dim, "rms_norm: weight is not [dim]");
    }
    if dim == 0 {
        return;
    }
    ex.rows_mut(out, dim, dim * 2, |first, rows| {
        for (i, or) in rows.chunks_mut(dim).enumerate() {
            let xr = &x[(first + i) * dim..(first + i + 1) * dim];
            let ms = sum_squares_f64(xr) / dim as f64;
            let r = 1.0 / (ms + f64::from(eps)).sqrt();
            match weight {
                Some(w) => {
                    for ((o, &v), &wv) in or.iter_mut().zip(xr).zip(w) {
                        *o = (f64::from(v) * r * f64::from(wv)) as f32;
                    }
                }
                None => {
                    for (o, &v) in or.iter_mut().zip(xr) {
                        *o = (f64::from(v) * r) as f32;
                    }
                }
            }
        }
    });
}

/// `rope`: rotate the last `table.rd` dims of each row by ±p·θ_i (f64 angles and products, as
/// the reference); sin/cos are computed once per run of rows sharing a position.
pub fn rope(
    ex: &Exec,
    x: &mut [f32],
    dim: usize,
    positions: &[usize],
    table: &RopeTable,
    inverse: bool,
) {
    let rd = table.rd;
    assert!(
        rd <= dim && rd.is_multiple_of(2),
        "rope: rotary dims {rd} do not fit rows of {dim}"
    );
    assert_eq!(positions.len() * dim, x.len(), "rope: one position per row");
    if dim == 0 || rd == 0 {
        return;
    }
    ex.rows_mut(x, dim, rd * 8, |first, rows| {
        let mut cached: Option<usize> = None;
        let mut sc = vec![(0f64, 0f64); table.freqs.len()];
        for (i, row) in rows.chunks_mut(dim).enumerate() {
            let p = positions[first + i];
            if cached != Some(p) {
                let pf = p as f64;
                for (s, &theta) in sc.iter_mut().zip(&table.freqs) {
                    let angle = if inverse { -pf * theta } else { pf * theta };
                    *s = angle.sin_cos();
                }
                cached = Some(p);
            }
            let tail = &mut row[dim - rd..];
            for (pair, &(s, c)) in tail.chunks_exact_mut(2).zip(&sc) {
                let (a, b) = (f64::from(pair[0]), f64::from(pair[1]));
                pair[0] = (a * c - b * s) as f32;
                pair[1] = (a * s + b * c) as f32;
            }
        }
    });
}

multiversion! {
    /// Per-column softmax-weighted sum over rows (f64, as the reference), columns
    /// `c0..c0+out.len()`.
    fn pool_columns(a: &[f32], z: &[f32], rows: usize, width: usize, c0: usize, out: &mut [f32]) {
        let w = out.len();
        let mut max = vec![f32::NEG_INFINITY; w];
        for r in 0..rows {
            let zr = &z[r * width + c0..r * width + c0 + w];
            for (m, &v) in max.iter_mut().zip(zr) {
                *m = m.max(v);
            }
        }
        let mut num = vec![0f64; w];
        let mut den = vec![0f64; w];
        for r in 0..rows {
            let zr = &z[r * width + c0..r * width + c0 + w];
            let ar = &a[r * width + c0..r * width + c0 + w];
            for c in 0..w {
                // Rows with z = −∞ get weight 0 (also when every row is −∞).
                let e = if zr[c] == f32::NEG_INFINITY {
                    0.0
                } else {
                    exp_f64(f64::from(zr[c]) - f64::from(max[c]))
                };
                num[c] += e * f64::from(ar[c]);
                den[c] += e;
            }
        }
        for c in 0..w {
            out[c] = if den[c] > 0.0 { (num[c] / den[c]) as f32 } else { 0.0 };
        }
    }
}

/// `softmax_pool`: out[c] = Σ_r softmax_r(z[·, c])·a[r, c].
pub fn softmax_pool(ex: &Exec, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
    assert!(
        a.len() >= rows * width && z.len() >= rows * width,
        "softmax_pool: inputs are not [rows, width]"
    );
    assert_eq!(out.len(), width, "softmax_pool: output is not [width]");
    if width == 0 {
        return;
    }
    let isa = ex.isa;
    // Columns are independent: split them in chunks of 64.
    ex.rows_mut(out, 64.min(width), rows * 8, |first, cols| {
        let c0 = first * 64.min(width);
        pool_columns(isa, a, z, rows, width, c0, cols);
    });
}

/// `hadamard`: fast Walsh–Hadamard transform per row (Sylvester order) in f64, scaled by
/// 1/sqrt(dim).
pub fn hadamard(ex: &Exec, x: &mut [f32], dim: usize) {
    assert!(
        dim.is_power_of_two(),
        "hadamard needs a power-of-two width, got {dim}"
    );
    let norm = 1.0 / (dim as f64).sqrt();
    ex.rows_mut(x, dim, dim * 8, |_, rows| {
        let mut buf = vec![0f64; dim];
        for row in rows.chunks_mut(dim) {
            for (b, &v) in buf.iter_mut().zip(row.iter()) {
                *b = f64::from(v);
            }
            let mut h = 1;
            while h < dim {
                for block in buf.chunks_exact_mut(2 * h) {
                    let (lo, hi) = block.split_at_mut(h);
                    for (u, v) in lo.iter_mut().zip(hi.iter_mut()) {
                        let (s, d) = (*u + *v, *u - *v);
                        *u = s;
                        *v = d;
                    }
                }
                h *= 2;
            }
            for (v, &b) in row.iter_mut().zip(&buf) {
                *v = (b * norm) as f32;
            }
        }
    });
}

/// `router_scores`: sqrt(softplus(x)) in f64, as the reference.
pub fn router_scores(logits: &[f32], out: &mut [f32]) {
    assert_eq!(
        logits.len(),
        out.len(),
        "router_scores: input and output differ in size"
    );
    for (o, &x) in out.iter_mut().zip(logits) {
        let x = f64::from(x);
        let sp = if x > 0.0 {
            x + (-x).exp().ln_1p()
        } else {
            x.exp().ln_1p()
        };
        *o = sp.sqrt() as f32;
    }
}

multiversion! {
    /// silu(min(g, L))·clamp(u, −L, L)·weight in f64, as the reference.
    fn swiglu_f64(g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
        for ((o, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
            let gv = f64::from(gv.min(limit));
            // As the reference (`clamp`), without its panic on a negative or NaN limit.
            let uv = f64::from(if limit >= 0.0 { uv.clamp(-limit, limit) } else { uv.max(-limit).min(limit) });
            let silu = gv / (1.0 + exp_f64(-gv));
            *o = (silu * uv * f64::from(weight)) as f32;
        }
    }
}

/// `swiglu`: out = silu(min(g, L))·clamp(u, −L, L)·weight.
pub fn swiglu(isa: Isa, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
    assert!(
        g.len() == out.len() && u.len() == out.len(),
        "swiglu: g, u and out differ in size"
    );
    swiglu_f64(isa, g, u, limit, weight, out);
}

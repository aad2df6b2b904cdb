//! Shared helpers of the cpu backend's integration tests: seeded random inputs and weights in
//! every format, and error metrics.

#![allow(dead_code)]

use dsv4_core::SplitMix64;
use dsv4_core::codec::{f32_to_bf16, pack_e2m1};
use dsv4_kernels::{Linear, WeightFormat};

/// `n` values uniform in [-a, a).
pub fn vec_sym(g: &mut SplitMix64, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| g.uniform_sym(a)).collect()
}

/// Relative L2 error of `got` against `want`.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Whether two slices hold the same bits.
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// How many elements of `a` and `b` differ in their bits.
pub fn differing_bits(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(p, q)| p.to_bits() != q.to_bits())
        .count()
}

/// A random weight [n, k] in `format`: e4m3 codes drawn from every finite code (subnormals
/// included), e2m1 from every code, scales around 2^-4 (fp8) and 2^-3 (MXFP4).
pub fn random_linear(format: WeightFormat, n: usize, k: usize, seed: u64) -> Linear {
    let mut g = SplitMix64::new(seed);
    let (data, scale) = match format {
        WeightFormat::F32 => (
            (0..n * k)
                .flat_map(|_| g.uniform_sym(0.1).to_le_bytes())
                .collect(),
            vec![],
        ),
        WeightFormat::Bf16 => (
            (0..n * k)
                .flat_map(|_| f32_to_bf16(g.uniform_sym(0.1)).to_le_bytes())
                .collect(),
            vec![],
        ),
        WeightFormat::Fp8Block => {
            let data = (0..n * k)
                .map(|_| {
                    let c = g.below(0x7F) as u8; // 0..=0x7E: never the NaN code
                    c | (g.below(2) as u8) << 7
                })
                .collect();
            let scales = n.div_ceil(128) * k.div_ceil(128);
            (data, (0..scales).map(|_| 115 + g.below(8) as u8).collect())
        }
        WeightFormat::Mxfp4 => {
            let codes: Vec<u8> = (0..n * k).map(|_| g.below(16) as u8).collect();
            let scales = (0..n * k / 32).map(|_| 120 + g.below(8) as u8).collect();
            (pack_e2m1(&codes), scales)
        }
    };
    Linear::new(format!("{format:?}"), n, k, format, data, scale).expect("sizes fit the format")
}

/// The four weight formats.
pub const FORMATS: [WeightFormat; 4] = [
    WeightFormat::F32,
    WeightFormat::Bf16,
    WeightFormat::Fp8Block,
    WeightFormat::Mxfp4,
];

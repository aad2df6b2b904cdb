//! Cases of `linear` (every weight format; fp8/fp4 weights with and without fp8 activation
//! quantization, as the model runs them) and of `act_quant_fp8`.

use crate::Op;
use crate::ops::case::{Case, Runner, SizeClass, uniform, uniform_std};
use crate::ops::harness::{GuardedF32, Produced, Ran, call};
use dsv4_core::ActQuant;
use dsv4_core::SplitMix64;
use dsv4_core::codec::f32_to_bf16;
use dsv4_kernels::{Linear, WeightFormat};
use dsv4_model::tiny::{quantize_fp8_blocks, quantize_mxfp4};
use std::sync::Arc;

fn format_name(f: WeightFormat) -> &'static str {
    match f {
        WeightFormat::F32 => "f32",
        WeightFormat::Bf16 => "bf16",
        WeightFormat::Fp8Block => "fp8",
        WeightFormat::Mxfp4 => "mxfp4",
    }
}

/// A random `[out, in]` weight in `format` with entries of std 1/sqrt(in).
pub(crate) fn random_linear(
    rng: &mut SplitMix64,
    name: &str,
    out: usize,
    inp: usize,
    format: WeightFormat,
) -> Result<Linear, String> {
    let w = uniform_std(rng, out * inp, 1.0 / (inp as f32).sqrt());
    let (data, scale) = match format {
        WeightFormat::F32 => (w.iter().flat_map(|v| v.to_le_bytes()).collect(), vec![]),
        WeightFormat::Bf16 => (
            w.iter()
                .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
                .collect(),
            vec![],
        ),
        WeightFormat::Fp8Block => quantize_fp8_blocks(&w, out, inp).map_err(|e| e.to_string())?,
        WeightFormat::Mxfp4 => quantize_mxfp4(&w, out, inp).map_err(|e| e.to_string())?,
    };
    Linear::new(name, out, inp, format, data, scale).map_err(|e| e.to_string())
}

fn linear_case(
    class: SizeClass,
    (rows, inp, out): (usize, usize, usize),
    format: WeightFormat,
    act: ActQuant,
) -> Case {
    let shape = format!("{rows}x{inp}->{out}.{}", format_name(format));
    let numerics = format.is_low_precision().then(|| format!("act={act}"));
    let stored = match format {
        WeightFormat::F32 => out * inp * 4,
        WeightFormat::Bf16 => out * inp * 2,
        WeightFormat::Fp8Block => out * inp + out.div_ceil(128) * inp.div_ceil(128),
        WeightFormat::Mxfp4 => out * inp / 2 + out * inp / 32,
    };
    let cost = (
        2.0 * (rows * inp * out) as f64,
        (stored + 4 * rows * (inp + out)) as f64,
    );
    let name = shape.clone();
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let w = Arc::new(random_linear(rng, &name, out, inp, format)?);
        let x = uniform_std(rng, rows * inp, 1.0);
        Ok(Box::new(move |be| {
            let mut xin = x.clone();
            let mut y = GuardedF32::poisoned(rows * out);
            let ((), elapsed) = call(|| {
                if act == ActQuant::Fp8 {
                    be.act_quant_fp8(&mut xin, inp);
                }
                be.linear(&w, &xin, rows, y.slice_mut());
            })?;
            Ok(Ran {
                out: Produced::Values(y.into_output("out")?),
                elapsed,
            })
        }))
    });
    Case::new(Op::Linear, class, shape, numerics, cost, build)
}

/// Linear cases; every fp8/fp4 shape runs with `act_quant` none and fp8.
fn linear_cases() -> Vec<Case> {
    use SizeClass::*;
    use WeightFormat::*;
    let both = [ActQuant::None, ActQuant::Fp8];
    let mut v = Vec::new();
    let mut quantized = |class, shape, format, full: bool| {
        for act in both {
            let c = linear_case(class, shape, format, act);
            v.push(if full { c.full_only() } else { c });
        }
    };
    // Tiny model: wq_a, wq_b (H·hd = 512), experts (MXFP4).
    quantized(Tiny, (3, 256, 128), Fp8Block, false);
    quantized(Tiny, (3, 128, 512), Fp8Block, false);
    quantized(Tiny, (3, 256, 128), Mxfp4, false);
    quantized(Tiny, (3, 128, 256), Mxfp4, false);
    // Partial 128-blocks of weight scales and activation blocks.
    quantized(Odd, (5, 160, 97), Fp8Block, false);
    quantized(Odd, (2, 96, 13), Mxfp4, false);
    quantized(Odd, (1, 32, 1), Mxfp4, false);
    // Flash: wq_a, wkv, experts w1/w3 and w2; wq_b (32768 outputs) and prefill rows with --full.
    quantized(Flash, (1, 4096, 1024), Fp8Block, false);
    quantized(Flash, (1, 4096, 512), Fp8Block, false);
    quantized(Flash, (1, 4096, 2048), Mxfp4, false);
    quantized(Flash, (1, 2048, 4096), Mxfp4, false);
    quantized(Flash, (1, 1024, 32768), Fp8Block, true);
    quantized(Flash, (16, 4096, 1024), Fp8Block, true);
    quantized(Flash, (8, 4096, 2048), Mxfp4, true);
    v.push(linear_case(Tiny, (3, 256, 384), Bf16, ActQuant::None));
    v.push(linear_case(Tiny, (3, 256, 8), Bf16, ActQuant::None));
    v.push(linear_case(Tiny, (2, 1024, 24), F32, ActQuant::None));
    v.push(linear_case(Odd, (5, 67, 33), F32, ActQuant::None));
    v.push(linear_case(Odd, (3, 67, 33), Bf16, ActQuant::None));
    // Flash router gate [256, 4096] bf16 and indexer weights_proj [64, 4096] bf16.
    v.push(linear_case(Flash, (2, 4096, 256), Bf16, ActQuant::None));
    v.push(linear_case(Flash, (2, 4096, 64), Bf16, ActQuant::None));
    v
}

/// Rows whose 128-blocks span magnitudes 1e-3..1e3, with an all-zero block when there is room.
fn act_inputs(rng: &mut SplitMix64, rows: usize, dim: usize) -> Vec<f32> {
    let mut x = uniform(rng, rows * dim, 1.0);
    for row in x.chunks_mut(dim) {
        for (b, block) in row.chunks_mut(128).enumerate() {
            let mag = 10f32.powf(rng.uniform_sym(3.0));
            let zero = b == 1;
            block
                .iter_mut()
                .for_each(|v| *v = if zero { 0.0 } else { *v * mag });
        }
    }
    x
}

fn act_quant_case(class: SizeClass, rows: usize, dim: usize) -> Case {
    let n = rows * dim;
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let x = act_inputs(rng, rows, dim);
        Ok(Box::new(move |be| {
            let mut g = GuardedF32::with_values(&x);
            let ((), elapsed) = call(|| be.act_quant_fp8(g.slice_mut(), dim))?;
            Ok(Ran {
                out: Produced::Values(g.into_in_place("x")?),
                elapsed,
            })
        }))
    });
    Case::new(
        Op::ActQuantFp8,
        class,
        format!("{rows}x{dim}"),
        None,
        (3.0 * n as f64, 8.0 * n as f64),
        build,
    )
}

/// Every case of this module.
pub(crate) fn cases() -> Vec<Case> {
    let mut v = linear_cases();
    v.push(act_quant_case(SizeClass::Tiny, 3, 256));
    v.push(act_quant_case(SizeClass::Odd, 2, 200));
    v.push(act_quant_case(SizeClass::Odd, 1, 7));
    v.push(act_quant_case(SizeClass::Flash, 4, 4096));
    v
}

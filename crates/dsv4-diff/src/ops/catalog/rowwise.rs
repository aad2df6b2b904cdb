//! Cases of the row-wise and element-wise ops: `rms_norm`, `rope`, `hadamard`,
//! `round_index_rows`, `router_scores`, `swiglu`.

use crate::Op;
use crate::ops::case::{Case, Runner, SizeClass, uniform};
use crate::ops::harness::{GuardedF32, Produced, Ran, call};
use dsv4_core::{IndexKDtype, SplitMix64};
use dsv4_kernels::RopeTable;
use dsv4_kernels::rope::Yarn;
use std::sync::Arc;

/// Rows of `dim` values, each row scaled by its own magnitude in 10^[-2, 2].
fn scaled_rows(rng: &mut SplitMix64, rows: usize, dim: usize) -> Vec<f32> {
    let mut x = uniform(rng, rows * dim, 1.0);
    for row in x.chunks_mut(dim) {
        let mag = 10f32.powf(rng.uniform_sym(2.0));
        row.iter_mut().for_each(|v| *v *= mag);
    }
    x
}

fn rms_norm_case(class: SizeClass, rows: usize, dim: usize, weighted: bool) -> Case {
    let n = (rows * dim) as f64;
    let shape = format!("{rows}x{dim}{}", if weighted { ".w" } else { "" });
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let x = scaled_rows(rng, rows, dim);
        let w: Option<Vec<f32>> =
            weighted.then(|| uniform(rng, dim, 0.5).iter().map(|v| 1.0 + v).collect());
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(rows * dim);
            let ((), elapsed) = call(|| be.rms_norm(&x, w.as_deref(), dim, 1e-6, out.slice_mut()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    Case::new(Op::RmsNorm, class, shape, None, (4.0 * n, 8.0 * n), build)
}

/// The Flash config's YaRN parameters (spec §1).
fn flash_yarn() -> Yarn {
    Yarn {
        factor: 16.0,
        original_max_position: 65536.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }
}

fn rope_case(
    class: SizeClass,
    (rows, dim, rd): (usize, usize, usize),
    yarn: bool,
    inverse: bool,
    max_pos: u64,
) -> Case {
    let table = Arc::new(if yarn {
        RopeTable::yarn(rd, 160000.0, flash_yarn())
    } else {
        RopeTable::plain(rd, 10000.0)
    });
    let shape = format!(
        "{rows}x{dim}.rd{rd}.{}{}.p<{max_pos}",
        if yarn { "yarn" } else { "plain" },
        if inverse { ".inv" } else { "" }
    );
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let x = uniform(rng, rows * dim, 1.0);
        let positions: Vec<usize> = (0..rows).map(|_| rng.below(max_pos) as usize).collect();
        let table = Arc::clone(&table);
        Ok(Box::new(move |be| {
            let mut g = GuardedF32::with_values(&x);
            let ((), elapsed) = call(|| be.rope(g.slice_mut(), dim, &positions, &table, inverse))?;
            Ok(Ran {
                out: Produced::Values(g.into_in_place("x")?),
                elapsed,
            })
        }))
    });
    let n = (rows * rd) as f64;
    Case::new(Op::Rope, class, shape, None, (3.0 * n, 8.0 * n), build)
}

fn hadamard_case(class: SizeClass, rows: usize, dim: usize) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let x = uniform(rng, rows * dim, 1.0);
        Ok(Box::new(move |be| {
            let mut g = GuardedF32::with_values(&x);
            let ((), elapsed) = call(|| be.hadamard(g.slice_mut(), dim))?;
            Ok(Ran {
                out: Produced::Values(g.into_in_place("x")?),
                elapsed,
            })
        }))
    });
    let n = (rows * dim) as f64;
    let flops = n * (dim.max(2) as f64).log2();
    Case::new(
        Op::Hadamard,
        class,
        format!("{rows}x{dim}"),
        None,
        (flops, 8.0 * n),
        build,
    )
}

fn round_index_case(class: SizeClass, rows: usize, dim: usize, dtype: IndexKDtype) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let x = scaled_rows(rng, rows, dim);
        Ok(Box::new(move |be| {
            let mut g = GuardedF32::with_values(&x);
            let ((), elapsed) = call(|| be.round_index_rows(dtype, g.slice_mut(), dim))?;
            Ok(Ran {
                out: Produced::Values(g.into_in_place("x")?),
                elapsed,
            })
        }))
    });
    let n = (rows * dim) as f64;
    Case::new(
        Op::RoundIndexRows,
        class,
        format!("{rows}x{dim}"),
        Some(format!("index_k={dtype}")),
        (2.0 * n, 8.0 * n),
        build,
    )
}

fn router_case(class: SizeClass, n: usize) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        // Mostly ordinary logits, every 16th far out where a naive exp overflows f32.
        let x: Vec<f32> = (0..n)
            .map(|i| rng.uniform_sym(if i % 16 == 5 { 100.0 } else { 8.0 }))
            .collect();
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(n);
            let ((), elapsed) = call(|| be.router_scores(&x, out.slice_mut()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let nf = n as f64;
    Case::new(
        Op::RouterScores,
        class,
        format!("{n}"),
        None,
        (4.0 * nf, 8.0 * nf),
        build,
    )
}

fn swiglu_case(class: SizeClass, n: usize) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        // ±15 crosses the clamp limit 10 on both sides.
        let g = uniform(rng, n, 15.0);
        let u = uniform(rng, n, 15.0);
        let weight = 1.0 + rng.uniform_sym(1.0);
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(n);
            let ((), elapsed) = call(|| be.swiglu(&g, &u, 10.0, weight, out.slice_mut()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let nf = n as f64;
    Case::new(
        Op::Swiglu,
        class,
        format!("{n}.limit10"),
        None,
        (8.0 * nf, 12.0 * nf),
        build,
    )
}

/// Every case of this module.
pub(crate) fn cases() -> Vec<Case> {
    use SizeClass::*;
    let mut v = vec![
        rms_norm_case(Tiny, 4, 256, true),
        rms_norm_case(Tiny, 3, 128, true),
        rms_norm_case(Tiny, 12, 128, false),
        rms_norm_case(Odd, 5, 97, true),
        rms_norm_case(Odd, 1, 1, false),
        rms_norm_case(Flash, 2, 4096, true),
        rms_norm_case(Flash, 2, 1024, true),
        rms_norm_case(Flash, 64, 512, false),
        rope_case(Tiny, (12, 128, 64), false, false, 1 << 16),
        rope_case(Tiny, (12, 128, 64), true, true, 1 << 16),
        rope_case(Odd, (3, 10, 6), false, false, 100),
        rope_case(Odd, (2, 2, 2), true, false, 1 << 20),
        rope_case(Flash, (64, 512, 64), true, false, 1 << 20),
        rope_case(Flash, (64, 512, 64), true, true, 1 << 20),
        rope_case(Flash, (64, 512, 64), false, false, 1 << 20),
        rope_case(Flash, (64, 128, 64), true, false, 1 << 20),
        hadamard_case(Tiny, 16, 128),
        hadamard_case(Odd, 3, 1),
        hadamard_case(Odd, 5, 2),
        hadamard_case(Odd, 2, 64),
        hadamard_case(Flash, 64, 128),
        router_case(Tiny, 24),
        router_case(Odd, 7),
        router_case(Flash, 1024),
        swiglu_case(Tiny, 384),
        swiglu_case(Odd, 33),
        swiglu_case(Flash, 4096),
    ];
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
        v.push(round_index_case(Tiny, 4, 128, dtype));
        v.push(round_index_case(Odd, 3, 48, dtype));
        v.push(round_index_case(Flash, 64, 128, dtype));
    }
    v
}

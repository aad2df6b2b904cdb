//! The tensor-core linear kernels (kernels/linear_mma.cu, `DSV4_CUDA_LINEAR=mma`) on the CPU
//! emulator, which runs `mma.sync` through the PTX ISA's fragment layout: the reference's
//! results within f32-sum accuracy in every format they serve (odd shapes, partial tiles, more
//! rows than one block takes), batch invariance (a row alone, in a batch and at another place
//! of a batch has the same bits), every fp8/MXFP4 scale byte with NaN codes and non-finite
//! inputs, the device op set's conformance (grouped launches bitwise the plain ones) and the
//! `dsv4 diff` op sweep.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::emu_available;
use dsv4_backend_cuda::{CudaBackend, EMU_NAME, LinearPath, emu};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::SplitMix64;
use dsv4_diff::ops::{OpsOptions, run_ops};
use dsv4_kernels::{Backend, Linear, WeightFormat};

fn mma_backend(acc_f64: bool) -> CudaBackend {
    let dev = emu::open(acc_f64).expect("open the emulator");
    CudaBackend::with_linear(EMU_NAME, dev, LinearPath::Mma)
}

/// A random weight: bf16 from random mantissas around ±0.01..0.1; fp8 and MXFP4 from random
/// codes (every code but NaN) with scales near 1, so subnormal and saturated codes appear.
fn random_weight(rng: &mut SplitMix64, format: WeightFormat, out: usize, inp: usize) -> Linear {
    let n = out * inp;
    let mut byte = |lo: u8, hi: u8| lo + (rng.next_u64() % (u64::from(hi - lo) + 1)) as u8;
    let (data, scale): (Vec<u8>, Vec<u8>) = match format {
        WeightFormat::Bf16 => (
            (0..n)
                .flat_map(|_| [byte(0, 255), byte(0x3c, 0x3d) | (byte(0, 1) << 7)])
                .collect(),
            vec![],
        ),
        WeightFormat::Fp8Block => (
            (0..n)
                .map(|_| byte(0, 255))
                .map(|c| if c & 0x7f == 0x7f { c - 1 } else { c })
                .collect(),
            (0..out.div_ceil(128) * inp.div_ceil(128))
                .map(|_| byte(118, 126))
                .collect(),
        ),
        WeightFormat::Mxfp4 => (
            (0..n / 2).map(|_| byte(0, 255)).collect(),
            (0..n / 32).map(|_| byte(120, 126)).collect(),
        ),
        WeightFormat::F32 => unreachable!("f32 weights keep the SIMT kernels"),
    };
    Linear::new(format!("{format:?}"), out, inp, format, data, scale).expect("valid weight")
}

/// Σ_k |w_k·x_k| over the finite products, per output (rows × out), in f64: the scale an f32
/// sum's error is measured in.
fn magnitudes(w: &Linear, x: &[f32], rows: usize) -> Vec<f64> {
    let (o, i) = (w.out_dim, w.in_dim);
    let dense = w.dequantized();
    let mut m = vec![0f64; rows * o];
    for r in 0..rows {
        for c in 0..o {
            m[r * o + c] = (0..i)
                .map(|k| (f64::from(dense[c * i + k]) * f64::from(x[r * i + k])).abs())
                .filter(|p| p.is_finite())
                .sum();
        }
    }
    m
}

/// Checks `got` against the reference's `want`: NaN where it is NaN, the same infinity, and
/// finite values within `rel`·Σ|w·x| + 1e-35 (the last for products in f32's subnormal range).
/// Outputs whose finite products' magnitudes pass 2^100 are skipped: f32 sums may overflow
/// there (and meet an infinite product as NaN) where the reference's f64 ones do not.
fn within_f32_sums(label: &str, want: &[f32], got: &[f32], mag: &[f64], out: usize, rel: f64) {
    for (n, ((&a, &b), &m)) in want.iter().zip(got).zip(mag).enumerate() {
        let (row, col) = (n / out, n % out);
        if m >= 2f64.powi(100) {
            continue;
        }
        if a.is_nan() {
            assert!(
                b.is_nan(),
                "{label}: row {row} col {col}: want NaN, got {b:e}"
            );
        } else if a.is_infinite() {
            assert_eq!(a, b, "{label}: row {row} col {col}");
        } else {
            let err = (f64::from(a) - f64::from(b)).abs();
            assert!(
                err <= rel * m + 1e-35,
                "{label}: row {row} col {col}: want {a:e}, got {b:e} (error {err:e}, Σ|w·x| {m:e})"
            );
        }
    }
}

#[test]
fn mma_linear_is_within_f32_sums_of_the_reference_and_batch_invariant() {
    if !emu_available("mma_linear_is_within_f32_sums_of_the_reference_and_batch_invariant") {
        return;
    }
    let mut rng = SplitMix64::new(23);
    // Outputs not a multiple of 16 (a partial m tile), inputs with a partial span of chunks
    // and a padded row pitch, one K span only (some warps idle), many spans.
    let shapes = [
        (WeightFormat::Bf16, 45, 333),
        (WeightFormat::Bf16, 16, 24),
        (WeightFormat::Fp8Block, 200, 333),
        (WeightFormat::Fp8Block, 130, 64),
        (WeightFormat::Mxfp4, 77, 320),
        (WeightFormat::Mxfp4, 40, 1024),
    ];
    let be = mma_backend(true);
    // 70 rows: more than one block's 64, so the second row block is partial.
    let rows = 70;
    for &(format, out, inp) in &shapes {
        let w = random_weight(&mut rng, format, out, inp);
        let x: Vec<f32> = (0..rows * inp).map(|_| rng.uniform_sym(2.0)).collect();
        let label = format!("{format:?} [{out}, {inp}]");
        let mut want = vec![0f32; rows * out];
        ReferenceBackend.linear(&w, &x, rows, &mut want);
        let mut together = vec![0f32; rows * out];
        be.linear(&w, &x, rows, &mut together);
        within_f32_sums(
            &label,
            &want,
            &together,
            &magnitudes(&w, &x, rows),
            out,
            1e-5,
        );
        // Each row alone, and rows 0..n after 70 − n others.
        for r in [0, 1, 7, 8, 63, 64, 69] {
            let mut alone = vec![0f32; out];
            be.linear(&w, &x[r * inp..(r + 1) * inp], 1, &mut alone);
            let t = &together[r * out..(r + 1) * out];
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&alone),
                bits(t),
                "{label}: row {r} alone vs in {rows} rows"
            );
        }
        for n in [1, 5, 9] {
            let skip = rows - n;
            let xs: Vec<f32> = x[n * inp..].iter().chain(&x[..n * inp]).copied().collect();
            let mut shifted = vec![0f32; rows * out];
            be.linear(&w, &xs, rows, &mut shifted);
            for r in 0..n {
                let s = &shifted[(skip + r) * out..(skip + r + 1) * out];
                let t = &together[r * out..(r + 1) * out];
                for c in 0..out {
                    assert_eq!(
                        s[c].to_bits(),
                        t[c].to_bits(),
                        "{label}: row {r} col {c} at row {} of a batch",
                        skip + r
                    );
                }
            }
        }
    }
}

#[test]
fn mma_linear_handles_every_scale_byte_nan_codes_and_non_finite_inputs() {
    // fp8 and MXFP4 weights decode into bf16 by a multiplication when the scale byte allows and
    // no code is NaN, else through the f32 decode (kernels/linear_mma.cu): every scale byte
    // (subnormal, overflowing and NaN scales among them), NaN codes in some rows, inputs with
    // ±inf and NaN in one row.
    if !emu_available("mma_linear_handles_every_scale_byte_nan_codes_and_non_finite_inputs") {
        return;
    }
    let mut rng = SplitMix64::new(29);
    // fp8: 2 × 64 blocks of 128×128, block (rb, cb) scaled by byte rb·128 + cb·2 (+1 for odd
    // rows of blocks); inputs 8184 wide (a partial last block).
    let (out, inp) = (256, 128 * 64 - 8);
    let mut data: Vec<u8> = (0..out * inp)
        .map(|_| (rng.next_u64() % 256) as u8)
        .map(|c| if c & 0x7f == 0x7f { c - 1 } else { c })
        .collect();
    for o in (5..out).step_by(37) {
        data[o * inp + (rng.next_u64() as usize % inp)] = 0x7f | ((o as u8 & 1) << 7);
    }
    let scale: Vec<u8> = (0..2 * 64).map(|b| (2 * b + b / 64) as u8).collect();
    let fp8 = Linear::new("fp8", out, inp, WeightFormat::Fp8Block, data, scale).expect("fp8");
    // MXFP4: row o's 32-value chunk ch scaled by byte (4·o + ch) mod 256.
    let (out4, inp4) = (64, 32 * 16);
    let data4: Vec<u8> = (0..out4 * inp4 / 2)
        .map(|_| (rng.next_u64() % 256) as u8)
        .collect();
    let scale4: Vec<u8> = (0..out4 * 16)
        .map(|i| ((4 * (i / 16) + i % 16) % 256) as u8)
        .collect();
    let mx = Linear::new("mxfp4", out4, inp4, WeightFormat::Mxfp4, data4, scale4).expect("mxfp4");
    let be = mma_backend(false);
    for w in [&fp8, &mx] {
        let (o, i) = (w.out_dim, w.in_dim);
        let rows = 3;
        let mut x: Vec<f32> = (0..rows * i).map(|_| rng.uniform_sym(2.0)).collect();
        // Row 2: one +inf, one −inf (their products make NaN or ±inf) and elsewhere finite.
        x[2 * i + 3] = f32::INFINITY;
        x[2 * i + i / 2] = f32::NEG_INFINITY;
        let mut want = vec![0f32; rows * o];
        ReferenceBackend.linear(w, &x, rows, &mut want);
        // Rows of blocks with a NaN or overflowing scale byte are NaN or inf; the rest finite.
        let finite = want[..2 * o].iter().filter(|v| v.is_finite()).count();
        assert!(
            finite >= o / 2,
            "{}: the case should have many finite outputs",
            w.name
        );
        let mut got = vec![0f32; rows * o];
        be.linear(w, &x, rows, &mut got);
        within_f32_sums(&w.name, &want, &got, &magnitudes(w, &x, rows), o, 1e-5);
        // A NaN input makes its whole row NaN, as in the reference.
        let mut xn = x[..i].to_vec();
        xn[i - 1] = f32::NAN;
        let mut gn = vec![0f32; o];
        be.linear(w, &xn, 1, &mut gn);
        assert!(gn.iter().all(|v| v.is_nan()), "{}: a NaN input", w.name);
    }
}

#[test]
fn the_device_op_set_conforms_on_the_mma_path() {
    // Resident linear and grouped_linear (one launch for every group's rows) bitwise the host
    // linear of the same backend, as for the SIMT kernels.
    if !emu_available("the_device_op_set_conforms_on_the_mma_path") {
        return;
    }
    let fails = dsv4_kernels::device_check::conformance(&mma_backend(false));
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

#[test]
fn the_linear_op_sweep_passes_on_the_mma_path() {
    if !emu_available("the_linear_op_sweep_passes_on_the_mma_path") {
        return;
    }
    let cand = mma_backend(false);
    let opts = OpsOptions {
        ops: vec!["linear".to_string()],
        ..Default::default()
    };
    let report = run_ops(&ReferenceBackend, &cand, &opts).expect("run the op sweep");
    assert!(!report.cases.is_empty(), "the sweep selected no cases");
    let failures: Vec<String> = report
        .cases
        .iter()
        .filter(|row| row.status.name() != "pass")
        .map(|row| format!("{}: {} {:?}", row.name, row.status.name(), row.value))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_linear_path_knob_parses_and_rejects_unknown_values() {
    assert_eq!(LinearPath::parse("mma"), Ok(LinearPath::Mma));
    assert_eq!(LinearPath::parse(" simt "), Ok(LinearPath::Simt));
    assert_eq!(LinearPath::parse(""), Ok(LinearPath::Simt));
    let e = LinearPath::parse("wmma").unwrap_err();
    assert!(e.contains("wmma") && e.contains("simt or mma"), "{e}");
    for p in [LinearPath::Simt, LinearPath::Mma] {
        assert_eq!(LinearPath::parse(p.name()), Ok(p));
    }
}

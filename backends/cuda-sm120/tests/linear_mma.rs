//! The tensor-core linear kernels (kernels/linear_mma.cu, `DSV4_CUDA_LINEAR=mma`) on the CPU
//! emulator, which runs `mma.sync` through the PTX ISA's fragment layout: the reference's
//! results within f32-sum accuracy in every format they serve (odd shapes, partial tiles, more
//! rows than one block takes), batch invariance (a row alone, in a batch and at another place
//! of a batch has the same bits), every fp8/MXFP4 scale byte with NaN codes and non-finite
//! inputs, and the device op set's conformance (grouped launches bitwise the plain ones). The
//! `dsv4 diff` op sweep and the tiny-model diff on this path run in dsv4-cli's tests/cuda_emu.rs.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::{emu_available, every_scale_byte_weights, random_weight};
use dsv4_backend_cuda::{CudaBackend, EMU_NAME, LinearPath, emu};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::SplitMix64;
use dsv4_kernels::{Backend, Linear, WeightFormat};

fn mma_backend(acc_f64: bool) -> CudaBackend {
    let dev = emu::open(acc_f64).expect("open the emulator");
    CudaBackend::with_linear(EMU_NAME, dev, LinearPath::Mma)
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
    let [fp8, mx] = every_scale_byte_weights(&mut rng);
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

//! The linear, row-wise and cache kernels (kernels/{linear,rows,cache}.cu) on the CPU emulator,
//! diffed against the reference backend: the op sweep of `dsv4 diff --ops` with f64 and with
//! f32 accumulation, batch invariance of `linear` in every weight format, weight residency, and
//! bit-exact linear at every fp8/MXFP4 scale byte and code, and the cache layout errors.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::{backend, emu_available, every_scale_byte_weights, random_weight};
use dsv4_backend_cuda::{CudaBackend, DecodeShape, DecodeShapes, EMU_NAME, emu};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::cache::{IndexKLayout, KvLayout};
use dsv4_core::{IndexKDtype, KvCacheDtype, SplitMix64};
use dsv4_diff::ops::{OpsOptions, run_ops};
use dsv4_kernels::{Backend, RowFormat, WeightFormat};

/// The ops these kernels implement, by trait method name.
const OPS: &[&str] = &[
    "linear",
    "act_quant_fp8",
    "rms_norm",
    "rope",
    "hadamard",
    "router_scores",
    "swiglu",
    "round_index_rows",
    "cache_store",
    "cache_load",
];

/// Whether the emulator can run here; prints the reason and skips (or fails under CI).
fn available(test: &str) -> bool {
    emu_available(test)
}

/// Run the op sweep for OPS and return (failures, worst NMSE per op) after printing every row.
fn sweep(acc_f64: bool) -> (Vec<String>, Vec<(String, f64)>) {
    let cand = backend(acc_f64);
    let opts = OpsOptions {
        ops: OPS.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let report = run_ops(&ReferenceBackend, &cand, &opts).expect("run the op sweep");
    let mut failures = Vec::new();
    let mut nmse = Vec::new();
    for row in &report.cases {
        println!(
            "{:<60} {:<11} {}={:?} (tol {}) {}",
            row.name,
            row.status.name(),
            row.metric.name(),
            row.value,
            row.tolerance,
            row.detail.as_deref().unwrap_or("")
        );
        if row.status.name() != "pass" {
            failures.push(format!(
                "{}: {} {:?} {}",
                row.name,
                row.status.name(),
                row.value,
                row.detail.as_deref().unwrap_or("")
            ));
        }
        if row.metric.name() == "nmse" {
            nmse.push((row.name.clone(), row.value.unwrap_or(f64::NAN)));
        }
    }
    assert!(!report.cases.is_empty(), "the sweep selected no cases");
    (failures, nmse)
}

#[test]
fn op_sweep_matches_the_reference_with_f64_accumulation() {
    if !available("op_sweep_matches_the_reference_with_f64_accumulation") {
        return;
    }
    let (failures, nmse) = sweep(true);
    assert!(
        failures.is_empty(),
        "failing cases:\n{}",
        failures.join("\n")
    );
    // With f64 sums the results are the reference's up to an occasional last-ulp flip.
    for (name, v) in nmse {
        assert!(v <= 1e-13, "{name}: NMSE {v:e} is more than last-ulp flips");
    }
}

#[test]
fn op_sweep_matches_the_reference_with_f32_accumulation() {
    if !available("op_sweep_matches_the_reference_with_f32_accumulation") {
        return;
    }
    let (failures, _) = sweep(false);
    assert!(
        failures.is_empty(),
        "failing cases:\n{}",
        failures.join("\n")
    );
}

fn nmse(want: &[f32], got: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&w, &g) in want.iter().zip(got) {
        num += (f64::from(w) - f64::from(g)).powi(2);
        den += f64::from(w).powi(2);
    }
    num / den.max(f64::MIN_POSITIVE)
}

#[test]
fn linear_is_batch_invariant_in_every_format() {
    if !available("linear_is_batch_invariant_in_every_format") {
        return;
    }
    let mut rng = SplitMix64::new(7);
    // fp8 with out and in not multiples of 128 (partial scale blocks, padded row pitch); fp8
    // and MXFP4 rows wider than one staged input tile of the decode kernels (128 chunks).
    let shapes = [
        (WeightFormat::F32, 37, 67),
        (WeightFormat::Bf16, 45, 333),
        (WeightFormat::Fp8Block, 200, 333),
        (WeightFormat::Fp8Block, 130, 256),
        (WeightFormat::Fp8Block, 130, 2100),
        (WeightFormat::Mxfp4, 77, 320),
        (WeightFormat::Mxfp4, 77, 32 * 150),
    ];
    for acc_f64 in [true, false] {
        let be = backend(acc_f64);
        for &(format, out, inp) in &shapes {
            let w = random_weight(&mut rng, format, out, inp);
            let x: Vec<f32> = (0..9 * inp).map(|_| rng.uniform_sym(2.0)).collect();
            let mut alone = vec![0f32; 9 * out];
            for r in 0..9 {
                be.linear(
                    &w,
                    &x[r * inp..(r + 1) * inp],
                    1,
                    &mut alone[r * out..(r + 1) * out],
                );
            }
            let mut want = vec![0f32; 9 * out];
            ReferenceBackend.linear(&w, &x, 9, &mut want);
            let e = nmse(&want, &alone);
            let limit = if acc_f64 { 1e-13 } else { 1e-7 };
            assert!(
                e <= limit,
                "{format:?} [{out}, {inp}] f64={acc_f64}: NMSE {e:e} vs the reference"
            );
            for n in 1..=9 {
                // Rows 0..n together, and the same rows placed after 9 − n others.
                let mut together = vec![0f32; n * out];
                be.linear(&w, &x[..n * inp], n, &mut together);
                let skip = 9 - n;
                let mut shifted = vec![0f32; 9 * out];
                let xs: Vec<f32> = x[(9 - skip) * inp..]
                    .iter()
                    .chain(&x[..n * inp])
                    .copied()
                    .collect();
                be.linear(&w, &xs, 9, &mut shifted);
                for r in 0..n {
                    let a = &alone[r * out..(r + 1) * out];
                    let t = &together[r * out..(r + 1) * out];
                    let s = &shifted[(skip + r) * out..(skip + r + 1) * out];
                    for c in 0..out {
                        assert_eq!(
                            (a[c].to_bits(), a[c].to_bits()),
                            (t[c].to_bits(), s[c].to_bits()),
                            "{format:?} [{out}, {inp}] f64={acc_f64}: row {r} col {c} alone vs in {n} rows / at {}",
                            skip + r
                        );
                    }
                }
            }
        }
    }
}

/// Whether `got` is `want` bit for bit, a NaN counting as any NaN.
fn same_bits(want: f32, got: f32) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else {
        want.to_bits() == got.to_bits()
    }
}

/// Asserts `got` is `want` bit for bit (a NaN as any NaN), naming the first differing row and
/// column of `cols`-wide rows and the two sides (`sides`: what `want` and `got` are).
fn assert_same_rows(what: &str, sides: (&str, &str), want: &[f32], got: &[f32], cols: usize) {
    assert_eq!(want.len(), got.len(), "{what}: output lengths");
    for (n, (&a, &b)) in want.iter().zip(got).enumerate() {
        assert!(
            same_bits(a, b),
            "{what}: row {} col {}: {} {a:e} ({:#x}), {} {b:e} ({:#x})",
            n / cols,
            n % cols,
            sides.0,
            a.to_bits(),
            sides.1,
            b.to_bits()
        );
    }
}

#[test]
fn linear_matches_the_reference_bitwise_at_every_scale_byte_and_code() {
    // fp8 and MXFP4 chunks are decoded straight into f64 when their scale byte allows and no
    // code is NaN, else in f32 (kernels/linear.cu): every scale byte (subnormal, overflowing
    // and NaN scales among them), every code, NaN codes in some rows, a partial last scale
    // block, through the decode and the batched kernels, bit for bit the reference's.
    if !available("linear_matches_the_reference_bitwise_at_every_scale_byte_and_code") {
        return;
    }
    let mut rng = SplitMix64::new(11);
    let [fp8, mx] = every_scale_byte_weights(&mut rng);
    let be = backend(true);
    for w in [&fp8, &mx] {
        let (o, i) = (w.out_dim, w.in_dim);
        let x: Vec<f32> = (0..3 * i).map(|_| rng.uniform_sym(2.0)).collect();
        let mut want = vec![0f32; 3 * o];
        ReferenceBackend.linear(w, &x, 3, &mut want);
        let finite = want.iter().filter(|v| v.is_finite() && **v != 0.0).count();
        assert!(
            finite > o,
            "{}: the case should have many finite outputs",
            w.name
        );
        for rows in [1, 3] {
            let mut got = vec![0f32; 3 * o];
            for (xr, gr) in x.chunks(rows * i).zip(got.chunks_mut(rows * o)) {
                be.linear(w, xr, rows, gr);
            }
            let what = format!("{} rows={rows}", w.name);
            assert_same_rows(&what, ("reference", "emulator"), &want, &got, o);
        }
    }
}

#[test]
fn linear_with_f32_sums_is_batch_invariant_at_every_scale_byte_and_code() {
    // With f32 sums the decode kernels (one row) take the fast routes of kernels/linear.cu —
    // fp8 codes against inputs prescaled by 2^(sb − 7), MXFP4 codes by table — for most chunks,
    // and the general decode for NaN codes, extreme scales and a row's partial last chunk; the
    // batched kernels decode every chunk in one piece. A row must get the same bits either way.
    if !available("linear_with_f32_sums_is_batch_invariant_at_every_scale_byte_and_code") {
        return;
    }
    let mut rng = SplitMix64::new(13);
    let [fp8, mx] = every_scale_byte_weights(&mut rng);
    let be = backend(false);
    for w in [&fp8, &mx] {
        let (o, i) = (w.out_dim, w.in_dim);
        let x: Vec<f32> = (0..3 * i).map(|_| rng.uniform_sym(2.0)).collect();
        let mut batched = vec![0f32; 3 * o];
        be.linear(w, &x, 3, &mut batched);
        let finite = batched
            .iter()
            .filter(|v| v.is_finite() && **v != 0.0)
            .count();
        assert!(
            finite > o,
            "{}: the case should have many finite outputs",
            w.name
        );
        for r in 0..3 {
            let mut alone = vec![0f32; o];
            be.linear(w, &x[r * i..(r + 1) * i], 1, &mut alone);
            let what = format!("{}, row {r} of 3", w.name);
            let sides = ("in 3 rows", "alone");
            assert_same_rows(&what, sides, &batched[r * o..(r + 1) * o], &alone, o);
        }
    }
}

#[test]
fn every_decode_shape_gives_the_default_shapes_bits() {
    // kernels/linear.cu compiles several shapes of the one-row fp8 and MXFP4 kernels (columns
    // a warp, warps a block, rounds of loads in flight; DSV4_CUDA_DECODE picks one): each must
    // give every column the
    // default shape's bits — with f64 sums the reference's — at every scale byte and code, on
    // rows wider than a staged tile and column counts that leave a block part empty; and the
    // device op set (resident and grouped launches) must conform on each.
    if !available("every_decode_shape_gives_the_default_shapes_bits") {
        return;
    }
    let mut rng = SplitMix64::new(17);
    let [fp8, mx] = every_scale_byte_weights(&mut rng);
    let odd_fp8 = random_weight(&mut rng, WeightFormat::Fp8Block, 200, 2100);
    let odd_mx = random_weight(&mut rng, WeightFormat::Mxfp4, 77, 32 * 150);
    for acc_f64 in [true, false] {
        let dev = emu::open(acc_f64).expect("open the emulator");
        for w in [&fp8, &mx, &odd_fp8, &odd_mx] {
            let (o, i) = (w.out_dim, w.in_dim);
            let x: Vec<f32> = (0..i).map(|_| rng.uniform_sym(2.0)).collect();
            let mut want = vec![0f32; o];
            if acc_f64 {
                ReferenceBackend.linear(w, &x, 1, &mut want);
            } else {
                CudaBackend::new(EMU_NAME, dev.clone()).linear(w, &x, 1, &mut want);
            }
            let shapes = DecodeShape::compiled(w.format);
            assert!(
                shapes.len() > 1,
                "{}: fp8 and MXFP4 have several shapes",
                w.name
            );
            for &shape in shapes {
                let decode = DecodeShapes::default()
                    .with(w.format, shape)
                    .expect("compiled");
                let be = CudaBackend::new(EMU_NAME, dev.clone()).with_decode_shapes(decode);
                let mut got = vec![0f32; o];
                be.linear(w, &x, 1, &mut got);
                let what = format!("{} [{o}, {i}] f64={acc_f64} shape {}", w.name, shape.name());
                let want_side = if acc_f64 {
                    "reference"
                } else {
                    "default shape"
                };
                assert_same_rows(&what, (want_side, "this shape"), &want, &got, o);
            }
        }
    }
    // Resident and grouped (`_g1`) launches on every other shape, fp8's and MXFP4's paired.
    let (f, m) = (
        DecodeShape::compiled(WeightFormat::Fp8Block),
        DecodeShape::compiled(WeightFormat::Mxfp4),
    );
    for i in 1..f.len().max(m.len()) {
        let spec = format!(
            "fp8={},mxfp4={}",
            f[i.min(f.len() - 1)].name(),
            m[i.min(m.len() - 1)].name()
        );
        let decode = DecodeShapes::parse(&spec).expect("compiled shapes");
        let fails =
            dsv4_kernels::device_check::conformance(&backend(false).with_decode_shapes(decode));
        assert!(fails.is_empty(), "{spec}: {}", fails.join("\n"));
    }
}

#[test]
fn fp8_decode_is_exact_for_inputs_its_prescaling_cannot_hold() {
    // The fp8 decode kernels stage x times its block's 2^k·scale and fall back to the general
    // decode where that product is not exact (kernels/linear.cu, lin_stage_fp8): inputs near
    // f32's largest and smallest values, subnormals, infinities and NaNs, against every scale
    // byte. With f64 sums a row gets the reference's bits; with f32 sums, the batched kernel's.
    if !available("fp8_decode_is_exact_for_inputs_its_prescaling_cannot_hold") {
        return;
    }
    let mut rng = SplitMix64::new(17);
    let [fp8, _] = every_scale_byte_weights(&mut rng);
    let (o, i) = (fp8.out_dim, fp8.in_dim);
    let special = [
        3.0e38f32,
        -2.5e38,
        1.0e30,
        f32::MIN_POSITIVE,
        -1.5e-38,
        1.0e-40, // subnormal
        -f32::from_bits(1),
        0.0,
        -0.0,
    ];
    // Row 0: a few extreme values among ordinary ones (most 128-column blocks exact, some not);
    // row 1: every value extreme; row 2: an infinity and a NaN in one block each.
    let mut x: Vec<f32> = (0..3 * i).map(|_| rng.uniform_sym(2.0)).collect();
    for k in (0..i).step_by(97) {
        x[k] = special[(k / 97) % special.len()];
    }
    for k in 0..i {
        x[i + k] = special[k % special.len()];
    }
    x[2 * i + 300] = f32::INFINITY;
    x[2 * i + 5000] = f32::NAN;
    let mut want = vec![0f32; 3 * o];
    ReferenceBackend.linear(&fp8, &x, 3, &mut want);
    let f64_sums = backend(true);
    let f32_sums = backend(false);
    let mut batched = vec![0f32; 3 * o];
    f32_sums.linear(&fp8, &x, 3, &mut batched);
    for r in 0..3 {
        let row = &x[r * i..(r + 1) * i];
        let mut got = vec![0f32; o];
        f64_sums.linear(&fp8, row, 1, &mut got);
        let mut got32 = vec![0f32; o];
        f32_sums.linear(&fp8, row, 1, &mut got32);
        let what = format!("f64 sums, row {r}");
        assert_same_rows(
            &what,
            ("reference", "emulator"),
            &want[r * o..(r + 1) * o],
            &got,
            o,
        );
        let what = format!("f32 sums, row {r}");
        let sides = ("in 3 rows", "alone");
        assert_same_rows(&what, sides, &batched[r * o..(r + 1) * o], &got32, o);
    }
    let finite = want[..o].iter().filter(|v| v.is_finite()).count();
    assert!(
        finite > o / 4,
        "row 0 should keep finite outputs ({finite} of {o})"
    );
}

#[test]
fn weights_are_uploaded_once() {
    if !available("weights_are_uploaded_once") {
        return;
    }
    let be = backend(true);
    let mut rng = SplitMix64::new(3);
    assert_eq!(be.resident_weight_bytes(), 0);
    let a = random_weight(&mut rng, WeightFormat::Fp8Block, 200, 256);
    let b = random_weight(&mut rng, WeightFormat::Mxfp4, 64, 128);
    let x: Vec<f32> = (0..2 * 256).map(|_| rng.uniform_sym(1.0)).collect();
    let mut y = vec![0f32; 2 * 200];
    be.linear(&a, &x, 2, &mut y);
    let after_a = be.resident_weight_bytes();
    assert!(
        after_a >= a.stored_bytes(),
        "{after_a} < {}",
        a.stored_bytes()
    );
    let first = y.clone();
    be.linear(&a, &x, 2, &mut y);
    be.linear(&a, &x[..256], 1, &mut y[..200]);
    assert_eq!(
        be.resident_weight_bytes(),
        after_a,
        "a second call re-uploaded"
    );
    assert_eq!(&y[..200], &first[..200]);
    be.prepare(&b).expect("upload b");
    let after_b = be.resident_weight_bytes();
    assert_eq!(after_b, after_a + b.stored_bytes());
    let mut z = vec![0f32; 64];
    be.linear(&b, &x[..128], 1, &mut z);
    assert_eq!(
        be.resident_weight_bytes(),
        after_b,
        "prepare did not make b resident"
    );
}

#[test]
fn cache_layout_errors_are_the_references() {
    if !available("cache_layout_errors_are_the_references") {
        return;
    }
    let be = backend(false);
    let formats = [
        RowFormat::Kv(KvLayout::from_head_dims(KvCacheDtype::Fp8, 192, 64, 3).unwrap()),
        RowFormat::Kv(KvLayout::from_head_dims(KvCacheDtype::Bf16, 10, 4, 2).unwrap()),
        RowFormat::IndexK(IndexKLayout::new(IndexKDtype::Fp4, 64, 2).unwrap()),
        RowFormat::IndexK(IndexKLayout::new(IndexKDtype::Fp8, 32, 2).unwrap()),
    ];
    for fmt in formats {
        let (pb, w, per) = (fmt.page_bytes(), fmt.width(), fmt.page_entries());
        let cases = [
            (pb, w, per),
            (pb + 1, w, 0),
            (pb, w - 1, 0),
            (pb - 1, w + 1, per + 5),
            (pb, w, 0),
        ];
        for (page_len, width, slot) in cases {
            let values: Vec<f32> = (0..width).map(|i| i as f32 * 0.37 - 1.0).collect();
            let mut p_ref = vec![0x5au8; page_len];
            let mut p_cand = p_ref.clone();
            let want = ReferenceBackend.cache_store(&fmt, &mut p_ref, slot, &values);
            let got = be.cache_store(&fmt, &mut p_cand, slot, &values);
            assert_eq!(
                want, got,
                "{fmt:?} store page {page_len} width {width} slot {slot}"
            );
            assert_eq!(p_ref, p_cand, "{fmt:?} store page bytes");
            let mut o_ref = vec![0f32; width];
            let mut o_cand = vec![0f32; width];
            let want = ReferenceBackend.cache_load(&fmt, &p_ref, slot, &mut o_ref);
            let got = be.cache_load(&fmt, &p_cand, slot, &mut o_cand);
            assert_eq!(
                want, got,
                "{fmt:?} load page {page_len} width {width} slot {slot}"
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&o_ref), bits(&o_cand), "{fmt:?} loaded values");
        }
    }
}

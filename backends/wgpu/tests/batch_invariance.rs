//! On the device: every row-wise op gives each row bit for bit the same result whether the row
//! runs alone or in a batch, and (where the adapter has SHADER_F64) the same bits as the
//! reference backend. Skips with the reason when no adapter exists, except under CI=true.

mod common;

use common::{backend, values};

use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::IndexKDtype;
use dsv4_core::codec::{f32_to_bf16, f32_to_e4m3, pack_e2m1};
use dsv4_kernels::{Backend, HcParams, Linear, RopeTable, WeightFormat};

fn weights(out: usize, inp: usize) -> Vec<Linear> {
    let w = values(out * inp, 7);
    let bf16: Vec<u8> = w
        .iter()
        .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
        .collect();
    let fp8: Vec<u8> = w.iter().map(|&v| f32_to_e4m3(v * 100.0)).collect();
    let fp8_scales = vec![120u8; out.div_ceil(128) * inp.div_ceil(128)];
    let codes: Vec<u8> = (0..out * inp).map(|i| (i * 7 % 16) as u8).collect();
    let fp4_scales: Vec<u8> = (0..out * inp / 32).map(|i| 125 + (i % 4) as u8).collect();
    vec![
        Linear::from_f32("f32", out, inp, &w).unwrap(),
        Linear::new("bf16", out, inp, WeightFormat::Bf16, bf16, vec![]).unwrap(),
        Linear::new("fp8", out, inp, WeightFormat::Fp8Block, fp8, fp8_scales).unwrap(),
        Linear::new(
            "fp4",
            out,
            inp,
            WeightFormat::Mxfp4,
            pack_e2m1(&codes),
            fp4_scales,
        )
        .unwrap(),
    ]
}

/// Run `op` on all `rows` rows at once and on each row alone; the outputs must be identical.
/// `op(x, rows, first)` gets the index of its first row (for per-row positions).
fn invariant(
    name: &str,
    rows: usize,
    width_in: usize,
    width_out: usize,
    op: impl Fn(&[f32], usize, usize) -> Vec<f32>,
) {
    let x = values(rows * width_in, name.len() as u64 + 3);
    let all = op(&x, rows, 0);
    for r in 0..rows {
        let one = op(&x[r * width_in..(r + 1) * width_in], 1, r);
        let batched = &all[r * width_out..(r + 1) * width_out];
        assert!(
            one.iter()
                .zip(batched)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: row {r} alone differs from the same row in a batch of {rows}"
        );
    }
}

fn same_bits(name: &str, a: &[f32], b: &[f32]) {
    let bad = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()))
        .count();
    assert_eq!(
        bad,
        0,
        "{name}: {bad} of {} values differ from the reference",
        a.len()
    );
}

#[test]
fn row_ops_are_batch_invariant_and_match_the_reference() {
    let Some(gpu) = backend(true) else { return };
    let exact = gpu.adapter().f64_accumulation;
    let reference = ReferenceBackend;
    let (rows, inp, out) = (7, 256, 160);
    for w in weights(out, inp) {
        invariant(&w.name, rows, inp, out, |x, r, _| {
            let mut o = vec![0.0; r * out];
            gpu.linear(&w, x, r, &mut o);
            o
        });
        let x = values(rows * inp, 1);
        let (mut a, mut b) = (vec![0.0; rows * out], vec![0.0; rows * out]);
        gpu.linear(&w, &x, rows, &mut a);
        reference.linear(&w, &x, rows, &mut b);
        if exact {
            same_bits(&w.name, &a, &b);
        }
    }
    let dim = 256;
    let norm_w = values(dim, 9);
    invariant("rms_norm", rows, dim, dim, |x, r, _| {
        let mut o = vec![0.0; r * dim];
        gpu.rms_norm(x, Some(&norm_w), dim, 1e-6, &mut o);
        o
    });
    invariant("act_quant_fp8", rows, dim, dim, |x, _, _| {
        let mut o = x.to_vec();
        gpu.act_quant_fp8(&mut o, dim);
        o
    });
    invariant("hadamard", rows, 128, 128, |x, _, _| {
        let mut o = x.to_vec();
        gpu.hadamard(&mut o, 128);
        o
    });
    let table = RopeTable::plain(64, 10000.0);
    invariant("rope", rows, dim, dim, |x, r, first| {
        let mut o = x.to_vec();
        let pos: Vec<usize> = (0..r).map(|i| 1000 + 37 * (first + i)).collect();
        gpu.rope(&mut o, dim, &pos, &table, false);
        o
    });
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
        invariant("round_index_rows", rows, 128, 128, |x, _, _| {
            let mut o = x.to_vec();
            gpu.round_index_rows(dtype, &mut o, 128);
            o
        });
        let x = values(rows * 128, 5);
        let (mut a, mut b) = (x.clone(), x.clone());
        gpu.round_index_rows(dtype, &mut a, 128);
        reference.round_index_rows(dtype, &mut b, 128);
        same_bits("round_index_rows", &a, &b);
    }
    let x = values(rows * dim, 2);
    let (mut a, mut b) = (x.clone(), x.clone());
    gpu.act_quant_fp8(&mut a, dim);
    reference.act_quant_fp8(&mut b, dim);
    same_bits("act_quant_fp8", &a, &b);
}

#[test]
fn mhc_is_batch_invariant() {
    let Some(gpu) = backend(true) else { return };
    let (m, d) = (4, 64);
    let fn_w = values((2 + m) * m * m * d, 11);
    let base = values((2 + m) * m, 12);
    let p = HcParams {
        fn_w: &fn_w,
        base: &base,
        scale: &[0.5, 0.8, 1.1],
        m,
        d,
        norm_eps: 1e-6,
        hc_eps: 1e-6,
        sinkhorn_iters: 20,
    };
    invariant("mhc_pre", 5, m * d, d, |x, t, _| gpu.mhc_pre(&p, x, t).u);
    invariant("mhc_pre comb", 5, m * d, m * m, |x, t, _| {
        gpu.mhc_pre(&p, x, t).comb
    });
    let x = values(3 * m * d, 4);
    let ours = gpu.mhc_pre(&p, &x, 3);
    let theirs = ReferenceBackend.mhc_pre(&p, &x, 3);
    if gpu.adapter().f64_accumulation {
        same_bits("mhc_pre u", &ours.u, &theirs.u);
        same_bits("mhc_pre comb", &ours.comb, &theirs.comb);
        same_bits("mhc_pre post", &ours.post, &theirs.post);
    }
}

#[test]
fn weights_above_the_binding_limit_are_split_and_give_the_same_bits() {
    let Some(whole) = backend(true) else { return };
    let Some(mut split) = backend(true) else {
        return;
    };
    // 300 × 256 weights: fp8 chunks of 128 rows (the scale-block granularity), others by row.
    split.cap_binding_bytes(128 * 256);
    let (rows, inp, out) = (3, 256, 300);
    let x = values(rows * inp, 21);
    for w in weights(out, inp) {
        let (mut a, mut b) = (vec![0.0; rows * out], vec![0.0; rows * out]);
        whole.linear(&w, &x, rows, &mut a);
        split.linear(&w, &x, rows, &mut b);
        same_bits(&format!("{} split", w.name), &b, &a);
    }
    assert!(split.resident_weight_bytes() > 0);
    // A row group that cannot fit one binding is refused with the reason.
    split.cap_binding_bytes(64);
    let big = Linear::from_f32("big", 1, 64, &[0.5; 64]).unwrap();
    let e = split.prepare(&big).unwrap_err().to_string();
    assert!(e.contains("`big`") && e.contains("does not fit"), "{e}");
}

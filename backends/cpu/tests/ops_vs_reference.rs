//! Every op of the cpu backend against the reference backend on seeded random inputs of several
//! shapes, odd sizes included: relative L2 ≤ 1e-5 for f32 math, exact where the cpu backend uses
//! the reference's own arithmetic (quantization, RoPE, router, cache bytes, index rounding,
//! top-k sets).

mod common;

use common::{FORMATS, differing_bits, rel_l2, same_bits, vec_sym};
use dsv4_backend_cpu::{CpuBackend, Sums};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::cache::{IndexKLayout, KvLayout};
use dsv4_core::{IndexKDtype, KvCacheDtype, SplitMix64};
use dsv4_kernels::rope::Yarn;
use dsv4_kernels::{Backend, HcParams, RopeTable, RowFormat, WeightFormat};

const TOL: f64 = 1e-5;

fn cpu() -> CpuBackend {
    CpuBackend::new(2).unwrap()
}

fn check(what: &str, got: &[f32], want: &[f32]) {
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{what}: non-finite output"
    );
    let e = rel_l2(got, want);
    assert!(e <= TOL, "{what}: relative L2 error {e:e}");
}

#[test]
fn linear_matches_reference_in_every_format() {
    let rf = ReferenceBackend;
    let mut g = SplitMix64::new(1);
    for sums in [Sums::F64, Sums::F32] {
        let cpu = cpu().with_sums(sums);
        for fmt in FORMATS {
            for (rows, n, k) in [
                (1usize, 1usize, 32usize),
                (3, 33, 64),
                (7, 100, 300),
                (16, 130, 256),
                (33, 257, 160),
                (200, 40, 96),
                (2, 24, 4096),
                (20, 24, 4096),
            ] {
                let k = if fmt == WeightFormat::Mxfp4 {
                    k.div_ceil(32) * 32
                } else {
                    k
                };
                let w = common::random_linear(fmt, n, k, g.next_u64());
                let x = vec_sym(&mut g, rows * k, 1.0);
                let (mut a, mut b) = (vec![f32::NAN; rows * n], vec![0f32; rows * n]);
                cpu.linear(&w, &x, rows, &mut a);
                rf.linear(&w, &x, rows, &mut b);
                let what = format!("linear {fmt:?} {rows}x{n}x{k}, {sums:?} sums");
                check(&what, &a, &b);
                if sums == Sums::F64 {
                    // f64 accumulation of exact products: the reference's f32 result but for
                    // the rare sum that rounds the other way.
                    let differing = differing_bits(&a, &b);
                    assert!(
                        differing * 1000 <= a.len(),
                        "{what}: {differing} of {} differ",
                        a.len()
                    );
                }
            }
        }
    }
}

#[test]
fn f32_sums_round_along_the_way() {
    // Over 4096 inputs f32 sums lose bits an f64 sum keeps, so most outputs differ from the
    // f64 path's in the last place: the knob really changes the arithmetic.
    let mut g = SplitMix64::new(9);
    let (rows, n, k) = (3, 40, 4096);
    let w = common::random_linear(WeightFormat::Bf16, n, k, g.next_u64());
    let x = vec_sym(&mut g, rows * k, 1.0);
    let (mut a, mut b) = (vec![0f32; rows * n], vec![0f32; rows * n]);
    cpu().with_sums(Sums::F64).linear(&w, &x, rows, &mut a);
    cpu().with_sums(Sums::F32).linear(&w, &x, rows, &mut b);
    let differing = differing_bits(&a, &b);
    assert!(
        differing * 2 > a.len(),
        "only {differing} of {} differ",
        a.len()
    );
    check("f32 against f64 sums", &b, &a);
}

#[test]
fn fp8_weights_with_nan_codes_and_extreme_scales_decode_like_the_reference() {
    for sums in [Sums::F64, Sums::F32] {
        nan_codes_and_extreme_scales(&cpu().with_sums(sums));
    }
}

fn nan_codes_and_extreme_scales(cpu: &CpuBackend) {
    let rf = ReferenceBackend;
    let (n, k) = (40, 136);
    let mut w = common::random_linear(WeightFormat::Fp8Block, n, k, 5);
    w.data[3 * k + 17] = 0x7F; // a NaN code in output row 3
    // Scale 2^120 on the second K-block (too large to fold 2^8 into): small codes there.
    w.scale[1] = 247;
    for o in 0..n {
        for i in 128..k {
            w.data[o * k + i] = 0x08 | (w.data[o * k + i] & 0x87);
        }
    }
    let x = vec_sym(&mut SplitMix64::new(6), 2 * k, 1.0);
    let (mut a, mut b) = (vec![0f32; 2 * n], vec![0f32; 2 * n]);
    cpu.linear(&w, &x, 2, &mut a);
    rf.linear(&w, &x, 2, &mut b);
    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
        assert_eq!(p.is_nan(), q.is_nan(), "element {i}: {p} vs {q}");
        if !q.is_nan() {
            assert!(
                (f64::from(*p) - f64::from(*q)).abs() <= 1e-5 * f64::from(q.abs()).max(1.0),
                "element {i}: {p} vs {q}"
            );
        }
    }
    assert!(a[3].is_nan() && a[n + 3].is_nan() && !a[4].is_nan());
}

#[test]
fn act_quant_is_bitwise_the_reference() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(2);
    for (rows, dim) in [(1, 128), (5, 300), (3, 7), (64, 256)] {
        let x: Vec<f32> = (0..rows * dim)
            .map(|i| g.uniform_sym(1.0) * 10f32.powi((i % 9) as i32 - 6))
            .collect();
        let (mut a, mut b) = (x.clone(), x);
        cpu.act_quant_fp8(&mut a, dim);
        rf.act_quant_fp8(&mut b, dim);
        assert!(same_bits(&a, &b), "act_quant {rows}x{dim}");
    }
}

#[test]
fn rms_norm_matches_reference() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(3);
    for (rows, dim) in [(1, 1), (3, 7), (5, 256), (70, 1000)] {
        let x = vec_sym(&mut g, rows * dim, 3.0);
        let w = vec_sym(&mut g, dim, 2.0);
        for weight in [None, Some(&w[..])] {
            let (mut a, mut b) = (vec![0f32; rows * dim], vec![0f32; rows * dim]);
            cpu.rms_norm(&x, weight, dim, 1e-6, &mut a);
            rf.rms_norm(&x, weight, dim, 1e-6, &mut b);
            check(
                &format!("rms_norm {rows}x{dim} weighted={}", weight.is_some()),
                &a,
                &b,
            );
        }
    }
}

#[test]
fn rope_is_bitwise_the_reference() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(4);
    let yarn = Yarn {
        factor: 16.0,
        original_max_position: 65536.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    for table in [
        RopeTable::plain(64, 10000.0),
        RopeTable::yarn(64, 160000.0, yarn),
        RopeTable::plain(6, 10.0),
    ] {
        for (rows, dim) in [(1, 64), (12, 128), (300, 70)] {
            let x = vec_sym(&mut g, rows * dim, 2.0);
            // Runs of equal positions (heads of one token) and jumps.
            let pos: Vec<usize> = (0..rows).map(|r| r / 4 * 37 + (r % 3) * 1000).collect();
            for inverse in [false, true] {
                let (mut a, mut b) = (x.clone(), x.clone());
                cpu.rope(&mut a, dim, &pos, &table, inverse);
                rf.rope(&mut b, dim, &pos, &table, inverse);
                assert!(
                    same_bits(&a, &b),
                    "rope rd {} {rows}x{dim} inverse {inverse}",
                    table.rd
                );
            }
        }
    }
}

fn hc_case(g: &mut SplitMix64, m: usize, d: usize, n_out: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (
        vec_sym(g, n_out * m * d, 0.05),
        vec_sym(g, n_out, 1.0),
        vec_sym(g, 3, 1.5),
    )
}

#[test]
fn mhc_pre_post_and_head_match_reference() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(5);
    for (m, d, t) in [(4, 8, 1), (4, 130, 5), (2, 64, 40), (4, 256, 3)] {
        let (fn_w, base, scale) = hc_case(&mut g, m, d, (2 + m) * m);
        let p = HcParams {
            fn_w: &fn_w,
            base: &base,
            scale: &scale,
            m,
            d,
            norm_eps: 1e-6,
            hc_eps: 1e-6,
            sinkhorn_iters: 20,
        };
        let x = vec_sym(&mut g, t * m * d, 2.0);
        let (a, b) = (cpu.mhc_pre(&p, &x, t), rf.mhc_pre(&p, &x, t));
        let what = format!("mhc m{m} d{d} t{t}");
        check(&format!("{what} u"), &a.u, &b.u);
        check(&format!("{what} post"), &a.post, &b.post);
        check(&format!("{what} comb"), &a.comb, &b.comb);
        let y = vec_sym(&mut g, t * d, 1.0);
        let (mut oa, mut ob) = (vec![0f32; t * m * d], vec![0f32; t * m * d]);
        cpu.mhc_post(&x, &y, &b, m, d, &mut oa);
        rf.mhc_post(&x, &y, &b, m, d, &mut ob);
        assert!(same_bits(&oa, &ob), "{what} post step");
        let (hw, hb, hs) = hc_case(&mut g, m, d, m);
        let hp = HcParams {
            fn_w: &hw,
            base: &hb,
            scale: &hs[..1],
            ..p
        };
        let (mut ha, mut hb2) = (vec![0f32; t * d], vec![0f32; t * d]);
        cpu.hc_head(&hp, &x, t, &mut ha);
        rf.hc_head(&hp, &x, t, &mut hb2);
        check(&format!("{what} head"), &ha, &hb2);
    }
}

#[test]
fn softmax_pool_matches_reference() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(6);
    for (rows, width) in [(1, 1), (4, 7), (8, 130), (128, 512)] {
        let a = vec_sym(&mut g, rows * width, 3.0);
        let mut z = vec_sym(&mut g, rows * width, 8.0);
        // Absent rows (z = −∞), and one column with every row absent.
        for r in (0..rows).step_by(3) {
            z[r * width..(r + 1) * width].fill(f32::NEG_INFINITY);
        }
        for r in 0..rows {
            z[r * width] = f32::NEG_INFINITY;
        }
        let (mut oa, mut ob) = (vec![1f32; width], vec![0f32; width]);
        cpu.softmax_pool(&a, &z, rows, width, &mut oa);
        rf.softmax_pool(&a, &z, rows, width, &mut ob);
        assert_eq!(oa[0], 0.0, "a column of absent rows pools to 0");
        check(&format!("softmax_pool {rows}x{width}"), &oa, &ob);
    }
}

#[test]
fn hadamard_matches_reference() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(7);
    for dim in [1, 2, 16, 128] {
        let x = vec_sym(&mut g, 3 * dim, 1.0);
        let (mut a, mut b) = (x.clone(), x);
        cpu.hadamard(&mut a, dim);
        rf.hadamard(&mut b, dim);
        check(&format!("hadamard {dim}"), &a, &b);
    }
}

#[test]
fn indexer_scores_match_reference() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(8);
    for (heads, dim, n) in [(1, 16, 1), (4, 128, 17), (64, 128, 300), (3, 40, 0)] {
        let q = vec_sym(&mut g, heads * dim, 1.0);
        let w = vec_sym(&mut g, heads, 1.0);
        let keys = vec_sym(&mut g, n * dim, 1.0);
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        cpu.indexer_scores(&q, &w, dim, &keys, &mut a);
        rf.indexer_scores(&q, &w, dim, &keys, &mut b);
        check(&format!("indexer_scores h{heads} d{dim} n{n}"), &a, &b);
    }
}

#[test]
fn topk_selects_the_reference_sets() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(9);
    for n in [0usize, 1, 5, 64, 1000] {
        // Distinct scores.
        let mut scores: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
        for i in (1..n).rev() {
            scores.swap(i, g.below(i as u64 + 1) as usize);
        }
        for k in [0, 1, 5, n, n + 3] {
            assert_eq!(
                cpu.topk(&scores, k),
                rf.topk(&scores, k),
                "distinct n{n} k{k}"
            );
        }
    }
    // Ties go to the lower index; NaN sorts last.
    let tied = [1.0, 2.0, 2.0, f32::NAN, 2.0, -1.0, 2.0, f32::NAN];
    for k in 0..=tied.len() {
        assert_eq!(cpu.topk(&tied, k), rf.topk(&tied, k), "tied k{k}");
    }
}

#[test]
fn sparse_attention_matches_reference() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(10);
    for (heads, dim, n) in [
        (1, 8, 1),
        (4, 128, 20),
        (16, 512, 300),
        (3, 33, 0),
        (2, 64, 129),
    ] {
        let q = vec_sym(&mut g, heads * dim, 0.3);
        let keys = vec_sym(&mut g, n * dim, 1.0);
        let mut sink = vec_sym(&mut g, heads, 2.0);
        sink[0] = f32::NEG_INFINITY;
        let scale = 1.0 / (dim as f32).sqrt();
        let (mut a, mut b) = (vec![f32::NAN; heads * dim], vec![0f32; heads * dim]);
        cpu.sparse_attention(&q, dim, &keys, &sink, scale, &mut a);
        rf.sparse_attention(&q, dim, &keys, &sink, scale, &mut b);
        if n == 0 {
            assert!(a.iter().all(|&v| v == 0.0), "no keys: zero output");
        } else {
            check(&format!("sparse_attention h{heads} d{dim} n{n}"), &a, &b);
        }
    }
}

#[test]
fn router_and_swiglu_match_reference() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(11);
    for n in [1, 7, 300] {
        let x = vec_sym(&mut g, n, 30.0);
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        cpu.router_scores(&x, &mut a);
        rf.router_scores(&x, &mut b);
        assert!(same_bits(&a, &b), "router_scores {n}");
        let u = vec_sym(&mut g, n, 30.0);
        cpu.swiglu(&x, &u, 10.0, 0.7, &mut a);
        rf.swiglu(&x, &u, 10.0, 0.7, &mut b);
        check(&format!("swiglu {n}"), &a, &b);
    }
}

#[test]
fn cache_rows_and_index_rounding_are_byte_exact() {
    let (cpu, rf) = (cpu(), ReferenceBackend);
    let mut g = SplitMix64::new(12);
    let mut formats = Vec::new();
    for dt in [KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
        formats.push(RowFormat::Kv(
            KvLayout::from_head_dims(dt, 128, 64, 4).unwrap(),
        ));
    }
    for dt in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
        formats.push(RowFormat::IndexK(IndexKLayout::new(dt, 128, 64).unwrap()));
    }
    for fmt in formats {
        let garbage: Vec<u8> = (0..fmt.page_bytes()).map(|_| g.below(256) as u8).collect();
        let (mut pa, mut pb) = (garbage.clone(), garbage);
        for slot in [0, 1, fmt.page_entries() - 1] {
            let v = vec_sym(&mut g, fmt.width(), 4.0);
            cpu.cache_store(&fmt, &mut pa, slot, &v).unwrap();
            rf.cache_store(&fmt, &mut pb, slot, &v).unwrap();
            assert_eq!(pa, pb, "{fmt:?} slot {slot}: page bytes");
            let (mut la, mut lb) = (vec![0f32; fmt.width()], vec![0f32; fmt.width()]);
            cpu.cache_load(&fmt, &pa, slot, &mut la).unwrap();
            rf.cache_load(&fmt, &pb, slot, &mut lb).unwrap();
            assert!(same_bits(&la, &lb), "{fmt:?} slot {slot}: loaded row");
        }
        assert!(
            cpu.cache_store(&fmt, &mut pa, fmt.page_entries(), &[0.0; 128])
                .is_err()
        );
    }
    for dt in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
        let x = vec_sym(&mut g, 5 * 128, 3.0);
        let (mut a, mut b) = (x.clone(), x);
        cpu.round_index_rows(dt, &mut a, 128);
        rf.round_index_rows(dt, &mut b, 128);
        assert!(same_bits(&a, &b), "round_index_rows {dt:?}");
    }
}

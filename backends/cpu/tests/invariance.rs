//! Batch invariance of the cpu backend by construction: a row's output is bitwise the same
//! whatever else is in the call, however many threads run, and whichever kernel set (AVX2 or
//! portable) computes it.

mod common;

use common::{FORMATS, same_bits, vec_sym};
use dsv4_backend_cpu::{CpuBackend, Isa, Sums};
use dsv4_core::{IndexKDtype, SplitMix64};
use dsv4_kernels::{Backend, HcParams, PerRow, RopeTable, WeightFormat};

#[test]
fn linear_rows_do_not_depend_on_the_other_rows() {
    // Two thread counts split the 200 outputs into items differently: with one, an item spans
    // panels of both 128-row fp8 scale blocks, so a kernel's scales change partway through it.
    for sums in [Sums::F64, Sums::F32] {
        for isa in Isa::available() {
            for threads in [1, 2] {
                let be = CpuBackend::with_isa(threads, isa).unwrap();
                linear_rows_alone_and_batched(&be.with_sums(sums));
            }
        }
    }
}

/// Every row of an M-row `linear` equals its own 1-row call, bitwise, for several M.
fn linear_rows_alone_and_batched(be: &CpuBackend) {
    let mut g = SplitMix64::new(1);
    for fmt in FORMATS {
        let (n, k) = (200, if fmt == WeightFormat::Mxfp4 { 320 } else { 300 });
        let w = common::random_linear(fmt, n, k, g.next_u64());
        let x = vec_sym(&mut g, 200 * k, 1.0);
        let alone: Vec<Vec<f32>> = (0..200)
            .map(|r| {
                let mut o = vec![0f32; n];
                be.linear(&w, &x[r * k..(r + 1) * k], 1, &mut o);
                o
            })
            .collect();
        for m in [1, 2, 3, 7, 16, 33, 200] {
            // Rows taken from an offset so that each lands at a different place in the tiles.
            let start = 200 - m;
            let mut out = vec![0f32; m * n];
            be.linear(&w, &x[start * k..], m, &mut out);
            for r in 0..m {
                assert!(
                    same_bits(&out[r * n..(r + 1) * n], &alone[start + r]),
                    "{:?} {:?} sums, {fmt:?}: row {r} of {m} differs from the 1-row call",
                    be.isa(),
                    be.sums()
                );
            }
        }
    }
}

/// Every op on fixed inputs large enough to be split over threads; outputs concatenated.
fn all_ops(be: &dyn Backend) -> Vec<Vec<f32>> {
    let mut g = SplitMix64::new(7);
    let mut outs = Vec::new();
    for fmt in FORMATS {
        let w = common::random_linear(fmt, 100, 256, g.next_u64());
        let x = vec_sym(&mut g, 40 * 256, 1.0);
        let mut o = vec![0f32; 40 * 100];
        be.linear(&w, &x, 40, &mut o);
        outs.push(o);
    }
    let x = vec_sym(&mut g, 300 * 256, 2.0);
    let mut q = x.clone();
    be.act_quant_fp8(&mut q, 256);
    outs.push(q);
    let mut o = vec![0f32; x.len()];
    be.rms_norm(&x, Some(&x[..256]), 256, 1e-6, &mut o);
    outs.push(o);
    let mut r = x.clone();
    let pos: Vec<usize> = (0..300).map(|i| i / 4).collect();
    be.rope(&mut r, 256, &pos, &RopeTable::plain(64, 10000.0), false);
    outs.push(r);
    let mut h = x.clone();
    be.hadamard(&mut h, 128);
    outs.push(h);
    let (m, d, t) = (4, 64, 30);
    let (fw, base, scale) = (
        vec_sym(&mut g, 24 * m * d, 0.05),
        vec_sym(&mut g, 24, 1.0),
        [1.0, 0.5, 2.0],
    );
    let p = HcParams {
        fn_w: &fw,
        base: &base,
        scale: &scale,
        m,
        d,
        norm_eps: 1e-6,
        hc_eps: 1e-6,
        sinkhorn_iters: 20,
    };
    let xs = &x[..t * m * d];
    let pre = be.mhc_pre(&p, xs, t);
    let mut post = vec![0f32; t * m * d];
    be.mhc_post(xs, &x[..t * d], &pre, m, d, &mut post);
    let mut head = vec![0f32; t * d];
    be.hc_head(
        &HcParams {
            fn_w: &fw[..m * m * d],
            base: &base[..m],
            ..p
        },
        xs,
        t,
        &mut head,
    );
    outs.extend([pre.u, pre.post, pre.comb, post, head]);
    let mut pooled = vec![0f32; 512];
    be.softmax_pool(&x[..128 * 512], &x[512..129 * 512], 128, 512, &mut pooled);
    outs.push(pooled);
    let mut s = vec![0f32; 500];
    be.indexer_scores(&x[..64 * 128], &x[..64], 128, &x[..500 * 128], &mut s);
    outs.push(be.topk(&s, 16).iter().map(|&i| i as f32).collect());
    outs.push(s);
    let mut att = vec![0f32; 16 * 256];
    be.sparse_attention(
        &x[..16 * 256],
        256,
        &x[..200 * 256],
        &x[..16],
        0.0625,
        &mut att,
    );
    outs.push(att);
    let mut sw = vec![0f32; 5000];
    be.swiglu(&x[..5000], &x[5000..10000], 10.0, 0.3, &mut sw);
    outs.push(sw);
    let mut ri = x[..64 * 128].to_vec();
    be.round_index_rows(IndexKDtype::Fp4, &mut ri, 128);
    outs.push(ri);
    outs
}

#[test]
fn thread_count_and_kernel_set_do_not_change_any_op() {
    for sums in [Sums::F64, Sums::F32] {
        let base = all_ops(&CpuBackend::new(1).unwrap().with_sums(sums));
        let mut others = vec![
            ("2 threads".to_string(), CpuBackend::new(2).unwrap()),
            ("3 threads".to_string(), CpuBackend::new(3).unwrap()),
        ];
        for isa in Isa::available() {
            others.push((
                format!("{isa:?}, 2 threads"),
                CpuBackend::with_isa(2, isa).unwrap(),
            ));
        }
        for (what, be) in others {
            let be = be.with_sums(sums);
            for (i, (a, b)) in all_ops(&be).iter().zip(&base).enumerate() {
                assert!(
                    same_bits(a, b),
                    "{what}, {sums:?} sums: output {i} differs from 1 thread"
                );
            }
        }
    }
}

#[test]
fn row_ops_do_not_depend_on_the_other_rows() {
    let be = CpuBackend::new(2).unwrap();
    let mut g = SplitMix64::new(3);
    let dim = 200;
    let x = vec_sym(&mut g, 64 * dim, 3.0);
    let pos: Vec<usize> = (0..64).map(|i| 5 * i).collect();
    let table = RopeTable::plain(64, 10000.0);
    let run = |rows: std::ops::Range<usize>| {
        let xs = &x[rows.start * dim..rows.end * dim];
        let mut n = vec![0f32; xs.len()];
        be.rms_norm(xs, None, dim, 1e-6, &mut n);
        let mut q = xs.to_vec();
        be.act_quant_fp8(&mut q, dim);
        let mut r = xs.to_vec();
        be.rope(&mut r, dim, &pos[rows], &table, true);
        [n, q, r]
    };
    let all = run(0..64);
    for r in [0, 17, 63] {
        for (op, (one, many)) in run(r..r + 1).iter().zip(&all).enumerate() {
            assert!(
                same_bits(one, &many[r * dim..(r + 1) * dim]),
                "op {op}, row {r}"
            );
        }
    }
}

/// The shared-key forms read each query's keys where they lie; they must give exactly what the
/// trait's definitions (the keys laid out per query, then the per-row ops) give on this backend.
#[test]
fn shared_key_ops_equal_their_laid_out_definitions() {
    let be = CpuBackend::new(2).unwrap();
    let per_row = PerRow(&be);
    let mut g = SplitMix64::new(11);
    // (heads, dim, rows of keys, each query's key ids): sliding windows, an unordered window,
    // a repeated id, a query without keys, more keys than a 128-key chunk; and a prefill
    // chunk's worth of queries, which the threads take several at a time.
    let cases: [(usize, usize, usize, Vec<Vec<usize>>); 4] = [
        (
            4,
            64,
            40,
            vec![
                (1..33).collect(),
                (2..34).rev().collect(),
                vec![],
                vec![5, 5, 0],
            ],
        ),
        (3, 24, 9, vec![vec![8], (0..9).collect()]),
        (8, 128, 300, vec![(0..300).collect(), (100..260).collect()]),
        (
            4,
            64,
            160,
            (0..24).map(|r| (r..r + 128 + r % 5).collect()).collect(),
        ),
    ];
    for (heads, dim, n, ids) in cases {
        let queries = ids.len();
        let q = vec_sym(&mut g, queries * heads * dim, 1.0);
        let keys = vec_sym(&mut g, n * dim, 1.0);
        let sink = vec_sym(&mut g, heads, 2.0);
        let mut starts = vec![0];
        for i in &ids {
            starts.push(starts[starts.len() - 1] + i.len());
        }
        let flat: Vec<usize> = ids.concat();
        let (mut got, mut want) = (vec![0f32; q.len()], vec![0f32; q.len()]);
        be.sparse_attention_indexed(&q, dim, &keys, &flat, &starts, &sink, 0.3, &mut got);
        per_row.sparse_attention_indexed(&q, dim, &keys, &flat, &starts, &sink, 0.3, &mut want);
        assert!(
            same_bits(&got, &want),
            "sparse_attention_indexed h{heads} d{dim}"
        );

        // Nested prefixes, an offset range and an empty one.
        let w = vec_sym(&mut g, queries * heads, 1.0);
        let ranges: Vec<(usize, usize)> = (0..queries)
            .map(|r| match r % 3 {
                0 => (0, n - r),
                1 => (1, n / 2),
                _ => (n / 3, n / 3),
            })
            .collect();
        for k in [0, 4, 64] {
            let got = be.indexer_topk_ranges(&q, &w, dim, &keys, &ranges, k);
            let want = per_row.indexer_topk_ranges(&q, &w, dim, &keys, &ranges, k);
            assert_eq!(got, want, "indexer_topk_ranges h{heads} d{dim} k{k}");
        }
    }
}

/// Two rows of `heads` × `dim` over `n` keys, the second range one key past the end: the
/// call must panic with that row's message.
fn second_range_past_the_keys(threads: usize, heads: usize, dim: usize, n: usize) {
    let be = CpuBackend::new(threads).unwrap();
    let (q, w, keys) = (
        vec![0.5f32; 2 * heads * dim],
        vec![1f32; 2 * heads],
        vec![0.25f32; n * dim],
    );
    be.indexer_topk_ranges(&q, &w, dim, &keys, &[(0, n), (3, n + 1)], 4);
}

/// A key range past the keys panics, as the laid-out definition does.
#[test]
#[should_panic(expected = "key range 1 is 3..41 of 40 rows")]
fn a_key_range_past_the_keys_panics() {
    second_range_past_the_keys(1, 2, 8, 40);
}

/// The same on two threads with enough work to wake the pool: each thread takes whole rows, and
/// the bad row's panic reaches the caller with its message, whichever thread ran it.
#[test]
#[should_panic(expected = "key range 1 is 3..401 of 400 rows")]
fn a_key_range_past_the_keys_panics_through_the_pool() {
    second_range_past_the_keys(2, 16, 128, 400);
}

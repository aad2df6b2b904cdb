//! `indexer_topk_rows` on the device: index for index what the trait's composition
//! (`indexer_scores_rows` then `topk_rows`, row by row) gives on the same backend, in one
//! submission that reads back only the selection flags (never the scores); it panics where the
//! composition does. Skips with the reason when no adapter exists, except under CI=true.

mod common;

use common::{backend, stats, values};
use dsv4_kernels::{Backend, DeviceStats, PerRow};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// (q, w, keys, starts): `counts[r]` keys for query r after `first` unused ones, `heads` heads
/// of `dim`, values from `seed`.
fn case(
    heads: usize,
    dim: usize,
    counts: &[usize],
    first: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<usize>) {
    let mut starts = vec![first];
    for c in counts {
        starts.push(starts[starts.len() - 1] + c);
    }
    let rows = counts.len();
    let q = values(rows * heads * dim, seed);
    let w = values(rows * heads, seed + 1);
    let keys = values(starts[rows] * dim, seed + 2);
    (q, w, keys, starts)
}

/// Shapes: unequal ranges with an empty one and one past a 128-key block, keys before the first
/// range, k above some ranges, no keys at all, k = 0, zero-width keys (all scores zero).
const CASES: [(usize, usize, &[usize], usize, usize); 6] = [
    (4, 64, &[16, 0, 137, 5], 0, 16),
    (3, 32, &[1, 9, 40], 2, 4),
    (9, 16, &[300, 7], 0, 64),
    (2, 16, &[0, 0], 1, 8),
    (2, 16, &[5, 3], 0, 0),
    (2, 0, &[5, 3], 0, 2),
];

/// Each `CASES` shape: the backend's selection equals the trait's composition on the same
/// backend (scores bit for bit, so indices index for index); (what, keys, selected, stats).
fn check_cases(
    be: &dyn Backend,
    stats: &dyn Fn() -> DeviceStats,
) -> Vec<(String, usize, usize, DeviceStats)> {
    let per_row = PerRow(be);
    let mut out = Vec::new();
    for (i, &(heads, dim, counts, first, k)) in CASES.iter().enumerate() {
        let (q, w, keys, starts) = case(heads, dim, counts, first, 40 + i as u64);
        let what = format!("heads {heads} dim {dim} counts {counts:?} first {first} k {k}");
        let want = per_row.indexer_topk_rows(&q, &w, dim, &keys, &starts, k);
        let before = stats();
        let got = be.indexer_topk_rows(&q, &w, dim, &keys, &starts, k);
        let s = stats().since(&before);
        assert_eq!(got, want, "{what}");
        assert_eq!(got.len(), counts.len(), "{what}");
        for (r, idx) in got.iter().enumerate() {
            assert_eq!(idx.len(), counts[r].min(k), "{what}: query {r}");
        }
        let keys_n: usize = counts.iter().sum();
        let selected: usize = counts.iter().map(|&c| c.min(k)).sum();
        out.push((what, if dim > 0 { keys_n } else { 0 }, selected, s));
    }
    out
}

/// The composition panics on these operands (decreasing starts, keys short of a range, a short
/// q); so must the backend's selection.
fn check_panics(be: &dyn Backend) {
    let per_row = PerRow(be);
    let (heads, dim) = (2usize, 4usize);
    let q = vec![0.25f32; 2 * heads * dim];
    let w = vec![0.5f32; 2 * heads];
    let keys = vec![0.5f32; 6 * dim];
    let cases: [(&[usize], usize); 3] = [
        (&[0, 4, 2], q.len()),
        (&[0, 3, 7], q.len()),
        (&[0, 3, 6], q.len() - 1),
    ];
    for (starts, qn) in cases {
        let run = |b: &dyn Backend| {
            catch_unwind(AssertUnwindSafe(|| {
                b.indexer_topk_rows(&q[..qn], &w, dim, &keys, starts, 2);
            }))
            .is_err()
        };
        assert!(run(&per_row), "the composition accepts {starts:?} q {qn}");
        assert!(run(be), "the fused op accepts {starts:?} q {qn}");
    }
}

#[test]
fn the_selection_equals_scores_then_topk_in_one_submission() {
    let Some(gpu) = backend(true) else { return };
    for (what, keys, selected, s) in check_cases(&gpu, &|| stats(&gpu)) {
        if keys > 0 && selected > 0 {
            assert_eq!(s.submissions, 1, "{what}: {s:?}");
            assert_eq!(
                s.read_bytes,
                keys as u64 * 4,
                "{what}: one flag per key, no scores"
            );
        }
    }
    check_panics(&gpu);
}

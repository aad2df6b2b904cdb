//! Checks of a backend's fused host ops against the trait's composition of row-by-row
//! definitions ([`PerRow`]), shared by the GPU backends' tests: `indexer_topk_rows` must choose
//! exactly what `indexer_scores_rows` then `topk_rows` choose on the same backend, and panic
//! where they panic. Each backend's test then asserts its own submission and read-back counts
//! from the [`IndexerTopkCall`]s.

use crate::{Backend, DeviceStats, PerRow};
use dsv4_core::SplitMix64;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Shapes (heads, dim, keys per query, unused keys before the first, k): unequal ranges with an
/// empty one and one past a 128-key block, keys before the first range, k above some ranges, no
/// keys at all, k = 0, zero-width keys (every score zero).
const CASES: [(usize, usize, &[usize], usize, usize); 6] = [
    (4, 64, &[16, 0, 137, 5], 0, 16),
    (3, 32, &[1, 9, 40], 2, 4),
    (9, 16, &[300, 7], 0, 64),
    (2, 16, &[0, 0], 1, 8),
    (2, 16, &[5, 3], 0, 0),
    (2, 0, &[5, 3], 0, 2),
];

/// One checked `indexer_topk_rows` call.
#[derive(Debug, Clone)]
pub struct IndexerTopkCall {
    /// The shape, for messages.
    pub what: String,
    /// Keys scored (0 when they have no width).
    pub keys: usize,
    /// Indices chosen over all queries.
    pub selected: usize,
    /// The backend's traffic during the call (what `stats` moved by).
    pub stats: DeviceStats,
}

/// `n` pseudo-random values of a few units.
fn values(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normalish(1.0)).collect()
}

/// Every shape: `be.indexer_topk_rows` equals the composition on `be`, index for index (with
/// the same scores bit for bit the ranking must agree), with min(k, n) indices per query.
/// `stats` reads the backend's traffic counters. Err names the first shape that differs.
pub fn indexer_topk_rows(
    be: &dyn Backend,
    stats: &dyn Fn() -> DeviceStats,
) -> Result<Vec<IndexerTopkCall>, String> {
    let per_row = PerRow(be);
    let mut rng = SplitMix64::new(0x1d3e_70b5);
    let mut calls = Vec::new();
    for &(heads, dim, counts, first, k) in &CASES {
        let mut starts = vec![first];
        for c in counts {
            starts.push(starts[starts.len() - 1] + c);
        }
        let rows = counts.len();
        let q = values(&mut rng, rows * heads * dim);
        let w = values(&mut rng, rows * heads);
        let keys = values(&mut rng, starts[rows] * dim);
        let what = format!("heads {heads} dim {dim} counts {counts:?} first {first} k {k}");
        let want = per_row.indexer_topk_rows(&q, &w, dim, &keys, &starts, k);
        let before = stats();
        let got = be.indexer_topk_rows(&q, &w, dim, &keys, &starts, k);
        let moved = stats().since(&before);
        if got != want {
            return Err(format!("{what}: chose {got:?}, the composition {want:?}"));
        }
        let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
        let want_sizes: Vec<usize> = counts.iter().map(|&c| c.min(k)).collect();
        if sizes != want_sizes {
            return Err(format!("{what}: {sizes:?} indices, not {want_sizes:?}"));
        }
        calls.push(IndexerTopkCall {
            what,
            keys: if dim > 0 { counts.iter().sum() } else { 0 },
            selected: want_sizes.iter().sum(),
            stats: moved,
        });
    }
    Ok(calls)
}

/// Operands the composition panics on (decreasing starts, keys short of a range, a short q):
/// `be.indexer_topk_rows` must panic too. Err names the first it accepts.
pub fn indexer_topk_rows_panics(be: &dyn Backend) -> Result<(), String> {
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
        let panics = |b: &dyn Backend| {
            catch_unwind(AssertUnwindSafe(|| {
                b.indexer_topk_rows(&q[..qn], &w, dim, &keys, starts, 2);
            }))
            .is_err()
        };
        if !panics(&per_row) {
            return Err(format!("the composition accepts starts {starts:?}, q {qn}"));
        }
        if !panics(be) {
            return Err(format!(
                "indexer_topk_rows accepts starts {starts:?}, q {qn}"
            ));
        }
    }
    Ok(())
}

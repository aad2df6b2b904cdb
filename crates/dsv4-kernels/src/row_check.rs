//! Checks of a backend's fused host ops against the trait's composition of row-by-row
//! definitions ([`PerRow`]), shared by the GPU backends' tests: `indexer_topk_rows` must choose
//! exactly what `indexer_scores_rows` then `topk_rows` choose on the same backend,
//! `paged_indexer_topk_rows` what `cache_load_rows` then `indexer_topk_rows` choose,
//! `paged_indexer_topk_ranges` what `paged_indexer_topk_rows` chooses over the expanded ranges,
//! `paged_attention_rows` must give bit for bit what `cache_load_rows` then
//! `sparse_attention_rows` give, and `paged_attention_indexed` what `paged_attention_rows` gives
//! over the rows laid out id by id; each must fail and panic where the composition does. Each
//! backend's test then asserts its own submission and read-back counts from the
//! [`FusedCall`]s.

use crate::{Backend, DeviceStats, PageTag, PerRow, RowFormat};
use dsv4_core::cache::IndexKLayout;
use dsv4_core::{IndexKDtype, SplitMix64};
use std::panic::{AssertUnwindSafe, catch_unwind};

mod attention;

pub use attention::{
    paged_attention_indexed, paged_attention_indexed_panics, paged_attention_rows,
    paged_attention_rows_panics,
};

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

/// One checked call of a fused op.
#[derive(Debug, Clone)]
pub struct FusedCall {
    /// The shape, for messages.
    pub what: String,
    /// Keys scored or attended over (0 when they have no width).
    pub keys: usize,
    /// Values the call returns: indices chosen (`indexer_topk_rows`), output floats
    /// (`paged_attention_rows`).
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
) -> Result<Vec<FusedCall>, String> {
    let per_row = PerRow(be);
    let mut rng = SplitMix64::new(0x1d3e_70b5);
    let mut calls = Vec::new();
    for &(heads, dim, counts, first, k) in &CASES {
        let starts = starts_of(first, counts);
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
        calls.push(FusedCall {
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
        both_panic(
            &per_row,
            be,
            "indexer_topk_rows",
            &format!("starts {starts:?}, q {qn}"),
            |b| {
                b.indexer_topk_rows(&q[..qn], &w, dim, &keys, starts, 2);
            },
        )?;
    }
    Ok(())
}

/// Three pages of `fmt` with every slot written by `be` from random values.
fn written_pages(be: &dyn Backend, fmt: &RowFormat, rng: &mut SplitMix64) -> Vec<Vec<u8>> {
    (0..3)
        .map(|_| {
            let mut page = vec![0u8; fmt.page_bytes()];
            for slot in 0..fmt.page_entries() {
                let v = values(rng, fmt.width());
                be.cache_store(fmt, &mut page, slot, &v)
                    .expect("a valid slot of a valid page");
            }
            page
        })
        .collect()
}

/// Shapes of the `paged_indexer_topk_rows` checks: (index-K dtype, dim, entries per page, heads,
/// keys per query, unused rows before the first, k): every index-K dtype, unequal ranges with
/// an empty one, rows before the first, k above a range, k = 0, no keys at all.
type PagedIndexerCase = (
    IndexKDtype,
    usize,
    usize,
    usize,
    &'static [usize],
    usize,
    usize,
);
const PAGED_INDEXER_CASES: [PagedIndexerCase; 5] = [
    (IndexKDtype::Fp8, 64, 4, 4, &[16, 0, 37, 5], 2, 8),
    (IndexKDtype::Fp4, 64, 3, 3, &[1, 9, 40], 0, 4),
    (IndexKDtype::Bf16, 32, 5, 2, &[7, 20], 1, 16),
    (IndexKDtype::Fp8, 64, 4, 2, &[5, 3], 0, 0),
    (IndexKDtype::Fp4, 64, 3, 2, &[0, 0], 1, 4),
];

/// Every shape: `be.paged_indexer_topk_rows` chooses what the composition (`cache_load_rows`
/// then `indexer_topk_rows`) chooses on `be`, index for index, over rows picked at random from
/// three pages (some twice); a row past a page's last slot is the same layout error. `stats`
/// reads the backend's traffic counters. Err names the first shape that differs.
pub fn paged_indexer_topk_rows(
    be: &dyn Backend,
    stats: &dyn Fn() -> DeviceStats,
) -> Result<Vec<FusedCall>, String> {
    let per_row = PerRow(be);
    let mut rng = SplitMix64::new(0x51dc_0a3b);
    let mut calls = Vec::new();
    for &(dtype, dim, per, heads, counts, first, k) in &PAGED_INDEXER_CASES {
        let layout = IndexKLayout::new(dtype, dim, per).map_err(|e| e.to_string())?;
        let fmt = RowFormat::IndexK(layout);
        let pages = written_pages(be, &fmt, &mut rng);
        let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
        let starts = starts_of(first, counts);
        let rows = random_rows(&mut rng, starts[counts.len()], per);
        let queries = counts.len();
        let q = values(&mut rng, queries * heads * dim);
        let w = values(&mut rng, queries * heads);
        let what =
            format!("{dtype:?} dim {dim} heads {heads} counts {counts:?} first {first} k {k}");
        let run = |b: &dyn Backend, rows: &[(usize, usize)]| {
            b.paged_indexer_topk_rows(&q, &w, &fmt, &refs, rows, &starts, k)
                .map_err(|e| e.to_string())
        };
        let want = run(&per_row, &rows);
        let before = stats();
        let got = run(be, &rows);
        let moved = stats().since(&before);
        if got != want {
            return Err(format!("{what}: chose {got:?}, the composition {want:?}"));
        }
        calls.push(FusedCall {
            what: what.clone(),
            keys: starts[queries] - first,
            selected: counts.iter().map(|&c| c.min(k)).sum(),
            stats: moved,
        });
        let bad = past_the_page(&rows, per);
        let (want, got) = (run(&per_row, &bad), run(be, &bad));
        if want.is_ok() || got != want {
            return Err(format!(
                "{what}, a slot past the page: {got:?}, the composition {want:?}"
            ));
        }
    }
    Ok(calls)
}

/// Operands the composition panics on (decreasing starts, rows short of a range, a short q):
/// `be.paged_indexer_topk_rows` must panic too. Err names the first it accepts.
pub fn paged_indexer_topk_rows_panics(be: &dyn Backend) -> Result<(), String> {
    let per_row = PerRow(be);
    let layout = IndexKLayout::new(IndexKDtype::Fp8, 32, 4).map_err(|e| e.to_string())?;
    let fmt = RowFormat::IndexK(layout);
    let mut rng = SplitMix64::new(11);
    let pages = written_pages(be, &fmt, &mut rng);
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let (heads, dim) = (2usize, 32usize);
    let rows: Vec<(usize, usize)> = (0..6).map(|i| (i % 3, i % 4)).collect();
    let q = vec![0.25f32; 2 * heads * dim];
    let w = vec![0.5f32; 2 * heads];
    let cases: [(&[usize], usize); 3] = [
        (&[0, 4, 2], q.len()),
        (&[0, 3, 7], q.len()),
        (&[0, 3, 6], q.len() - 1),
    ];
    for (starts, qn) in cases {
        let case = format!("starts {starts:?}, q {qn}");
        both_panic(&per_row, be, "paged_indexer_topk_rows", &case, |b| {
            let _ = b.paged_indexer_topk_rows(&q[..qn], &w, &fmt, &refs, &rows, starts, 2);
        })?;
    }
    Ok(())
}

/// Key ranges over 40 shared rows: nested prefixes (a prefill chunk's rows of one sequence),
/// one range inside another, an empty one, one repeated, every row. Row 39 is in none but the
/// last, so a check of a bad row 38 (none of the first four ranges) is a check of unused rows.
const SHARED_RANGES: [(usize, usize); 6] = [(0, 9), (0, 13), (4, 30), (13, 13), (0, 13), (0, 40)];

/// Every shape of `paged_indexer_topk_rows`'s cases: `be.paged_indexer_topk_ranges` over
/// `SHARED_RANGES` of 40 rows picked at random from three pages chooses what the
/// composition (the rows laid out range after range, then `paged_indexer_topk_rows`) chooses on
/// `be`, index for index; a row past a page's last slot is the same layout error, also when
/// the ranges that would read it are left out. Err names the first shape that differs.
pub fn paged_indexer_topk_ranges(
    be: &dyn Backend,
    stats: &dyn Fn() -> DeviceStats,
) -> Result<Vec<FusedCall>, String> {
    let per_row = PerRow(be);
    let mut rng = SplitMix64::new(0x7a9e_5b11);
    let mut calls = Vec::new();
    for &(dtype, dim, per, heads, _, _, k) in &PAGED_INDEXER_CASES {
        let layout = IndexKLayout::new(dtype, dim, per).map_err(|e| e.to_string())?;
        let fmt = RowFormat::IndexK(layout);
        let pages = written_pages(be, &fmt, &mut rng);
        let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
        let rows = random_rows(&mut rng, 40, per);
        let queries = SHARED_RANGES.len();
        let q = values(&mut rng, queries * heads * dim);
        let w = values(&mut rng, queries * heads);
        let what = format!("{dtype:?} dim {dim} heads {heads} shared ranges, k {k}");
        let tags = fresh_tags(refs.len());
        let run_tagged = |b: &dyn Backend,
                          rows: &[(usize, usize)],
                          ranges: &[(usize, usize)],
                          tags: &[PageTag]| {
            let (q, w) = (&q[..ranges.len() * heads * dim], &w[..ranges.len() * heads]);
            b.paged_indexer_topk_ranges(q, w, &fmt, &refs, tags, rows, ranges, k)
                .map_err(|e| e.to_string())
        };
        let run = |b: &dyn Backend, rows: &[(usize, usize)], ranges: &[(usize, usize)]| {
            run_tagged(b, rows, ranges, &[])
        };
        let want = run(&per_row, &rows, &SHARED_RANGES);
        let before = stats();
        let got = run(be, &rows, &SHARED_RANGES);
        let moved = stats().since(&before);
        if got != want {
            return Err(format!("{what}: chose {got:?}, the composition {want:?}"));
        }
        // Tagged pages, twice (a backend may keep them from the first call): the same choice.
        for pass in 0..2 {
            let got = run_tagged(be, &rows, &SHARED_RANGES, &tags);
            if got != want {
                return Err(format!(
                    "{what}: tagged pass {pass} chose {got:?}, not {want:?}"
                ));
            }
        }
        calls.push(FusedCall {
            what: what.clone(),
            keys: rows.len(),
            selected: SHARED_RANGES.iter().map(|&(a, b)| (b - a).min(k)).sum(),
            stats: moved,
        });
        let mut bad = rows.clone();
        bad[38] = (1, per);
        for ranges in [&SHARED_RANGES[..], &SHARED_RANGES[..4]] {
            let (want, got) = (run(&per_row, &bad, ranges), run(be, &bad, ranges));
            if want.is_ok() || got != want {
                return Err(format!(
                    "{what}, a slot past the page ({} ranges): {got:?}, the composition {want:?}",
                    ranges.len()
                ));
            }
        }
    }
    Ok(calls)
}

/// Ranges the composition panics on (decreasing, past the rows): `be.paged_indexer_topk_ranges`
/// must panic too. Err names the first it accepts.
pub fn paged_indexer_topk_ranges_panics(be: &dyn Backend) -> Result<(), String> {
    let per_row = PerRow(be);
    let layout = IndexKLayout::new(IndexKDtype::Fp8, 32, 4).map_err(|e| e.to_string())?;
    let fmt = RowFormat::IndexK(layout);
    let mut rng = SplitMix64::new(13);
    let pages = written_pages(be, &fmt, &mut rng);
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let rows: Vec<(usize, usize)> = (0..6).map(|i| (i % 3, i % 4)).collect();
    let (q, w) = (vec![0.25f32; 2 * 2 * 32], vec![0.5f32; 2 * 2]);
    let cases: [[(usize, usize); 2]; 3] = [[(0, 4), (3, 2)], [(0, 7), (0, 1)], [(2, 6), (7, 7)]];
    for ranges in cases {
        let case = format!("ranges {ranges:?} of 6 rows");
        both_panic(&per_row, be, "paged_indexer_topk_ranges", &case, |b| {
            let _ = b.paged_indexer_topk_ranges(&q, &w, &fmt, &refs, &[], &rows, &ranges, 2);
        })?;
    }
    Ok(())
}

/// `n` content tags for pages written whole here: fresh lineages, every entry settled.
pub fn fresh_tags(n: usize) -> Vec<PageTag> {
    (0..n).map(|_| PageTag::fresh_whole()).collect()
}

/// Err unless `call` panics both on the composition (`per_row`) and on `be`, which runs `op`;
/// `case` names the operands.
fn both_panic(
    per_row: &dyn Backend,
    be: &dyn Backend,
    op: &str,
    case: &str,
    call: impl Fn(&dyn Backend),
) -> Result<(), String> {
    let panics = |b: &dyn Backend| catch_unwind(AssertUnwindSafe(|| call(b))).is_err();
    if !panics(per_row) {
        return Err(format!("the composition accepts {case}"));
    }
    if !panics(be) {
        return Err(format!("{op} accepts {case}"));
    }
    Ok(())
}

/// Range starts: `first`, then after each of `counts`.
fn starts_of(first: usize, counts: &[usize]) -> Vec<usize> {
    let mut starts = vec![first];
    for c in counts {
        starts.push(starts[starts.len() - 1] + c);
    }
    starts
}

/// `n` rows (page of three, slot of `per`) at random, the last a repeat of the first.
fn random_rows(rng: &mut SplitMix64, n: usize, per: usize) -> Vec<(usize, usize)> {
    let mut rows: Vec<(usize, usize)> = (0..n)
        .map(|_| (rng.below(3) as usize, rng.below(per as u64) as usize))
        .collect();
    if n > 1 {
        rows[n - 1] = rows[0];
    }
    rows
}

/// `rows` and a slot past the last of a page of `per` entries, then a valid one.
fn past_the_page(rows: &[(usize, usize)], per: usize) -> Vec<(usize, usize)> {
    let mut bad = rows.to_vec();
    bad.push((1, per));
    bad.push((0, 0));
    bad
}

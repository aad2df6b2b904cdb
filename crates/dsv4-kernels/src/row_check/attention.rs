//! The paged attention checks of [`super`]: `paged_attention_rows` against `cache_load_rows`
//! then `sparse_attention_rows`, and `paged_attention_indexed` against `paged_attention_rows`
//! over the rows laid out id by id, each bit for bit, and the panics of both.

use super::{
    FusedCall, both_panic, fresh_tags, past_the_page, random_rows, starts_of, values, written_pages,
};
use crate::{Backend, DeviceStats, PageTag, PerRow, RowFormat};
use dsv4_core::cache::KvLayout;
use dsv4_core::{KvCacheDtype, SplitMix64};

/// Shapes of the `paged_attention_rows` checks: (KV dtype, head dim, rope dim, entries per page,
/// heads, keys per query, unused rows before the first): unequal ranges with an empty one, rows
/// before the first range, a query without keys (the sink alone), no keys at all.
type PagedCase = (
    KvCacheDtype,
    usize,
    usize,
    usize,
    usize,
    &'static [usize],
    usize,
);
const PAGED_CASES: [PagedCase; 4] = [
    (KvCacheDtype::Fp8, 192, 64, 3, 4, &[5, 0, 7, 3], 2),
    (KvCacheDtype::Bf16, 10, 4, 2, 3, &[1, 4], 0),
    (KvCacheDtype::Bf16, 128, 64, 4, 8, &[9], 1),
    (KvCacheDtype::Fp8, 192, 64, 3, 2, &[0, 0], 1),
];

/// Every shape: `be.paged_attention_rows` equals the composition (`cache_load_rows` then
/// `sparse_attention_rows`) on `be` bit for bit, over rows picked at random from three pages
/// (some twice); and a row past a page's last slot is the same layout error. `stats` reads the
/// backend's traffic counters. Err names the first shape that differs.
pub fn paged_attention_rows(
    be: &dyn Backend,
    stats: &dyn Fn() -> DeviceStats,
) -> Result<Vec<FusedCall>, String> {
    let per_row = PerRow(be);
    let mut rng = SplitMix64::new(0x9a6e_d017);
    let mut calls = Vec::new();
    for &(dtype, hd, rd, per, heads, counts, first) in &PAGED_CASES {
        let layout = KvLayout::from_head_dims(dtype, hd, rd, per)
            .map_err(|e| format!("a bad case layout: {e}"))?;
        let fmt = RowFormat::Kv(layout);
        let pages = written_pages(be, &fmt, &mut rng);
        let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
        let starts = starts_of(first, counts);
        let n = starts[counts.len()];
        let rows = random_rows(&mut rng, n, per);
        let queries = counts.len();
        let q = values(&mut rng, queries * heads * hd);
        let sink = values(&mut rng, heads);
        let scale = 1.0 / (hd as f32).sqrt();
        let what = format!("{dtype:?} hd {hd} heads {heads} counts {counts:?} first {first}");
        let run = |b: &dyn Backend, rows: &[(usize, usize)]| {
            let mut out = vec![f32::NAN; queries * heads * hd];
            let r = b.paged_attention_rows(&q, &fmt, &refs, rows, &starts, &sink, scale, &mut out);
            (r.map_err(|e| e.to_string()), out)
        };
        let (want_r, want) = run(&per_row, &rows);
        let before = stats();
        let (got_r, got) = run(be, &rows);
        let moved = stats().since(&before);
        if got_r != want_r {
            return Err(format!("{what}: {got_r:?}, the composition {want_r:?}"));
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        if bits(&got) != bits(&want) {
            return Err(format!("{what}: the output differs from the composition's"));
        }
        calls.push(FusedCall {
            what: what.clone(),
            keys: n - first,
            selected: got.len(),
            stats: moved,
        });
        // A slot past the page: the composition's error, not a panic or another error.
        let bad = past_the_page(&rows, per);
        let (want_r, _) = run(&per_row, &bad);
        let (got_r, _) = run(be, &bad);
        if want_r.is_ok() || got_r != want_r {
            return Err(format!(
                "{what}, a slot past the page: {got_r:?}, the composition {want_r:?}"
            ));
        }
    }
    Ok(calls)
}

/// Operands the composition panics on (decreasing starts, rows short of a range, a short q or
/// output): `be.paged_attention_rows` must panic too. Err names the first it accepts.
pub fn paged_attention_rows_panics(be: &dyn Backend) -> Result<(), String> {
    let per_row = PerRow(be);
    let layout =
        KvLayout::from_head_dims(KvCacheDtype::Bf16, 8, 4, 4).map_err(|e| e.to_string())?;
    let fmt = RowFormat::Kv(layout);
    let mut rng = SplitMix64::new(7);
    let pages = written_pages(be, &fmt, &mut rng);
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let (heads, dim) = (2usize, 8usize);
    let rows: Vec<(usize, usize)> = (0..6).map(|i| (i % 3, i % 4)).collect();
    let q = vec![0.25f32; 2 * heads * dim];
    let sink = [0.5f32, -0.5];
    let cases: [(&[usize], usize, usize); 4] = [
        (&[0, 4, 2], q.len(), q.len()),
        (&[0, 3, 7], q.len(), q.len()),
        (&[0, 3, 6], q.len() - 1, q.len()),
        (&[0, 3, 6], q.len(), q.len() - 1),
    ];
    for (starts, qn, on) in cases {
        let case = format!("starts {starts:?}, q {qn}, out {on}");
        both_panic(&per_row, be, "paged_attention_rows", &case, |b| {
            let mut out = vec![0f32; on];
            let _ =
                b.paged_attention_rows(&q[..qn], &fmt, &refs, &rows, starts, &sink, 0.5, &mut out);
        })?;
    }
    Ok(())
}

/// Key ids over 20 shared rows, and each query's keys of them: two keys before the first query
/// (rows 0 and 1 are read by no query), sliding windows (a prefill chunk's rows of one
/// sequence), a query without keys, repeated and unordered ids, and row 19 in one query only.
const SHARED_IDS: [usize; 25] = [
    0, 1, 2, 3, 4, 5, 6, 3, 4, 5, 6, 7, 8, 8, 8, 15, 19, 2, 12, 13, 14, 15, 16, 17, 18,
];
/// Where each query's keys start in [`SHARED_IDS`] (five queries).
const SHARED_ID_STARTS: [usize; 6] = [2, 7, 13, 13, 18, 25];

/// Every KV shape of `paged_attention_rows`'s cases: `be.paged_attention_indexed` over
/// `SHARED_IDS` of 20 rows picked at random from three pages gives bit for bit what the
/// composition (the rows laid out id by id, then `paged_attention_rows`) gives on `be`; a row
/// past a page's last slot is the same layout error, also when no query reads it. Err names the
/// first shape that differs.
pub fn paged_attention_indexed(
    be: &dyn Backend,
    stats: &dyn Fn() -> DeviceStats,
) -> Result<Vec<FusedCall>, String> {
    let per_row = PerRow(be);
    let mut rng = SplitMix64::new(0x5a4e_d1d5);
    let mut calls = Vec::new();
    for &(dtype, hd, rd, per, heads, _, _) in &PAGED_CASES {
        let layout = KvLayout::from_head_dims(dtype, hd, rd, per)
            .map_err(|e| format!("a bad case layout: {e}"))?;
        let fmt = RowFormat::Kv(layout);
        let pages = written_pages(be, &fmt, &mut rng);
        let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
        let rows = random_rows(&mut rng, 20, per);
        let queries = SHARED_ID_STARTS.len() - 1;
        let q = values(&mut rng, queries * heads * hd);
        let sink = values(&mut rng, heads);
        let scale = 1.0 / (hd as f32).sqrt();
        let what = format!("{dtype:?} hd {hd} heads {heads} shared key ids");
        let tags = fresh_tags(refs.len());
        let run_tagged = |b: &dyn Backend, rows: &[(usize, usize)], tags: &[PageTag]| {
            let mut out = vec![f32::NAN; queries * heads * hd];
            let (ids, starts) = (&SHARED_IDS[..], &SHARED_ID_STARTS[..]);
            let r = b.paged_attention_indexed(
                &q,
                &fmt,
                &refs,
                tags,
                &[],
                rows,
                ids,
                starts,
                &sink,
                scale,
                &mut out,
            );
            (r.map_err(|e| e.to_string()), out)
        };
        let run = |b: &dyn Backend, rows: &[(usize, usize)]| run_tagged(b, rows, &[]);
        let (want_r, want) = run(&per_row, &rows);
        let before = stats();
        let (got_r, got) = run(be, &rows);
        let moved = stats().since(&before);
        if got_r != want_r {
            return Err(format!("{what}: {got_r:?}, the composition {want_r:?}"));
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        if bits(&got) != bits(&want) {
            return Err(format!("{what}: the output differs from the composition's"));
        }
        // Tagged pages, twice (a backend may keep them from the first call): the same output.
        for pass in 0..2 {
            let (got_r, got) = run_tagged(be, &rows, &tags);
            if got_r != want_r || bits(&got) != bits(&want) {
                return Err(format!(
                    "{what}: tagged pass {pass} differs from the composition"
                ));
            }
        }
        calls.push(FusedCall {
            what: what.clone(),
            keys: rows.len(),
            selected: got.len(),
            stats: moved,
        });
        // Row 0 past its page: read by no query, still the composition's layout error.
        let mut bad = rows.clone();
        bad[0] = (1, per);
        let (want_r, _) = run(&per_row, &bad);
        let (got_r, _) = run(be, &bad);
        let (tagged_r, _) = run_tagged(be, &bad, &tags);
        if want_r.is_ok() || got_r != want_r || tagged_r != want_r {
            return Err(format!(
                "{what}, an unread slot past the page: {got_r:?} ({tagged_r:?} tagged), the \
                 composition {want_r:?}"
            ));
        }
    }
    Ok(calls)
}

/// Operands the composition panics on (an id past the rows, starts past the ids, a short q):
/// `be.paged_attention_indexed` must panic too. Err names the first it accepts.
pub fn paged_attention_indexed_panics(be: &dyn Backend) -> Result<(), String> {
    let per_row = PerRow(be);
    let layout =
        KvLayout::from_head_dims(KvCacheDtype::Fp8, 192, 64, 4).map_err(|e| e.to_string())?;
    let fmt = RowFormat::Kv(layout);
    let mut rng = SplitMix64::new(11);
    let pages = written_pages(be, &fmt, &mut rng);
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let (heads, dim) = (2usize, 192usize);
    let rows: Vec<(usize, usize)> = (0..6).map(|i| (i % 3, i % 4)).collect();
    let q = vec![0.25f32; 2 * heads * dim];
    let sink = [0.5f32, -0.5];
    let cases: [(&[usize], &[usize], usize); 4] = [
        (&[0, 6, 1], &[0, 1, 3], q.len()),
        (&[0, 1, 2], &[0, 2, 4], q.len()),
        (&[0, 1, 2], &[0, 2, 1], q.len()),
        (&[0, 1, 2], &[0, 1, 3], q.len() - 1),
    ];
    for (ids, starts, qn) in cases {
        let case = format!("ids {ids:?} of 6 rows, starts {starts:?}, q {qn}");
        both_panic(&per_row, be, "paged_attention_indexed", &case, |b| {
            let mut out = vec![0f32; q.len()];
            let (q, s) = (&q[..qn], &sink[..]);
            let _ = b.paged_attention_indexed(
                q,
                &fmt,
                &refs,
                &[],
                &[],
                &rows,
                ids,
                starts,
                s,
                0.5,
                &mut out,
            );
        })?;
    }
    Ok(())
}

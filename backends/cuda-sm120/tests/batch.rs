//! The batched host ops `cache_load_rows`, `indexer_scores_rows`, `topk_rows`,
//! `sparse_attention_rows` and `softmax_pool_rows` on the CPU emulator:
//! bitwise equal to the trait's row-by-row definitions (run through a wrapper that keeps the
//! default methods), with the same errors, and one submission (one synchronisation) per call.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::{backend, bits, emu_available, stats};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::cache::{CacheLayoutError, IndexKLayout, KvLayout};
use dsv4_core::{IndexKDtype, KvCacheDtype, SplitMix64};
use dsv4_kernels::{Backend, DeviceStats, PerRow, RowFormat};

/// What a call returned, as text (errors by their Display string).
fn shown(r: &Result<(), CacheLayoutError>) -> String {
    match r {
        Ok(()) => "Ok".into(),
        Err(e) => format!("Err({e})"),
    }
}

/// Every row format the cache tests use: KV bf16/fp8, index-K bf16/fp8/fp4.
fn formats() -> Vec<RowFormat> {
    vec![
        RowFormat::Kv(KvLayout::from_head_dims(KvCacheDtype::Fp8, 192, 64, 3).unwrap()),
        RowFormat::Kv(KvLayout::from_head_dims(KvCacheDtype::Bf16, 10, 4, 2).unwrap()),
        RowFormat::IndexK(IndexKLayout::new(IndexKDtype::Bf16, 48, 3).unwrap()),
        RowFormat::IndexK(IndexKLayout::new(IndexKDtype::Fp8, 32, 2).unwrap()),
        RowFormat::IndexK(IndexKLayout::new(IndexKDtype::Fp4, 64, 2).unwrap()),
    ]
}

/// `count` pages of `fmt` with every slot written (by the reference) from random values.
fn pages(fmt: &RowFormat, count: usize, rng: &mut SplitMix64) -> Vec<Vec<u8>> {
    (0..count)
        .map(|_| {
            let mut page = vec![0u8; fmt.page_bytes()];
            for slot in 0..fmt.page_entries() {
                let v: Vec<f32> = (0..fmt.width()).map(|_| rng.normalish(2.0)).collect();
                ReferenceBackend
                    .cache_store(fmt, &mut page, slot, &v)
                    .expect("store");
            }
            page
        })
        .collect()
}

#[test]
fn cache_load_rows_equals_the_row_loop_in_one_submission() {
    if !emu_available("cache_load_rows_equals_the_row_loop_in_one_submission") {
        return;
    }
    let be = backend(true);
    let looped = PerRow(&be);
    let mut rng = SplitMix64::new(11);
    for fmt in formats() {
        let owned = pages(&fmt, 4, &mut rng);
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let per = fmt.page_entries();
        // Arbitrary order, pages repeated, the same (page, slot) twice, one page unused.
        let mut rows: Vec<(usize, usize)> = (0..13)
            .map(|_| {
                let page = [2, 0, 3, 0, 2][rng.below(5) as usize];
                (page, rng.below(per as u64) as usize)
            })
            .collect();
        rows.push(rows[3]);
        rows.push((3, per - 1));
        rows.push((0, 0));
        let w = fmt.width();
        let mut want = vec![0f32; rows.len() * w];
        let before = stats(&be);
        looped
            .cache_load_rows(&fmt, &refs, &rows, &mut want)
            .expect("looped load");
        let loop_stats = stats(&be).since(&before);
        let mut got = vec![0f32; rows.len() * w];
        let before = stats(&be);
        be.cache_load_rows(&fmt, &refs, &rows, &mut got)
            .expect("batched load");
        let s = stats(&be).since(&before);
        assert_eq!(bits(&want), bits(&got), "{fmt:?}");
        let mut reference = vec![0f32; rows.len() * w];
        ReferenceBackend
            .cache_load_rows(&fmt, &refs, &rows, &mut reference)
            .expect("reference load");
        assert_eq!(
            bits(&reference),
            bits(&got),
            "{fmt:?} against the reference"
        );
        assert_eq!(loop_stats.submissions, rows.len() as u64, "{loop_stats:?}");
        assert_eq!(
            (s.submissions, s.reads, s.dispatches, s.read_bytes),
            (1, 1, 1, (rows.len() * w * 4) as u64),
            "{fmt:?}: {s:?}"
        );
        // No rows: nothing to do, nothing submitted.
        let before = stats(&be);
        be.cache_load_rows(&fmt, &refs, &[], &mut [])
            .expect("no rows");
        be.cache_load_rows(&fmt, &[], &[], &mut [])
            .expect("no rows, no pages");
        assert_eq!(stats(&be).since(&before), DeviceStats::default());
    }
}

#[test]
fn cache_load_rows_errors_are_the_row_loops() {
    if !emu_available("cache_load_rows_errors_are_the_row_loops") {
        return;
    }
    let be = backend(false);
    let looped = PerRow(&be);
    let mut rng = SplitMix64::new(5);
    for fmt in formats() {
        let mut owned = pages(&fmt, 3, &mut rng);
        // Page 2 has the wrong size.
        owned[2].push(0);
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let per = fmt.page_entries();
        let w = fmt.width();
        let cases: Vec<(Vec<(usize, usize)>, isize)> = vec![
            (vec![(0, 0), (1, per - 1)], 0),
            (vec![(0, 0), (1, 1)], 1),
            (vec![(0, 0), (1, 1)], -1),
            (vec![], 3),
            (vec![(1, 0), (0, 1), (5, 0)], 0),
            (vec![(1, 0), (0, per), (5, 0)], 0),
            (vec![(1, 0), (2, 0), (0, per)], 0),
            (vec![(0, 1), (1, per + 7), (2, 0), (9, 0)], 0),
            (vec![(3, 0)], 0),
            (vec![(0, usize::MAX)], 0),
        ];
        for (rows, extra) in cases {
            let len = (rows.len() * w).saturating_add_signed(extra);
            let mut want = vec![0f32; len];
            let mut got = vec![0f32; len];
            let a = looped.cache_load_rows(&fmt, &refs, &rows, &mut want);
            let b = be.cache_load_rows(&fmt, &refs, &rows, &mut got);
            assert_eq!(shown(&a), shown(&b), "{fmt:?} rows {rows:?} out {len}");
            if a.is_ok() {
                assert_eq!(bits(&want), bits(&got), "{fmt:?} rows {rows:?}");
            }
        }
    }
}

/// Random queries and keys for `counts` key rows per query, the keys starting at row `first`
/// of a key array with `tail` unused rows after the last; (q, keys, key_starts).
fn attention_case(
    rng: &mut SplitMix64,
    heads: usize,
    dim: usize,
    counts: &[usize],
    first: usize,
    tail: usize,
) -> (Vec<f32>, Vec<f32>, Vec<usize>) {
    let mut starts = vec![first];
    for c in counts {
        starts.push(starts.last().unwrap() + c);
    }
    let n = starts.last().unwrap() + tail;
    let q = (0..counts.len() * heads * dim)
        .map(|_| rng.normalish(1.0))
        .collect();
    let keys = (0..n * dim).map(|_| rng.normalish(1.0)).collect();
    (q, keys, starts)
}

#[test]
fn zero_keys_attend_only_to_the_sink() {
    // What the per-row op does with no keys (checked on the reference first): the output is
    // Σ over nothing / (0 + e^0), a signed zero; the CUDA op agrees bit for bit.
    if !emu_available("zero_keys_attend_only_to_the_sink") {
        return;
    }
    let be = backend(true);
    let (heads, dim) = (3, 8);
    let q = vec![0.5f32; heads * dim];
    let sink = [0.1f32, -2.0, 3.0];
    let mut want = vec![1f32; heads * dim];
    let mut got = vec![1f32; heads * dim];
    ReferenceBackend.sparse_attention(&q, dim, &[], &sink, 0.3, &mut want);
    be.sparse_attention(&q, dim, &[], &sink, 0.3, &mut got);
    assert!(want.iter().all(|v| *v == 0.0), "{want:?}");
    assert_eq!(bits(&want), bits(&got));
}

#[test]
fn sparse_attention_rows_equals_the_row_loop_in_one_submission() {
    if !emu_available("sparse_attention_rows_equals_the_row_loop_in_one_submission") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = backend(acc_f64);
        let looped = PerRow(&be);
        let mut rng = SplitMix64::new(u64::from(acc_f64) + 3);
        // Unequal key counts, one query with none, one past a 128-key block; heads above and
        // below a head group of 8; keys before the first start and after the last unused.
        for (heads, dim, counts, first, tail) in [
            (3usize, 16usize, vec![5usize, 0, 130, 1, 17], 2usize, 3usize),
            (9, 40, vec![0, 7, 33], 0, 0),
            (1, 4, vec![2], 0, 5),
            (2, 8, vec![0], 1, 0),
        ] {
            let (q, keys, starts) = attention_case(&mut rng, heads, dim, &counts, first, tail);
            let sink: Vec<f32> = (0..heads).map(|_| rng.normalish(1.0)).collect();
            let scale = 1.0 / (dim as f32).sqrt();
            let len = counts.len() * heads * dim;
            let mut want = vec![7f32; len];
            let before = stats(&be);
            looped.sparse_attention_rows(&q, dim, &keys, &starts, &sink, scale, &mut want);
            let loop_stats = stats(&be).since(&before);
            let mut got = vec![7f32; len];
            let before = stats(&be);
            be.sparse_attention_rows(&q, dim, &keys, &starts, &sink, scale, &mut got);
            let s = stats(&be).since(&before);
            let what = format!("acc_f64={acc_f64} heads {heads} dim {dim} counts {counts:?}");
            assert_eq!(bits(&want), bits(&got), "{what}");
            if acc_f64 {
                let mut reference = vec![7f32; len];
                ReferenceBackend.sparse_attention_rows(
                    &q,
                    dim,
                    &keys,
                    &starts,
                    &sink,
                    scale,
                    &mut reference,
                );
                assert_eq!(bits(&reference), bits(&got), "{what} against the reference");
            }
            assert_eq!(
                loop_stats.submissions,
                counts.len() as u64,
                "{loop_stats:?}"
            );
            assert_eq!(
                (s.submissions, s.reads, s.read_bytes),
                (1, 1, len as u64 * 4),
                "{what}: {s:?}"
            );
            // Longer q and out than the rows need: the rest is left alone.
            let mut q2 = q.clone();
            q2.extend([9.0; 5]);
            let mut got2 = vec![7f32; len + 5];
            be.sparse_attention_rows(&q2, dim, &keys, &starts, &sink, scale, &mut got2);
            assert_eq!(bits(&want), bits(&got2[..len]), "{what} (long q, out)");
            assert_eq!(
                bits(&got2[len..]),
                bits(&[7.0; 5]),
                "{what}: wrote past the rows"
            );
        }
        // No queries: nothing to do, nothing submitted.
        let before = stats(&be);
        for starts in [&[][..], &[0][..], &[3][..]] {
            be.sparse_attention_rows(&[], 4, &[0.0; 12], starts, &[0.5, 0.25], 1.0, &mut []);
        }
        assert_eq!(stats(&be).since(&before), DeviceStats::default());
    }
}

#[test]
fn sparse_attention_rows_panics_where_the_row_loop_does() {
    if !emu_available("sparse_attention_rows_panics_where_the_row_loop_does") {
        return;
    }
    let be = backend(true);
    let looped = PerRow(&be);
    let (heads, dim) = (2usize, 4usize);
    let sink = [0.0f32; 2];
    let q = vec![0.25f32; 2 * heads * dim];
    let keys = vec![0.5f32; 6 * dim];
    let cases: [(&[usize], usize, usize); 4] = [
        (&[0, 4, 2], q.len(), 2 * heads * dim),
        (&[0, 3, 7], q.len(), 2 * heads * dim),
        (&[0, 3, 6], q.len() - 1, 2 * heads * dim),
        (&[0, 3, 6], q.len(), 2 * heads * dim - 1),
    ];
    for (starts, qn, on) in cases {
        let run = |b: &dyn Backend| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut out = vec![0f32; on];
                b.sparse_attention_rows(&q[..qn], dim, &keys, starts, &sink, 1.0, &mut out);
            }))
            .is_err()
        };
        assert!(
            run(&looped),
            "the row loop accepts {starts:?} q {qn} out {on}"
        );
        assert!(
            run(&be),
            "the batched op accepts {starts:?} q {qn} out {on}"
        );
    }
}

#[test]
fn indexer_scores_rows_equals_the_row_loop_in_one_submission() {
    if !emu_available("indexer_scores_rows_equals_the_row_loop_in_one_submission") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = backend(acc_f64);
        let looped = PerRow(&be);
        let mut rng = SplitMix64::new(u64::from(acc_f64) + 21);
        // Unequal key counts, queries with none or one, one past a 128-key block; heads above
        // and below a head group of 8; queries too large for shared memory (heads·dim > 8192);
        // keys before the first start and after the last unused (their scores left alone).
        for (heads, dim, counts, first, tail) in [
            (3usize, 16usize, vec![5usize, 0, 130, 1, 17], 2usize, 3usize),
            (9, 40, vec![0, 7, 33], 0, 0),
            (1, 4, vec![2], 0, 5),
            (2, 8, vec![0, 0], 1, 2),
            (3, 2900, vec![3, 0, 2], 1, 1),
            (0, 4, vec![2, 3], 0, 0),
        ] {
            let (q, keys, starts) = attention_case(&mut rng, heads, dim, &counts, first, tail);
            let w: Vec<f32> = (0..counts.len() * heads)
                .map(|_| rng.normalish(1.0))
                .collect();
            let n = keys.len() / dim;
            let mut want = vec![7f32; n];
            let before = stats(&be);
            looped.indexer_scores_rows(&q, &w, dim, &keys, &starts, &mut want);
            let loop_stats = stats(&be).since(&before);
            let mut got = vec![7f32; n];
            let before = stats(&be);
            be.indexer_scores_rows(&q, &w, dim, &keys, &starts, &mut got);
            let s = stats(&be).since(&before);
            let what = format!("acc_f64={acc_f64} heads {heads} dim {dim} counts {counts:?}");
            assert_eq!(bits(&want), bits(&got), "{what}");
            if acc_f64 {
                let mut reference = vec![7f32; n];
                ReferenceBackend.indexer_scores_rows(&q, &w, dim, &keys, &starts, &mut reference);
                assert_eq!(bits(&reference), bits(&got), "{what} against the reference");
            }
            let busy = counts.iter().filter(|&&c| c > 0).count() as u64;
            assert_eq!(loop_stats.submissions, busy, "{what}: {loop_stats:?}");
            let scored: usize = counts.iter().sum();
            let want_stats = if scored == 0 {
                (0, 0, 0)
            } else {
                (1, 1, scored as u64 * 4)
            };
            assert_eq!(
                (s.submissions, s.reads, s.read_bytes),
                want_stats,
                "{what}: {s:?}"
            );
            // Longer q, w and out than the rows need: the rest is left alone.
            let mut q2 = q.clone();
            q2.extend([9.0; 5]);
            let mut got2 = vec![7f32; n + 5];
            be.indexer_scores_rows(&q2, &w, dim, &keys, &starts, &mut got2);
            assert_eq!(bits(&want), bits(&got2[..n]), "{what} (long q, out)");
            assert_eq!(bits(&got2[n..]), bits(&[7.0; 5]), "{what}: wrote past");
        }
        // No queries, or zero-width keys: nothing to do, nothing submitted.
        let before = stats(&be);
        for starts in [&[][..], &[0][..], &[3][..]] {
            be.indexer_scores_rows(&[], &[0.5, 0.25], 4, &[0.0; 12], starts, &mut []);
        }
        let mut out = [7f32; 3];
        be.indexer_scores_rows(&[], &[0.5, 0.25], 0, &[], &[0, 2, 3], &mut out);
        assert_eq!(out, [7.0; 3]);
        assert_eq!(stats(&be).since(&before), DeviceStats::default());
    }
}

#[test]
fn indexer_scores_rows_panics_where_the_row_loop_does() {
    if !emu_available("indexer_scores_rows_panics_where_the_row_loop_does") {
        return;
    }
    let be = backend(true);
    let looped = PerRow(&be);
    let (heads, dim) = (2usize, 4usize);
    let q = vec![0.25f32; 2 * heads * dim];
    let w = vec![0.5f32; 2 * heads];
    let keys = vec![0.5f32; 6 * dim];
    // Decreasing starts, a start past the keys, a short q, a short out.
    let cases: [(&[usize], usize, usize); 5] = [
        (&[0, 4, 2], q.len(), 6),
        (&[0, 3, 7], q.len(), 7),
        (&[0, 3, 6], q.len() - 1, 6),
        (&[0, 3, 6], q.len(), 5),
        (&[2, 2, 1], q.len(), 6),
    ];
    for (starts, qn, on) in cases {
        let run = |b: &dyn Backend| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut out = vec![0f32; on];
                b.indexer_scores_rows(&q[..qn], &w, dim, &keys, starts, &mut out);
            }))
            .is_err()
        };
        assert!(
            run(&looped),
            "the row loop accepts {starts:?} q {qn} out {on}"
        );
        assert!(
            run(&be),
            "the batched op accepts {starts:?} q {qn} out {on}"
        );
    }
}

/// Scores with ties, ±∞, NaN and signed zeros for `counts` ranges, starting at `first` of an
/// array with `tail` unused scores after the last range; (scores, starts).
fn topk_case(
    rng: &mut SplitMix64,
    counts: &[usize],
    first: usize,
    tail: usize,
) -> (Vec<f32>, Vec<usize>) {
    let mut starts = vec![first];
    for c in counts {
        starts.push(starts.last().unwrap() + c);
    }
    let n = starts.last().unwrap() + tail;
    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.5,
        -1.5,
        f32::from_bits(0xffc0_0001),
    ];
    let scores = (0..n)
        .map(|_| match rng.below(4) {
            0 => special[rng.below(special.len() as u64) as usize],
            1 => rng.below(5) as f32 * 0.5,
            _ => rng.normalish(3.0),
        })
        .collect();
    (scores, starts)
}

#[test]
fn topk_rows_equals_the_row_loop_in_one_submission() {
    if !emu_available("topk_rows_equals_the_row_loop_in_one_submission") {
        return;
    }
    let be = backend(true);
    let looped = PerRow(&be);
    let mut rng = SplitMix64::new(17);
    // Ranges of 0 and 1 scores, unequal lengths, one past a selection chunk (4096); k = 0,
    // k > every range, k between.
    for (counts, first, tail) in [
        (vec![5usize, 0, 1, 130, 17, 3], 2usize, 3usize),
        (vec![0, 0], 1, 1),
        (vec![1], 0, 0),
        (vec![5000, 16, 0, 40], 0, 2),
    ] {
        let (scores, starts) = topk_case(&mut rng, &counts, first, tail);
        for k in [0usize, 1, 3, 16, 200, 10_000, usize::MAX] {
            let what = format!("counts {counts:?} k {k}");
            let before = stats(&be);
            let want = looped.topk_rows(&scores, &starts, k);
            let loop_stats = stats(&be).since(&before);
            let before = stats(&be);
            let got = be.topk_rows(&scores, &starts, k);
            let s = stats(&be).since(&before);
            assert_eq!(want, got, "{what}");
            let reference = ReferenceBackend.topk_rows(&scores, &starts, k);
            assert_eq!(reference, got, "{what} against the reference");
            let selected: usize = counts.iter().map(|&c| c.min(k)).sum();
            let busy = counts.iter().filter(|&&c| c.min(k) > 0).count() as u64;
            assert_eq!(loop_stats.submissions, busy, "{what}: {loop_stats:?}");
            let want_stats = if selected == 0 {
                (0, 0, 0)
            } else {
                (1, 1, selected as u64 * 4)
            };
            assert_eq!(
                (s.submissions, s.reads, s.read_bytes),
                want_stats,
                "{what}: {s:?}"
            );
        }
    }
    // All ties, and all NaN: the lowest indices.
    for v in [1.0f32, f32::NAN, f32::NEG_INFINITY] {
        let scores = vec![v; 40];
        let starts = [0, 7, 7, 40];
        let want = looped.topk_rows(&scores, &starts, 5);
        assert_eq!(want, be.topk_rows(&scores, &starts, 5), "all {v}");
        assert_eq!(want, vec![vec![0, 1, 2, 3, 4], vec![], vec![0, 1, 2, 3, 4]]);
    }
    // No ranges: nothing to do, nothing submitted.
    let before = stats(&be);
    for starts in [&[][..], &[0][..], &[3][..]] {
        assert!(be.topk_rows(&[1.0; 4], starts, 2).is_empty());
    }
    assert_eq!(stats(&be).since(&before), DeviceStats::default());
}

#[test]
fn topk_rows_panics_where_the_row_loop_does() {
    if !emu_available("topk_rows_panics_where_the_row_loop_does") {
        return;
    }
    let be = backend(true);
    let looped = PerRow(&be);
    let scores = vec![0.5f32; 6];
    // Decreasing starts, a start past the scores; with k = 0 too.
    for starts in [&[0usize, 4, 2][..], &[0, 3, 7], &[7, 7], &[3, 2, 2]] {
        for k in [0, 2] {
            let run = |b: &dyn Backend| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    b.topk_rows(&scores, starts, k);
                }))
                .is_err()
            };
            assert!(run(&looped), "the row loop accepts {starts:?} k {k}");
            assert!(run(&be), "the batched op accepts {starts:?} k {k}");
        }
    }
}

#[test]
fn softmax_pool_rows_equals_the_window_loop_in_one_submission() {
    if !emu_available("softmax_pool_rows_equals_the_window_loop_in_one_submission") {
        return;
    }
    let be = backend(true);
    let looped = PerRow(&be);
    let mut rng = SplitMix64::new(29);
    // (windows, rows, width): ratio-4 and ratio-128 windows, one window, no rows, widths off
    // the block size, nothing to pool.
    for (windows, rows, width) in [
        (16usize, 8usize, 128usize),
        (3, 128, 33),
        (1, 8, 64),
        (5, 0, 7),
        (70, 4, 300),
        (0, 8, 16),
        (4, 8, 0),
    ] {
        let n = windows * rows * width;
        let a: Vec<f32> = (0..n).map(|_| rng.normalish(1.0)).collect();
        // Scattered −∞ logits, and column 0 of window 1 fully masked (it pools to 0).
        let z: Vec<f32> = (0..n)
            .map(|i| {
                let (w, c) = (i / (rows * width).max(1), i % width.max(1));
                if (w == 1 && c == 0) || rng.below(9) == 0 {
                    f32::NEG_INFINITY
                } else {
                    rng.normalish(4.0)
                }
            })
            .collect();
        let what = format!("{windows} windows of {rows}x{width}");
        let mut want = vec![f32::NAN; windows * width];
        looped.softmax_pool_rows(&a, &z, windows, rows, width, &mut want);
        let mut got = vec![f32::NAN; windows * width];
        let before = stats(&be);
        be.softmax_pool_rows(&a, &z, windows, rows, width, &mut got);
        let s = stats(&be).since(&before);
        assert_eq!(bits(&want), bits(&got), "{what}");
        let runs = u64::from(windows * width > 0);
        assert_eq!((s.submissions, s.reads), (runs, runs), "{what}: {s:?}");
        if windows > 1 && rows > 0 && width > 0 {
            assert_eq!(got[width], 0.0, "{what}: a fully masked column pools to 0");
        }
    }
    // Operands shorter than the windows need panic, as the window loop does.
    let (a, z) = (vec![0.5f32; 3 * 8 * 16], vec![0f32; 3 * 8 * 16]);
    for (na, nz, no) in [
        (a.len() - 1, z.len(), 48),
        (a.len(), 100, 48),
        (a.len(), z.len(), 47),
    ] {
        let run = |b: &dyn Backend| {
            let mut out = vec![0f32; no];
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                b.softmax_pool_rows(&a[..na], &z[..nz], 3, 8, 16, &mut out)
            }))
            .is_err()
        };
        assert!(run(&looped), "the window loop accepts {na}, {nz}, {no}");
        assert!(run(&be), "the batched op accepts {na}, {nz}, {no}");
    }
}

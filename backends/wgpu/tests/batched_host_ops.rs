//! On the device: the batched host ops `cache_load_rows`, `sparse_attention_rows`,
//! `indexer_scores_rows`, `topk_rows` and `softmax_pool_rows` give bit for bit (index for
//! index) what the trait's default per-row loops give on the same backend, return the same
//! errors (or panic where they do), and run in one submission per call (none when there is
//! nothing to compute). Skips with the reason when no adapter exists, except under CI=true.

mod common;

use common::{backend, formats, stats, values};

use dsv4_backend_reference::ReferenceBackend;
use dsv4_kernels::{Backend, PerRow, RowFormat};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Deterministic bytes (cache pages with slots never written hold garbage).
fn garbage(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 32) as u8
        })
        .collect()
}

/// (page index, slot) of each row.
type Rows = Vec<(usize, usize)>;

fn same_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    let bad = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(bad, 0, "{what}: {bad} of {} values differ", a.len());
}

/// `n` pages of `fmt`: garbage bytes, with most slots then written from values.
fn pages(fmt: &RowFormat, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|p| {
            let mut page = garbage(fmt.page_bytes(), 100 + p as u64);
            for slot in (0..fmt.page_entries()).filter(|s| s % 5 != 3) {
                let v = values(fmt.width(), (p * 1000 + slot) as u64);
                fmt.write(&mut page, slot, &v).unwrap();
            }
            page
        })
        .collect()
}

#[test]
fn cache_load_rows_matches_the_per_row_loop_in_one_submission() {
    let Some(gpu) = backend(true) else { return };
    let per_row = PerRow(&gpu);
    for (name, fmt) in formats() {
        let owned = pages(&fmt, 5);
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let last = fmt.page_entries() - 1;
        // Arbitrary order, pages used repeatedly, one row twice, page 3 unused, garbage slots.
        let rows = [
            (4, 7),
            (0, 0),
            (2, last),
            (0, 3),
            (4, 7),
            (1, 8),
            (2, 1),
            (0, last),
            (1, 13),
        ];
        let w = fmt.width();
        let mut want = vec![0f32; rows.len() * w];
        per_row
            .cache_load_rows(&fmt, &refs, &rows, &mut want)
            .unwrap();
        let mut got = vec![0f32; rows.len() * w];
        let before = stats(&gpu);
        gpu.cache_load_rows(&fmt, &refs, &rows, &mut got).unwrap();
        let after = stats(&gpu);
        same_bits(&name, &got, &want);
        assert_eq!(after.submissions - before.submissions, 1, "{name}");
        assert_eq!(after.reads - before.reads, 1, "{name}");
        assert_eq!(after.dispatches - before.dispatches, 1, "{name}");
        // The host codec agrees too (bit for bit; NaN payloads included).
        let mut host = vec![0f32; w];
        for (r, &(p, s)) in rows.iter().enumerate() {
            ReferenceBackend
                .cache_load(&fmt, refs[p], s, &mut host)
                .unwrap();
            let ok = host
                .iter()
                .zip(&got[r * w..(r + 1) * w])
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
            assert!(ok, "{name}: row {r} differs from the reference codec");
        }
        // Zero rows: nothing submitted.
        let before = stats(&gpu);
        gpu.cache_load_rows(&fmt, &refs, &[], &mut []).unwrap();
        gpu.cache_load_rows(&fmt, &[], &[], &mut []).unwrap();
        assert_eq!(stats(&gpu).submissions, before.submissions, "{name}");
    }
}

#[test]
fn cache_load_rows_gathers_entries_when_the_pages_do_not_fit_one_binding() {
    let Some(gpu) = backend(true) else { return };
    let Some(mut small) = backend(true) else {
        return;
    };
    for (name, fmt) in formats() {
        let owned = pages(&fmt, 4);
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let rows = [(3, 2), (1, 15), (0, 4), (2, 9)];
        let w = fmt.width();
        let mut want = vec![0f32; rows.len() * w];
        PerRow(&gpu)
            .cache_load_rows(&fmt, &refs, &rows, &mut want)
            .unwrap();
        // Room for the output, not for the four pages.
        let cap = rows.len() * w * 4;
        assert!(4 * fmt.page_bytes() > cap, "{name}: pages must not fit");
        small.cap_binding_bytes(cap as u64);
        let mut got = vec![0f32; rows.len() * w];
        let before = stats(&small);
        small.cache_load_rows(&fmt, &refs, &rows, &mut got).unwrap();
        let after = stats(&small);
        same_bits(&format!("{name} gathered"), &got, &want);
        assert_eq!(after.submissions - before.submissions, 1, "{name}");
        let uploaded = after.write_bytes - before.write_bytes;
        assert!(
            uploaded < (4 * fmt.page_bytes()) as u64,
            "{name}: {uploaded} bytes uploaded, the pages were not left behind"
        );
        // The uncapped backend uploads the pages.
        let before = stats(&gpu);
        gpu.cache_load_rows(&fmt, &refs, &rows, &mut got).unwrap();
        let uploaded = stats(&gpu).write_bytes - before.write_bytes;
        assert!(uploaded >= (4 * fmt.page_bytes()) as u64, "{name}");
        same_bits(&format!("{name} pages"), &got, &want);
    }
}

#[test]
fn cache_load_rows_returns_the_per_row_errors_without_running() {
    let Some(gpu) = backend(true) else { return };
    let per_row = PerRow(&gpu);
    for (name, fmt) in formats() {
        let owned = pages(&fmt, 3);
        let short = vec![0u8; fmt.page_bytes() - 1];
        let mut refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        refs.push(&short);
        let w = fmt.width();
        let n = fmt.page_entries();
        let cases: [(&str, Rows, usize); 7] = [
            ("output too short", vec![(0, 1), (1, 2)], 2 * w - 1),
            ("output too long", vec![(0, 1)], w + 1),
            ("no rows, some output", vec![], 1),
            ("page out of range", vec![(0, 1), (7, 0), (1, n)], 3 * w),
            ("wrong page size", vec![(2, 1), (3, 0), (9, 0)], 3 * w),
            ("slot out of range", vec![(1, 1), (0, n), (5, 0)], 3 * w),
            ("first error wins", vec![(0, n + 4), (8, 0)], 2 * w),
        ];
        for (case, rows, len) in cases {
            let mut want = vec![0f32; len];
            let e_default = per_row
                .cache_load_rows(&fmt, &refs, &rows, &mut want)
                .unwrap_err();
            let mut got = vec![7f32; len];
            let before = stats(&gpu);
            let e = gpu
                .cache_load_rows(&fmt, &refs, &rows, &mut got)
                .unwrap_err();
            assert_eq!(e.to_string(), e_default.to_string(), "{name}: {case}");
            assert_eq!(
                stats(&gpu).submissions,
                before.submissions,
                "{name}: {case}"
            );
            assert!(got.iter().all(|&v| v == 7.0), "{name}: {case} wrote");
        }
    }
}

/// Attention inputs: `rows` queries of `heads`×`dim`, over key ranges with `counts` keys each,
/// laid out after `skip` keys that no query uses (and followed by two more).
struct Attn {
    q: Vec<f32>,
    keys: Vec<f32>,
    starts: Vec<usize>,
    sink: Vec<f32>,
}

fn attn(heads: usize, dim: usize, counts: &[usize], skip: usize) -> Attn {
    let mut starts = vec![skip];
    for c in counts {
        starts.push(starts.last().unwrap() + c);
    }
    let n = starts.last().unwrap() + 2;
    Attn {
        q: values(counts.len() * heads * dim, 31),
        keys: values(n * dim, 32),
        starts,
        sink: values(heads, 33),
    }
}

#[test]
fn sparse_attention_rows_matches_the_per_row_loop_in_one_submission() {
    for allow_f64 in [true, false] {
        let Some(gpu) = backend(allow_f64) else {
            return;
        };
        let exact = gpu.adapter().f64_accumulation;
        let per_row = PerRow(&gpu);
        let (heads, dim, scale) = (4, 64, 0.125);
        // Unequal key counts, a row with none, keys before and after the ranges used.
        for (counts, skip) in [
            (vec![3, 0, 7, 1, 12], 5),
            (vec![0], 0),
            (vec![9], 0),
            (vec![0, 0, 4], 1),
        ] {
            let a = attn(heads, dim, &counts, skip);
            let len = counts.len() * heads * dim;
            let mut want = vec![0f32; len + 3];
            per_row.sparse_attention_rows(&a.q, dim, &a.keys, &a.starts, &a.sink, scale, &mut want);
            let mut got = vec![0f32; len + 3];
            let before = stats(&gpu);
            gpu.sparse_attention_rows(&a.q, dim, &a.keys, &a.starts, &a.sink, scale, &mut got);
            let after = stats(&gpu);
            let what = format!("f64 {allow_f64}, keys {counts:?}");
            same_bits(&what, &got, &want);
            assert_eq!(after.submissions - before.submissions, 1, "{what}");
            assert_eq!(after.reads - before.reads, 1, "{what}");
            if exact {
                let mut reference = vec![0f32; len + 3];
                ReferenceBackend.sparse_attention_rows(
                    &a.q,
                    dim,
                    &a.keys,
                    &a.starts,
                    &a.sink,
                    scale,
                    &mut reference,
                );
                same_bits(&format!("{what} vs reference"), &got, &reference);
            }
        }
        // Zero queries: nothing runs, nothing is written.
        let a = attn(heads, dim, &[2], 0);
        let before = stats(&gpu);
        for starts in [&[][..], &[1][..]] {
            let mut out = vec![5f32; 3];
            gpu.sparse_attention_rows(&a.q, dim, &a.keys, starts, &a.sink, scale, &mut out);
            assert_eq!(out, [5.0; 3]);
        }
        assert_eq!(stats(&gpu).submissions, before.submissions);
    }
}

#[test]
fn sparse_attention_with_no_keys_matches_the_reference() {
    let Some(gpu) = backend(true) else { return };
    let (heads, dim) = (3, 16);
    let q = values(heads * dim, 41);
    let sink = values(heads, 42);
    let (mut a, mut b) = (vec![1f32; heads * dim], vec![2f32; heads * dim]);
    gpu.sparse_attention(&q, dim, &[], &sink, 0.3, &mut a);
    ReferenceBackend.sparse_attention(&q, dim, &[], &sink, 0.3, &mut b);
    same_bits("no keys", &a, &b);
    // −0: the reference's empty f64 sum (Rust's float `sum` starts at −0) over its denominator.
    assert!(a.iter().all(|&v| v.to_bits() == (-0f32).to_bits()));
}

#[test]
fn sparse_attention_rows_panics_where_the_per_row_loop_does() {
    let Some(gpu) = backend(true) else { return };
    let per_row = PerRow(&gpu);
    let (heads, dim) = (2, 8);
    let a = attn(heads, dim, &[3, 2], 0);
    let hd = heads * dim;
    let n = a.keys.len() / dim;
    let cases: Vec<(&str, Vec<usize>, usize, usize)> = vec![
        ("decreasing starts", vec![3, 1, 4], 2 * hd, 2 * hd),
        ("keys past the end", vec![0, 2, n + 1], 2 * hd, 2 * hd),
        ("query too short", vec![0, 2, 4], 2 * hd - 1, 2 * hd),
        ("output too short", vec![0, 2, 4], 2 * hd, 2 * hd - 1),
        ("fine", vec![0, 2, 4], 2 * hd, 2 * hd),
    ];
    for (case, starts, qlen, olen) in cases {
        let run = |b: &dyn Backend| {
            catch_unwind(AssertUnwindSafe(|| {
                let mut out = vec![0f32; olen];
                b.sparse_attention_rows(
                    &a.q[..qlen],
                    dim,
                    &a.keys,
                    &starts,
                    &a.sink,
                    1.0,
                    &mut out,
                );
            }))
            .is_err()
        };
        assert_eq!(run(&gpu), run(&per_row), "{case}");
        assert_eq!(run(&gpu), case != "fine", "{case}");
    }
}

/// Indexer inputs: `counts.len()` queries of `heads`×`dim` with their head weights, over key
/// ranges with `counts` keys each, laid out after `skip` unused keys (and two more after).
struct Scores {
    q: Vec<f32>,
    w: Vec<f32>,
    keys: Vec<f32>,
    starts: Vec<usize>,
}

fn scores_input(heads: usize, dim: usize, counts: &[usize], skip: usize) -> Scores {
    let mut starts = vec![skip];
    for c in counts {
        starts.push(starts.last().unwrap() + c);
    }
    let n = starts.last().unwrap() + 2;
    Scores {
        q: values(counts.len() * heads * dim, 51),
        w: values(counts.len() * heads, 52),
        keys: values(n * dim, 53),
        starts,
    }
}

#[test]
fn indexer_scores_rows_matches_the_per_row_loop_in_one_submission() {
    for allow_f64 in [true, false] {
        let Some(gpu) = backend(allow_f64) else {
            return;
        };
        let exact = gpu.adapter().f64_accumulation;
        let per_row = PerRow(&gpu);
        // Unequal key counts, rows with none or one key, keys before and after the ranges used.
        for (heads, dim, counts, skip) in [
            (4, 64, vec![3, 0, 7, 1, 12], 5),
            (4, 64, vec![0], 0),
            (4, 64, vec![1], 0),
            (4, 64, vec![9], 0),
            (4, 64, vec![0, 0, 4], 1),
            (3, 7, vec![70, 2, 0, 1, 65], 3),
            (1, 128, vec![1; 16], 0),
        ] {
            let a = scores_input(heads, dim, &counts, skip);
            let len = a.keys.len() / dim;
            let mut want = vec![9f32; len];
            per_row.indexer_scores_rows(&a.q, &a.w, dim, &a.keys, &a.starts, &mut want);
            let mut got = vec![9f32; len];
            let before = stats(&gpu);
            gpu.indexer_scores_rows(&a.q, &a.w, dim, &a.keys, &a.starts, &mut got);
            let after = stats(&gpu);
            let what = format!("f64 {allow_f64}, {heads}x{dim}, keys {counts:?}");
            same_bits(&what, &got, &want);
            let runs = u64::from(counts.iter().any(|&c| c > 0));
            assert_eq!(after.submissions - before.submissions, runs, "{what}");
            assert_eq!(after.reads - before.reads, runs, "{what}");
            assert_eq!(after.dispatches - before.dispatches, runs, "{what}");
            if exact {
                let mut reference = vec![9f32; len];
                ReferenceBackend.indexer_scores_rows(
                    &a.q,
                    &a.w,
                    dim,
                    &a.keys,
                    &a.starts,
                    &mut reference,
                );
                same_bits(&format!("{what} vs reference"), &got, &reference);
            }
        }
        // Zero queries: nothing runs, nothing is written.
        let a = scores_input(2, 8, &[2], 0);
        let before = stats(&gpu);
        for starts in [&[][..], &[1][..]] {
            let mut out = vec![5f32; 3];
            gpu.indexer_scores_rows(&a.q, &a.w, 8, &a.keys, starts, &mut out);
            assert_eq!(out, [5.0; 3]);
        }
        assert_eq!(stats(&gpu).submissions, before.submissions);
    }
}

#[test]
fn indexer_scores_rows_panics_where_the_per_row_loop_does() {
    let Some(gpu) = backend(true) else { return };
    let per_row = PerRow(&gpu);
    let (heads, dim) = (2, 8);
    let a = scores_input(heads, dim, &[3, 2], 0);
    let hd = heads * dim;
    let n = a.keys.len() / dim;
    let cases: Vec<(&str, Vec<usize>, usize, usize)> = vec![
        ("decreasing starts", vec![3, 1, 4], 2 * hd, n),
        ("keys past the end", vec![0, 2, n + 1], 2 * hd, n + 1),
        ("query too short", vec![0, 2, 4], 2 * hd - 1, n),
        ("output too short", vec![0, 2, 4], 2 * hd, 3),
        ("fine", vec![0, 2, 4], 2 * hd, 4),
        ("fine, offset", vec![1, 2, n], 2 * hd, n),
    ];
    for (case, starts, qlen, olen) in cases {
        let run = |b: &dyn Backend| {
            catch_unwind(AssertUnwindSafe(|| {
                let mut out = vec![0f32; olen];
                b.indexer_scores_rows(&a.q[..qlen], &a.w, dim, &a.keys, &starts, &mut out);
            }))
            .is_err()
        };
        assert_eq!(run(&gpu), run(&per_row), "{case}");
        assert_eq!(run(&gpu), !case.starts_with("fine"), "{case}");
    }
}

/// Scores with many ties (values rounded to halves), NaN, ±inf and ±0 scattered in.
fn tied_scores(n: usize, seed: u64) -> Vec<f32> {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        -f32::NAN,
    ];
    values(n, seed)
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if (i * 7 + seed as usize).is_multiple_of(5) {
                specials[(i / 5 + seed as usize) % specials.len()]
            } else {
                (v * 2.0).round() / 2.0
            }
        })
        .collect()
}

#[test]
fn topk_rows_matches_the_per_row_loop_in_one_submission() {
    for allow_f64 in [true, false] {
        let Some(gpu) = backend(allow_f64) else {
            return;
        };
        let per_row = PerRow(&gpu);
        // Range lengths (0, 1, short, past one workgroup), after `skip` unused scores.
        let layouts: [(Vec<usize>, usize); 6] = [
            (vec![5, 0, 1, 9, 3, 12], 2),
            (vec![0], 0),
            (vec![1], 0),
            (vec![0, 0, 0], 4),
            (vec![130, 1, 0, 77, 64, 65, 2], 1),
            (vec![16; 16], 0),
        ];
        for (lens, skip) in layouts {
            let mut starts = vec![skip];
            for l in &lens {
                starts.push(starts.last().unwrap() + l);
            }
            let scores = tied_scores(starts.last().unwrap() + 3, lens.len() as u64);
            for k in [0, 1, 2, 3, 8, 64, 100, 1000, usize::MAX] {
                let want = per_row.topk_rows(&scores, &starts, k);
                let before = stats(&gpu);
                let got = gpu.topk_rows(&scores, &starts, k);
                let after = stats(&gpu);
                let what = format!("f64 {allow_f64}, lengths {lens:?}, k {k}");
                assert_eq!(got, want, "{what}");
                assert_eq!(
                    got,
                    ReferenceBackend.topk_rows(&scores, &starts, k),
                    "{what}"
                );
                let runs = u64::from(k > 0 && lens.iter().any(|&l| l > 0));
                assert_eq!(after.submissions - before.submissions, runs, "{what}");
                assert_eq!(after.reads - before.reads, runs, "{what}");
            }
        }
        // Zero ranges: nothing runs.
        let before = stats(&gpu);
        assert!(gpu.topk_rows(&[1.0, 2.0], &[], 3).is_empty());
        assert!(gpu.topk_rows(&[1.0, 2.0], &[1], 3).is_empty());
        assert_eq!(stats(&gpu).submissions, before.submissions);
    }
}

#[test]
fn topk_rows_panics_where_the_per_row_loop_does() {
    let Some(gpu) = backend(true) else { return };
    let per_row = PerRow(&gpu);
    let scores = tied_scores(10, 3);
    let cases: [(&str, Vec<usize>, usize); 6] = [
        ("decreasing starts", vec![4, 2, 6], 2),
        ("past the end", vec![0, 5, 11], 2),
        ("decreasing, k = 0", vec![4, 2], 0),
        ("past the end, k = 0", vec![9, 12], 0),
        ("fine", vec![0, 5, 10], 2),
        ("fine, empty", vec![10, 10], 2),
    ];
    for (case, starts, k) in cases {
        let run = |b: &dyn Backend| {
            catch_unwind(AssertUnwindSafe(|| b.topk_rows(&scores, &starts, k))).is_err()
        };
        assert_eq!(run(&gpu), run(&per_row), "{case}");
        assert_eq!(run(&gpu), !case.starts_with("fine"), "{case}");
    }
}

/// Pooling operands of `windows` windows of [rows, width]: values, and logits with scattered
/// −∞ (column 0 of window 1 fully masked: its output is 0).
fn pool_operands(windows: usize, rows: usize, width: usize) -> (Vec<f32>, Vec<f32>) {
    let n = windows * rows * width;
    let a = values(n, 7);
    let z = values(n, 8)
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let (w, r, c) = (i / (rows * width), (i / width) % rows, i % width);
            let masked = (w == 1 && c == 0) || (r * 7 + c * 3 + w) % 11 == 0;
            if masked { f32::NEG_INFINITY } else { 4.0 * v }
        })
        .collect();
    (a, z)
}

#[test]
fn softmax_pool_rows_matches_the_per_window_loop_in_one_submission() {
    for allow_f64 in [true, false] {
        let Some(gpu) = backend(allow_f64) else {
            return;
        };
        let per_row = PerRow(&gpu);
        // (windows, rows, width): ratio-4 and ratio-128 windows, one window, no rows, widths
        // that are not a multiple of a workgroup, nothing to do.
        for (windows, rows, width) in [
            (16, 8, 128),
            (3, 128, 33),
            (1, 8, 64),
            (5, 0, 7),
            (300, 4, 65),
            (0, 8, 16),
            (4, 8, 0),
        ] {
            let (a, z) = pool_operands(windows, rows, width);
            let what = format!("f64 {allow_f64}, {windows} windows of {rows}x{width}");
            let mut want = vec![f32::NAN; windows * width];
            per_row.softmax_pool_rows(&a, &z, windows, rows, width, &mut want);
            let mut got = vec![f32::NAN; windows * width];
            let before = stats(&gpu);
            gpu.softmax_pool_rows(&a, &z, windows, rows, width, &mut got);
            let runs = u64::from(windows * width > 0);
            assert_eq!(stats(&gpu).submissions - before.submissions, runs, "{what}");
            same_bits(&what, &got, &want);
            if windows > 1 && rows > 0 && width > 0 {
                assert_eq!(got[width], 0.0, "{what}: a fully masked column pools to 0");
            }
        }
    }
}

#[test]
fn softmax_pool_rows_panics_where_the_per_window_loop_does() {
    let Some(gpu) = backend(true) else { return };
    let per_row = PerRow(&gpu);
    let (a, z) = pool_operands(3, 8, 16);
    // (case, values, logits, outputs) for 3 windows of 8×16.
    let cases: [(&str, usize, usize, usize); 5] = [
        ("short values", a.len() - 1, z.len(), 48),
        ("short logits", a.len(), 100, 48),
        ("short output", a.len(), z.len(), 47),
        ("fine", a.len(), z.len(), 48),
        ("fine, long output", a.len(), z.len(), 60),
    ];
    for (case, na, nz, no) in cases {
        let run = |b: &dyn Backend| {
            let mut out = vec![0f32; no];
            catch_unwind(AssertUnwindSafe(|| {
                b.softmax_pool_rows(&a[..na], &z[..nz], 3, 8, 16, &mut out)
            }))
            .is_err()
        };
        assert_eq!(run(&gpu), run(&per_row), "{case}");
        assert_eq!(run(&gpu), !case.starts_with("fine"), "{case}");
    }
}

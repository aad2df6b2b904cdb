//! The batched host op `cache_encode_rows` on the CPU emulator: bitwise equal to the trait's
//! row-by-row definition (run through a wrapper that keeps the default methods) for every cache
//! row format, with the same errors, and one upload, one launch and one read-back per call
//! (a launch per 65535 rows past that).
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::{backend, emu_available, stats};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::cache::{CacheLayoutError, IndexKLayout, KvLayout};
use dsv4_core::{IndexKDtype, KvCacheDtype, SplitMix64};
use dsv4_kernels::{Backend, DeviceStats, PerRow, RowFormat};

/// What a call returned, as text (errors by their Display string).
fn shown(r: &Result<Vec<u8>, CacheLayoutError>) -> String {
    match r {
        Ok(b) => format!("Ok({b:?})"),
        Err(e) => format!("Err({e})"),
    }
}

fn kv(dtype: KvCacheDtype, head_dim: usize, rope_dim: usize, entries: usize) -> RowFormat {
    RowFormat::Kv(KvLayout::from_head_dims(dtype, head_dim, rope_dim, entries).unwrap())
}

fn index(dtype: IndexKDtype, dim: usize, entries: usize) -> RowFormat {
    RowFormat::IndexK(IndexKLayout::new(dtype, dim, entries).unwrap())
}

/// Every storage format at a few sizes, odd ones among them (an odd rope part, odd widths, more
/// than one 256-thread block of bf16 values, the model's 448 + 64).
fn formats() -> Vec<RowFormat> {
    vec![
        kv(KvCacheDtype::Fp8, 192, 64, 3),
        kv(KvCacheDtype::Fp8, 71, 7, 2),
        kv(KvCacheDtype::Fp8, 512, 64, 1),
        kv(KvCacheDtype::Fp8, 64, 0, 4),
        kv(KvCacheDtype::Bf16, 10, 4, 2),
        kv(KvCacheDtype::Bf16, 9, 3, 5),
        kv(KvCacheDtype::Bf16, 300, 64, 1),
        index(IndexKDtype::Bf16, 48, 3),
        index(IndexKDtype::Bf16, 33, 1),
        index(IndexKDtype::Fp8, 32, 2),
        index(IndexKDtype::Fp8, 37, 3),
        index(IndexKDtype::Fp8, 128, 1),
        index(IndexKDtype::Fp4, 64, 2),
        index(IndexKDtype::Fp4, 32, 1),
        index(IndexKDtype::Fp4, 160, 3),
    ]
}

/// `rows` rows of `width` values over wide magnitudes: signed zeros, subnormals, values near
/// the fp8 scale floor and past the e4m3 / e2m1 ranges, whole zero rows and zero 64-blocks,
/// and, when `special`, a row with ±∞ and NaN.
fn values(rng: &mut SplitMix64, rows: usize, width: usize, special: bool) -> Vec<f32> {
    let mut v: Vec<f32> = (0..rows * width)
        .map(|_| match rng.below(10) {
            0 => 0.0,
            1 => -0.0,
            2 => {
                f32::from_bits(1 + rng.below(0x7f_ffff) as u32) * [1.0, -1.0][rng.below(2) as usize]
            }
            3 => rng.normalish(1e-6),
            4 => rng.normalish(5e3),
            5 => rng.normalish(1e30),
            6 => rng.normalish(1e-30),
            _ => rng.normalish(2.0),
        })
        .collect();
    for (r, row) in v.chunks_exact_mut(width).enumerate() {
        match r % 5 {
            1 => row.fill(0.0),
            2 => row[..width.min(64)].fill(0.0),
            3 => row[width / 2..].fill(-0.0),
            _ => {}
        }
    }
    if special && rows > 4 {
        let row = &mut v[4 * width..5 * width];
        row[0] = f32::INFINITY;
        row[width - 1] = f32::NEG_INFINITY;
        row[width / 2] = f32::NAN;
    }
    v
}

#[test]
fn cache_encode_rows_equals_the_row_loop_in_one_submission() {
    if !emu_available("cache_encode_rows_equals_the_row_loop_in_one_submission") {
        return;
    }
    let be = backend(true);
    let looped = PerRow(&be);
    let mut rng = SplitMix64::new(29);
    for fmt in formats() {
        let (w, e) = (fmt.width(), fmt.entry_bytes());
        for rows in [1usize, 5, 37] {
            let what = format!("{fmt:?} rows {rows}");
            for special in [false, true] {
                let v = values(&mut rng, rows, w, special);
                let before = stats(&be);
                let want = looped.cache_encode_rows(&fmt, &v).expect("looped encode");
                let loop_stats = stats(&be).since(&before);
                let before = stats(&be);
                let got = be.cache_encode_rows(&fmt, &v).expect("batched encode");
                let s = stats(&be).since(&before);
                assert_eq!(want, got, "{what} special {special}");
                assert_eq!(got.len(), rows * e, "{what}");
                assert_eq!(
                    loop_stats.submissions, rows as u64,
                    "{what}: {loop_stats:?}"
                );
                assert_eq!(loop_stats.dispatches, rows as u64, "{what}: {loop_stats:?}");
                assert_eq!(
                    (s.submissions, s.reads, s.dispatches, s.read_bytes),
                    (1, 1, 1, (rows * e) as u64),
                    "{what}: {s:?}"
                );
                assert_eq!(
                    (s.writes, s.write_bytes),
                    (1, (rows * w * 4) as u64),
                    "{what}: {s:?}"
                );
                if !special {
                    let reference = ReferenceBackend
                        .cache_encode_rows(&fmt, &v)
                        .expect("reference encode");
                    assert_eq!(reference, got, "{what} against the reference");
                }
                // Each entry, put in a slot, is what cache_store writes there.
                let mut stored = vec![0u8; fmt.page_bytes()];
                let mut put = vec![0u8; fmt.page_bytes()];
                for (r, (row, entry)) in v.chunks_exact(w).zip(got.chunks_exact(e)).enumerate() {
                    let slot = r % fmt.page_entries();
                    be.cache_store(&fmt, &mut stored, slot, row).expect("store");
                    fmt.put_entry(&mut put, slot, entry).expect("put");
                    assert_eq!(stored, put, "{what} row {r}");
                }
            }
        }
    }
}

#[test]
fn cache_encode_rows_errors_are_the_row_loops() {
    if !emu_available("cache_encode_rows_errors_are_the_row_loops") {
        return;
    }
    let be = backend(true);
    let looped = PerRow(&be);
    let mut rng = SplitMix64::new(31);
    for fmt in formats() {
        let w = fmt.width();
        for len in [0, 1, w - 1, w + 1, 2 * w + 3, 5 * w - 1] {
            if len.is_multiple_of(w) {
                continue;
            }
            let v = values(&mut rng, 5, w, false);
            let before = stats(&be);
            let got = be.cache_encode_rows(&fmt, &v[..len]);
            assert_eq!(stats(&be).since(&before), DeviceStats::default(), "{fmt:?}");
            let want = looped.cache_encode_rows(&fmt, &v[..len]);
            assert_eq!(shown(&want), shown(&got), "{fmt:?} {len} values");
            assert_eq!(
                got,
                Err(CacheLayoutError::PartialRow { width: w, got: len }),
                "{fmt:?}"
            );
        }
        // No rows: an empty result, nothing submitted.
        let before = stats(&be);
        let got = be.cache_encode_rows(&fmt, &[]);
        assert_eq!(stats(&be).since(&before), DeviceStats::default(), "{fmt:?}");
        assert_eq!(shown(&looped.cache_encode_rows(&fmt, &[])), shown(&got));
        assert_eq!(got, Ok(vec![]), "{fmt:?}");
    }
}

#[test]
fn more_rows_than_a_grid_holds_are_a_few_launches_and_one_read_back() {
    if !emu_available("more_rows_than_a_grid_holds_are_a_few_launches_and_one_read_back") {
        return;
    }
    let be = backend(true);
    let looped = PerRow(&be);
    let mut rng = SplitMix64::new(37);
    let fmt = index(IndexKDtype::Fp8, 32, 4);
    let (w, e) = (fmt.width(), fmt.entry_bytes());
    let rows = 65_535 + 3;
    let v = values(&mut rng, rows, w, false);
    let before = stats(&be);
    let got = be.cache_encode_rows(&fmt, &v).expect("batched encode");
    let s = stats(&be).since(&before);
    assert_eq!(
        (s.submissions, s.reads, s.dispatches, s.read_bytes),
        (1, 1, 2, (rows * e) as u64),
        "{s:?}"
    );
    let reference = ReferenceBackend
        .cache_encode_rows(&fmt, &v)
        .expect("reference encode");
    assert!(reference == got, "65538 rows against the reference");
    // The rows either side of the launch boundary, and the first and last, row by row.
    for r in [0, 65_533, 65_534, 65_535, 65_536, rows - 1] {
        let want = looped
            .cache_encode_rows(&fmt, &v[r * w..(r + 1) * w])
            .expect("looped encode");
        assert_eq!(want, got[r * e..(r + 1) * e], "row {r}");
    }
}

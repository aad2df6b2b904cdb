//! On the device: `cache_encode_rows` gives byte for byte what the trait's per-row loop (and the
//! host codec) gives, for every storage format including entries that are not whole words, in
//! one submission per call (none for no rows), returns the per-row errors, and splits batches
//! that do not fit one storage binding. Skips with the reason when no adapter exists, except
//! under CI=true.

mod common;

use common::{backend, formats, stats, values};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::cache::{CacheLayoutError, IndexKLayout, KvLayout};
use dsv4_core::{IndexKDtype, KvCacheDtype};
use dsv4_kernels::{Backend, PerRow, RowFormat};

/// The encode formats: every storage format, at the test width and an odd one (entries that are
/// not whole words, so output words straddle two entries).
fn encode_formats() -> Vec<(String, RowFormat)> {
    let mut f = formats();
    let kv = |dt, nd, rd| RowFormat::Kv(KvLayout::new(dt, nd, rd, 4).unwrap());
    let ik = |dt, dim| RowFormat::IndexK(IndexKLayout::new(dt, dim, 4).unwrap());
    f.push(("KV Bf16 7 wide".into(), kv(KvCacheDtype::Bf16, 4, 3)));
    f.push(("KV Fp8 128+5".into(), kv(KvCacheDtype::Fp8, 128, 5)));
    f.push(("index-K Bf16 37".into(), ik(IndexKDtype::Bf16, 37)));
    f.push(("index-K Fp8 37".into(), ik(IndexKDtype::Fp8, 37)));
    f.push(("index-K Fp4 96".into(), ik(IndexKDtype::Fp4, 96)));
    f
}

/// `rows` rows of `width` values: plain rows, rows with zero blocks, rows whose 32-value blocks
/// span huge, tiny and subnormal magnitudes, and rows with ±0, ±inf and a NaN.
fn encode_values(width: usize, rows: usize, seed: u64) -> Vec<f32> {
    let mut v = values(width * rows, seed);
    for (r, row) in v.chunks_mut(width).enumerate() {
        match r % 4 {
            1 => row[..width.min(64)].fill(0.0),
            2 => {
                for (i, x) in row.iter_mut().enumerate() {
                    *x *= [1e30, 1e-30, 3e-39, 1.0][(i / 32) % 4];
                }
            }
            3 if r % 8 == 7 => {
                row[0] = -0.0;
                row[width / 2] = f32::INFINITY;
                row[width - 1] = f32::NAN;
            }
            _ => {}
        }
    }
    v
}

#[test]
fn cache_encode_rows_matches_the_per_row_loop_in_one_submission() {
    for allow_f64 in [true, false] {
        let Some(gpu) = backend(allow_f64) else {
            return;
        };
        for (name, fmt) in encode_formats() {
            for rows in [1, 5, 37] {
                let v = encode_values(fmt.width(), rows, rows as u64);
                let before = stats(&gpu);
                let want = PerRow(&gpu).cache_encode_rows(&fmt, &v).unwrap();
                let per_row = stats(&gpu).since(&before);
                let got = gpu.cache_encode_rows(&fmt, &v).unwrap();
                let batched = stats(&gpu).since(&before).since(&per_row);
                let what = format!("{name}, {rows} rows, f64 {allow_f64}");
                assert_eq!(got.len(), rows * fmt.entry_bytes(), "{what}");
                let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(bad, 0, "{what}: {bad} of {} bytes differ", got.len());
                // The host codec agrees too (the per-row path shares the kernel).
                let host = ReferenceBackend.cache_encode_rows(&fmt, &v).unwrap();
                assert!(got == host, "{what}: differs from the reference codec");
                assert_eq!(per_row.submissions, rows as u64, "{what}");
                assert_eq!(per_row.reads, rows as u64, "{what}");
                assert_eq!(batched.submissions, 1, "{what}");
                assert_eq!(batched.reads, 1, "{what}");
                assert_eq!(batched.dispatches, 1, "{what}");
                if rows == 37 {
                    eprintln!(
                        "{what}: per-row {} submissions / {} reads, batched {} / {}",
                        per_row.submissions, per_row.reads, batched.submissions, batched.reads
                    );
                }
            }
        }
    }
}

#[test]
fn cache_encode_rows_returns_the_per_row_errors_without_running() {
    let Some(gpu) = backend(true) else { return };
    for (name, fmt) in encode_formats() {
        let w = fmt.width();
        for len in [1, w - 1, w + 1, 3 * w + 2] {
            let v = values(len, 3);
            let want = PerRow(&gpu).cache_encode_rows(&fmt, &v).unwrap_err();
            let before = stats(&gpu);
            let e = gpu.cache_encode_rows(&fmt, &v).unwrap_err();
            assert_eq!(e, want, "{name}: {len} values");
            assert_eq!(e, CacheLayoutError::PartialRow { width: w, got: len });
            assert_eq!(stats(&gpu).submissions, before.submissions, "{name}");
        }
        // No rows: no bytes, nothing submitted.
        let before = stats(&gpu);
        assert_eq!(gpu.cache_encode_rows(&fmt, &[]), Ok(Vec::new()), "{name}");
        assert_eq!(PerRow(&gpu).cache_encode_rows(&fmt, &[]), Ok(Vec::new()));
        assert_eq!(stats(&gpu).submissions, before.submissions, "{name}");
    }
}

#[test]
fn cache_encode_rows_splits_batches_that_do_not_fit_one_binding() {
    for (name, fmt) in encode_formats() {
        let (w, e) = (fmt.width(), fmt.entry_bytes());
        let v = encode_values(w, 37, 9);
        let want = ReferenceBackend.cache_encode_rows(&fmt, &v).unwrap();
        // Room for all entries but not all values (one read-back), then for 10 entries.
        for (cap_rows, one_read) in [(37, true), (10, false)] {
            let Some(mut small) = backend(true) else {
                return;
            };
            small.cap_binding_bytes((cap_rows * e).div_ceil(4) as u64 * 4);
            let before = stats(&small);
            let got = small.cache_encode_rows(&fmt, &v).unwrap();
            let d = stats(&small).since(&before);
            let what = format!("{name}, room for {cap_rows} entries");
            assert!(got == want, "{what}: differs from the reference codec");
            assert_eq!(d.submissions, 1, "{what}");
            assert!(d.dispatches > 1, "{what}: {} dispatches", d.dispatches);
            assert_eq!(d.reads == 1, one_read, "{what}: {} reads", d.reads);
        }
    }
}

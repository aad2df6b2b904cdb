//! Encoded cache entries: `Backend::cache_encode_rows` (the trait's default, on the reference
//! and cpu backends) gives each row the bytes `cache_store` writes into a slot, and
//! `RowFormat::put_entry` puts them into any slot so the page equals the one `cache_store`
//! writes; `RowFormat::copy_entry` moves one slot's bytes to another page's slot; bad lengths,
//! pages and slots are errors that change nothing.

use dsv4_backend_cpu::CpuBackend;
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::cache::{CacheLayoutError, IndexKLayout, KvLayout};
use dsv4_core::{IndexKDtype, KvCacheDtype, SplitMix64};
use dsv4_kernels::{Backend, RowFormat};

/// Every storage format, at a few sizes (one odd), 5 entries a page.
fn formats() -> Vec<RowFormat> {
    let mut f = Vec::new();
    for (dt, hd, rd) in [
        (KvCacheDtype::Bf16, 128, 64),
        (KvCacheDtype::Bf16, 10, 4),
        (KvCacheDtype::Fp8, 128, 64),
        (KvCacheDtype::Fp8, 192, 64),
    ] {
        f.push(RowFormat::Kv(
            KvLayout::from_head_dims(dt, hd, rd, 5).unwrap(),
        ));
    }
    for (dt, dim) in [
        (IndexKDtype::Bf16, 37),
        (IndexKDtype::Fp8, 128),
        (IndexKDtype::Fp4, 64),
    ] {
        f.push(RowFormat::IndexK(IndexKLayout::new(dt, dim, 5).unwrap()));
    }
    f
}

/// `rows` rows of values, one of them all zeros and one with a zero block and wide magnitudes.
fn rows_of(fmt: &RowFormat, rows: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    let w = fmt.width();
    let mut v: Vec<f32> = (0..rows * w).map(|_| rng.uniform_sym(3.0)).collect();
    if rows > 2 {
        v[w..2 * w].fill(0.0);
        for (i, x) in v[2 * w..3 * w].iter_mut().enumerate() {
            *x *= [1e-3, 0.0, 40.0, 1e4][(i / 32) % 4];
        }
    }
    v
}

#[test]
fn encoded_rows_put_into_slots_are_the_pages_cache_store_writes() {
    let cpu = CpuBackend::new(2).expect("the cpu backend");
    let backends: [&dyn Backend; 2] = [&ReferenceBackend, &cpu];
    for be in backends {
        for fmt in formats() {
            let w = fmt.width();
            let values = rows_of(&fmt, 7, 11);
            let entries = be.cache_encode_rows(&fmt, &values).unwrap();
            let e = fmt.entry_bytes();
            assert_eq!(entries.len(), 7 * e, "{fmt:?}");
            // Rows into slots 4, 0, 3, 1, 2 of two pages that start as garbage: byte for byte
            // the pages cache_store writes.
            let garbage: Vec<u8> = (0..fmt.page_bytes()).map(|i| (i * 37 + 5) as u8).collect();
            let (mut put, mut stored) = (
                vec![garbage.clone(), garbage.clone()],
                vec![garbage.clone(), garbage],
            );
            for r in 0..7 {
                let (page, slot) = (r / 5, [4, 0, 3, 1, 2][r % 5]);
                let row = &values[r * w..(r + 1) * w];
                fmt.put_entry(&mut put[page], slot, &entries[r * e..(r + 1) * e])
                    .unwrap();
                be.cache_store(&fmt, &mut stored[page], slot, row).unwrap();
            }
            assert!(put == stored, "{} {fmt:?}", be.name());
        }
    }
}

#[test]
fn bad_lengths_pages_and_slots_are_errors_that_change_nothing() {
    let be = ReferenceBackend;
    for fmt in formats() {
        let (w, e) = (fmt.width(), fmt.entry_bytes());
        for len in [1, w - 1, w + 1, 3 * w + 2] {
            assert_eq!(
                be.cache_encode_rows(&fmt, &vec![0.5; len]),
                Err(CacheLayoutError::PartialRow { width: w, got: len })
            );
        }
        assert_eq!(be.cache_encode_rows(&fmt, &[]), Ok(Vec::new()));
        let entry = be.cache_encode_rows(&fmt, &rows_of(&fmt, 1, 3)).unwrap();
        let page = vec![0xA5u8; fmt.page_bytes()];
        let mut p = page.clone();
        let slot_err = fmt.put_entry(&mut p, 5, &entry).unwrap_err();
        assert!(
            matches!(slot_err, CacheLayoutError::SlotOutOfRange { slot: 5, .. }),
            "{slot_err}"
        );
        assert_eq!(
            fmt.put_entry(&mut p, 0, &entry[..e - 1]),
            Err(CacheLayoutError::WrongEntrySize {
                expected: e,
                got: e - 1
            })
        );
        let mut long = entry.clone();
        long.push(0);
        assert!(fmt.put_entry(&mut p, 0, &long).is_err());
        assert!(p == page, "{fmt:?}: a refused put changed the page");
        let mut short_page = vec![0u8; fmt.page_bytes() - 1];
        assert_eq!(
            fmt.put_entry(&mut short_page, 0, &entry),
            Err(CacheLayoutError::WrongPageSize {
                expected: fmt.page_bytes(),
                got: fmt.page_bytes() - 1
            })
        );
    }
}

#[test]
fn a_copied_entry_decodes_as_its_source_and_touches_nothing_else() {
    let be = ReferenceBackend;
    for fmt in formats() {
        let (w, pb) = (fmt.width(), fmt.page_bytes());
        let values = rows_of(&fmt, 5, 23);
        let mut src = vec![0u8; pb];
        for slot in 0..5 {
            be.cache_store(&fmt, &mut src, slot, &values[slot * w..(slot + 1) * w])
                .unwrap();
        }
        let garbage: Vec<u8> = (0..pb).map(|i| (i * 11 + 3) as u8).collect();
        for (from, to) in [(0, 4), (2, 2), (4, 0), (3, 1)] {
            let mut dst = garbage.clone();
            fmt.copy_entry(&src, from, &mut dst, to).unwrap();
            let (mut want, mut got) = (vec![0f32; w], vec![0f32; w]);
            fmt.read(&src, from, &mut want).unwrap();
            fmt.read(&dst, to, &mut got).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{fmt:?} slot {from} -> {to}");
            let at = fmt.slot_bytes(to).unwrap();
            let outside: Vec<usize> = (0..pb).filter(|&b| !at.contains(b)).collect();
            assert!(
                outside.iter().all(|&b| dst[b] == garbage[b]),
                "{fmt:?}: bytes outside slot {to} changed"
            );
        }
        let mut dst = garbage.clone();
        assert!(matches!(
            fmt.copy_entry(&src, 5, &mut dst, 0),
            Err(CacheLayoutError::SlotOutOfRange { slot: 5, .. })
        ));
        assert!(matches!(
            fmt.copy_entry(&src, 0, &mut dst, 5),
            Err(CacheLayoutError::SlotOutOfRange { slot: 5, .. })
        ));
        assert_eq!(
            fmt.copy_entry(&src[..pb - 1], 0, &mut dst, 0),
            Err(CacheLayoutError::WrongPageSize {
                expected: pb,
                got: pb - 1
            })
        );
        assert_eq!(
            fmt.copy_entry(&src, 0, &mut dst[..pb - 1], 0),
            Err(CacheLayoutError::WrongPageSize {
                expected: pb,
                got: pb - 1
            })
        );
        assert!(dst == garbage, "{fmt:?}: a refused copy changed the page");
    }
}

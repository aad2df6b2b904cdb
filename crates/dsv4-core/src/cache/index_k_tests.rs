//! Tests of the index-K layout and of the query rounding: sizes, golden bytes, slot isolation,
//! agreement between the layout and `round_index_vector`, error bounds, errors.

use super::*;
use crate::codec::{e4m3_to_f32, f32_to_bf16};
use crate::{IndexKDtype, SplitMix64};

const ALL: [IndexKDtype; 3] = [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4];

fn random_vec(g: &mut SplitMix64, n: usize, std: f32) -> Vec<f32> {
    (0..n).map(|_| g.normalish(std)).collect()
}

#[test]
fn entry_and_page_sizes() {
    let l = |d| IndexKLayout::new(d, 128, INDEX_K_PAGE_ENTRIES).unwrap();
    assert_eq!(INDEX_K_PAGE_ENTRIES, 64);
    let fp8 = l(IndexKDtype::Fp8);
    assert_eq!(
        (
            fp8.entry_bytes(),
            fp8.data_row_bytes(),
            fp8.scale_row_bytes()
        ),
        (132, 128, 4)
    );
    assert_eq!(fp8.page_bytes(), 64 * 132);
    assert_eq!(l(IndexKDtype::Bf16).entry_bytes(), 256);
    assert_eq!(l(IndexKDtype::Bf16).page_bytes(), 64 * 256);
    let fp4 = l(IndexKDtype::Fp4);
    assert_eq!(
        (
            fp4.entry_bytes(),
            fp4.data_row_bytes(),
            fp4.scale_row_bytes()
        ),
        (68, 64, 4)
    );
    assert_eq!(fp4.page_bytes(), 64 * 68);
    assert_eq!(
        (fp4.dim(), fp4.page_entries(), fp4.dtype()),
        (128, 64, IndexKDtype::Fp4)
    );
    // Data rows for all 64 entries first, then the scale rows.
    let at = fp8.slot_bytes(5).unwrap();
    assert_eq!((at.data, at.scale), (640..768, 8192 + 20..8192 + 24));
    let at = fp4.slot_bytes(63).unwrap();
    assert_eq!((at.data, at.scale), (4032..4096, 4096 + 252..4096 + 256));
}

#[test]
fn fp8_golden_bytes() {
    let layout = IndexKLayout::new(IndexKDtype::Fp8, 4, 2).unwrap();
    let mut page = vec![0u8; layout.page_bytes()];
    assert_eq!(page.len(), 16);
    // amax 448 → scale 1.0: 448 → 0x7E, −224 → 0xF6, 1 → 0x38, 0 → 0x00.
    layout
        .write(&mut page, 1, &[448.0, -224.0, 1.0, 0.0])
        .unwrap();
    assert_eq!(&page[..4], &[0; 4], "slot 0 untouched");
    assert_eq!(&page[4..8], &[0x7E, 0xF6, 0x38, 0x00]);
    assert_eq!(&page[8..12], &[0; 4]);
    assert_eq!(&page[12..16], &1.0f32.to_le_bytes());
    // A scale that is not a power of two: amax 1 → 1/448 rounded to f32.
    let values = [1.0f32, -0.5, 0.25, 1e-3];
    layout.write(&mut page, 0, &values).unwrap();
    let scale = 1.0f32 / 448.0;
    assert_eq!(&page[8..12], &scale.to_le_bytes());
    for (i, &x) in values.iter().enumerate() {
        assert_eq!(page[i], crate::codec::f32_to_e4m3(x / scale), "value {i}");
    }
    let mut out = [0.0f32; 4];
    layout.read(&page, 0, &mut out).unwrap();
    for (i, (&x, &y)) in values.iter().zip(&out).enumerate() {
        assert_eq!(y, e4m3_to_f32(page[i]) * scale);
        assert!(
            (x - y).abs() <= x.abs() / 16.0 + scale / 1024.0,
            "{x} → {y}"
        );
    }
}

#[test]
fn fp4_golden_bytes() {
    let layout = IndexKLayout::new(IndexKDtype::Fp4, 64, 1).unwrap();
    let mut page = vec![0xFFu8; layout.page_bytes()];
    assert_eq!(page.len(), 34);
    let mut v = vec![0.0f32; 64];
    // Block 0, amax 6 → scale 1 (ue8m0 127): 6 → 0x7, −0.5 → 0x9, 2.5 → 2 (0x4), 0.25 → 0.
    v[..4].copy_from_slice(&[6.0, -0.5, 2.5, 0.25]);
    // Block 1, amax 3 → scale 2^-1 (ue8m0 126): 3 → 6 (0x7), −1 → −2 (0xC).
    v[32..34].copy_from_slice(&[3.0, -1.0]);
    layout.write(&mut page, 0, &v).unwrap();
    assert_eq!(&page[..2], &[0x97, 0x04], "low nibble first");
    assert!(page[2..16].iter().all(|&b| b == 0));
    assert_eq!(page[16], 0xC7);
    assert_eq!(&page[32..34], &[127, 126]);
    let mut out = vec![0.0; 64];
    layout.read(&page, 0, &mut out).unwrap();
    assert_eq!(&out[..4], &[6.0, -0.5, 2.0, 0.0]);
    assert_eq!(&out[32..34], &[3.0, -1.0]);
}

#[test]
fn bf16_golden_bytes() {
    let layout = IndexKLayout::new(IndexKDtype::Bf16, 2, 2).unwrap();
    let mut page = vec![0u8; layout.page_bytes()];
    layout.write(&mut page, 1, &[1.0, -2.0]).unwrap();
    assert_eq!(page, vec![0, 0, 0, 0, 0x80, 0x3F, 0x00, 0xC0]);
    assert_eq!(f32_to_bf16(-2.0), 0xC000);
}

#[test]
fn writing_a_slot_changes_only_that_slot() {
    let mut g = SplitMix64::new(31);
    for dtype in ALL {
        let layout = IndexKLayout::new(dtype, 128, INDEX_K_PAGE_ENTRIES).unwrap();
        let mut page = vec![0x5Au8; layout.page_bytes()];
        layout
            .write(&mut page, 3, &random_vec(&mut g, 128, 1.0))
            .unwrap();
        let at = layout.slot_bytes(3).unwrap();
        for (i, &b) in page.iter().enumerate() {
            if !at.contains(i) {
                assert_eq!(b, 0x5A, "{dtype}: byte {i} outside slot 3 changed");
            }
        }
        let keys: Vec<Vec<f32>> = (0..64)
            .map(|s| random_vec(&mut g, 128, 0.01 + s as f32))
            .collect();
        for (s, k) in keys.iter().enumerate() {
            layout.write(&mut page, s, k).unwrap();
        }
        let mut out = vec![0.0; 128];
        for (s, k) in keys.iter().enumerate() {
            layout.read(&page, s, &mut out).unwrap();
            assert_eq!(out, round_index_vector(dtype, k), "{dtype}: slot {s}");
        }
    }
}

#[test]
fn query_rounding_equals_the_key_round_trip() {
    let mut g = SplitMix64::new(41);
    for dtype in ALL {
        let layout = IndexKLayout::new(dtype, 128, 64).unwrap();
        for std in [1e-9f32, 1e-3, 1.0, 500.0] {
            let x = random_vec(&mut g, 128, std);
            assert_eq!(
                layout.round_trip(&x).unwrap(),
                round_index_vector(dtype, &x),
                "{dtype}"
            );
        }
    }
}

#[test]
fn round_trip_error_bounds() {
    let mut g = SplitMix64::new(51);
    for _ in 0..100 {
        let x = random_vec(&mut g, 128, 3.0);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let s8 = amax / 448.0;
        let y = round_index_vector(IndexKDtype::Fp8, &x);
        for (xi, yi) in x.iter().zip(&y) {
            assert!(
                (xi - yi).abs() <= xi.abs() / 16.0 * 1.0001 + s8 / 1024.0,
                "fp8 {xi} → {yi}"
            );
        }
        let y = round_index_vector(IndexKDtype::Fp4, &x);
        for (xs, ys) in x.chunks(32).zip(y.chunks(32)) {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let s4 = 2f32.powi((f64::from(amax / 6.0)).log2().ceil() as i32);
            for (xi, yi) in xs.iter().zip(ys) {
                assert!(
                    (xi - yi).abs() <= xi.abs() / 4.0 + s4 / 4.0,
                    "fp4 {xi} → {yi}"
                );
            }
        }
        let y = round_index_vector(IndexKDtype::Bf16, &x);
        for (xi, yi) in x.iter().zip(&y) {
            assert!((xi - yi).abs() <= xi.abs() / 256.0, "bf16 {xi} → {yi}");
        }
    }
}

#[test]
fn query_vectors_use_one_fp8_scale_and_fp4_blocks_of_32() {
    // One scale for the whole vector: 448 fixes it at 1.0, so 1e-3 becomes the e4m3 subnormal
    // 2^-9 (1e-3 · 2^9 = 0.512 rounds to 1).
    let y = round_index_vector(IndexKDtype::Fp8, &[448.0, 1e-3]);
    assert_eq!(y, vec![448.0, 2f32.powi(-9)]);
    // 40 values: a block of 32 with amax 6 and a last block of 8 with amax 0.75 (scale 2^-3).
    let mut x = vec![0.0f32; 40];
    x[0] = 6.0;
    x[31] = 0.75;
    x[32] = 0.75;
    x[39] = -0.1;
    let y = round_index_vector(IndexKDtype::Fp4, &x);
    assert_eq!(y.len(), 40);
    assert_eq!((y[0], y[31]), (6.0, 1.0), "0.75 at scale 1 ties to 1.0");
    assert_eq!(
        (y[32], y[39]),
        (0.75, -0.125),
        "0.75 exact at scale 1/8; −0.1/0.125 = −0.8 → −1"
    );
    assert!(round_index_vector(IndexKDtype::Fp4, &[]).is_empty());
}

#[test]
fn non_finite_values_do_not_panic() {
    let mut x = vec![1.0f32; 64];
    x[3] = f32::NAN;
    let y = round_index_vector(IndexKDtype::Fp4, &x);
    assert!(
        y[..32].iter().all(|v| v.is_nan()),
        "a NaN poisons its fp4 block (scale code 255)"
    );
    assert!(y[32..].iter().all(|&v| v == 1.0));
    let y = round_index_vector(IndexKDtype::Fp8, &x);
    assert!(y[3].is_nan() && y[4] == 1.0);
    let layout = IndexKLayout::new(IndexKDtype::Fp4, 64, 1).unwrap();
    let mut page = vec![0u8; layout.page_bytes()];
    layout.write(&mut page, 0, &x).unwrap();
    // Second block: amax 1 → 2^ceil(log2(1/6)) = 2^-2 (ue8m0 125).
    assert_eq!(&page[32..34], &[255, 125]);
    let mut g = SplitMix64::new(3);
    for dtype in ALL {
        let layout = IndexKLayout::new(dtype, 128, 4).unwrap();
        let page: Vec<u8> = (0..layout.page_bytes())
            .map(|_| g.below(256) as u8)
            .collect();
        let mut out = vec![0.0; 128];
        for s in 0..4 {
            layout.read(&page, s, &mut out).unwrap();
        }
        let inf = round_index_vector(dtype, &[f32::INFINITY, 1.0]);
        assert_eq!(inf.len(), 2, "{dtype}");
    }
}

#[test]
fn bad_layouts_and_bad_buffers_are_errors() {
    use CacheLayoutError as E;
    let e = IndexKLayout::new(IndexKDtype::Fp4, 48, 64).unwrap_err();
    assert_eq!(
        e,
        E::IndexDimNotMultiple {
            dtype: "fp4",
            dim: 48,
            multiple: 32
        }
    );
    assert!(e.to_string().contains("multiple of 32, got 48"), "{e}");
    assert!(IndexKLayout::new(IndexKDtype::Fp4, 0, 64).is_err());
    assert_eq!(
        IndexKLayout::new(IndexKDtype::Fp8, 0, 64),
        Err(E::EmptyEntry)
    );
    assert_eq!(
        IndexKLayout::new(IndexKDtype::Bf16, 8, 0),
        Err(E::ZeroPageEntries)
    );
    assert_eq!(
        IndexKLayout::new(IndexKDtype::Bf16, 8, usize::MAX / 8),
        Err(E::TooLarge {
            page_entries: usize::MAX / 8
        })
    );
    assert!(
        IndexKLayout::new(IndexKDtype::Fp8, 100, 64).is_ok(),
        "fp8 has one scale per entry"
    );
    let layout = IndexKLayout::new(IndexKDtype::Fp8, 128, 64).unwrap();
    let mut page = vec![0u8; layout.page_bytes()];
    let v = vec![0.5f32; 128];
    assert_eq!(
        layout.write(&mut page, 64, &v),
        Err(E::SlotOutOfRange {
            slot: 64,
            page_entries: 64
        })
    );
    assert_eq!(
        layout.write(&mut page, 0, &v[1..]),
        Err(E::WrongValueCount {
            expected: 128,
            got: 127
        })
    );
    assert_eq!(
        layout.write(&mut page[..8447], 0, &v),
        Err(E::WrongPageSize {
            expected: 8448,
            got: 8447
        })
    );
    let mut out = vec![0.0; 128];
    assert!(layout.read(&page, 64, &mut out).is_err());
    assert!(layout.read(&page, 0, &mut out[..64]).is_err());
    assert!(layout.round_trip(&v[..3]).is_err());
    assert!(page.iter().all(|&b| b == 0), "failed calls write nothing");
}

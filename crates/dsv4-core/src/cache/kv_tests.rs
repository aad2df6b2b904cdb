//! Tests of the KV entry layout: sizes, golden bytes, slot isolation, round-trip bounds, errors.

use super::*;
use crate::codec::{bf16_to_f32, f32_to_bf16};
use crate::{KvCacheDtype, SplitMix64};

const FP8: KvCacheDtype = KvCacheDtype::Fp8;
const BF16: KvCacheDtype = KvCacheDtype::Bf16;

fn random_entry(g: &mut SplitMix64, hd: usize, std: f32) -> Vec<f32> {
    (0..hd).map(|_| g.normalish(std)).collect()
}

#[test]
fn entry_and_page_sizes() {
    let flash = KvLayout::new(FP8, 448, 64, 64).unwrap();
    assert_eq!(flash.entry_bytes(), 584);
    assert_eq!((flash.data_row_bytes(), flash.scale_row_bytes()), (576, 8));
    assert_eq!(
        flash.page_bytes(),
        65 * 576,
        "64 × 584 = 37376 padded to a multiple of 576"
    );
    assert_eq!(KvLayout::new(FP8, 448, 64, 1).unwrap().page_bytes(), 1152);
    assert_eq!(
        KvLayout::from_head_dims(FP8, 512, 64, 64).unwrap(),
        flash,
        "head_dim 512 with rope 64 is nd 448"
    );
    let tiny = |p| KvLayout::new(FP8, 64, 64, p).unwrap();
    assert_eq!(tiny(1).entry_bytes(), 194);
    for (p, want) in [(1, 384), (2, 576), (3, 768), (64, 12480)] {
        assert_eq!(tiny(p).page_bytes(), want, "page of {p} entries");
        assert_eq!(tiny(p).page_bytes() % 192, 0);
        assert!(tiny(p).page_bytes() >= p * 194);
    }
    let bf16 = KvLayout::new(BF16, 448, 64, 64).unwrap();
    assert_eq!(bf16.entry_bytes(), 1024);
    assert_eq!(bf16.scale_row_bytes(), 0);
    assert_eq!(bf16.page_bytes(), 64 * 1024);
    assert_eq!(KvLayout::new(BF16, 64, 64, 3).unwrap().entry_bytes(), 256);
    assert_eq!(bf16.head_dim(), 512);
    assert_eq!((bf16.nd(), bf16.rd(), bf16.page_entries()), (448, 64, 64));
    assert_eq!(bf16.dtype(), BF16);
}

/// nope[i] = (i − 32)/4 (amax 8 → scale 2^-5, ue8m0 byte 122); rope = [1, 1 + 2^-7, 1/3, 0, …].
fn golden_entry() -> Vec<f32> {
    let mut v: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) * 0.25).collect();
    v.extend([1.0, 1.0 + 2f32.powi(-7), 1.0 / 3.0]);
    v.resize(128, 0.0);
    v
}

#[test]
fn fp8_golden_bytes_of_one_entry() {
    let layout = KvLayout::new(FP8, 64, 64, 1).unwrap();
    let mut page = vec![0xEEu8; layout.page_bytes()];
    layout.write(&mut page, 0, &golden_entry()).unwrap();
    // e4m3 of x·32: −8 → −256 (0xF8); 0 → 0x00; 0.25 → 8 (0x50); 0.5 → 16 (0x58);
    // 0.75 → 24 (0x5C); 7.75 → 248, a tie between 240 and 256 that goes to even 256 (0x78).
    assert_eq!(page[0], 0xF8);
    assert_eq!(page[32], 0x00);
    assert_eq!(&page[33..36], &[0x50, 0x58, 0x5C]);
    assert_eq!(page[63], 0x78);
    // Rope values as little-endian bf16: 1.0 = 0x3F80, 1 + 2^-7 = 0x3F81, 1/3 = 0x3EAB.
    assert_eq!(&page[64..70], &[0x80, 0x3F, 0x81, 0x3F, 0xAB, 0x3E]);
    assert_eq!(&page[70..192], &[0u8; 122][..]);
    // Scale row right after the (single) data row: ue8m0 122 = 2^-5, then the pad byte 0.
    assert_eq!(&page[192..194], &[122, 0]);
    // Padding up to 384 bytes is not part of the entry and keeps its old contents.
    assert!(page[194..].iter().all(|&b| b == 0xEE));
    let mut back = vec![0.0; 128];
    layout.read(&page, 0, &mut back).unwrap();
    assert_eq!(back[63], 8.0, "7.75 reads back as 8");
    for (i, (&x, &y)) in golden_entry()[..64].iter().zip(&back).enumerate() {
        assert_eq!(y, crate::codec::e4m3_to_f32(page[i]) / 32.0, "value {i}");
        if x.abs() <= 4.0 {
            assert_eq!(y, x, "x·32 has at most 4 significant bits here");
        }
    }
    assert_eq!(back[1], -8.0, "−7.75 ties to −8");
    assert_eq!(back[3], -7.0, "−7.25 = −232/32 ties to even −224/32");
    assert_eq!(back[66], bf16_to_f32(0x3EAB));
}

#[test]
fn fp8_rows_are_placed_per_page() {
    let layout = KvLayout::new(FP8, 64, 64, 3).unwrap();
    let mut page = vec![0u8; layout.page_bytes()];
    layout.write(&mut page, 1, &golden_entry()).unwrap();
    let at = layout.slot_bytes(1).unwrap();
    assert_eq!(at.data, 192..384);
    assert_eq!(at.scale, 3 * 192 + 2..3 * 192 + 4);
    assert_eq!(page[192], 0xF8);
    assert_eq!(&page[578..580], &[122, 0]);
    assert!(page[..192].iter().all(|&b| b == 0), "slot 0 untouched");
    assert!(
        page[580..].iter().all(|&b| b == 0),
        "slot 2's scale row and padding untouched"
    );
}

#[test]
fn bf16_golden_bytes() {
    let layout = KvLayout::new(BF16, 64, 64, 2).unwrap();
    let mut page = vec![0u8; layout.page_bytes()];
    let values = golden_entry();
    layout.write(&mut page, 1, &values).unwrap();
    let row = &page[256..512];
    for (i, &v) in values.iter().enumerate() {
        assert_eq!(
            row[2 * i..2 * i + 2],
            f32_to_bf16(v).to_le_bytes(),
            "value {i}"
        );
    }
    assert_eq!(&row[0..2], &[0x00, 0xC1], "−8.0 = 0xC100");
    assert!(page[..256].iter().all(|&b| b == 0));
}

#[test]
fn writing_a_slot_changes_only_that_slot() {
    let mut g = SplitMix64::new(21);
    for layout in [
        KvLayout::new(FP8, 448, 64, 64).unwrap(),
        KvLayout::new(FP8, 64, 64, 5).unwrap(),
        KvLayout::new(BF16, 64, 64, 5).unwrap(),
    ] {
        let mut page = vec![0xA5u8; layout.page_bytes()];
        let values = random_entry(&mut g, layout.head_dim(), 2.0);
        layout.write(&mut page, 3, &values).unwrap();
        let at = layout.slot_bytes(3).unwrap();
        for (i, &b) in page.iter().enumerate() {
            if !at.contains(i) {
                assert_eq!(b, 0xA5, "{layout:?}: byte {i} outside slot 3 changed");
            }
        }
        assert!(page[at.data.clone()].iter().any(|&b| b != 0xA5));
        // Fill every slot, then read each back: it equals its own round trip.
        let entries: Vec<Vec<f32>> = (0..layout.page_entries())
            .map(|s| random_entry(&mut g, layout.head_dim(), 0.1 + s as f32))
            .collect();
        for (s, e) in entries.iter().enumerate() {
            layout.write(&mut page, s, e).unwrap();
        }
        let mut out = vec![0.0; layout.head_dim()];
        for (s, e) in entries.iter().enumerate() {
            layout.read(&page, s, &mut out).unwrap();
            assert_eq!(out, layout.round_trip(e).unwrap(), "{layout:?}: slot {s}");
        }
    }
}

#[test]
fn fp8_round_trip_error_bounds_and_idempotence() {
    let layout = KvLayout::new(FP8, 448, 64, 64).unwrap();
    let mut g = SplitMix64::new(5);
    for trial in 0..200 {
        let std = [1e-6f32, 1e-3, 0.5, 30.0, 1e4][trial % 5];
        let x = random_entry(&mut g, 512, std);
        let y = layout.round_trip(&x).unwrap();
        for (b, (xs, ys)) in x[..448].chunks(64).zip(y[..448].chunks(64)).enumerate() {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = 2f32.powi(f64::from(amax.max(1e-4) / 448.0).log2().ceil() as i32);
            for (xi, yi) in xs.iter().zip(ys) {
                let bound = xi.abs() / 16.0 + scale / 1024.0;
                assert!(
                    (xi - yi).abs() <= bound,
                    "block {b}: {xi} → {yi} (scale {scale})"
                );
            }
        }
        for (xi, yi) in x[448..].iter().zip(&y[448..]) {
            assert!((xi - yi).abs() <= xi.abs() / 256.0, "rope {xi} → {yi}");
        }
        assert_eq!(
            layout.round_trip(&y).unwrap(),
            y,
            "reading back is a fixed point"
        );
    }
}

#[test]
fn bf16_round_trip_is_bf16_rounding() {
    let layout = KvLayout::new(BF16, 448, 64, 64).unwrap();
    let mut g = SplitMix64::new(6);
    let x = random_entry(&mut g, 512, 3.0);
    let y = layout.round_trip(&x).unwrap();
    for (xi, yi) in x.iter().zip(&y) {
        assert_eq!(*yi, crate::codec::round_bf16(*xi));
    }
}

#[test]
fn non_finite_values_do_not_panic_and_propagate() {
    let layout = KvLayout::new(FP8, 64, 64, 1).unwrap();
    let mut x = golden_entry();
    x[5] = f32::NAN;
    x[64] = f32::INFINITY;
    let y = layout.round_trip(&x).unwrap();
    assert!(y[5].is_nan());
    assert_eq!(y[6], x[6], "NaN does not change its block's scale");
    assert_eq!(y[64], f32::INFINITY, "bf16 rope keeps inf");
    x[5] = f32::NEG_INFINITY;
    let y = layout.round_trip(&x).unwrap();
    assert_eq!(
        y[5],
        f32::NEG_INFINITY,
        "inf saturates to 448 under the 2^127 scale"
    );
    assert_eq!(y[6], 0.0);
    // Arbitrary bytes read without panicking; the NaN scale code gives NaN.
    let mut g = SplitMix64::new(9);
    let mut page: Vec<u8> = (0..layout.page_bytes())
        .map(|_| g.below(256) as u8)
        .collect();
    page[192] = 255;
    let mut out = vec![0.0; 128];
    layout.read(&page, 0, &mut out).unwrap();
    assert!(out[..64].iter().all(|v| v.is_nan()));
}

#[test]
fn bad_layouts_and_bad_buffers_are_errors() {
    use CacheLayoutError as E;
    assert_eq!(
        KvLayout::new(FP8, 100, 64, 1),
        Err(E::NopeNotMultipleOf64 { nd: 100 })
    );
    assert!(
        KvLayout::new(BF16, 100, 64, 1).is_ok(),
        "bf16 has no blocks"
    );
    assert_eq!(KvLayout::new(FP8, 0, 0, 1), Err(E::EmptyEntry));
    assert_eq!(KvLayout::new(FP8, 64, 64, 0), Err(E::ZeroPageEntries));
    assert_eq!(
        KvLayout::from_head_dims(FP8, 64, 128, 1),
        Err(E::RopeExceedsHead {
            head_dim: 64,
            rope_dim: 128
        })
    );
    assert_eq!(
        KvLayout::new(BF16, usize::MAX / 2, 64, 1),
        Err(E::TooLarge { page_entries: 1 })
    );
    assert_eq!(
        KvLayout::new(FP8, 64, 64, usize::MAX / 64),
        Err(E::TooLarge {
            page_entries: usize::MAX / 64
        })
    );
    let layout = KvLayout::new(FP8, 64, 64, 2).unwrap();
    let mut page = vec![0u8; layout.page_bytes()];
    let v = vec![1.0; 128];
    let e = layout.write(&mut page[..100], 0, &v).unwrap_err();
    assert_eq!(
        e,
        E::WrongPageSize {
            expected: 576,
            got: 100
        }
    );
    assert!(e.to_string().contains("576 bytes"), "{e}");
    assert_eq!(
        layout.write(&mut page, 0, &v[..127]),
        Err(E::WrongValueCount {
            expected: 128,
            got: 127
        })
    );
    let e = layout.write(&mut page, 2, &v).unwrap_err();
    assert_eq!(
        e,
        E::SlotOutOfRange {
            slot: 2,
            page_entries: 2
        }
    );
    assert_eq!(e.to_string(), "slot 2 is outside a page of 2 entries");
    let mut out = vec![0.0; 128];
    assert!(layout.read(&page, 7, &mut out).is_err());
    assert!(layout.read(&page[1..], 0, &mut out).is_err());
    assert!(layout.read(&page, 0, &mut out[..3]).is_err());
    assert!(layout.round_trip(&v[..5]).is_err());
    assert!(layout.slot_bytes(2).is_err());
    assert!(page.iter().all(|&b| b == 0), "failed calls write nothing");
    let msg = KvLayout::new(FP8, 100, 28, 1).unwrap_err().to_string();
    assert!(
        msg.contains("multiple of 64") && msg.contains("100"),
        "{msg}"
    );
}

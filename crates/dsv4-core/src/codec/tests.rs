//! Exhaustive and brute-force tests of the number codecs against first-principles references:
//! every code of the small formats, every midpoint between neighbouring codes, and random values
//! compared with a nearest-even search over the format's value table.

use super::*;
use crate::SplitMix64;

/// Index of the value nearest to `x` (x ≥ 0) in the ascending table `values`, ties to the even
/// index; values past the last entry round to it (saturation, or infinity when the table ends
/// with the overflow threshold). Indexes equal codes because every table starts at code 0.
fn nearest_even(values: &[f64], x: f64) -> usize {
    let hi = values.partition_point(|&v| v < x);
    if hi == 0 {
        return 0;
    }
    if hi == values.len() {
        return values.len() - 1;
    }
    let lo = hi - 1;
    // Neighbouring table values are within a factor 2 (or lo is 0), so both differences are exact.
    let (below, above) = (x - values[lo], values[hi] - x);
    if below < above || (below == above && lo % 2 == 0) {
        lo
    } else {
        hi
    }
}

/// Reference encoder: sign bit plus the nearest-even magnitude code from `table`.
fn reference_code(table: &[f64], sign_bit: u32, x: f32) -> u32 {
    let code = nearest_even(table, f64::from(x.abs())) as u32;
    if x.is_sign_negative() {
        code | sign_bit
    } else {
        code
    }
}

/// A random finite f32 with a uniformly random binary exponent in `exp_lo..=exp_hi` (unbiased;
/// -127 gives subnormals), a random mantissa and a random sign.
fn random_f32(g: &mut SplitMix64, exp_lo: i32, exp_hi: i32) -> f32 {
    let span = (exp_hi - exp_lo + 1) as u64;
    let e = exp_lo + g.below(span) as i32;
    let r = g.next_u64();
    let bits =
        (((e + 127) as u32) << 23) | (r as u32 & 0x7F_FFFF) | ((r >> 32) as u32 & 0x8000_0000);
    f32::from_bits(bits)
}

/// Midpoints of every pair of neighbouring table entries, with the f32 values just below and above.
fn midpoints_and_neighbours(table: &[f64]) -> Vec<f32> {
    let mut out = Vec::new();
    for w in table.windows(2) {
        let m = ((w[0] + w[1]) / 2.0) as f32;
        assert_eq!(
            f64::from(m),
            (w[0] + w[1]) / 2.0,
            "midpoint must be exact in f32"
        );
        out.extend([m, m.next_down(), m.next_up()]);
    }
    out
}

fn e4m3_table() -> Vec<f64> {
    (0u8..=0x7E).map(|c| f64::from(e4m3_to_f32(c))).collect()
}

fn e2m1_table() -> Vec<f64> {
    (0u8..=7).map(|c| f64::from(e2m1_to_f32(c))).collect()
}

/// Positive f16 values by code, ending with 2^16 for code 0x7C00: anything that rounds to it
/// overflows to infinity.
fn f16_table() -> Vec<f64> {
    let mut t: Vec<f64> = (0u16..0x7C00).map(|c| f64::from(f16_to_f32(c))).collect();
    t.push(65536.0);
    t
}

/// Positive bf16 values by code, ending with 2^128 for code 0x7F80 (infinity).
fn bf16_table() -> Vec<f64> {
    let mut t: Vec<f64> = (0u16..0x7F80).map(|c| f64::from(bf16_to_f32(c))).collect();
    t.push(2f64.powi(128));
    t
}

/// 2^e as f64 for e in -1074..=1023, subnormals included (powi underflows there).
fn pow2_f64(e: i32) -> f64 {
    if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (e + 1074))
    }
}

fn assert_strictly_increasing(table: &[f64], what: &str) {
    for (i, w) in table.windows(2).enumerate() {
        assert!(
            w[0] < w[1],
            "{what}: code {i} ({}) !< code {} ({})",
            w[0],
            i + 1,
            w[1]
        );
    }
}

// ---------------------------------------------------------------- e4m3

#[test]
fn e4m3_all_256_codes_round_trip() {
    for c in 0u8..=255 {
        let v = e4m3_to_f32(c);
        if c & 0x7F == 0x7F {
            assert!(v.is_nan(), "code {c:#04x} must decode to NaN");
        } else {
            assert!(v.is_finite(), "code {c:#04x} must be finite");
        }
        assert_eq!(
            f32_to_e4m3(v),
            c,
            "code {c:#04x} (value {v}) does not round-trip"
        );
    }
    assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
    assert_eq!(f32_to_e4m3(0.0), 0x00);
    assert_eq!(f32_to_e4m3(-0.0), 0x80);
}

#[test]
fn e4m3_landmark_values() {
    assert_eq!(e4m3_to_f32(0x7E), 448.0);
    assert_eq!(E4M3_MAX, 448.0);
    assert_eq!(e4m3_to_f32(0xFE), -448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9), "smallest subnormal");
    assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9), "largest subnormal");
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6), "smallest normal");
    assert_eq!(e4m3_to_f32(0x38), 1.0);
    assert_eq!(e4m3_to_f32(0x39), 1.125);
    assert_eq!(e4m3_to_f32(0xC0), -2.0);
    assert_eq!(e4m3_to_f32(0x7D), 416.0);
    assert_strictly_increasing(&e4m3_table(), "e4m3");
}

#[test]
fn e4m3_midpoints_match_nearest_even_search() {
    let table = e4m3_table();
    let mut xs = midpoints_and_neighbours(&table);
    // Beyond the largest code: 464 is the would-be midpoint to 480, which does not exist.
    xs.extend([448.0f32.next_up(), 464.0, 479.0, 480.0, 500.0]);
    for x in xs {
        for v in [x, -x] {
            let want = reference_code(&table, 0x80, v) as u8;
            assert_eq!(f32_to_e4m3(v), want, "e4m3({v:e})");
        }
    }
    // Spot checks of ties: both neighbours at equal distance go to the even mantissa.
    assert_eq!(f32_to_e4m3(1.0625), 0x38, "1 + 1/16 → 1");
    assert_eq!(f32_to_e4m3(1.1875), 0x3A, "1 + 3/16 → 1.25");
    assert_eq!(
        f32_to_e4m3(2f32.powi(-10)),
        0x00,
        "half the smallest subnormal → 0"
    );
    assert_eq!(f32_to_e4m3(2f32.powi(-10).next_up()), 0x01);
    assert_eq!(
        f32_to_e4m3(3.0 * 2f32.powi(-10)),
        0x02,
        "1.5 subnormal steps → 2"
    );
    assert_eq!(
        f32_to_e4m3(15.0 * 2f32.powi(-10)),
        0x08,
        "subnormal rounds up into normal"
    );
}

#[test]
fn e4m3_random_values_match_nearest_even_search() {
    let table = e4m3_table();
    let mut g = SplitMix64::new(0xE4);
    for _ in 0..200_000 {
        let x = random_f32(&mut g, -14, 10);
        let want = reference_code(&table, 0x80, x) as u8;
        assert_eq!(f32_to_e4m3(x), want, "e4m3({x:e})");
    }
}

#[test]
fn e4m3_saturates_and_keeps_sign() {
    for x in [448.0f32, 449.0, 464.0, 500.0, 1e9, f32::MAX, f32::INFINITY] {
        assert_eq!(f32_to_e4m3(x), 0x7E, "{x}");
        assert_eq!(f32_to_e4m3(-x), 0xFE, "-{x}");
    }
}

#[test]
fn e4m3_nan_is_preserved_with_sign() {
    assert_eq!(f32_to_e4m3(f32::NAN), E4M3_NAN);
    assert_eq!(f32_to_e4m3(-f32::NAN), 0xFF);
    // A signalling NaN with a payload in the low bits must not become a number.
    assert_eq!(f32_to_e4m3(f32::from_bits(0x7F80_0001)) & 0x7F, 0x7F);
    assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
    assert!(e4m3_to_f32(0xFF).is_sign_negative());
}

#[test]
fn e4m3_tiny_values_underflow_to_signed_zero() {
    for x in [1e-30f32, 2f32.powi(-11), f32::from_bits(1)] {
        assert_eq!(f32_to_e4m3(x), 0x00, "{x:e}");
        assert_eq!(f32_to_e4m3(-x), 0x80, "-{x:e}");
    }
}

// ---------------------------------------------------------------- bf16

#[test]
fn bf16_all_codes_round_trip() {
    for c in 0u16..=0xFFFF {
        let v = bf16_to_f32(c);
        let back = f32_to_bf16(v);
        if v.is_nan() {
            assert!(
                bf16_to_f32(back).is_nan(),
                "NaN code {c:#06x} must stay NaN"
            );
        } else {
            assert_eq!(back, c, "bf16 code {c:#06x} ({v:e})");
        }
    }
}

#[test]
fn bf16_rounds_to_nearest_even() {
    // Between 1 (0x3F80) and 1 + 2^-7 (0x3F81) the midpoint 1 + 2^-8 goes to the even 0x3F80.
    assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3F80);
    assert_eq!(f32_to_bf16((1.0 + 2f32.powi(-8)).next_up()), 0x3F81);
    assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
    assert_eq!(f32_to_bf16(-(1.0 + 3.0 * 2f32.powi(-8))), 0xBF82);
    assert_eq!(round_bf16(1.0 + 2f32.powi(-9)), 1.0);
    let table = bf16_table();
    let mut g = SplitMix64::new(0xBF16);
    for _ in 0..200_000 {
        let x = random_f32(&mut g, -127, 127);
        let want = reference_code(&table, 0x8000, x) as u16;
        assert_eq!(f32_to_bf16(x), want, "bf16({x:e})");
    }
    for x in midpoints_and_neighbours(&table[..4096]) {
        assert_eq!(
            f32_to_bf16(x),
            reference_code(&table, 0x8000, x) as u16,
            "bf16({x:e})"
        );
    }
}

#[test]
fn bf16_nan_and_overflow() {
    for nan in [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFF80_0001),
    ] {
        let b = f32_to_bf16(nan);
        assert!(
            bf16_to_f32(b).is_nan(),
            "{:#010x} → {b:#06x}",
            nan.to_bits()
        );
        assert_eq!(b & 0x8000 != 0, nan.is_sign_negative());
    }
    assert_eq!(
        f32_to_bf16(f32::MAX),
        0x7F80,
        "f32::MAX rounds past bf16 max to +inf"
    );
    assert_eq!(f32_to_bf16(-f32::MAX), 0xFF80);
    assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
    assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xFF80);
    let max = bf16_to_f32(0x7F7F);
    assert_eq!(f32_to_bf16(max), 0x7F7F);
    assert_eq!(f32_to_bf16(-0.0), 0x8000);
}

// ---------------------------------------------------------------- f16

#[test]
fn f16_all_65536_codes_round_trip() {
    for c in 0u16..=0xFFFF {
        let v = f16_to_f32(c);
        if c & 0x7FFF > 0x7C00 {
            assert!(v.is_nan(), "code {c:#06x} is NaN");
            let back = f32_to_f16(v);
            assert!(
                back & 0x7FFF > 0x7C00,
                "NaN must encode to NaN, got {back:#06x}"
            );
            assert_eq!(back & 0x8000, c & 0x8000, "NaN keeps its sign");
        } else {
            assert_eq!(f32_to_f16(v), c, "f16 code {c:#06x} ({v:e})");
        }
    }
    assert_strictly_increasing(&f16_table(), "f16");
}

#[test]
fn f16_subnormals() {
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x03FF), 1023.0 * 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
    assert_eq!(
        f32_to_f16(2f32.powi(-25)),
        0x0000,
        "half the smallest subnormal ties to 0"
    );
    assert_eq!(f32_to_f16(2f32.powi(-25).next_up()), 0x0001);
    assert_eq!(f32_to_f16(3.0 * 2f32.powi(-25)), 0x0002, "ties to even");
    assert_eq!(
        f32_to_f16(-(5.0 * 2f32.powi(-25))),
        0x8002,
        "ties to even, negative"
    );
    assert_eq!(f32_to_f16(-1e-30), 0x8000);
}

#[test]
fn f16_overflow_and_random_values() {
    assert_eq!(f16_to_f32(0x7BFF), 65504.0);
    assert_eq!(f32_to_f16(65504.0), 0x7BFF);
    assert_eq!(f32_to_f16(65519.0), 0x7BFF);
    assert_eq!(
        f32_to_f16(65520.0),
        0x7C00,
        "the midpoint to 2^16 overflows (ties to even)"
    );
    assert_eq!(f32_to_f16(1e6), 0x7C00);
    assert_eq!(f32_to_f16(-1e6), 0xFC00);
    assert_eq!(f32_to_f16(f32::NEG_INFINITY), 0xFC00);
    assert_eq!(f16_to_f32(0x7C00), f32::INFINITY);
    let table = f16_table();
    for x in midpoints_and_neighbours(&table) {
        assert_eq!(
            f32_to_f16(x),
            reference_code(&table, 0x8000, x) as u16,
            "f16({x:e})"
        );
    }
    let mut g = SplitMix64::new(0xF16);
    for _ in 0..200_000 {
        let x = random_f32(&mut g, -27, 17);
        let want = reference_code(&table, 0x8000, x) as u16;
        assert_eq!(f32_to_f16(x), want, "f16({x:e})");
    }
}

// ---------------------------------------------------------------- ue8m0 and scale exponents

#[test]
fn ue8m0_codes_are_powers_of_two() {
    for b in 0u8..255 {
        let v = ue8m0_to_f32(b);
        let want = 2f64.powi(i32::from(b) - 127);
        assert_eq!(f64::from(v), want, "ue8m0 {b}");
        assert_eq!(f32_to_ue8m0(i32::from(b) - 127), Some(b));
    }
    assert!(ue8m0_to_f32(255).is_nan());
    assert_eq!(ue8m0_to_f32(127), 1.0);
    assert!(ue8m0_to_f32(0) > 0.0 && ue8m0_to_f32(0).is_subnormal());
}

#[test]
fn f32_to_ue8m0_range() {
    assert_eq!(f32_to_ue8m0(-127), Some(0));
    assert_eq!(f32_to_ue8m0(0), Some(127));
    assert_eq!(f32_to_ue8m0(127), Some(254));
    for bad in [-128, 128, i32::MIN, i32::MAX] {
        assert_eq!(f32_to_ue8m0(bad), None, "exponent {bad} has no ue8m0 code");
    }
}

#[test]
fn pow2_ceil_exponent_on_powers_of_two_and_neighbours() {
    for e in -1074..=1023 {
        let p = pow2_f64(e);
        assert_eq!(pow2_ceil_exponent(p), e, "2^{e}");
        if e < 1023 {
            assert_eq!(pow2_ceil_exponent(p.next_up()), e + 1, "just above 2^{e}");
        }
        // (Below 2^-1073 the only smaller value is 2^-1074, itself a power of two.)
        if e > -1073 {
            assert_eq!(pow2_ceil_exponent(p.next_down()), e, "just below 2^{e}");
        }
    }
    assert_eq!(pow2_ceil_exponent(3.0), 2);
    assert_eq!(pow2_ceil_exponent(0.75), 0);
    assert_eq!(pow2_ceil_exponent(f64::MAX), 1024);
    assert_eq!(pow2_ceil_exponent(f64::from(1e-4f32 / 448.0)), -22);
    assert_eq!(
        pow2_ceil_exponent(3.0 * pow2_f64(-1074)),
        -1072,
        "subnormal non-power"
    );
}

#[test]
fn checked_pow2_ceil_exponent_rejects_bad_input() {
    for bad in [0.0, -0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(checked_pow2_ceil_exponent(bad), None, "{bad}");
    }
    assert_eq!(checked_pow2_ceil_exponent(5.0), Some(3));
}

// ---------------------------------------------------------------- e2m1 and packing

#[test]
fn e2m1_all_16_codes_round_trip() {
    let want = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    for c in 0u8..16 {
        let v = e2m1_to_f32(c);
        let mag = want[usize::from(c & 7)];
        assert_eq!(v, if c & 8 != 0 { -mag } else { mag }, "code {c}");
        assert_eq!(v.is_sign_negative(), c & 8 != 0, "code {c} sign");
        assert_eq!(f32_to_e2m1(v), c, "code {c} ({v})");
    }
    assert_eq!(E2M1_MAX, 6.0);
}

#[test]
fn e2m1_midpoints_round_to_even_and_saturate() {
    let cases = [
        (0.25f32, 0.0f32),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (5.0, 4.0),
        (7.0, 6.0),
        (100.0, 6.0),
        (f32::INFINITY, 6.0),
    ];
    for (x, want) in cases {
        assert_eq!(e2m1_to_f32(f32_to_e2m1(x)), want, "e2m1({x})");
        assert_eq!(e2m1_to_f32(f32_to_e2m1(-x)), -want, "e2m1(-{x})");
    }
    assert_eq!(
        f32_to_e2m1(-0.1),
        0x8,
        "small negatives keep the sign as -0"
    );
    assert_eq!(
        f32_to_e2m1(f32::NAN),
        0,
        "NaN has no e2m1 code and maps to +0"
    );
    let table = e2m1_table();
    for x in midpoints_and_neighbours(&table) {
        assert_eq!(
            u32::from(f32_to_e2m1(x)),
            reference_code(&table, 8, x),
            "e2m1({x})"
        );
    }
    let mut g = SplitMix64::new(0xE2);
    for _ in 0..50_000 {
        let x = random_f32(&mut g, -4, 4);
        assert_eq!(
            u32::from(f32_to_e2m1(x)),
            reference_code(&table, 8, x),
            "e2m1({x:e})"
        );
    }
}

#[test]
fn pack_and_unpack_e2m1_low_nibble_first() {
    assert_eq!(pack_e2m1(&[0x1, 0x2, 0x3, 0xF]), vec![0x21, 0xF3]);
    assert_eq!(
        pack_e2m1(&[0x5]),
        vec![0x05],
        "an odd count pads the high nibble with 0"
    );
    assert_eq!(
        pack_e2m1(&[0xF1, 0xE2]),
        vec![0x21],
        "only the low 4 bits of a code are used"
    );
    assert_eq!(pack_e2m1(&[]), Vec::<u8>::new());
    assert_eq!(unpack_e2m1(&[0x21, 0xF3]), vec![0x1, 0x2, 0x3, 0xF]);
    let mut g = SplitMix64::new(4);
    let codes: Vec<u8> = (0..1000).map(|_| g.below(16) as u8).collect();
    assert_eq!(unpack_e2m1(&pack_e2m1(&codes)), codes);
    let bytes: Vec<u8> = (0u8..=255).collect();
    assert_eq!(pack_e2m1(&unpack_e2m1(&bytes)), bytes);
}

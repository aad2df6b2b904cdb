//! Rounding an f32 into small float formats (round-to-nearest-even) and decoding them back.

/// Round |x| (finite, ≥ 0) to a sign-less minifloat code with `man` mantissa bits and exponent
/// `bias`; subnormals included. The result may exceed the format's largest code: callers
/// saturate or map to infinity.
fn encode_magnitude(x: f64, man: u32, bias: i32) -> u64 {
    debug_assert!(x >= 0.0 && x.is_finite());
    let emin = 1 - bias;
    if x == 0.0 {
        return 0;
    }
    let exp = ((x.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    if exp < emin {
        // Subnormal: multiples of 2^(emin - man). q may round up into the first normal code.
        let q = x * pow2(man as i32 - emin);
        return round_even(q) as u64;
    }
    let q = x * pow2(man as i32 - exp); // in [2^man, 2^(man+1))
    let q = round_even(q) as u64;
    // A carry out of the mantissa increments the exponent field through the addition.
    (((exp + bias) as u64) << man) + (q - (1u64 << man))
}

fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

fn round_even(q: f64) -> f64 {
    q.round_ties_even()
}

fn decode_magnitude(code: u32, man: u32, bias: i32) -> f64 {
    let e = (code >> man) as i32;
    let m = f64::from(code & ((1 << man) - 1));
    if e == 0 {
        m * pow2(1 - bias - man as i32)
    } else {
        (1.0 + m / f64::from(1u32 << man)) * pow2(e - bias)
    }
}

/// f32 → bf16 bits, round-to-nearest-even; NaN stays NaN (quietened).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7FFF + lsb) >> 16) as u16
}

/// bf16 bits → f32 (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Round an f32 to the nearest bf16 value and return it as f32.
pub fn round_bf16(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(x))
}

/// f32 → IEEE binary16 bits, round-to-nearest-even; overflow gives ±infinity, NaN stays NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    if x.is_nan() {
        return sign | 0x7E00;
    }
    if x.is_infinite() {
        return sign | 0x7C00;
    }
    let code = encode_magnitude(f64::from(x.abs()), 10, 15);
    sign | code.min(0x7C00) as u16
}

/// IEEE binary16 bits → f32 (exact; a NaN keeps its sign, its payload is not kept).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign: f64 = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let mag = u32::from(h & 0x7FFF);
    if mag >= 0x7C00 {
        let v = if mag == 0x7C00 {
            f32::INFINITY
        } else {
            f32::NAN
        };
        return if sign < 0.0 { -v } else { v };
    }
    (sign * decode_magnitude(mag, 10, 15)) as f32
}

/// f32 → e4m3 ("fn": bias 7, max ±448, no infinities), round-to-nearest-even, saturating;
/// ±infinity saturates to ±448, NaN maps to the NaN code of its sign.
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return sign | super::E4M3_NAN;
    }
    if x.is_infinite() {
        return sign | 0x7E;
    }
    let code = encode_magnitude(f64::from(x.abs()), 3, 7);
    sign | code.min(0x7E) as u8
}

/// e4m3 code → f32 (exact; 0x7F and 0xFF are NaN, decoded with their sign so that
/// encoding the result gives the same code back).
pub fn e4m3_to_f32(c: u8) -> f32 {
    let mag = u32::from(c & 0x7F);
    let v = if mag == 0x7F {
        f32::NAN
    } else {
        decode_magnitude(mag, 3, 7) as f32
    };
    if c & 0x80 != 0 { -v } else { v }
}

/// f32 → e2m1 code (4 bits: sign, 2 exponent bits, 1 mantissa bit), round-to-nearest-even,
/// saturating at ±6. NaN has no e2m1 code and maps to +0 (callers reject NaN inputs first).
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let sign = if x.is_sign_negative() { 0x8 } else { 0 };
    if x.is_infinite() {
        return sign | 0x7;
    }
    let code = encode_magnitude(f64::from(x.abs()), 1, 1);
    sign | code.min(0x7) as u8
}

/// e2m1 code (low 4 bits) → f32.
pub fn e2m1_to_f32(c: u8) -> f32 {
    const VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let v = VALUES[usize::from(c & 0x7)];
    if c & 0x8 != 0 { -v } else { v }
}

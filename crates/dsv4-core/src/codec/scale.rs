//! Power-of-two block scales: the ue8m0 code (value 2^(b−127)) and the ceil-log2 rule that
//! chooses them.

/// ue8m0 code → f32: 2^(b−127); 255 is NaN. Code 0 is 2^-127, an f32 subnormal.
pub fn ue8m0_to_f32(b: u8) -> f32 {
    if b == 255 {
        return f32::NAN;
    }
    // Exact through f64, then exact into f32 (2^-127 is representable as a subnormal).
    f64::from_bits(((1023 + i32::from(b) - 127) as u64) << 52) as f32
}

/// The ue8m0 code of 2^exp, or None when exp is outside [-127, 127].
pub fn f32_to_ue8m0(exp: i32) -> Option<u8> {
    (-127..=127).contains(&exp).then(|| (exp + 127) as u8)
}

/// ceil(log2(v)) for a finite v > 0, exactly (no floating log).
///
/// # Panics
/// When `v` is not finite and positive; use [`checked_pow2_ceil_exponent`] for untrusted input.
pub fn pow2_ceil_exponent(v: f64) -> i32 {
    checked_pow2_ceil_exponent(v).expect("pow2_ceil_exponent needs a finite positive value")
}

/// ceil(log2(v)) exactly, or None when `v` is zero, negative, infinite or NaN.
pub fn checked_pow2_ceil_exponent(v: f64) -> Option<i32> {
    if !(v > 0.0 && v.is_finite()) {
        return None;
    }
    let bits = v.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let mant = bits & ((1u64 << 52) - 1);
    if biased == 0 {
        // f64 subnormal: value = mant * 2^-1074.
        let hi = 63 - mant.leading_zeros() as i32; // floor(log2(mant))
        let exact = mant.is_power_of_two();
        return Some(hi - 1074 + if exact { 0 } else { 1 });
    }
    let e = biased - 1023;
    Some(if mant == 0 { e } else { e + 1 })
}

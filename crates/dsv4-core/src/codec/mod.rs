//! Number codecs: bf16, f16, e4m3 (OCP "fn"), ue8m0 scales and e2m1 (MXFP4 elements).
//!
//! Every encoder rounds to nearest, ties to even, from the exact f32 value. e4m3 and e2m1 saturate
//! at their largest finite value; f16 and bf16 overflow to infinity as IEEE does.

mod minifloat;
pub mod scale;

pub use minifloat::{
    bf16_to_f32, e2m1_to_f32, e4m3_to_f32, f16_to_f32, f32_to_bf16, f32_to_e2m1, f32_to_e4m3,
    f32_to_f16, round_bf16,
};
pub use scale::{checked_pow2_ceil_exponent, f32_to_ue8m0, pow2_ceil_exponent, ue8m0_to_f32};

/// Largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// The e4m3 NaN code (positive sign); 0xFF is the negative-sign NaN.
pub const E4M3_NAN: u8 = 0x7F;

/// Pack e2m1 codes (low 4 bits of each) two per byte, the first value in the low nibble.
pub fn pack_e2m1(codes: &[u8]) -> Vec<u8> {
    codes
        .chunks(2)
        .map(|c| (c[0] & 0xF) | (c.get(1).copied().unwrap_or(0) & 0xF) << 4)
        .collect()
}

/// Unpack bytes of two e2m1 codes each (low nibble first) into one code per element.
pub fn unpack_e2m1(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|b| [b & 0xF, b >> 4]).collect()
}

#[cfg(test)]
mod tests;

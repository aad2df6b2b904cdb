//! Block quantization rules shared by the cache layouts and by activation quantization
//! (spec §4–§6): power-of-two block scales for e4m3 and e2m1, and `act_quant_fp8`.
//!
//! Scales are chosen from the f32 quotient `max(amax, floor) / qmax`, as the GPU kernels compute
//! it, then rounded up to a power of two exactly. NaN inputs never panic: e4m3 keeps them as NaN
//! codes; an infinite block maximum gives the largest scale (2^127), so ±inf reads back as ±inf.

use crate::codec::{checked_pow2_ceil_exponent, e4m3_to_f32, f32_to_e4m3, ue8m0_to_f32};

/// Lower clamp of a block's absolute maximum before an e4m3 scale is chosen (spec §4).
pub const E4M3_AMAX_FLOOR: f32 = 1e-4;
/// Lower clamp of a block's absolute maximum before an e2m1 scale is chosen: 6·2^-126.
pub const E2M1_AMAX_FLOOR: f32 = 6.0 * f32::MIN_POSITIVE;
/// Block width of activation quantization in front of fp8/fp4-weight linears.
pub const ACT_QUANT_BLOCK: usize = 128;
/// Block width of the e4m3 "nope" part of fp8 KV entries.
pub const KV_NOPE_BLOCK: usize = 64;
/// Block width of e2m1 values sharing one ue8m0 scale (MXFP4).
pub const E2M1_BLOCK: usize = 32;

/// What was wrong with a quantization request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// A block width of zero was asked for.
    #[error("quantization block width must be at least 1 (spec §5 uses 128 for activations)")]
    ZeroBlock,
}

/// The largest |x| of a block, ignoring NaN (0 for an empty or all-NaN block).
pub fn block_amax(values: &[f32]) -> f32 {
    values.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// Exponent e of the block scale 2^e = 2^ceil(log2(max(amax, floor) / qmax)), the quotient
/// computed in f32; clamped to the ue8m0 range [-127, 127] (an infinite amax gives 127).
pub fn pow2_scale_exponent(amax: f32, floor: f32, qmax: f32) -> i32 {
    let q = amax.max(floor) / qmax;
    match checked_pow2_ceil_exponent(f64::from(q)) {
        Some(e) => e.clamp(-127, 127),
        None if q.is_infinite() => 127,
        None => -127,
    }
}

/// 2^e as f32 for e in [-127, 127] (exact, 2^-127 is an f32 subnormal).
pub(crate) fn pow2_f32(e: i32) -> f32 {
    ue8m0_to_f32((e.clamp(-127, 127) + 127) as u8)
}

/// Quantize one block to e4m3 codes with a power-of-two scale (floor 1e-4, max 448) and return
/// the scale's ue8m0 code. `codes` must have the block's length.
pub(crate) fn quantize_e4m3_pow2(values: &[f32], codes: &mut [u8]) -> u8 {
    let e = pow2_scale_exponent(block_amax(values), E4M3_AMAX_FLOOR, crate::codec::E4M3_MAX);
    let scale = pow2_f32(e);
    for (c, &x) in codes.iter_mut().zip(values) {
        *c = f32_to_e4m3(x / scale);
    }
    (e + 127) as u8
}

/// Decode e4m3 codes that share the scale whose ue8m0 code is `scale_code` (exact in f32;
/// the NaN scale code 255 gives NaN).
pub(crate) fn dequantize_e4m3_pow2(codes: &[u8], scale_code: u8, out: &mut [f32]) {
    let scale = ue8m0_to_f32(scale_code);
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = e4m3_to_f32(c) * scale;
    }
}

/// Activation quantization (spec §5 `act_quant = fp8`): per block of `block` values (the last
/// block may be shorter), e4m3 with scale 2^ceil(log2(max(amax, 1e-4)/448)); returns the
/// dequantized values the linear then multiplies.
pub fn act_quant_fp8(values: &[f32], block: usize) -> Result<Vec<f32>, QuantError> {
    let mut out = values.to_vec();
    act_quant_fp8_in_place(&mut out, block)?;
    Ok(out)
}

/// [`act_quant_fp8`] overwriting `values` with the dequantized result.
pub fn act_quant_fp8_in_place(values: &mut [f32], block: usize) -> Result<(), QuantError> {
    if block == 0 {
        return Err(QuantError::ZeroBlock);
    }
    let mut codes = vec![0u8; block.min(values.len())];
    for chunk in values.chunks_mut(block) {
        let codes = &mut codes[..chunk.len()];
        let scale_code = quantize_e4m3_pow2(chunk, codes);
        dequantize_e4m3_pow2(codes, scale_code, chunk);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SplitMix64;

    #[test]
    fn scale_exponent_rule() {
        // 8/448 = 2^-5.8 → 2^-5; exactly 448·2^k → 2^k; below the floor → ceil(log2(1e-4/448)).
        assert_eq!(pow2_scale_exponent(8.0, E4M3_AMAX_FLOOR, 448.0), -5);
        assert_eq!(pow2_scale_exponent(448.0, E4M3_AMAX_FLOOR, 448.0), 0);
        assert_eq!(
            pow2_scale_exponent(448.0f32.next_up(), E4M3_AMAX_FLOOR, 448.0),
            1
        );
        assert_eq!(pow2_scale_exponent(896.0, E4M3_AMAX_FLOOR, 448.0), 1);
        assert_eq!(pow2_scale_exponent(0.0, E4M3_AMAX_FLOOR, 448.0), -22);
        assert_eq!(pow2_scale_exponent(f32::NAN, E4M3_AMAX_FLOOR, 448.0), -22);
        assert_eq!(
            pow2_scale_exponent(f32::INFINITY, E4M3_AMAX_FLOOR, 448.0),
            127
        );
        assert_eq!(pow2_scale_exponent(f32::MAX, E4M3_AMAX_FLOOR, 448.0), 120);
        assert_eq!(pow2_scale_exponent(0.0, E2M1_AMAX_FLOOR, 6.0), -126);
        assert_eq!(pow2_scale_exponent(6.0, E2M1_AMAX_FLOOR, 6.0), 0);
        assert_eq!(pow2_scale_exponent(3.0, E2M1_AMAX_FLOOR, 6.0), -1);
        assert_eq!(block_amax(&[1.0, -3.0, f32::NAN, 2.0]), 3.0);
        assert_eq!(block_amax(&[]), 0.0);
    }

    #[test]
    fn act_quant_matches_a_direct_computation_per_block() {
        let mut g = SplitMix64::new(11);
        let x: Vec<f32> = (0..384)
            .map(|i| g.normalish(1.0 + i as f32 / 50.0))
            .collect();
        let y = act_quant_fp8(&x, ACT_QUANT_BLOCK).unwrap();
        for (b, (xs, ys)) in x.chunks(128).zip(y.chunks(128)).enumerate() {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let e = (f64::from(amax / 448.0)).log2().ceil() as i32;
            let scale = 2f32.powi(e);
            for (xi, yi) in xs.iter().zip(ys) {
                let want = e4m3_to_f32(f32_to_e4m3(xi / scale)) * scale;
                assert_eq!(*yi, want, "block {b}: x = {xi}");
                assert!((xi - yi).abs() <= xi.abs() / 16.0 + scale / 1024.0);
            }
            // The block maximum lands in the top binade of e4m3.
            let top = ys.iter().fold(0.0f32, |m, v| m.max(v.abs())) / scale;
            assert!(top > 224.0 && top <= 448.0, "block {b}: {top}");
        }
    }

    #[test]
    fn act_quant_short_last_block_zero_block_and_non_finite() {
        let x = [1000.0f32, 1.0, 0.001, 3.0];
        let y = act_quant_fp8(&x, 3).unwrap();
        // Block [1000, 1, 0.001]: scale 4, 1.0/4 = 0.25 exact; 0.001/4 underflows to 0.
        assert_eq!(&y[..3], &[1024.0, 1.0, 0.0]);
        // Last block [3.0] alone: scale 2^-7, 3 exact.
        assert_eq!(y[3], 3.0);
        assert_eq!(act_quant_fp8(&x, 0), Err(QuantError::ZeroBlock));
        assert_eq!(act_quant_fp8(&[], 128).unwrap(), Vec::<f32>::new());
        let y = act_quant_fp8(&[f32::NAN, 1.0, f32::INFINITY, -2.0], 2).unwrap();
        assert!(y[0].is_nan());
        assert_eq!(y[1], 1.0, "NaN does not enter the block maximum");
        assert_eq!(y[2], f32::INFINITY);
        assert_eq!(
            y[3], 0.0,
            "a finite neighbour of inf vanishes under the 2^127 scale"
        );
        let z = vec![0.0f32; 128];
        assert_eq!(act_quant_fp8(&z, 128).unwrap(), z);
    }
}

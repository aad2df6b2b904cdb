// The number codecs of the kernels (namespace codec): bit-exact ports of dsv4_core::codec
// (bf16, e4m3, e2m1, ue8m0 scales and the quantizers' scale exponents) that linear.cu, rows.cu
// and cache.cu use.
#pragma once
#include "common.cuh"

namespace codec {

// 2^e for e in −126..=127 (normal range), from its bits.
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float((u32)(e + 127) << 23); }

__device__ __forceinline__ float nan_f32() { return __uint_as_float(0x7fc00000u); }

// ue8m0 code → 2^(b−127); 255 is NaN, 0 is the f32 subnormal 2^-127.
__device__ __forceinline__ float ue8m0_to_f32(u32 b) {
    if (b == 255u) return nan_f32();
    if (b == 0u) return __uint_as_float(0x00400000u);
    return __uint_as_float(b << 23);
}

// 2^e for e in −127..=127 (dsv4_core::quant::pow2_f32).
__device__ __forceinline__ float pow2_scale(int e) { return ue8m0_to_f32((u32)(e + 127)); }

__device__ __forceinline__ float bf16_to_f32(u32 b) { return __uint_as_float((b & 0xffffu) << 16); }

__device__ __forceinline__ u32 f32_to_bf16(float x) {
    const u32 bits = __float_as_uint(x);
    if (isnan(x)) return ((bits >> 16) | 0x40u) & 0xffffu;
    const u32 lsb = (bits >> 16) & 1u;
    return ((bits + 0x7fffu + lsb) >> 16) & 0xffffu;
}

// e4m3 code → f32, exactly: the magnitude bits placed in an f32 at exponent offset 120 (its
// subnormals become f32 subnormals), times 2^120; 0x7f/0xff are NaN.
__device__ __forceinline__ float e4m3_to_f32(u32 c) {
    const u32 mag = c & 0x7fu;
    float v = __uint_as_float(mag << 20) * __uint_as_float(0x7b800000u);
    if (mag == 0x7fu) v = nan_f32();
    return (c & 0x80u) ? -v : v;
}

// e2m1 code (low 4 bits) → f32 (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives), exactly.
__device__ __forceinline__ float e2m1_to_f32(u32 c) {
    const float v = __uint_as_float((c & 7u) << 22) * __uint_as_float(0x7e800000u);
    return (c & 8u) ? -v : v;
}

// Round-to-nearest-even of 0 ≤ q < 2^22 (the f32 addition of 2^23 rounds to an integer).
__device__ __forceinline__ u32 rne_small(float q) {
    return (u32)((q + 8388608.0f) - 8388608.0f);
}

// dsv4_core's encode_magnitude for a finite x ≥ 0 (the caller saturates); every step is exact
// in f32: scaling by powers of two, then one rounding to an integer.
__device__ __forceinline__ u32 encode_magnitude(float x, int man, int bias) {
    if (x == 0.0f) return 0u;
    const int emin = 1 - bias;
    const u32 biased = (__float_as_uint(x) >> 23) & 0xffu;
    if (biased == 0u) return 0u; // f32 subnormals are below every minifloat's half-ulp
    const int ex = (int)biased - 127;
    if (ex < emin) return rne_small(x * pow2f(man - emin));
    const u32 q = rne_small(x * pow2f(man - ex));
    return ((u32)(ex + bias) << man) + (q - (1u << man));
}

__device__ __forceinline__ u32 f32_to_e4m3(float x) {
    const u32 sign = (__float_as_uint(x) >> 24) & 0x80u;
    if (isnan(x)) return sign | 0x7fu;
    if (isinf(x)) return sign | 0x7eu;
    return sign | min(encode_magnitude(fabsf(x), 3, 7), 0x7eu);
}

__device__ __forceinline__ u32 f32_to_e2m1(float x) {
    if (isnan(x)) return 0u;
    const u32 sign = (__float_as_uint(x) >> 28) & 0x8u;
    if (isinf(x)) return sign | 7u;
    return sign | min(encode_magnitude(fabsf(x), 1, 1), 7u);
}

// ceil(log2 v) for a finite v > 0, exactly (dsv4_core's checked_pow2_ceil_exponent).
__device__ __forceinline__ int ceil_log2(double v) {
    const u64 bits = (u64)__double_as_longlong(v);
    int biased = (int)((bits >> 52) & 0x7ffu);
    u64 mant = bits & ((1ull << 52) - 1ull);
    if (biased == 0) {
        // f64 subnormal: mant·2^-1074.
        int hi = 63;
        while (((mant >> hi) & 1ull) == 0ull) hi--;
        const bool exact = (mant & (mant - 1ull)) == 0ull;
        return hi - 1074 + (exact ? 0 : 1);
    }
    return biased - 1023 + (mant == 0ull ? 0 : 1);
}

// dsv4_core::quant::pow2_scale_exponent: 2^e ≥ max(amax, floor)/qmax, the quotient in f32.
__device__ __forceinline__ int pow2_scale_exponent(float amax, float floor_, float qmax) {
    const float q = fmaxf(amax, floor_) / qmax;
    if (isinf(q)) return 127;
    if (!(q > 0.0f)) return -127;
    return max(-127, min(127, ceil_log2((double)q)));
}

// 6·f32::MIN_POSITIVE, the e2m1 block-maximum floor.
__device__ __forceinline__ float e2m1_floor() { return __uint_as_float(0x01c00000u); }

// Whether any lane's flag is set (every lane of the warp must call it).
__device__ __forceinline__ bool warp_any(bool flag) {
    u32 v = flag ? 1u : 0u;
    for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(0xffffffffu, v, o);
    return v != 0u;
}

} // namespace codec

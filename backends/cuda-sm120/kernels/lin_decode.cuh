// The weight side of the linear kernels (linear.cu, linear_mma.cu): a weight row's 16-byte
// chunks and their formats (f32, bf16, fp8 e4m3 with ue8m0 scales per 128×128 block, MXFP4
// e2m1 with ue8m0 scales per 32 of a row), their scale bytes, and the decoders that turn a
// chunk into the exact values of dsv4_kernels::Linear::dequantized: the general decode, the
// fast routes most chunks take (f32 and, with f64 sums, f64), and the input-row helpers.
#pragma once
#include "common.cuh"
#include "codec.cuh"

#define LIN_THREADS 128
#define LIN_WARPS (LIN_THREADS / DSV4_WARP)

// One 16-byte chunk of a weight row, and four floats of an input row.
struct alignas(16) lin_chunk {
    u32 w[4];
};
struct alignas(16) lin_f4 {
    float v[4];
};

// Weight formats (ops/linear.rs passes the matching kernel): elements per 16-byte chunk.
#define LIN_F32 0
#define LIN_BF16 1
#define LIN_FP8 2
#define LIN_MXFP4 3

template <int FMT> struct lin_fmt;
template <> struct lin_fmt<LIN_F32> { static const int E = 4; };
template <> struct lin_fmt<LIN_BF16> { static const int E = 8; };
template <> struct lin_fmt<LIN_FP8> { static const int E = 16; };
template <> struct lin_fmt<LIN_MXFP4> { static const int E = 32; };

// The scale byte of chunk `c` of output row `o` (fp8: its 128×128 block's; MXFP4: the chunk's
// own); 0 for f32 and bf16 weights, which have none.
template <int FMT>
__device__ __forceinline__ u32 lin_scale_byte(const u8* __restrict__ scale, u32 o, u32 c,
                                              u32 in_dim) {
    if constexpr (FMT == LIN_FP8) {
        return scale[(u64)(o / 128u) * ((in_dim + 127u) / 128u) + (c * 16u) / 128u];
    } else if constexpr (FMT == LIN_MXFP4) {
        return scale[(u64)o * (in_dim / 32u) + c];
    } else {
        return 0u;
    }
}

// ---- MXFP4 decode by table ----
//
// A chunk's 32 e2m1 codes share one scale 2^(sb − 127), so the chunk has only 8 weight
// magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6 times the scale), and each is exact in f32 and f64
// with its nonzero bits in the top 16 of the word (in f32 for 2 ≤ sb ≤ 252: normal and finite;
// in f64 for sb ≤ 252, where the f32 product code·scale of dsv4_kernels::Linear::dequantized is
// finite, subnormal or not). lin_e2m1_lut builds those 16-bit tops as two 8-byte tables (high
// and low bytes), and lin_e2m1_tops looks up four codes at a time with one byte permute per
// table, adds the signs with a third, and pairs the bytes with a fourth: about three integer
// instructions a weight and no multiplication, where decoding each code and multiplying by the
// scale took about six (sm_90 SASS of linear_mxfp4_g1, sass-fast-path.py).

// The two tables of a chunk's scale: high bytes of magnitudes 0..3 and 4..7, low bytes of 0..3
// and 4..7.
struct lin_lut {
    u32 hi0, hi1, lo0, lo1;
};

// The tables for scale byte sb, in f64 (F64) or f32 bit patterns. Magnitude m's top 16 bits are
// (sb << SH) + K[m]: the exponent field starts at bit 4 (f64) or 7 (f32) of them, and K holds
// the exponent offset and the one mantissa bit (1.5, 3, 6); magnitude 0 is 0.
template <bool F64>
__device__ __forceinline__ lin_lut lin_e2m1_lut(u32 sb) {
    // f64: 0.5·2^(sb−127) has exponent field sb − 128 + 1023 = sb + 895; f32: sb − 1.
    const u32 SH = F64 ? 4u : 7u;
    const i32 e0 = F64 ? 895 : -1;
    const u32 M = F64 ? 0x8u : 0x40u; // the mantissa's top bit
    const u32 k1 = (u32)(e0 << SH), k2 = (u32)((e0 + 1) << SH), k3 = k2 | M;
    const u32 k4 = (u32)((e0 + 2) << SH), k5 = k4 | M, k6 = (u32)((e0 + 3) << SH), k7 = k6 | M;
    const u32 rep = (1u << SH) * 0x10001u; // sb << SH in both halves
    const u32 p01 = (sb << (SH + 16u)) + (k1 << 16);
    const u32 p23 = sb * rep + ((k3 << 16) | (k2 & 0xffffu));
    const u32 p45 = sb * rep + ((k5 << 16) | (k4 & 0xffffu));
    const u32 p67 = sb * rep + ((k7 << 16) | (k6 & 0xffffu));
    lin_lut t;
    t.hi0 = prmt(p01, p23, 0x7531u);
    t.lo0 = prmt(p01, p23, 0x6420u);
    t.hi1 = prmt(p45, p67, 0x7531u);
    t.lo1 = prmt(p45, p67, 0x6420u);
    return t;
}

// Four words with byte k of `hi` in bits 31..24 and byte k of `lo` in bits 23..16 (k = 0..3),
// low halves zero: two byte permutes pair the bytes, two codes each, and a shift or a mask
// puts each pair's half on top.
__device__ __forceinline__ void lin_pair_tops(u32 lo, u32 hi, u32* top) {
    const u32 u01 = prmt(lo, hi, 0x5140u); // codes 1 : 0, 16 bits each
    const u32 u23 = prmt(lo, hi, 0x7362u); // codes 3 : 2
    top[0] = u01 << 16;
    top[1] = u01 & 0xffff0000u;
    top[2] = u23 << 16;
    top[3] = u23 & 0xffff0000u;
}

// The 8 weights of an MXFP4 word (code k in bits 4k..4k+3) as the top halves of f32 or
// f64-high words (low halves zero), from its chunk's tables.
__device__ __forceinline__ void lin_e2m1_word(u32 w, const lin_lut& t, u32* top) {
    const u32 mag = w & 0x77777777u; // the magnitudes as byte selectors
    const u32 w4 = w << 4;           // codes 0, 2, 4, 6 with their sign at a byte's bit 7
#pragma unroll
    for (int g = 0; g < 2; g++) {
        const u32 sel = g == 0 ? mag : mag >> 16;
        const u32 hi = prmt(t.hi0, t.hi1, sel);
        const u32 lo = prmt(t.lo0, t.lo1, sel);
        // Byte n: code 4g + n's sign bit copied into all 8 bits.
        const u32 sign = prmt(w4, w, g == 0 ? 0xd9c8u : 0xfbeau);
        lin_pair_tops(lo, hi | (sign & 0x80808080u), top + 4 * g);
    }
}

// The 32 weights of an MXFP4 chunk, as lin_e2m1_word gives them, in element order.
__device__ __forceinline__ void lin_e2m1_tops(const lin_chunk& ch, const lin_lut& t, u32* top) {
#pragma unroll
    for (int q = 0; q < 4; q++) lin_e2m1_word(ch.w[q], t, top + 8 * q);
}

// The 4 codes of an fp8 word (code k in byte k) as f64-high words: sign at bit 31, the 7
// magnitude bits at 23..17 (2^-1016 times the e4m3 value, a subnormal f64 for the small codes),
// low 16 bits zero.
__device__ __forceinline__ void lin_e4m3_tops64(u32 w, u32* top) {
    lin_pair_tops((w & 0x7f7f7f7fu) << 1, w & 0x80808080u, top);
}

// The 4 codes of an fp8 word as f32 bit patterns: sign at bit 31, the 7 magnitude bits at
// 26..20 (2^-120 times the e4m3 value, an f32 subnormal for the small codes). The magnitude
// straddles bytes 3 and 2, so its high 3 bits go with the sign and its low 4 in their own byte.
__device__ __forceinline__ void lin_e4m3_tops32(u32 w, u32* top) {
    lin_pair_tops((w << 4) & 0xf0f0f0f0u, (w & 0x80808080u) | ((w >> 4) & 0x07070707u), top);
}

// Whether an fp8 chunk has a NaN code (0x7f or 0xff): a byte's low 7 bits plus one carry into
// its bit 7 exactly then.
__device__ __forceinline__ bool lin_e4m3_has_nan(const lin_chunk& ch) {
    u32 nan = 0u;
#pragma unroll
    for (int q = 0; q < 4; q++) nan |= ((ch.w[q] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
    return nan != 0u;
}

// Decode a chunk with scale byte `sb` (lin_scale_byte) into E f32 weights by the fast route
// its format has for most chunks; false (w untouched) when the chunk needs lin_decode's general
// one: fp8 chunks with a NaN code or a scale byte above 134, MXFP4 chunks with a scale byte
// outside 2..=252. The values are dsv4_kernels::Linear::dequantized's, exactly.
template <int FMT>
__device__ __forceinline__ bool lin_decode_fast(const lin_chunk& ch, u32 sb, float* w) {
    if constexpr (FMT == LIN_F32) {
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] = __uint_as_float(ch.w[k]);
        return true;
    } else if constexpr (FMT == LIN_BF16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[2 * k] = codec::bf16_to_f32(ch.w[k]);
            w[2 * k + 1] = codec::bf16_to_f32(ch.w[k] >> 16);
        }
        return true;
    } else if constexpr (FMT == LIN_FP8) {
        if (sb > 134u || lin_e4m3_has_nan(ch)) return false;
        // The code's bits seeeemmm placed at f32 bits 31 and 26..20 (2^-120 times its value, an
        // f32 subnormal for the small codes) times 2^120·scale = 2^(sb − 7), one f32
        // multiplication: the exact product code·scale (see lin_decode64 below), so the same
        // bits as the general decode's two multiplications, with two fewer instructions per
        // weight and the NaN test once per chunk.
        const float f = __uint_as_float((sb + 120u) << 23);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            u32 top[4];
            lin_e4m3_tops32(ch.w[q], top);
#pragma unroll
            for (int k = 0; k < 4; k++) w[4 * q + k] = __uint_as_float(top[k]) * f;
        }
        return true;
    } else {
        if (sb < 2u || sb > 252u) return false;
        u32 top[32];
        lin_e2m1_tops(ch, lin_e2m1_lut<false>(sb), top);
#pragma unroll
        for (int k = 0; k < 32; k++) w[k] = __uint_as_float(top[k]);
        return true;
    }
}

// Decode a chunk with scale byte `sb` into E f32 weights, whatever its codes and scale: the
// fast route where it applies, else each code decoded and multiplied by the scale (NaN codes
// and scales, overflowing and subnormal products as the reference has them).
template <int FMT>
__device__ __forceinline__ void lin_decode(const lin_chunk& ch, u32 sb, float* w) {
    if (lin_decode_fast<FMT>(ch, sb, w)) return;
    if constexpr (FMT == LIN_FP8) {
        const float s = codec::ue8m0_to_f32(sb);
#pragma unroll
        for (int k = 0; k < 16; k++) {
            w[k] = codec::e4m3_to_f32((ch.w[k / 4] >> (8 * (k % 4))) & 0xffu) * s;
        }
    } else if constexpr (FMT == LIN_MXFP4) {
        const float s = codec::ue8m0_to_f32(sb);
#pragma unroll
        for (int k = 0; k < 32; k++) {
            w[k] = codec::e2m1_to_f32((ch.w[k / 8] >> (4 * (k % 8))) & 0xfu) * s;
        }
    }
}

// E input values at xr (16-byte aligned: the host pads input rows to the weight's pitch).
template <int E>
__device__ __forceinline__ void lin_load_x(const float* __restrict__ xr, float* xv) {
    const lin_f4* p = reinterpret_cast<const lin_f4*>(xr);
#pragma unroll
    for (int q = 0; q < E / 4; q++) {
        const lin_f4 f = p[q];
#pragma unroll
        for (int k = 0; k < 4; k++) xv[4 * q + k] = f.v[k];
    }
}

// acc + w·x for a weight w and an input x (f32 values, given as acc_t), rounded once: every
// linear kernel adds its products with this one fused multiply-add. With f64 sums the product
// is exact, so it is the reference's acc + w·x in one FP64 instruction; with f32 sums it is one
// FFMA where a multiply and an add were two, and it depends only on the exact product, so the
// fast decodes' rescaled operands (fp8 codes against x·2^k·scale) give the general decode's
// bits.
__device__ __forceinline__ acc_t lin_mac(acc_t w, acc_t x, acc_t acc) {
#ifdef DSV4_ACC_F64
    return fma(w, x, acc);
#else
    return fmaf(w, x, acc);
#endif
}

// acc += Σ_k w[k]·x[k] over the chunk's first `lim` elements, in element order (lin_mac).
template <int E>
__device__ __forceinline__ void lin_dot(acc_t& acc, const float* w, const float* xv, u32 lim) {
    if (lim == (u32)E) {
#pragma unroll
        for (int k = 0; k < E; k++) acc = lin_mac((acc_t)w[k], (acc_t)xv[k], acc);
    } else {
        // The row's last, partial chunk: the zero padding past in_dim is skipped.
#pragma unroll
        for (int k = 0; k < E; k++) {
            if ((u32)k < lim) acc = lin_mac((acc_t)w[k], (acc_t)xv[k], acc);
        }
    }
}

#ifdef DSV4_ACC_F64
// ---- f64 accumulation without f32→f64 conversions of the weights ----
//
// The decode GEMV adds exact f32 products in f64. Converting each decoded f32 weight to f64
// costs an F2F instruction, which runs at 16 results per clock per multiprocessor on sm_80 and
// sm_90, a quarter of the FP64 rate (CUDA C++ Programming Guide, "Arithmetic Instructions"
// throughput table): for fp8 and MXFP4 weights on an H200 that, not memory, would bound the
// GEMV. So fp8 codes are decoded straight into f64 by placing their bits in an f64 (a
// subnormal f64 for the small codes) and one multiplication by 2^k·scale, and MXFP4 codes by
// table (lin_e2m1_tops, with the scale in the table). Either equals the f32 product code·scale
// of dsv4_kernels::Linear::dequantized, which is exact: codes are multiples of 2^-9 (e4m3) or
// 1/2 (e2m1) with at most 4 significant bits, scales are powers of two from 2^-127, so every
// product is a multiple of 2^-149 (an f32, subnormal or not) and, for the scale bytes taken,
// finite. The fp8 factor 2^k·scale must fit an f64: scale bytes up to 134 (2^1016·2^7); MXFP4
// takes scale bytes up to 252 (above, 4·scale leaves f32). Chunks with a larger scale or a NaN
// code take the f32 decode. The products w·x of two f32 values are exact in f64, so fma(w, x, acc)
// rounds once exactly as acc + w·x does: the sums are bitwise the reference's either way.

// 2^e as an f64 (e in −1022..=1023).
__device__ __forceinline__ double lin_pow2_f64(int e) { return __hiloint2double((e + 1023) << 20, 0); }

// Decode a chunk with scale byte `sb` into E f64 weights when its codes and scale allow (see
// above; MXFP4 through lin_e2m1_tops, for scale bytes up to 252); false (w untouched) when it
// must take the f32 decode. f32 and bf16 chunks: their f32 values, converted.
template <int FMT>
__device__ __forceinline__ bool lin_decode64(const lin_chunk& ch, u32 sb, double* w) {
    if constexpr (FMT == LIN_FP8) {
        if (sb > 134u || lin_e4m3_has_nan(ch)) return false;
        // Each code times 2^1016·scale.
        const double f = lin_pow2_f64((int)sb - 127 + 1016);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            u32 top[4];
            lin_e4m3_tops64(ch.w[q], top);
#pragma unroll
            for (int k = 0; k < 4; k++) w[4 * q + k] = __hiloint2double((int)top[k], 0) * f;
        }
        return true;
    } else if constexpr (FMT == LIN_MXFP4) {
        if (sb > 252u) return false;
        u32 top[32];
        lin_e2m1_tops(ch, lin_e2m1_lut<true>(sb), top);
#pragma unroll
        for (int k = 0; k < 32; k++) w[k] = __hiloint2double((int)top[k], 0);
        return true;
    } else {
        // f32 and bf16 weights: their f32 values, converted.
        float w32[lin_fmt<FMT>::E];
        lin_decode_fast<FMT>(ch, sb, w32);
#pragma unroll
        for (int k = 0; k < lin_fmt<FMT>::E; k++) w[k] = (double)w32[k];
        return true;
    }
}

// acc += Σ_k w_k·x_k over the chunk's first `lim` elements, in element order, w given in f64
// and the E floats of x read 4 at a time from xr (16-byte aligned), each converted once.
template <int E>
__device__ __forceinline__ void lin_dot64(double& acc, const double* wd,
                                          const float* __restrict__ xr, u32 lim) {
    const lin_f4* p = reinterpret_cast<const lin_f4*>(xr);
    if (lim == (u32)E) {
#pragma unroll
        for (int q = 0; q < E / 4; q++) {
            const lin_f4 f = p[q];
#pragma unroll
            for (int k = 0; k < 4; k++) acc = lin_mac(wd[4 * q + k], (double)f.v[k], acc);
        }
    } else {
#pragma unroll
        for (int q = 0; q < E / 4; q++) {
            const lin_f4 f = p[q];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if ((u32)(4 * q + k) < lim) acc = lin_mac(wd[4 * q + k], (double)f.v[k], acc);
            }
        }
    }
}

#endif

// The fast route of one chunk and column of the staged decode kernels (fp8, MXFP4), a word (EW
// elements) at a time: `prep` once per chunk (ok: whether the chunk can take it), then `word`
// gives word q's weights in acc_t, the values lin_decode64 / lin_decode_fast give.
template <int FMT> struct lin_fast;

template <> struct lin_fast<LIN_FP8> {
    static const int EW = 4;
    bool ok;
    // The scale is in the staged inputs (lin_stage_fp8, linear.cu): `word` gives the codes
    // placed in acc_t unscaled, 2^-1016 (f64) or 2^-120 (f32) times their value, whose products
    // with x·2^1016·scale or x·2^120·scale are exactly code·scale·x.
    __device__ __forceinline__ void prep(const lin_chunk& ch, u32) { ok = !lin_e4m3_has_nan(ch); }
    __device__ __forceinline__ void word(u32 w, acc_t* out) const {
        u32 top[4];
#ifdef DSV4_ACC_F64
        lin_e4m3_tops64(w, top);
#pragma unroll
        for (int k = 0; k < 4; k++) out[k] = __hiloint2double((int)top[k], 0);
#else
        lin_e4m3_tops32(w, top);
#pragma unroll
        for (int k = 0; k < 4; k++) out[k] = __uint_as_float(top[k]);
#endif
    }
};

template <> struct lin_fast<LIN_MXFP4> {
    static const int EW = 8;
    bool ok;
    lin_lut t;
    __device__ __forceinline__ void prep(const lin_chunk&, u32 sb) {
#ifdef DSV4_ACC_F64
        ok = sb <= 252u;
        t = lin_e2m1_lut<true>(sb);
#else
        ok = sb >= 2u && sb <= 252u;
        t = lin_e2m1_lut<false>(sb);
#endif
    }
    __device__ __forceinline__ void word(u32 w, acc_t* out) const {
        u32 top[8];
        lin_e2m1_word(w, t, top);
#pragma unroll
        for (int k = 0; k < 8; k++) {
#ifdef DSV4_ACC_F64
            out[k] = __hiloint2double((int)top[k], 0);
#else
            out[k] = __uint_as_float(top[k]);
#endif
        }
    }
};

// acc plus a chunk's dot product with the E inputs at xc (its first `lim` elements, in order),
// whatever its codes and scale.
template <int FMT>
__device__ __forceinline__ acc_t lin_chunk_dot_any(acc_t acc, const lin_chunk& ch, u32 sb,
                                                   const float* xc, u32 lim) {
    const int E = lin_fmt<FMT>::E;
    float w[E], xv[E];
    lin_decode<FMT>(ch, sb, w);
    lin_load_x<E>(xc, xv);
    lin_dot<E>(acc, w, xv, lim);
    return acc;
}

// acc plus a chunk's dot product with the E inputs at xc (its first `lim` elements, in order),
// for the chunks the decode kernels' fast routes leave (lin_decode_fast, lin_decode64): rare, so
// kept out of line, away from the fast loop's registers and instruction cache.
template <int FMT>
__device__ __noinline__ acc_t lin_chunk_dot_general(acc_t acc, lin_chunk ch, u32 sb,
                                                    const float* xc, u32 lim) {
    return lin_chunk_dot_any<FMT>(acc, ch, sb, xc, lim);
}

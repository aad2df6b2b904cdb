// linear: out[r, o] = Σ_i W[o, i]·x[r, i] with W resident in its stored format (f32, bf16,
// fp8 e4m3 with ue8m0 scales per 128×128 block, MXFP4 e2m1 with ue8m0 scales per 32 of a row)
// and decoded in registers. Also the number codecs (namespace codec) that rows.cu and cache.cu
// use: bit-exact ports of dsv4_core::codec (this file comes first in the translation unit).
//
// Launch (ops/linear.rs): block LIN_THREADS = 128 threads (4 warps). Each weight row is stored
// with a pitch that is a multiple of 16 bytes (the host pads odd widths with zeros, and input
// rows to the same number of elements); lane l reads the 16-byte chunks l, l + 32, … of a row
// (coalesced, one 128-bit load per chunk) and decodes them in registers. Decode (`_r1`): a warp
// computes lin_r1<FMT>::COLS (2 for fp8, else 4) output columns, loading each input chunk once for all
// of them and each lane's next weight chunks before it uses the current ones; grid
// (ceil(out / (4 · COLS)), 1).
// Prefill (`_r8`): a warp computes one column for up to 8 rows, so each weight is read once per
// 8 rows; grid (ceil(out / 4), ceil(rows / 8)). With f64 sums both decode fp8 and MXFP4 weights
// straight into f64 (lin_decode64, below). A (row, column) sum is: per lane, chunks in
// order and elements in order, in acc_t; then warp_sum. That order does not depend on the
// variant or on how many rows the call has (batch invariance).
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

// ---- linear ----

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

// Decode chunk `c` of output row `o` into E f32 weights (the exact values of
// dsv4_kernels::Linear::dequantized: the same f32 multiplication by the scale).
template <int FMT>
__device__ __forceinline__ void lin_decode(const lin_chunk& ch, const u8* __restrict__ scale,
                                           u32 o, u32 c, u32 in_dim, float* w) {
    if constexpr (FMT == LIN_F32) {
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] = __uint_as_float(ch.w[k]);
    } else if constexpr (FMT == LIN_BF16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[2 * k] = codec::bf16_to_f32(ch.w[k]);
            w[2 * k + 1] = codec::bf16_to_f32(ch.w[k] >> 16);
        }
    } else if constexpr (FMT == LIN_FP8) {
        const u32 sc_row = (in_dim + 127u) / 128u;
        const u32 sb = scale[(u64)(o / 128u) * sc_row + (c * 16u) / 128u];
        // A byte of 0x7f/0xff (NaN) in a word: its low 7 bits plus one carry into bit 7.
        u32 nan = 0u;
#pragma unroll
        for (int q = 0; q < 4; q++) nan |= ((ch.w[q] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
        if (sb <= 134u && nan == 0u) {
            // The code's bits seeeemmm placed at f32 bits 31 and 26..20 (2^-120 times its value,
            // an f32 subnormal for the small codes) times 2^120·scale = 2^(sb − 7), one f32
            // multiplication: the exact product code·scale (see lin_decode64 below), so the
            // same bits as the two multiplications of the general case, with two fewer
            // instructions per weight and the NaN test once per chunk.
            const float f = __uint_as_float((sb + 120u) << 23);
#pragma unroll
            for (int k = 0; k < 16; k++) {
                const u32 b = (ch.w[k / 4] >> (8 * (k % 4))) & 0xffu;
                w[k] = __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * f;
            }
        } else {
            const float s = codec::ue8m0_to_f32(sb);
#pragma unroll
            for (int k = 0; k < 16; k++) {
                w[k] = codec::e4m3_to_f32((ch.w[k / 4] >> (8 * (k % 4))) & 0xffu) * s;
            }
        }
    } else {
        const float s = codec::ue8m0_to_f32(scale[(u64)o * (in_dim / 32u) + c]);
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

// acc += Σ_k w[k]·x[k] over the chunk's first `lim` elements, in element order.
template <int E>
__device__ __forceinline__ void lin_dot(acc_t& acc, const float* w, const float* xv, u32 lim) {
    if (lim == (u32)E) {
#pragma unroll
        for (int k = 0; k < E; k++) acc += (acc_t)w[k] * (acc_t)xv[k];
    } else {
        // The row's last, partial chunk: the zero padding past in_dim is skipped.
#pragma unroll
        for (int k = 0; k < E; k++) {
            if ((u32)k < lim) acc += (acc_t)w[k] * (acc_t)xv[k];
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
// GEMV. So fp8 and MXFP4 codes are decoded straight into f64 by placing their bits in an f64
// (a subnormal f64 for the small codes) and one multiplication by 2^k·scale. That equals the
// f32 product code·scale of dsv4_kernels::Linear::dequantized, which is exact: codes are
// multiples of 2^-9 (e4m3) or 1/2 (e2m1) with at most 4 significant bits, scales are powers of
// two from 2^-127, so every product is a multiple of 2^-149 (an f32, subnormal or not) and,
// for the scale bytes taken, finite. The factor 2^k·scale must fit an f64: scale bytes up to
// 134 (fp8: 2^1016·2^7) and 128 (MXFP4: 2^1022·2^1); chunks with a larger scale or a NaN code
// take the f32 decode. The products w·x of two f32 values are exact in f64, so fma(w, x, acc)
// rounds once exactly as acc + w·x does: the sums are bitwise the reference's either way.

// 2^e as an f64 (e in −1022..=1023).
__device__ __forceinline__ double lin_pow2_f64(int e) { return __hiloint2double((e + 1023) << 20, 0); }

// Decode one fp8/MXFP4 chunk of output row `o` into E f64 weights when the scale allows (see
// above); false (w untouched) when the chunk must take the f32 decode, always for f32/bf16.
template <int FMT>
__device__ __forceinline__ bool lin_decode64(const lin_chunk& ch, const u8* __restrict__ scale,
                                             u32 o, u32 c, u32 in_dim, double* w) {
    if constexpr (FMT == LIN_FP8) {
        const u32 sc_row = (in_dim + 127u) / 128u;
        const int sb = scale[(u64)(o / 128u) * sc_row + (c * 16u) / 128u];
        // A byte of 0x7f/0xff (NaN) in a word: its low 7 bits plus one carry into bit 7.
        u32 nan = 0u;
#pragma unroll
        for (int q = 0; q < 4; q++) nan |= ((ch.w[q] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
        if (sb > 134 || nan != 0u) return false;
        // Code bits seeeemmm at f64 bits 63 and 55..49: 2^-1016 times the e4m3 value.
        const double f = lin_pow2_f64(sb - 127 + 1016);
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const u32 b = (ch.w[k / 4] >> (8 * (k % 4))) & 0xffu;
            w[k] = __hiloint2double((int)(((b & 0x80u) << 24) | ((b & 0x7fu) << 17)), 0) * f;
        }
        return true;
    } else if constexpr (FMT == LIN_MXFP4) {
        const int sb = scale[(u64)o * (in_dim / 32u) + c];
        if (sb > 128) return false;
        // Code bits seem at f64 bits 63 and 53..51: 2^-1022 times the e2m1 value.
        const double f = lin_pow2_f64(sb - 127 + 1022);
#pragma unroll
        for (int k = 0; k < 32; k++) {
            const u32 n = (ch.w[k / 8] >> (4 * (k % 8))) & 0xfu;
            w[k] = __hiloint2double((int)(((n & 8u) << 28) | ((n & 7u) << 19)), 0) * f;
        }
        return true;
    } else {
        return false;
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
            for (int k = 0; k < 4; k++) acc = fma(wd[4 * q + k], (double)f.v[k], acc);
        }
    } else {
#pragma unroll
        for (int q = 0; q < E / 4; q++) {
            const lin_f4 f = p[q];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if ((u32)(4 * q + k) < lim) acc = fma(wd[4 * q + k], (double)f.v[k], acc);
            }
        }
    }
}

// acc += Σ_k w_k·x_k over the chunk's first `lim` elements, in element order, x given in f64:
// the chunk's weights decoded in f64 when lin_decode64 allows, else in f32 and converted (every
// format's decode GEMV with f64 sums goes through here, so x is converted once per chunk).
template <int FMT>
__device__ __forceinline__ void lin_chunk_dot64(double& acc, const lin_chunk& ch,
                                                const u8* __restrict__ scale, u32 o, u32 c,
                                                u32 in_dim, const double* xd, u32 lim) {
    const int E = lin_fmt<FMT>::E;
    double wd[E];
    if (lin_decode64<FMT>(ch, scale, o, c, in_dim, wd)) {
#pragma unroll
        for (int k = 0; k < E; k++) {
            if ((u32)k < lim) acc = fma(wd[k], xd[k], acc);
        }
    } else {
        float w[E];
        lin_decode<FMT>(ch, scale, o, c, in_dim, w);
#pragma unroll
        for (int k = 0; k < E; k++) {
            if ((u32)k < lim) acc = fma((double)w[k], xd[k], acc);
        }
    }
}
#endif

// One warp computes COLS consecutive output columns for ROWS consecutive rows from row r0. Every (row,
// column) sum has the same order whatever ROWS, COLS and the row count are: lane l adds chunks
// l, l + 32, … in order, each chunk's elements in order; then warp_sum.
template <int FMT, int ROWS, int COLS>
__device__ __forceinline__ void linear_impl(const u8* __restrict__ wdata,
                                            const u8* __restrict__ scale,
                                            const float* __restrict__ x, float* __restrict__ out,
                                            u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch,
                                            u32 rows, u32 r0) {
    const int E = lin_fmt<FMT>::E;
    const u32 lane = threadIdx.x % DSV4_WARP;
    const u32 o0 = (blockIdx.x * LIN_WARPS + threadIdx.x / DSV4_WARP) * COLS;
    // Whole warps leave together; the kernel has no __syncthreads.
    if (o0 >= out_dim || r0 >= rows) return;
    const u32 nr = min((u32)ROWS, rows - r0);
    const u32 nc = min((u32)COLS, out_dim - o0);
    acc_t acc[ROWS][COLS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
#pragma unroll
        for (int j = 0; j < COLS; j++) acc[r][j] = (acc_t)0;
    }
    const u32 nchunks = pitch / 16u;
    const float* xr0 = x + (u64)r0 * xpitch;
    if constexpr (ROWS == 1) {
        // Decode: each input chunk is loaded once and used for COLS weight rows, and the
        // weight chunks of the lane's next chunk are loaded before this one's are used, so two
        // rounds of weight loads are in flight per warp (memory-bound: the loads must overlap).
        lin_chunk cur[COLS] = {}, next[COLS] = {};
#pragma unroll
        for (int j = 0; j < COLS; j++) {
            if ((u32)j < nc && lane < nchunks)
                cur[j] = reinterpret_cast<const lin_chunk*>(wdata + (u64)(o0 + j) * pitch)[lane];
        }
        for (u32 c = lane; c < nchunks; c += DSV4_WARP) {
            const u32 i0 = c * (u32)E;
            const u32 lim = min((u32)E, in_dim - i0);
            const u32 cn = c + DSV4_WARP;
#pragma unroll
            for (int j = 0; j < COLS; j++) {
                if ((u32)j < nc && cn < nchunks)
                    next[j] = reinterpret_cast<const lin_chunk*>(wdata + (u64)(o0 + j) * pitch)[cn];
            }
            float xv[E];
            lin_load_x<E>(xr0 + i0, xv);
#ifdef DSV4_ACC_F64
            // x in f64 once per chunk, for all COLS columns.
            double xd[E];
#pragma unroll
            for (int k = 0; k < E; k++) xd[k] = (double)xv[k];
#pragma unroll
            for (int j = 0; j < COLS; j++) {
                if ((u32)j < nc)
                    lin_chunk_dot64<FMT>(acc[0][j], cur[j], scale, o0 + j, c, in_dim, xd, lim);
            }
#else
#pragma unroll
            for (int j = 0; j < COLS; j++) {
                if ((u32)j < nc) {
                    float w[E];
                    lin_decode<FMT>(cur[j], scale, o0 + j, c, in_dim, w);
                    lin_dot<E>(acc[0][j], w, xv, lim);
                }
            }
#endif
#pragma unroll
            for (int j = 0; j < COLS; j++) cur[j] = next[j];
        }
    } else {
        for (u32 c = lane; c < nchunks; c += DSV4_WARP) {
            const u32 i0 = c * (u32)E;
            const u32 lim = min((u32)E, in_dim - i0);
            // Batched: each decoded weight chunk is used for up to ROWS input rows.
#pragma unroll
            for (int j = 0; j < COLS; j++) {
                if ((u32)j < nc) {
                    const u32 o = o0 + (u32)j;
                    const lin_chunk ch =
                        reinterpret_cast<const lin_chunk*>(wdata + (u64)o * pitch)[c];
#ifdef DSV4_ACC_F64
                    // Weights in f64 once for all rows (fp8/MXFP4 decoded straight into f64
                    // where the scale allows, else via f32); each x converted once.
                    double wd[E];
                    if (!lin_decode64<FMT>(ch, scale, o, c, in_dim, wd)) {
                        float w[E];
                        lin_decode<FMT>(ch, scale, o, c, in_dim, w);
#pragma unroll
                        for (int k = 0; k < E; k++) wd[k] = (double)w[k];
                    }
#pragma unroll
                    for (int r = 0; r < ROWS; r++) {
                        if ((u32)r < nr)
                            lin_dot64<E>(acc[r][j], wd, xr0 + (u64)r * xpitch + i0, lim);
                    }
#else
                    float w[E];
                    lin_decode<FMT>(ch, scale, o, c, in_dim, w);
#pragma unroll
                    for (int r = 0; r < ROWS; r++) {
                        if ((u32)r < nr) {
                            float xv[E];
                            lin_load_x<E>(xr0 + (u64)r * xpitch + i0, xv);
                            lin_dot<E>(acc[r][j], w, xv, lim);
                        }
                    }
#endif
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
#pragma unroll
        for (int j = 0; j < COLS; j++) {
            if ((u32)r < nr && (u32)j < nc) { // the same on every lane: no divergent shuffle
                const acc_t s = warp_sum(acc[r][j]);
                if (lane == 0u) out[(u64)(r0 + r) * out_dim + o0 + j] = (float)s;
            }
        }
    }
}

// Output columns one warp of the decode kernels (_r1, _g1) computes, per format (ops/linear.rs
// `r1_cols` mirrors this table). Fewer columns per warp mean more warps for the same output: on
// an H200 (docs/performance.md, 2026-12-04) the 4-column fp8 warps left one or two warps per
// scheduler, and 2 columns ran the fp8 decode GEMVs up to 1.5x faster (f32 sums: with the
// one-multiply decode above, up to 1.6x). MXFP4's grouped expert GEMV, the one the model runs,
// was fastest with 4 (1 took it from 42 to 64 us with f64 sums), as were bf16 weights. A
// column's sum has the same order whatever the count (linear_impl).
template <int FMT> struct lin_r1 {
    static const int COLS = FMT == LIN_FP8 ? 2 : 4;
};

// Decode variants (one row; lin_r1<FMT>::COLS columns per warp share each input chunk) and
// batched variants (up to 8 rows per weight pass; one column per warp) of each format; a row
// gets the same bits from either. Parameters: weight bytes (out_dim rows of `pitch` bytes),
// scale bytes, x [rows, xpitch], out [rows, out_dim], out_dim, in_dim, pitch, xpitch, rows.
// Grid: (ceil(out_dim / (4 · COLS)), ceil(rows / ROWS)), block LIN_THREADS.
extern "C" __global__ void linear_f32_r1(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                      const float* __restrict__ x, float* __restrict__ out,
                                      u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_impl<LIN_F32, 1, lin_r1<LIN_F32>::COLS>(wdata, scale, x, out, out_dim, in_dim,
                                                   pitch, xpitch, rows, blockIdx.y * 1u);
}
extern "C" __global__ void linear_f32_r8(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                      const float* __restrict__ x, float* __restrict__ out,
                                      u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_impl<LIN_F32, 8, 1>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                                  blockIdx.y * 8u);
}
extern "C" __global__ void linear_bf16_r1(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                      const float* __restrict__ x, float* __restrict__ out,
                                      u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_impl<LIN_BF16, 1, lin_r1<LIN_BF16>::COLS>(wdata, scale, x, out, out_dim, in_dim,
                                                     pitch, xpitch, rows, blockIdx.y * 1u);
}
extern "C" __global__ void linear_bf16_r8(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                      const float* __restrict__ x, float* __restrict__ out,
                                      u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_impl<LIN_BF16, 8, 1>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                                  blockIdx.y * 8u);
}
extern "C" __global__ void linear_fp8_r1(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                      const float* __restrict__ x, float* __restrict__ out,
                                      u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_impl<LIN_FP8, 1, lin_r1<LIN_FP8>::COLS>(wdata, scale, x, out, out_dim, in_dim,
                                                   pitch, xpitch, rows, blockIdx.y * 1u);
}
extern "C" __global__ void linear_fp8_r8(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                      const float* __restrict__ x, float* __restrict__ out,
                                      u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_impl<LIN_FP8, 8, 1>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                                  blockIdx.y * 8u);
}
extern "C" __global__ void linear_mxfp4_r1(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                      const float* __restrict__ x, float* __restrict__ out,
                                      u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_impl<LIN_MXFP4, 1, lin_r1<LIN_MXFP4>::COLS>(wdata, scale, x, out, out_dim, in_dim,
                                                       pitch, xpitch, rows, blockIdx.y * 1u);
}
extern "C" __global__ void linear_mxfp4_r8(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                      const float* __restrict__ x, float* __restrict__ out,
                                      u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_impl<LIN_MXFP4, 8, 1>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                                  blockIdx.y * 8u);
}

// Grouped variants (DeviceOps::grouped_linear: a layer's routed experts in one launch): block
// row y runs the r1 / r8 computation above for the weight and rows of entry y of `table`, so
// each row gets the same bits as from a plain launch of its weight. Entries (lin_group, 24
// bytes, in the parameter arena): weight bytes, scale bytes, first row, rows (1 for _g1, at
// most 8 for _g8). Every weight has the same out_dim, in_dim and pitch. Grid: (ceil(out_dim /
// (4 · COLS)), entries), block LIN_THREADS.
struct lin_group {
    const u8* wdata;
    const u8* scale;
    u32 row0;
    u32 rows;
};

template <int FMT, int ROWS, int COLS>
__device__ __forceinline__ void linear_grouped(const lin_group* __restrict__ table,
                                               const float* __restrict__ x,
                                               float* __restrict__ out, u32 out_dim, u32 in_dim,
                                               u32 pitch, u32 xpitch) {
    const lin_group g = table[blockIdx.y];
    linear_impl<FMT, ROWS, COLS>(g.wdata, g.scale, x + (u64)g.row0 * xpitch,
                                 out + (u64)g.row0 * out_dim, out_dim, in_dim, pitch, xpitch,
                                 g.rows, 0u);
}

extern "C" __global__ void linear_f32_g1(const lin_group* __restrict__ table,
                                    const float* __restrict__ x, float* __restrict__ out,
                                    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_grouped<LIN_F32, 1, lin_r1<LIN_F32>::COLS>(table, x, out, out_dim, in_dim,
                                                      pitch, xpitch);
}
extern "C" __global__ void linear_f32_g8(const lin_group* __restrict__ table,
                                    const float* __restrict__ x, float* __restrict__ out,
                                    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_grouped<LIN_F32, 8, 1>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_bf16_g1(const lin_group* __restrict__ table,
                                    const float* __restrict__ x, float* __restrict__ out,
                                    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_grouped<LIN_BF16, 1, lin_r1<LIN_BF16>::COLS>(table, x, out, out_dim, in_dim,
                                                        pitch, xpitch);
}
extern "C" __global__ void linear_bf16_g8(const lin_group* __restrict__ table,
                                    const float* __restrict__ x, float* __restrict__ out,
                                    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_grouped<LIN_BF16, 8, 1>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_fp8_g1(const lin_group* __restrict__ table,
                                    const float* __restrict__ x, float* __restrict__ out,
                                    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_grouped<LIN_FP8, 1, lin_r1<LIN_FP8>::COLS>(table, x, out, out_dim, in_dim,
                                                      pitch, xpitch);
}
extern "C" __global__ void linear_fp8_g8(const lin_group* __restrict__ table,
                                    const float* __restrict__ x, float* __restrict__ out,
                                    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_grouped<LIN_FP8, 8, 1>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_mxfp4_g1(const lin_group* __restrict__ table,
                                    const float* __restrict__ x, float* __restrict__ out,
                                    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_grouped<LIN_MXFP4, 1, lin_r1<LIN_MXFP4>::COLS>(table, x, out, out_dim, in_dim,
                                                          pitch, xpitch);
}
extern "C" __global__ void linear_mxfp4_g8(const lin_group* __restrict__ table,
                                    const float* __restrict__ x, float* __restrict__ out,
                                    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_grouped<LIN_MXFP4, 8, 1>(table, x, out, out_dim, in_dim, pitch, xpitch);
}

#include "common.cuh"
#include "lin_decode.cuh"
// Tensor-core linear (DSV4_CUDA_LINEAR=mma): out[r, o] = Σ_i W[o, i]·x[r, i] on mma.sync
// m16n8k16 bf16 tiles with f32 accumulators (sm_80+), for bf16, fp8 and MXFP4 weights (f32
// weights keep the SIMT kernels of linear.cu, which comes first in the translation unit).
//
// Exact operands. Every bf16 weight, e4m3 code and decoded MXFP4 weight (e2m1·2^k) is a bf16
// value, so the A fragments carry the weights exactly (fp8 spans multiply their sums by the
// block scale, lmma_decode). Activations are f32: each x is split into three bf16
// parts x = hi + mid + lo (truncations; each difference is exact and the last part has at
// most 8 significant bits), and every tile runs three mma, one per part. A bf16·bf16 product
// is exact in f32, so the only roundings are the tensor core's f32 additions: the sums have
// f32-sum accuracy (within the diff harness's f32 tolerances), no activation is rounded, and
// this path serves every numerics setting the SIMT f32 sums do.
//
// Layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"): M = 16
// output columns (weight rows), N = 8 rows (tokens), K = 16. Lane (g = lane / 4, t = lane % 4)
// holds A rows g and g + 8 at k ∈ {2t, 2t+1, 2t+8, 2t+9}, B column g at the same k, and D at
// rows g, g + 8, columns 2t, 2t + 1. Which physical input index a tile's k stands for is free
// as long as A and B agree: lane t takes 16-byte weight chunk c = 4·s + t of span s (chunks
// are E elements, lin_fmt), and tile j of the chunk maps k {2t, 2t+1, 2t+8, 2t+9} to elements
// c·E + 4j + {0, 1, 2, 3}. So each lane loads whole 16-byte weight chunks of rows g and g + 8
// and 16-byte float4s of x, and decodes in registers.
//
// Launch (ops/linear.rs): block LMMA_THREADS = 128 (4 warps) computes 16 output columns for
// up to LMMA_ROWS = 64 rows (8 n-tiles); the warps split K: warp w takes spans w, w + 4, …
// (prefetching its next span's weight chunks), then the block adds the four partial tiles in
// warp order through shared memory. Grid (ceil(out / 16), ceil(rows / 64)). A (row, column)
// sum is fixed by the kernel alone: per warp, spans in order, tiles in order, parts hi, mid,
// lo, each an mma (fp8: a span's mma from zero, then acc + sum·scale); then ((w0 + w1) + w2)
// + w3. It does not depend on the row count or on the
// row's place in its tile (each D element depends only on its own A row, B column and C), so
// every call, the grouped one too, gives a row the same bits (batch invariance), and decode
// (one row: one n-tile computed) is the same kernel.

#define LMMA_THREADS 128
#define LMMA_WARPS (LMMA_THREADS / DSV4_WARP)
#define LMMA_NT 8
#define LMMA_ROWS (8 * LMMA_NT)

// d += A·B for one m16n8k16 tile: A 4 registers and B 2 registers of bf16 pairs (the lower
// index in the low half), d 4 f32 accumulators; every lane of the warp must call it.
__device__ __forceinline__ void lmma_16816(float* d, const u32* a, const u32* b) {
#if defined(__CUDA_ARCH__)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    // The emulator: the same fragment layout gathered with shuffles, each D element summed in
    // k order in f32 from C (the products are exact; the hardware's f32 adding order is its
    // own, so GPU and emulator agree within f32 tolerance, not bit for bit).
    const u32 lane = threadIdx.x % DSV4_WARP, g = lane >> 2, t = lane & 3u;
    float ar[2][16], bc[2][16];
    const u64 a01 = (u64)a[0] | ((u64)a[1] << 32), a23 = (u64)a[2] | ((u64)a[3] << 32);
    const u64 bb = (u64)b[0] | ((u64)b[1] << 32);
    for (u32 s = 0; s < 4; s++) {
        const u64 x01 = __shfl_sync(0xffffffffu, a01, (int)(g * 4u + s));
        const u64 x23 = __shfl_sync(0xffffffffu, a23, (int)(g * 4u + s));
        const u64 y0 = __shfl_sync(0xffffffffu, bb, (int)(2u * t * 4u + s));
        const u64 y1 = __shfl_sync(0xffffffffu, bb, (int)((2u * t + 1u) * 4u + s));
        // Lane (g, s): a0 row g and a1 row g + 8 at k 2s, 2s+1; a2 / a3 at k 2s+8, 2s+9.
        // Lane (n, s): b0 at k 2s, 2s+1 and b1 at k 2s+8, 2s+9 of column n.
        const u32 w[4] = {(u32)x01, (u32)(x01 >> 32), (u32)x23, (u32)(x23 >> 32)};
        const u32 v[2][2] = {{(u32)y0, (u32)(y0 >> 32)}, {(u32)y1, (u32)(y1 >> 32)}};
        for (u32 h = 0; h < 2; h++) {
            const u32 k = 2u * s + 8u * h;
            for (u32 e = 0; e < 2; e++) {
                ar[0][k + e] = __uint_as_float(((w[2 * h] >> (16 * e)) & 0xffffu) << 16);
                ar[1][k + e] = __uint_as_float(((w[2 * h + 1] >> (16 * e)) & 0xffffu) << 16);
                bc[0][k + e] = __uint_as_float(((v[0][h] >> (16 * e)) & 0xffffu) << 16);
                bc[1][k + e] = __uint_as_float(((v[1][h] >> (16 * e)) & 0xffffu) << 16);
            }
        }
    }
    for (u32 i = 0; i < 4; i++) {
        float acc = d[i];
        for (u32 k = 0; k < 16; k++) acc = acc + ar[i >> 1][k] * bc[i & 1u][k];
        d[i] = acc;
    }
#endif
}

// Two bf16 values as one register, the first in the low half.
__device__ __forceinline__ u32 lmma_pair(u32 lo, u32 hi) { return (lo & 0xffffu) | (hi << 16); }

// The scale of an fp8 span (64 inputs of one 128×128 block, the same for the tile's 16 rows):
// the tiles hold the bare e4m3 codes (every code is a bf16 value, so no weight underflows) and
// the span's sum is multiplied by 2^(sb − 127), a power of two, before it joins the
// accumulators. Scale bytes of 247 and up, where code·scale may overflow f32 (and 255, NaN),
// are folded into the weights instead (`fold`), as lin_decode's f32 products, so an infinite
// weight is the reference's infinity.
#define LMMA_FOLD_SCALE 247u

// The chunk's E weights as E/2 bf16 pairs, exactly; true when one of them is ±inf.
// fp8: the codes (or, with `fold`, code·scale rounded to bf16, exact unless it overflows).
// MXFP4: codes placed in an f32 and multiplied by 2^126·scale (e2m1_to_f32's offset; every
// e2m1·2^k with k ≥ −127 is a bf16 value), whose top 16 bits are the bf16 value; scale bytes
// past 128 (the factor leaves f32) take lin_decode and a rounding conversion. NaN codes take
// the f32 decode.
template <int FMT>
__device__ __forceinline__ bool lmma_decode(const lin_chunk& ch, const u8* __restrict__ scale,
                                            u32 o, u32 c, u32 in_dim, bool fold, u32* p) {
    const int E = lin_fmt<FMT>::E;
    if constexpr (FMT == LIN_BF16) {
        bool inf = false;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            p[q] = ch.w[q];
            inf |= (ch.w[q] & 0x7fffu) == 0x7f80u || (ch.w[q] & 0x7fff0000u) == 0x7f800000u;
        }
        return inf;
    } else {
        bool fast;
        float f;
        if constexpr (FMT == LIN_FP8) {
            u32 nan = 0u;
#pragma unroll
            for (int q = 0; q < 4; q++) nan |= ((ch.w[q] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
            fast = !fold && nan == 0u;
            f = __uint_as_float(0x7b800000u); // 2^120: e4m3_to_f32's offset
        } else {
            const u32 sb = scale[(u64)o * (in_dim / 32u) + c];
            fast = sb <= 128u;
            // 2^126 times the scale 2^(sb − 127); byte 0 is 2^-127.
            f = __uint_as_float((sb + 126u) << 23);
        }
        if (fast) {
#pragma unroll
            for (int q = 0; q < E / 2; q++) {
                u32 h[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int k = 2 * q + e;
                    u32 bits;
                    if constexpr (FMT == LIN_FP8) {
                        const u32 b = (ch.w[k / 4] >> (8 * (k % 4))) & 0xffu;
                        bits = ((b & 0x80u) << 24) | ((b & 0x7fu) << 20);
                    } else {
                        const u32 n = (ch.w[k / 8] >> (4 * (k % 8))) & 0xfu;
                        bits = ((n & 8u) << 28) | ((n & 7u) << 22);
                    }
                    h[e] = __float_as_uint(__uint_as_float(bits) * f) >> 16;
                }
                p[q] = lmma_pair(h[0], h[1]);
            }
            return false;
        }
        float w[E];
        if (FMT == LIN_FP8 && !fold) {
            // NaN codes, unscaled.
#pragma unroll
            for (int k = 0; k < E; k++) w[k] = codec::e4m3_to_f32((ch.w[k / 4] >> (8 * (k % 4))) & 0xffu);
        } else {
            lin_decode<FMT>(ch, lin_scale_byte<FMT>(scale, o, c, in_dim), w);
        }
        bool inf = false;
#pragma unroll
        for (int q = 0; q < E / 2; q++) {
            p[q] = lmma_pair(codec::f32_to_bf16(w[2 * q]), codec::f32_to_bf16(w[2 * q + 1]));
            inf |= isinf(w[2 * q]) || isinf(w[2 * q + 1]);
        }
        return inf;
    }
}

// A pair with its ±inf halves zeroed: the A operand of the mid and lo mma where a weight is
// infinite, so inf·0 (x's parts past hi are often 0) makes no NaN the reference's inf·x does
// not (inf·hi(x) in the hi mma carries the weight's infinity, and inf·0 there for x = 0 is the
// reference's NaN).
__device__ __forceinline__ u32 lmma_zero_inf(u32 p) {
    p = (p & 0x7fffu) == 0x7f80u ? (p & 0xffff0000u) : p;
    return (p & 0x7fff0000u) == 0x7f800000u ? (p & 0x0000ffffu) : p;
}

// x = hi + mid + lo as three bf16 values, each a truncation of what is left: exact for finite x
// down to about 2^-110 (below, the lowest bits fall under bf16's subnormals, far inside f32
// tolerance). ±inf and NaN keep hi (NaN stays NaN) and zero mid and lo.
__device__ __forceinline__ void lmma_split(float x, u32* hi, u32* mid, u32* lo) {
    const u32 b = __float_as_uint(x);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        *hi = (b >> 16) | ((b & 0x007fffffu) != 0u ? 0x40u : 0u);
        *mid = 0u;
        *lo = 0u;
        return;
    }
    const float r = x - __uint_as_float(b & 0xffff0000u);
    const u32 rb = __float_as_uint(r) & 0xffff0000u;
    *hi = b >> 16;
    *mid = rb >> 16;
    *lo = __float_as_uint(r - __uint_as_float(rb)) >> 16;
}

// The block's 16 output columns from o0 for up to LMMA_ROWS rows from r0 (see the top).
template <int FMT>
__device__ __forceinline__ void linear_mma_impl(const u8* __restrict__ wdata,
                                                const u8* __restrict__ scale,
                                                const float* __restrict__ x,
                                                float* __restrict__ out, u32 out_dim, u32 in_dim,
                                                u32 pitch, u32 xpitch, u32 rows, u32 r0) {
    const int E = lin_fmt<FMT>::E;
    const int J = E / 4;
    __shared__ float part[LMMA_WARPS][16][LMMA_ROWS];
    const u32 o0 = blockIdx.x * 16u;
    // Whole blocks leave together (the partial sums meet at a barrier).
    if (o0 >= out_dim || r0 >= rows) return;
    const u32 nr = min((u32)LMMA_ROWS, rows - r0);
    const u32 warp = threadIdx.x / DSV4_WARP, lane = threadIdx.x % DSV4_WARP;
    const u32 g = lane >> 2, t = lane & 3u;
    const u32 oa = o0 + g, ob = o0 + g + 8u;
    const u32 nchunks = pitch / 16u, nspans = (nchunks + 3u) / 4u;
    const lin_chunk* wa = reinterpret_cast<const lin_chunk*>(wdata + (u64)oa * pitch);
    const lin_chunk* wb = reinterpret_cast<const lin_chunk*>(wdata + (u64)ob * pitch);
    float acc[LMMA_NT][4];
#pragma unroll
    for (int n = 0; n < LMMA_NT; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) acc[n][i] = 0.0f;
    }
    lin_chunk ca = {}, cb = {};
    if (warp < nspans) {
        const u32 c = warp * 4u + t;
        if (c < nchunks && oa < out_dim) ca = wa[c];
        if (c < nchunks && ob < out_dim) cb = wb[c];
    }
    for (u32 s = warp; s < nspans; s += LMMA_WARPS) {
        const u32 c = s * 4u + t;
        const bool have = c < nchunks;
        // fp8: the span's scale (the same on every lane), applied to its sums unless folded.
        bool fold = false;
        float mult = 1.0f;
        if constexpr (FMT == LIN_FP8) {
            const u32 sb = scale[(u64)(o0 / 128u) * ((in_dim + 127u) / 128u) + (s * 64u) / 128u];
            fold = sb >= LMMA_FOLD_SCALE;
            if (!fold) mult = codec::ue8m0_to_f32(sb);
        }
        u32 pa[E / 2], pb[E / 2];
#pragma unroll
        for (int q = 0; q < E / 2; q++) pa[q] = pb[q] = 0u;
        bool inf = false;
        if (have && oa < out_dim) inf |= lmma_decode<FMT>(ca, scale, oa, c, in_dim, fold, pa);
        if (have && ob < out_dim) inf |= lmma_decode<FMT>(cb, scale, ob, c, in_dim, fold, pb);
        // Whether any lane holds an infinite weight: a warp-uniform branch below (mma.sync.aligned
        // wants every lane on the same path), rarely taken.
        const bool any_inf = __any_sync(0xffffffffu, inf);
        // The next span's chunks load while this span's tiles run.
        const u32 cn = c + 4u * LMMA_WARPS;
        ca = lin_chunk{};
        cb = lin_chunk{};
        if (cn < nchunks && oa < out_dim) ca = wa[cn];
        if (cn < nchunks && ob < out_dim) cb = wb[cn];
#pragma unroll
        for (int n = 0; n < LMMA_NT; n++) {
            if ((u32)n * 8u >= nr) break; // the same on every lane
            const u32 row = (u32)n * 8u + g;
            const bool rv = have && row < nr;
            const float* xr = x + (u64)(r0 + row) * xpitch + (u64)c * E;
            // The span's sums: straight into the accumulators, or for fp8 from zero and then
            // scaled (one multiplication by a power of two and one addition).
            float sp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            float* d = FMT == LIN_FP8 ? sp : acc[n];
#pragma unroll
            for (int j = 0; j < J; j++) {
                lin_f4 v = {};
                if (rv) v = reinterpret_cast<const lin_f4*>(xr)[j];
                u32 hi[4], mid[4], lo[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    // Past in_dim the weights are zero padding; x is taken as 0 there too.
                    const float xv = (c * E + 4u * j + e < in_dim) ? v.v[e] : 0.0f;
                    lmma_split(xv, &hi[e], &mid[e], &lo[e]);
                }
                const u32 a[4] = {pa[2 * j], pb[2 * j], pa[2 * j + 1], pb[2 * j + 1]};
                const u32 bh[2] = {lmma_pair(hi[0], hi[1]), lmma_pair(hi[2], hi[3])};
                const u32 bm[2] = {lmma_pair(mid[0], mid[1]), lmma_pair(mid[2], mid[3])};
                const u32 bl[2] = {lmma_pair(lo[0], lo[1]), lmma_pair(lo[2], lo[3])};
                // The lanes took their own paths through the decode, the split and the loads;
                // mma.sync.aligned needs the whole warp converged.
                __syncwarp();
                lmma_16816(d, a, bh);
                u32 ar[4] = {a[0], a[1], a[2], a[3]};
                if (any_inf) {
#pragma unroll
                    for (int q = 0; q < 4; q++) ar[q] = lmma_zero_inf(ar[q]);
                    __syncwarp();
                }
                lmma_16816(d, ar, bm);
                lmma_16816(d, ar, bl);
            }
            if constexpr (FMT == LIN_FP8) {
#pragma unroll
                for (int i = 0; i < 4; i++) acc[n][i] = acc[n][i] + sp[i] * mult;
            }
        }
    }
#pragma unroll
    for (int n = 0; n < LMMA_NT; n++) {
        const u32 col = (u32)n * 8u + 2u * t;
        part[warp][g][col] = acc[n][0];
        part[warp][g][col + 1u] = acc[n][1];
        part[warp][g + 8u][col] = acc[n][2];
        part[warp][g + 8u][col + 1u] = acc[n][3];
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < 16u * LMMA_ROWS; i += LMMA_THREADS) {
        const u32 m = i % 16u, row = i / 16u;
        if (row < nr && o0 + m < out_dim) {
            float sum = part[0][m][row];
#pragma unroll
            for (int w = 1; w < LMMA_WARPS; w++) sum = sum + part[w][m][row];
            out[(u64)(r0 + row) * out_dim + o0 + m] = sum;
        }
    }
}

// Parameters as linear.cu's `_r1`/`_r8` kernels: weight bytes (out_dim rows of `pitch` bytes),
// scale bytes, x [rows, xpitch], out [rows, out_dim], out_dim, in_dim, pitch, xpitch, rows.
// Grid (ceil(out_dim / 16), ceil(rows / 64)), block LMMA_THREADS.
extern "C" __global__ void linear_bf16_mma(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                           const float* __restrict__ x, float* __restrict__ out,
                                           u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_mma_impl<LIN_BF16>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                              blockIdx.y * (u32)LMMA_ROWS);
}
extern "C" __global__ void linear_fp8_mma(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                          const float* __restrict__ x, float* __restrict__ out,
                                          u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_mma_impl<LIN_FP8>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                             blockIdx.y * (u32)LMMA_ROWS);
}
extern "C" __global__ void linear_mxfp4_mma(const u8* __restrict__ wdata, const u8* __restrict__ scale,
                                            const float* __restrict__ x, float* __restrict__ out,
                                            u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_mma_impl<LIN_MXFP4>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                               blockIdx.y * (u32)LMMA_ROWS);
}

// Grouped variants (DeviceOps::grouped_linear): block row y runs the computation above for the
// weight and rows (at most 64) of entry y of `table` (lin_group, linear.cu), so each row has
// the plain kernel's bits. Grid (ceil(out_dim / 16), entries), block LMMA_THREADS.
template <int FMT>
__device__ __forceinline__ void linear_mma_grouped(const lin_group* __restrict__ table,
                                                   const float* __restrict__ x,
                                                   float* __restrict__ out, u32 out_dim,
                                                   u32 in_dim, u32 pitch, u32 xpitch) {
    const lin_group gr = table[blockIdx.y];
    linear_mma_impl<FMT>(gr.wdata, gr.scale, x + (u64)gr.row0 * xpitch,
                         out + (u64)gr.row0 * out_dim, out_dim, in_dim, pitch, xpitch, gr.rows,
                         0u);
}

extern "C" __global__ void linear_bf16_mma_g(const lin_group* __restrict__ table,
                                             const float* __restrict__ x, float* __restrict__ out,
                                             u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_mma_grouped<LIN_BF16>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_fp8_mma_g(const lin_group* __restrict__ table,
                                            const float* __restrict__ x, float* __restrict__ out,
                                            u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_mma_grouped<LIN_FP8>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_mxfp4_mma_g(const lin_group* __restrict__ table,
                                              const float* __restrict__ x, float* __restrict__ out,
                                              u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch) {
    linear_mma_grouped<LIN_MXFP4>(table, x, out, out_dim, in_dim, pitch, xpitch);
}

// linear: out[r, o] = Σ_i W[o, i]·x[r, i] with W resident in its stored format and decoded in
// registers (lin_decode.cuh).
//
// Launch (ops/linear.rs): block LIN_THREADS = 128 threads (4 warps; the decode kernels' blocks
// have their shape's warps, lin_r1.cuh). Each weight row is stored
// with a pitch that is a multiple of 16 bytes (the host pads odd widths with zeros, and input
// rows to the same number of elements); lane l reads the 16-byte chunks l, l + 32, … of a row
// (coalesced, one 128-bit load per chunk) and decodes them in registers. Decode (`_r1`): a warp
// computes lin_r1<FMT>::COLS (2 for fp8, else 4) output columns, reading each input chunk once
// for all of them (fp8 and MXFP4: from a tile of the row the block stages in shared memory) and
// loading each lane's next weight chunks and scale bytes before it uses the current ones; grid
// (ceil(out / (WARPS · COLS)), rows). fp8 and MXFP4 chunks go a 32-bit word at a time through a fast
// decode (lin_fast: byte permutes, MXFP4 by table), the rare rest out of line.
// Prefill (`_r8`): a warp computes one column for up to 8 rows, so each weight is read once per
// 8 rows; grid (ceil(out / 4), ceil(rows / 8)). With f64 sums both decode fp8 and MXFP4 weights
// straight into f64 (lin_decode64). A (row, column) sum is: per lane, chunks in order and
// elements in order, in acc_t; then warp_sum. That order does not depend on the variant or on
// how many rows the call has (batch invariance).
#include "common.cuh"
#include "lin_decode.cuh"
#include "lin_r1.cuh"

// One warp computes one output column for up to ROWS consecutive rows from row r0 (the batched
// kernels): each decoded weight chunk is used for all of them. Every (row, column) sum has the
// order linear_r1's has: lane l adds chunks l, l + 32, … in order, each chunk's elements in
// order; then warp_sum.
template <int FMT, int ROWS>
__device__ __forceinline__ void linear_rows(const u8* __restrict__ wdata,
                                            const u8* __restrict__ scale,
                                            const float* __restrict__ x, float* __restrict__ out,
                                            u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch,
                                            u32 rows, u32 r0) {
    const int E = lin_fmt<FMT>::E;
    const u32 lane = threadIdx.x % DSV4_WARP;
    const u32 o = blockIdx.x * LIN_WARPS + threadIdx.x / DSV4_WARP;
    // Whole warps leave together; the kernel has no __syncthreads.
    if (o >= out_dim || r0 >= rows) return;
    const u32 nr = min((u32)ROWS, rows - r0);
    acc_t acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = (acc_t)0;
    const u32 nchunks = pitch / 16u;
    const float* xr0 = x + (u64)r0 * xpitch;
    for (u32 c = lane; c < nchunks; c += DSV4_WARP) {
        const u32 i0 = c * (u32)E;
        const u32 lim = min((u32)E, in_dim - i0);
        const lin_chunk ch = reinterpret_cast<const lin_chunk*>(wdata + (u64)o * pitch)[c];
        const u32 sb = lin_scale_byte<FMT>(scale, o, c, in_dim);
#ifdef DSV4_ACC_F64
        // Weights in f64 once for all rows (fp8/MXFP4 decoded straight into f64 where the
        // scale allows, else via f32); each x converted once.
        double wd[E];
        if (!lin_decode64<FMT>(ch, sb, wd)) {
            float w[E];
            lin_decode<FMT>(ch, sb, w);
#pragma unroll
            for (int k = 0; k < E; k++) wd[k] = (double)w[k];
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if ((u32)r < nr) lin_dot64<E>(acc[r], wd, xr0 + (u64)r * xpitch + i0, lim);
        }
#else
        float w[E];
        lin_decode<FMT>(ch, sb, w);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if ((u32)r < nr) {
                float xv[E];
                lin_load_x<E>(xr0 + (u64)r * xpitch + i0, xv);
                lin_dot<E>(acc[r], w, xv, lim);
            }
        }
#endif
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if ((u32)r < nr) { // the same on every lane: no divergent shuffle
            const acc_t s = warp_sum(acc[r]);
            if (lane == 0u) out[(u64)(r0 + r) * out_dim + o] = (float)s;
        }
    }
}

// Blocks per multiprocessor the MXFP4 decode kernels are compiled for, 4-warp and 8-warp shapes:
// ptxas takes every register a bound leaves them (the word-at-a-time decode of four columns
// keeps four tables live, and the chunks of lin_r1.cuh's ring, unrolled). Bounded to
// 3 blocks, the 4-warp shapes get 168 registers; to 4 (128), the 4-column ones spill on sm_90,
// as the 8-warp 4-column and 2-column depth-2 shapes do at 2 (`dsv4 kernels compile
// --resources`), so those are not compiled. 3 blocks are 12 warps a multiprocessor: the H200
// ran the MXFP4 GEMVs at 13 (docs/performance.md, 2026-12-04).
#define LIN_MXFP4_BLOCKS 3
#define LIN_MXFP4_BLOCKS8 2
// MXFP4 c2w4 (two tables live, not four) fits 4 blocks: 128 registers, 16 warps.
#define LIN_MXFP4_C2_BLOCKS 4

// Blocks per multiprocessor the fp8 decode kernels are compiled for. Unbounded, ptxas gave them
// more registers than their loads in flight need: the default c2w8 took 96 on sm_90, so a
// multiprocessor held 2 of its blocks (16 warps; the H200 found these kernels latency-bound with
// too few bytes in flight). Bounded to 3 it takes 80, and its fast path is the same within 3%
// with every weight load first touched as far from its issue (sass-fast-path.py), for half as
// many warps again. Each bound here compiles without a spill for sm_80, sm_90 and sm_120 with
// either sums (`dsv4 kernels compile --resources`); the ones that spilled are not taken: c4w4
// at 5 and c1w8p3 at 4 with f64 sums, c2w8p2 and c2w8p3 at 3 (they stay unbounded, 2 blocks).
#define LIN_FP8_BLOCKS8 3 // c2w8: 80 registers, 24 warps
#define LIN_FP8_C2W4_BLOCKS 6 // 80 registers, 24 warps
#define LIN_FP8_C1_BLOCKS 4 // c1w8: 64 registers, 32 warps
#ifdef DSV4_ACC_F64
#define LIN_FP8_C4_BLOCKS 4 // c4w4: 128 registers, 16 warps
#define LIN_FP8_C1P3_BLOCKS 3 // c1w8p3: 80 registers, 24 warps
#else
#define LIN_FP8_C4_BLOCKS 5 // 96 registers, 20 warps
#define LIN_FP8_C1P3_BLOCKS 4 // 64 registers, 32 warps
#endif

// One row of a decode launch: block row y computes row y (grid y = rows).
template <int FMT, int COLS = lin_r1<FMT>::COLS, int WARPS = lin_r1<FMT>::WARPS,
          int DEPTH = lin_r1<FMT>::DEPTH>
__device__ __forceinline__ void linear_r1_row(const u8* __restrict__ wdata,
                                              const u8* __restrict__ scale,
                                              const float* __restrict__ x,
                                              float* __restrict__ out, u32 out_dim, u32 in_dim,
                                              u32 pitch, u32 xpitch, u32 rows) {
    if (blockIdx.y >= rows) return; // the whole block
    linear_r1<FMT, COLS, WARPS, DEPTH>(wdata, scale, x + (u64)blockIdx.y * xpitch,
                                       out + (u64)blockIdx.y * out_dim, out_dim, in_dim, pitch);
}

// Decode variants (one row; lin_r1<FMT>::COLS columns per warp share each input chunk) and
// batched variants (up to 8 rows per weight pass; one column per warp) of each format; a row
// gets the same bits from either. Parameters: weight bytes (out_dim rows of `pitch` bytes),
// scale bytes, x [rows, xpitch], out [rows, out_dim], out_dim, in_dim, pitch, xpitch, rows.
// Grid: (ceil(out_dim / (WARPS · COLS)), rows) for _r1, block WARPS warps;
// (ceil(out_dim / 4), ceil(rows / 8)) for _r8, block LIN_THREADS.
extern "C" __global__ void linear_f32_r1(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_F32>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void linear_f32_r8(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_rows<LIN_F32, 8>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                         blockIdx.y * 8u);
}
extern "C" __global__ void linear_bf16_r1(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_BF16>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void linear_bf16_r8(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_rows<LIN_BF16, 8>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                         blockIdx.y * 8u);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_FP8_BLOCKS8)
linear_fp8_r1(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_FP8>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void linear_fp8_r8(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_rows<LIN_FP8, 8>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
                         blockIdx.y * 8u);
}
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_MXFP4_BLOCKS)
linear_mxfp4_r1(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_MXFP4>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void linear_mxfp4_r8(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_rows<LIN_MXFP4, 8>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows,
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

template <int FMT, int ROWS, int COLS = lin_r1<FMT>::COLS, int WARPS = lin_r1<FMT>::WARPS,
          int DEPTH = lin_r1<FMT>::DEPTH>
__device__ __forceinline__ void linear_grouped(const lin_group* __restrict__ table,
                                               const float* __restrict__ x,
                                               float* __restrict__ out, u32 out_dim, u32 in_dim,
                                               u32 pitch, u32 xpitch) {
    const lin_group g = table[blockIdx.y];
    if constexpr (ROWS == 1) {
        if (g.rows == 0u) return; // the whole block
        linear_r1<FMT, COLS, WARPS, DEPTH>(g.wdata, g.scale, x + (u64)g.row0 * xpitch,
                                           out + (u64)g.row0 * out_dim, out_dim, in_dim, pitch);
    } else {
        linear_rows<FMT, ROWS>(g.wdata, g.scale, x + (u64)g.row0 * xpitch,
                               out + (u64)g.row0 * out_dim, out_dim, in_dim, pitch, xpitch,
                               g.rows, 0u);
    }
}

extern "C" __global__ void linear_f32_g1(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_F32, 1>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_f32_g8(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_F32, 8>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_bf16_g1(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_BF16, 1>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_bf16_g8(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_BF16, 8>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_FP8_BLOCKS8)
linear_fp8_g1(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_FP8, 1>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_fp8_g8(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_FP8, 8>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_MXFP4_BLOCKS)
linear_mxfp4_g1(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_MXFP4, 1>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_mxfp4_g8(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_MXFP4, 8>(table, x, out, out_dim, in_dim, pitch, xpitch);
}

// The other decode shapes of fp8 and MXFP4 (`_cCwW`: C columns a warp, W warps a block; the
// default shapes are the plain kernels above), for DSV4_CUDA_DECODE and `dsv4 bench`, which
// times each: which is fastest depends on the GPU (docs/cuda.md). Same parameters and bits as
// the plain _r1 / _g1 kernels.
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_FP8_C2W4_BLOCKS)
linear_fp8_r1_c2w4(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_FP8, 2, 4>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_FP8_C2W4_BLOCKS)
linear_fp8_g1_c2w4(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_FP8, 1, 2, 4>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_FP8_C4_BLOCKS)
linear_fp8_r1_c4w4(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_FP8, 4, 4>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_FP8_C4_BLOCKS)
linear_fp8_g1_c4w4(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_FP8, 1, 4, 4>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_MXFP4_C2_BLOCKS)
linear_mxfp4_r1_c2w4(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_MXFP4, 2, 4>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_MXFP4_C2_BLOCKS)
linear_mxfp4_g1_c2w4(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_MXFP4, 1, 2, 4>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_FP8_C1_BLOCKS)
linear_fp8_r1_c1w8(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_FP8, 1, 8>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_FP8_C1_BLOCKS)
linear_fp8_g1_c1w8(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_FP8, 1, 1, 8>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_MXFP4_BLOCKS8)
linear_mxfp4_r1_c2w8(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_MXFP4, 2, 8>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_MXFP4_BLOCKS8)
linear_mxfp4_g1_c2w8(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_MXFP4, 1, 2, 8>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
// Deeper rings of weight loads (`pD`: D rounds in flight, lin_r1.cuh's DEPTH; the shapes above
// keep one), for GPUs where one round leaves the decode GEMVs latency-bound, as the H200 found.
// fp8 c2w8p2 and c2w8p3 are unbounded (94-109 registers on sm_90, 2 blocks: at 3 they spill).
extern "C" __global__ void linear_fp8_r1_c2w8p2(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_FP8, 2, 8, 2>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void linear_fp8_g1_c2w8p2(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_FP8, 1, 2, 8, 2>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void linear_fp8_r1_c2w8p3(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_FP8, 2, 8, 3>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void linear_fp8_g1_c2w8p3(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_FP8, 1, 2, 8, 3>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_FP8_C1P3_BLOCKS)
linear_fp8_r1_c1w8p3(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_FP8, 1, 8, 3>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_FP8_C1P3_BLOCKS)
linear_fp8_g1_c1w8p3(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_FP8, 1, 1, 8, 3>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_MXFP4_BLOCKS)
linear_mxfp4_r1_c2w4p2(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_MXFP4, 2, 4, 2>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void __launch_bounds__(LIN_THREADS, LIN_MXFP4_BLOCKS)
linear_mxfp4_g1_c2w4p2(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_MXFP4, 1, 2, 4, 2>(table, x, out, out_dim, in_dim, pitch, xpitch);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_MXFP4_BLOCKS8)
linear_mxfp4_r1_c1w8p3(const u8* __restrict__ wdata,
    const u8* __restrict__ scale, const float* __restrict__ x, float* __restrict__ out,
    u32 out_dim, u32 in_dim, u32 pitch, u32 xpitch, u32 rows) {
    linear_r1_row<LIN_MXFP4, 1, 8, 3>(wdata, scale, x, out, out_dim, in_dim, pitch, xpitch, rows);
}
extern "C" __global__ void __launch_bounds__(2 * LIN_THREADS, LIN_MXFP4_BLOCKS8)
linear_mxfp4_g1_c1w8p3(const lin_group* __restrict__ table,
    const float* __restrict__ x, float* __restrict__ out, u32 out_dim, u32 in_dim, u32 pitch,
    u32 xpitch) {
    linear_grouped<LIN_MXFP4, 1, 1, 8, 3>(table, x, out, out_dim, in_dim, pitch, xpitch);
}

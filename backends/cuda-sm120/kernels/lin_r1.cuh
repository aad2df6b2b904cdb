// The decode half of the linear kernels (linear.cu's `_r1` and `_g1`): one warp computes a few
// output columns of one input row, reading each input chunk once for all of them. Included by
// linear.cu only.
#pragma once
#include "common.cuh"
#include "lin_decode.cuh"

// Output columns one warp of the decode kernels (_r1, _g1) computes, per format (ops/linear.rs
// `r1_cols` mirrors this table), and whether they stage the input row in shared memory. Fewer
// columns per warp mean more warps for the same output: on an H200 (docs/performance.md,
// 2026-12-04) the 4-column fp8 warps left one or two warps per scheduler, and 2 columns ran the
// fp8 decode GEMVs up to 1.5x faster (f32 sums: with lin_decode_fast's one-multiply decode, up
// to 1.6x).
// MXFP4's grouped expert GEMV, the one the model runs, was fastest with 4 (1 took it from 42 to
// 64 us with f64 sums), as were bf16 weights. A column's sum has the same order whatever the
// count (linear_r1).
//
// STAGE: a lane reads its chunk's E inputs as E/4 16-byte loads 4·E bytes apart from the next
// lane's, so one warp-wide load touches 8 (fp8) or 16 (MXFP4) cache lines where a weight load
// touches 4, and every warp of a block reads the row again. Nsight Compute on the H200 found the
// MXFP4 GEMV bound by exactly that: L1 88% busy, DRAM 9%, warps stalled on L1 results 63% of
// the time (the fp8 one: L1 41%, 39% of the stalls). Staged, the block's threads copy a tile of
// the row into shared memory with contiguous loads, and each lane reads its chunk there, at a
// stride that keeps every 8 lanes of a 16-byte shared load on distinct banks (lin_xs). bf16
// weights, already at the copy bandwidth, and f32 ones keep reading the row directly.
//
// WARPS: warps per block (8 for fp8, else LIN_WARPS). The block's warps share one staged tile,
// so more warps copy less of the row per weight; every shape gives a column the same bits. The
// H200 run of 2026-12-04 timed every compiled shape: fp8 c2w8 ran its GEMVs 1.03-1.11x faster
// than c2w4 with either sums (docs/performance.md); for MXFP4 no shape won in both.
// DEPTH: rounds of weight loads in flight (linear_r1); 1 by default, as the H200 ran them.
// linear.cu compiles the default shape of each format and, for fp8 and MXFP4, a few others
// (`_cCwW` and `_cCwWpD` kernels; ops/decode_shape.rs lists them) for `DSV4_CUDA_DECODE` and
// the bench.
template <int FMT> struct lin_r1 {
    static const int COLS = FMT == LIN_FP8 ? 2 : 4;
    static const int WARPS = FMT == LIN_FP8 ? 8 : LIN_WARPS;
    static const int DEPTH = 1;
    static const bool STAGE = FMT == LIN_FP8 || FMT == LIN_MXFP4;
};

// Chunks of the input row one staged tile holds (a multiple of the warp size, so a lane's
// chunks l, l + 32, … fall into tiles whole).
#define LIN_TILE 128

// A staged tile's layout for chunks of E values of type T: each chunk starts UNITS 16-byte units
// after the previous one, its size padded to an odd number of units, so lanes 0..7 (one phase of
// a 16-byte shared load) start on distinct groups of 4 banks; PER values of T make a unit.
template <typename T, int E> struct lin_xs {
    static const int PER = 16 / (int)sizeof(T);
    static const int UNITS = E / PER + ((E / PER) % 2 == 0 ? 1 : 0);
};

// T if B, else F.
template <bool B, typename T, typename F> struct lin_if {
    typedef T type;
};
template <typename T, typename F> struct lin_if<false, T, F> {
    typedef F type;
};

// N staged values of type T at p (16-byte aligned) into v.
template <typename T, int N>
__device__ __forceinline__ void lin_load_staged(const T* p, T* v) {
    const lin_f4* q = reinterpret_cast<const lin_f4*>(p);
    const int PER = 16 / (int)sizeof(T);
#pragma unroll
    for (int u = 0; u < N / PER; u++) {
        const lin_f4 f = q[u];
        const T* t = reinterpret_cast<const T*>(&f);
#pragma unroll
        for (int k = 0; k < PER; k++) v[u * PER + k] = t[k];
    }
}

// The tile of an fp8 decode kernel: x times its 128-column block's 2^k·scale, so the weights need
// no multiplication (lin_fast<LIN_FP8>). The block's 8 columns lie in one 128-row scale block
// (blocks start at multiples of 8, or 16 or 32 for wider blocks; at most 128 columns), so one
// factor per column block serves every warp. Warp w of WARPS stages column blocks w, w + WARPS,
// … of the tile; ok[b] says whether every product of block b is
// exact (else its chunks take the general decode from the unscaled row).
template <int E, int WARPS>
__device__ __forceinline__ void lin_stage_fp8(const float* __restrict__ xr, const u8* srow,
                                              u32 t0, u32 t1, acc_t* xs, u32* ok) {
    const int U = lin_xs<acc_t, E>::UNITS * lin_xs<acc_t, E>::PER; // values per staged chunk
    const u32 lane = threadIdx.x % DSV4_WARP;
    const u32 n = (t1 - t0) * (u32)E; // values in the tile
    for (u32 b = threadIdx.x / DSV4_WARP; b < (n + 127u) / 128u; b += WARPS) {
        const u32 sb = srow[(t0 * (u32)E) / 128u + b];
        bool exact = sb <= 134u;
        const u32 e0 = b * 128u + lane * 4u; // this lane's 4 values
        if (exact && e0 < n) {
            const lin_f4 v = reinterpret_cast<const lin_f4*>(xr + (u64)t0 * E)[e0 / 4u];
            acc_t* dst = xs + (e0 / (u32)E) * (u32)U + e0 % (u32)E;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float x = v.v[k];
#ifdef DSV4_ACC_F64
                // 2^(sb − 127 + 1016): never below f64's normal range; the one failure is
                // overflow to infinity.
                const double y = (double)x * lin_pow2_f64((int)sb - 127 + 1016);
                exact = exact && (!isinf(y) || isinf(x));
#else
                // 2^(sb − 7); exact when scaling back gives x (no overflow, no bits lost
                // below the normal range), or x is not a number.
                const float y = x * codec::pow2_scale((int)sb - 7);
                exact = exact && (y * codec::pow2_scale(7 - (int)sb) == x || x != x);
#endif
                dst[k] = y;
            }
        }
        exact = __all_sync(0xffffffffu, exact);
        if (lane == 0u) ok[b] = exact ? 1u : 0u;
    }
}

// One warp computes COLS consecutive output columns of one row (the decode kernels). Lane l
// adds chunks l, l + 32, … in order, each chunk's elements in order, then warp_sum: the order
// linear_rows uses, so a row gets the same bits from either. Each input chunk is read once for
// all COLS columns.
//
// DEPTH: rounds of weight loads a lane keeps in flight. Before it adds chunk c, a lane loads
// its chunk c + 32·DEPTH of each column (and MXFP4 scale bytes) into a ring of registers, in
// the slot of a chunk it has added, so nothing touches a load's registers until DEPTH chunks
// later. The kernels before the ring loaded into `next` and moved it to `cur`: the move reads
// the load's registers, so the warp waited for the load there, and in the fp8 kernel ptxas put
// that move about 40 instructions after the load, ahead of the chunk's work (sass-fast-path.py
// prints where each load is first touched). The H200's Nsight Compute profile of that kernel
// (docs/performance.md, 2026-12-04) found it latency-bound: DRAM 25% busy, 0.4 instructions
// issued per scheduler and cycle. A deeper ring puts more bytes in flight per warp, at 4 · COLS
// registers a round. The depth is 1, 2 or 3 (a ring of 2 or 4 slots, unrolled). It changes
// when a load is issued, never what is added: every depth gives a column the same bits.
template <int FMT, int COLS, int WARPS, int DEPTH>
__device__ __forceinline__ void linear_r1(const u8* __restrict__ wdata,
                                          const u8* __restrict__ scale,
                                          const float* __restrict__ xr, float* __restrict__ outr,
                                          u32 out_dim, u32 in_dim, u32 pitch) {
    const int E = lin_fmt<FMT>::E;
    const bool STAGE = lin_r1<FMT>::STAGE;
    // fp8 tiles hold prescaled inputs in acc_t (lin_stage_fp8), and fp8 chunks need no scale
    // byte on their fast route; MXFP4 tiles hold the inputs, and each column its scale bytes.
    const bool PRE = FMT == LIN_FP8;
    typedef typename lin_if<PRE, acc_t, float>::type xt;
    const int XS = lin_xs<xt, E>::UNITS * lin_xs<xt, E>::PER; // values per staged chunk
    const int SC = PRE ? 1 : COLS;
    __shared__ lin_f4 xs4[STAGE ? LIN_TILE * lin_xs<xt, E>::UNITS : 1];
    __shared__ u32 xok[PRE ? LIN_TILE * E / 128 : 1];
    xt* xs = reinterpret_cast<xt*>(xs4);
    const u32 lane = threadIdx.x % DSV4_WARP;
    static_assert(FMT != LIN_FP8 || (128 % (COLS * WARPS) == 0), "fp8 blocks in one scale block");
    const u32 o0 = (blockIdx.x * WARPS + threadIdx.x / DSV4_WARP) * COLS;
    const bool active = o0 < out_dim;
    // Unstaged, whole warps leave together; staged, every warp takes part in the copies.
    if (!STAGE && !active) return;
    const u32 nc = active ? min((u32)COLS, out_dim - o0) : 0u;
    const u32 nchunks = pitch / 16u;
    acc_t acc[COLS];
#pragma unroll
    for (int j = 0; j < COLS; j++) acc[j] = (acc_t)0;
    // Chunk c's weights for each column into w (and MXFP4 scale bytes into s), if the row has
    // a chunk c; columns past nc keep zero weights and scale byte 127 (2^0), which every fast
    // route takes.
    auto load = [&](u32 c, lin_chunk (&w)[COLS], u32 (&s)[SC]) {
#pragma unroll
        for (int j = 0; j < COLS; j++) {
            if ((u32)j < nc && c < nchunks) {
                w[j] = reinterpret_cast<const lin_chunk*>(wdata + (u64)(o0 + j) * pitch)[c];
                if (!PRE && j < SC) s[j] = lin_scale_byte<FMT>(scale, o0 + j, c, in_dim);
            }
        }
    };
    // The ring: R slots, the fewest of 2 and 4 (a tile's rounds are a whole number of rings)
    // that hold the chunk being added and the DEPTH rounds in flight. Round k of a lane (chunk
    // lane + 32·k) has slot k mod R. A column past nc keeps zeros and scale byte 127; past the
    // row's last chunk a slot keeps what it had, which nothing reads again.
    const int R = DEPTH < 2 ? 2 : 4;
    static_assert(DEPTH < R && (LIN_TILE / DSV4_WARP) % R == 0, "a tile holds whole rings");
    lin_chunk ring[R][COLS] = {};
    u32 sring[R][SC];
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int j = 0; j < SC; j++) sring[r][j] = 127u;
    }
#pragma unroll
    for (int d = 0; d < DEPTH; d++) load(lane + (u32)d * DSV4_WARP, ring[d], sring[d]);
    // Adds chunk c of tile t0 (weights cur, MXFP4 scale bytes scur) to every column's sum.
    auto add = [&](u32 c, u32 t0, const lin_chunk (&cur)[COLS], const u32 (&scur)[SC]) {
        const u32 lim = min((u32)E, in_dim - c * (u32)E);
        // The chunk's inputs: staged (fp8: prescaled), or the row's own.
        const xt* xc;
        if constexpr (STAGE) {
            xc = xs + (c - t0) * XS;
        } else {
            xc = xr + (u64)c * E;
        }
        if constexpr (STAGE) {
            // Whole chunks whose every column takes the fast route go a word at a time: the
            // word's inputs read and converted once for all COLS columns, each column's word
            // decoded and added (its elements in order). The rest (a row's last, partial
            // chunk; NaN codes; extreme scales) out of line.
            const int EW = lin_fast<FMT>::EW;
            // Every column is computed, those past nc too (zero weights, a benign scale byte;
            // never stored): no per-column branches on the fast path.
            lin_fast<FMT> fast[COLS];
            bool ok = lim == (u32)E;
            if constexpr (PRE) ok = ok && xok[(c - t0) * E / 128u] != 0u;
#pragma unroll
            for (int j = 0; j < COLS; j++) {
                fast[j].prep(cur[j], scur[SC == 1 ? 0 : j]);
                ok &= fast[j].ok;
            }
            if (ok) {
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    acc_t xa[EW];
                    if constexpr (PRE) {
                        lin_load_staged<acc_t, EW>(xc + q * EW, xa);
                    } else {
                        float xv[EW];
                        lin_load_staged<float, EW>(xc + q * EW, xv);
#pragma unroll
                        for (int k = 0; k < EW; k++) xa[k] = (acc_t)xv[k];
                    }
#pragma unroll
                    for (int j = 0; j < COLS; j++) {
                        acc_t w[EW];
                        fast[j].word(cur[j].w[q], w);
#pragma unroll
                        for (int k = 0; k < EW; k++) acc[j] = lin_mac(w[k], xa[k], acc[j]);
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < COLS; j++) {
                    if ((u32)j >= nc) continue;
                    if constexpr (PRE) {
                        // From the unscaled row, with the chunk's scale byte.
                        acc[j] = lin_chunk_dot_general<FMT>(
                            acc[j], cur[j], lin_scale_byte<FMT>(scale, o0 + j, c, in_dim),
                            xr + (u64)c * E, lim);
                    } else {
                        acc[j] = lin_chunk_dot_general<FMT>(acc[j], cur[j], scur[j], xc, lim);
                    }
                }
            }
        } else {
            // f32 and bf16 weights: a column at a time, the chunk's inputs read once.
            float xv[E];
            lin_load_x<E>(xc, xv);
#ifdef DSV4_ACC_F64
            double xd[E];
#pragma unroll
            for (int k = 0; k < E; k++) xd[k] = (double)xv[k];
#endif
#pragma unroll
            for (int j = 0; j < COLS; j++) {
                if (lim == (u32)E) { // every column (see above)
#ifdef DSV4_ACC_F64
                    double wd[E];
                    lin_decode64<FMT>(cur[j], 0u, wd);
#pragma unroll
                    for (int k = 0; k < E; k++) acc[j] = lin_mac(wd[k], xd[k], acc[j]);
#else
                    float w[E];
                    lin_decode_fast<FMT>(cur[j], 0u, w);
#pragma unroll
                    for (int k = 0; k < E; k++) acc[j] = lin_mac(w[k], xv[k], acc[j]);
#endif
                } else if ((u32)j < nc) {
                    acc[j] = lin_chunk_dot_any<FMT>(acc[j], cur[j], 0u, xc, lim);
                }
            }
        }
    };
    const u32 tile = STAGE ? (u32)LIN_TILE : nchunks;
    for (u32 t0 = 0; t0 < nchunks; t0 += tile) {
        const u32 t1 = min(nchunks, t0 + tile);
        if constexpr (STAGE) {
            __syncthreads(); // every warp is done with the previous tile
            if constexpr (PRE) {
                const u32 rb = blockIdx.x * WARPS * COLS / 128u;
                lin_stage_fp8<E, WARPS>(xr, scale + (u64)rb * ((in_dim + 127u) / 128u), t0,
                                        t1, xs, xok);
            } else {
                const lin_f4* src = reinterpret_cast<const lin_f4*>(xr + (u64)t0 * E);
                for (u32 q = threadIdx.x; q < (t1 - t0) * (E / 4); q += WARPS * DSV4_WARP)
                    xs4[(q / (E / 4)) * lin_xs<xt, E>::UNITS + q % (E / 4)] = src[q];
            }
            __syncthreads();
        }
        if (!active) continue;
        // One ring per pass: chunk c0 + 32·r is in slot r. Chunk c + 32·DEPTH goes into the
        // slot of chunk c + 32·(DEPTH − R), added already.
        for (u32 c0 = t0 + lane; c0 < t1; c0 += R * DSV4_WARP) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const u32 c = c0 + (u32)r * DSV4_WARP;
                if (c >= t1) break;
                load(c + DEPTH * DSV4_WARP, ring[(r + DEPTH) % R], sring[(r + DEPTH) % R]);
                add(c, t0, ring[r], sring[r]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < COLS; j++) {
        if ((u32)j < nc) { // the same on every lane: no divergent shuffle
            const acc_t s = warp_sum(acc[j]);
            if (lane == 0u) outr[o0 + j] = (float)s;
        }
    }
}

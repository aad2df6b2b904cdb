// Top-k selection by radix select, one block per score range (a batch of ranges is one launch).
// Each score maps to an order-preserving u32 key (larger score → larger key; NaN → 0, below −∞,
// so NaN ranks last; −0.0 and +0.0 share a key, as they compare equal). Four passes of 8-bit
// histograms, most significant byte first, find the k-th largest key T and how many keys equal
// to T to take; then every key > T is selected plus the lowest-index keys == T, and the indices
// are written in ascending order by a block-wide prefix scan over index order. The result is
// exactly the reference's (larger score first, ties to the lower index, NaN last, indices
// ascending).
#include "common.cuh"

// Threads of each block (a multiple of 32, at least 256).
#define TOPK_THREADS 512
// Consecutive scores each thread handles per chunk of the selection pass.
#define TOPK_ITEMS 8

// The order-preserving key of a score.
__device__ __forceinline__ u32 topk_key(float f) {
    if (isnan(f)) return 0u;
    u32 b = __float_as_uint(f);
    if (b == 0x80000000u) b = 0u;  // −0.0 ties with +0.0
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Inclusive prefix sum over the 32 lanes of a warp (all lanes must call it).
__device__ __forceinline__ u32 topk_warp_scan(u32 v, u32 lane) {
    for (u32 d = 1; d < 32u; d <<= 1) {
        const u32 y = __shfl_sync(0xffffffffu, v, lane >= d ? lane - d : lane);
        if (lane >= d) v += y;
    }
    return v;
}

// topk_select over a batch of score ranges: range r is scores[starts[r] .. starts[r+1]] (n_r
// scores); its min(k, n_r) indices (relative to the range, ascending) go to out[offs[r] ..]. One
// block per range: grid rows × TOPK_THREADS.
extern "C" __global__ void topk_select(const float* __restrict__ all_scores,
                                       const u32* __restrict__ starts,
                                       const u32* __restrict__ offs, u32* __restrict__ all_out,
                                       u32 k_max) {
    __shared__ u32 hist[256];
    __shared__ u32 found[2];     // bucket, count of keys above it (radix passes)
    __shared__ u32 warp_off[32]; // per-warp exclusive offsets (selection pass)
    __shared__ u32 chunk_total[1];
    const u32 r = blockIdx.x;
    const float* scores = all_scores + starts[r];
    const u32 n = starts[r + 1u] - starts[r];
    const u32 k = min(k_max, n);
    // The whole block leaves together (before any barrier) when the range selects nothing.
    if (k == 0) return;
    u32* out = all_out + offs[r];
    const u32 tid = threadIdx.x;
    const u32 lane = tid & 31u;
    const u32 warp = tid >> 5;
    const u32 warps = blockDim.x >> 5;

    // Radix select: after pass p, `prefix` holds the top 8(p+1) bits of T and `krem` how many of
    // the keys sharing those bits are still to take.
    u32 prefix = 0;
    u32 krem = k;
    for (u32 pass = 0; pass < 4u; ++pass) {
        const u32 shift = 24u - 8u * pass;
        const u32 hi_mask = pass == 0 ? 0u : (0xffffffffu << (shift + 8u));
        for (u32 i = tid; i < 256u; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        // Each thread counts runs of equal buckets before adding them, so ties (masked −∞
        // scores, repeated values) cost one atomic per run instead of one per score.
        u32 run_b = 0;
        u32 run_n = 0;
        for (u32 i = tid; i < n; i += blockDim.x) {
            const u32 key = topk_key(__ldg(scores + i));
            if ((key & hi_mask) == prefix) {
                const u32 b = (key >> shift) & 255u;
                if (run_n != 0 && b != run_b) {
                    atomicAdd(&hist[run_b], run_n);
                    run_n = 0;
                }
                run_b = b;
                ++run_n;
            }
        }
        if (run_n != 0) atomicAdd(&hist[run_b], run_n);
        __syncthreads();
        if (warp == 0) {
            // Lane l covers buckets 255 − 8l down to 248 − 8l.
            u32 local = 0;
            for (u32 e = 0; e < 8u; ++e) local += hist[255u - 8u * lane - e];
            u32 above = topk_warp_scan(local, lane) - local;
            for (u32 e = 0; e < 8u; ++e) {
                const u32 b = 255u - 8u * lane - e;
                const u32 h = hist[b];
                if (above < krem && krem <= above + h) {
                    found[0] = b;
                    found[1] = above;
                }
                above += h;
            }
        }
        __syncthreads();
        prefix |= found[0] << shift;
        krem -= found[1];
    }
    const u32 thr = prefix;  // T, the k-th largest key
    const u32 need = krem;   // keys == T to take (the lowest-index ones)

    // Selection in chunks of TOPK_THREADS·TOPK_ITEMS scores: thread t handles TOPK_ITEMS
    // consecutive ones. Counts are packed: keys > T in the low 16 bits, keys == T in the high.
    u32 carry_gt = 0;
    u32 carry_eq = 0;
    const u32 chunk = blockDim.x * TOPK_ITEMS;
    for (u32 base = 0; base < n; base += chunk) {
        const u32 i0 = base + tid * TOPK_ITEMS;
        u32 cnt = 0;
        for (u32 e = 0; e < TOPK_ITEMS; ++e) {
            const u32 i = i0 + e;
            if (i < n) {
                const u32 key = topk_key(__ldg(scores + i));
                cnt += key > thr ? 1u : (key == thr ? 0x10000u : 0u);
            }
        }
        const u32 incl = topk_warp_scan(cnt, lane);
        if (lane == 31u) warp_off[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            const u32 v = lane < warps ? warp_off[lane] : 0u;
            const u32 wi = topk_warp_scan(v, lane);
            if (lane < warps) warp_off[lane] = wi - v;
            if (lane == 31u) chunk_total[0] = wi;
        }
        __syncthreads();
        const u32 excl = warp_off[warp] + incl - cnt;
        u32 gt = carry_gt + (excl & 0xffffu);
        u32 eq = carry_eq + (excl >> 16);
        for (u32 e = 0; e < TOPK_ITEMS; ++e) {
            const u32 i = i0 + e;
            if (i < n) {
                const u32 key = topk_key(__ldg(scores + i));
                if (key > thr) {
                    out[gt + min(eq, need)] = i;
                    ++gt;
                } else if (key == thr) {
                    if (eq < need) out[gt + eq] = i;
                    ++eq;
                }
            }
        }
        const u32 tot = chunk_total[0];
        carry_gt += tot & 0xffffu;
        carry_eq += tot >> 16;
        __syncthreads();
    }
}

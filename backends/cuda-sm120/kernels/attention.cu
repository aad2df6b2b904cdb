// Attention-side kernels: compressor softmax pooling, indexer scores, and the three launches of
// sparse attention with a per-head sink (logits, then max and e^(l−max) per head, then the
// weighted sum and denominator). Every sum runs in the reference's order (with f64
// accumulation the results are the reference's bits), so it never depends on the batch.
// Sums start at −0.0 as Rust's f64 `Sum` does, so even signed zeros match the reference.
#include "common.cuh"

// Query values (acc_t: 32 KB with f64 sums) the indexer and attn_logits stage in shared memory,
// already converted: with f64 sums a per-multiply f32→f64 conversion (F2F, a quarter of the FP64
// rate on sm_80/sm_90) would bound these kernels, as it did the GEMV (see linear.cu).
#define ATTN_Q_SHARED 4096
// Heads one thread of the indexer, attn_logits and attn_out handles at a time (a key value is
// read and converted once per this many heads; the heads' sums run side by side, each in order).
#define ATTN_HT 8

// −∞ as a float / double.
__device__ __forceinline__ float attn_neg_inf_f() { return __uint_as_float(0xff800000u); }
__device__ __forceinline__ double attn_neg_inf_d() {
    return __longlong_as_double((long long)0xfff0000000000000ull);
}

// attn_softmax_pool: a, z = [windows, rows, width]; for window w and column c, out[w, c] =
// Σ_r e^(z_wrc − max)·a_wrc / Σ_r e^(z_wrc − max) over the rows with z_wrc ≠ −∞ (0 when there are
// none). One thread per (window, column), rows in order, so a window's result never depends on
// the others; grid ceil(windows·width/256) × 256.
extern "C" __global__ void attn_softmax_pool(const float* __restrict__ a,
                                             const float* __restrict__ z, float* __restrict__ out,
                                             u32 rows, u32 width, u32 windows) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)windows * width) return;
    const u64 c = t % width;
    const u64 base = (t / width) * rows * width + c;
    float mx = attn_neg_inf_f();
    for (u32 r = 0; r < rows; ++r) mx = fmaxf(mx, __ldg(z + base + (u64)r * width));
    acc_t num = (acc_t)-0.0;
    acc_t den = (acc_t)-0.0;
    for (u32 r = 0; r < rows; ++r) {
        const float zr = __ldg(z + base + (u64)r * width);
        if (zr == attn_neg_inf_f()) continue;
        const acc_t e = (acc_t)exp((double)zr - (double)mx);
        num += e * (acc_t)__ldg(a + base + (u64)r * width);
        den += e;
    }
    out[t] = den > (acc_t)0.0 ? (float)(num / den) : 0.0f;
}

// A key row of f32 values (the decoded keys), as a reader like cache.cu's entry readers.
struct attn_f32_key {
    const float* k;
    __device__ __forceinline__ attn_f32_key(const u8* row, u32, u32)
        : k(reinterpret_cast<const float*>(row)) {}
    __device__ __forceinline__ float operator()(u32 c) const { return __ldg(k + c); }
};

// d[i] = Σ_c q[i·dim + c]·k(c) in channel order for the first hn ≤ ATTN_HT heads of q (staged
// acc_t values in shared memory, or floats in global memory when they do not fit); each key
// value is read (decoded, for a cache entry reader) and converted once for all of them.
template <typename Q, typename K>
__device__ __forceinline__ void attn_head_dots(const Q* qh, u32 hn, const K& k, u32 dim,
                                               acc_t* d) {
#pragma unroll
    for (u32 i = 0; i < ATTN_HT; ++i) d[i] = (acc_t)-0.0;
    if (hn == (u32)ATTN_HT) {
        // A full group (every group when heads is a multiple of ATTN_HT): no per-head branches.
        for (u32 c = 0; c < dim; ++c) {
            const acc_t kv = (acc_t)k(c);
#pragma unroll
            for (u32 i = 0; i < ATTN_HT; ++i) d[i] = acc_mac((acc_t)qh[(u64)i * dim + c], kv, d[i]);
        }
        return;
    }
    for (u32 c = 0; c < dim; ++c) {
        const acc_t kv = (acc_t)k(c);
#pragma unroll
        for (u32 i = 0; i < ATTN_HT; ++i) {
            if (i < hn) d[i] = acc_mac((acc_t)qh[(u64)i * dim + c], kv, d[i]);
        }
    }
}

// total + Σ_i w[i]·max(q_i·k, 0) over hn ≤ ATTN_HT heads, in head order.
template <typename Q, typename K>
__device__ __forceinline__ acc_t attn_index_group(const Q* qh, const float* __restrict__ w, u32 hn,
                                                  const K& k, u32 dim, acc_t total) {
    acc_t d[ATTN_HT];
    attn_head_dots(qh, hn, k, dim, d);
#pragma unroll
    for (u32 i = 0; i < ATTN_HT; ++i) {
        if (i < hn) total += (acc_t)__ldg(w + i) * fmax(d[i], (acc_t)0.0);
    }
    return total;
}

// attn_indexer_scores over a batch of queries, each over its own keys: q = [rows, heads, dim],
// w = [rows, heads], keys = [N, dim]; query r scores n_r = starts[r+1] − starts[r] key rows from
// bases[r] on: out[starts[r] + j] = Σ_h w[r, h]·max(q_rh·K_{bases[r]+j}, 0). With bases = starts
// each query has its own keys; other bases let queries share keys (nested prefixes of one
// sequence's index-K entries in a prefill chunk, uploaded once). One thread per key: each dot
// runs over the channels in order and the heads are summed in order, as the reference does, so a
// score never depends on the batch. The block's query is staged in shared memory (as acc_t, read
// as broadcasts) a whole number of ATTN_HT-head groups at a time; a dim too wide for one group
// reads it from global memory instead. Key j is row j of `keys` (`stride` bytes apart) read
// through K: f32 rows, or cache entries read in place (the _bf16/_kv_fp8/_index_fp8/_index_fp4
// variants, with the format's sizes a, b as cache.cu's readers take them), so a paged indexer
// call needs no decoded copy of its keys. With `ids` (null: none), key row k is row ids[k] of
// `keys` instead: keys kept on the device across calls, in the slots of a page cache. Grid
// (ceil(max n_r/128), rows) × 128; each launch covers queries row0 + blockIdx.y, so more than
// 65535 queries are a few launches.
template <typename K>
__device__ __forceinline__ void attn_indexer(const float* __restrict__ q,
                                             const float* __restrict__ w,
                                             const u8* __restrict__ keys, u32 stride, u32 a,
                                             u32 b, const u32* __restrict__ starts,
                                             const u32* __restrict__ bases,
                                             const u32* __restrict__ ids,
                                             float* __restrict__ out, u32 dim, u32 heads,
                                             u32 row0) {
    __shared__ acc_t sq[ATTN_Q_SHARED];
    const u32 r = row0 + blockIdx.y;
    const u32 k0 = starts[r];
    const u32 n = starts[r + 1u] - k0;
    const u32 base = bases[r];
    // The whole block leaves together (before any barrier) when it has no key of this query.
    if ((u64)blockIdx.x * blockDim.x >= n) return;
    const float* qr = q + (u64)r * heads * dim;
    const float* wr = w + (u64)r * heads;
    const u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = j < n;
    // An idle thread reads the block's first key (it exists) and never uses it.
    const u64 kr = (u64)base + (live ? j : (u64)blockIdx.x * blockDim.x);
    const K kj(keys + (ids ? (u64)ids[kr] : kr) * stride, a, b);
    acc_t total = (acc_t)-0.0;
    // Heads per stage: a multiple of ATTN_HT, 0 when not even one group fits.
    const u32 per = (ATTN_Q_SHARED / dim) / ATTN_HT * ATTN_HT;
    if (per == 0u) {
        for (u32 h0 = 0; live && h0 < heads; h0 += ATTN_HT) {
            total = attn_index_group(qr + (u64)h0 * dim, wr + h0, min(heads - h0, (u32)ATTN_HT),
                                     kj, dim, total);
        }
    } else {
        for (u32 s0 = 0; s0 < heads; s0 += per) {
            const u32 sn = min(heads - s0, per);
            __syncthreads(); // every thread is done with the previous stage
            for (u32 i = threadIdx.x; i < sn * dim; i += blockDim.x) {
                sq[i] = (acc_t)__ldg(qr + (u64)s0 * dim + i);
            }
            __syncthreads();
            for (u32 h0 = 0; live && h0 < sn; h0 += ATTN_HT) {
                total = attn_index_group<acc_t>(sq + (u64)h0 * dim, wr + s0 + h0,
                                                min(sn - h0, (u32)ATTN_HT), kj, dim, total);
            }
        }
    }
    if (live) out[(u64)k0 + j] = (float)total;
}

extern "C" __global__ void attn_indexer_scores(const float* __restrict__ q,
                                               const float* __restrict__ w,
                                               const float* __restrict__ keys,
                                               const u32* __restrict__ starts,
                                               const u32* __restrict__ bases, const u32* __restrict__ ids,
                                               float* __restrict__ out, u32 dim, u32 heads,
                                               u32 row0) {
    attn_indexer<attn_f32_key>(q, w, reinterpret_cast<const u8*>(keys), dim * 4u, 0u, 0u,
                               starts, bases, ids, out, dim, heads, row0);
}

// The in-place variants: keys = entries of `stride` bytes laid end to end, in the format's
// reader (cache.cu) with its sizes a, b.
extern "C" __global__ void attn_indexer_scores_bf16(const float* __restrict__ q, const float* __restrict__ w,
                                                    const u8* __restrict__ keys, const u32* __restrict__ starts,
                                                    const u32* __restrict__ bases, const u32* __restrict__ ids,
                                                    float* __restrict__ out, u32 dim, u32 heads, u32 row0,
                                                    u32 stride, u32 a, u32 b) {
    attn_indexer<cache_bf16>(q, w, keys, stride, a, b, starts, bases, ids, out, dim, heads, row0);
}
extern "C" __global__ void attn_indexer_scores_kv_fp8(const float* __restrict__ q, const float* __restrict__ w,
                                                      const u8* __restrict__ keys, const u32* __restrict__ starts,
                                                      const u32* __restrict__ bases, const u32* __restrict__ ids,
                                                      float* __restrict__ out, u32 dim, u32 heads, u32 row0,
                                                      u32 stride, u32 a, u32 b) {
    attn_indexer<cache_kv_fp8>(q, w, keys, stride, a, b, starts, bases, ids, out, dim, heads, row0);
}
extern "C" __global__ void attn_indexer_scores_index_fp8(const float* __restrict__ q, const float* __restrict__ w,
                                                         const u8* __restrict__ keys, const u32* __restrict__ starts,
                                                         const u32* __restrict__ bases, const u32* __restrict__ ids,
                                                         float* __restrict__ out, u32 dim, u32 heads, u32 row0,
                                                         u32 stride, u32 a, u32 b) {
    attn_indexer<cache_index_fp8>(q, w, keys, stride, a, b, starts, bases, ids, out, dim, heads, row0);
}
extern "C" __global__ void attn_indexer_scores_index_fp4(const float* __restrict__ q, const float* __restrict__ w,
                                                         const u8* __restrict__ keys, const u32* __restrict__ starts,
                                                         const u32* __restrict__ bases, const u32* __restrict__ ids,
                                                         float* __restrict__ out, u32 dim, u32 heads, u32 row0,
                                                         u32 stride, u32 a, u32 b) {
    attn_indexer<cache_index_fp4>(q, w, keys, stride, a, b, starts, bases, ids, out, dim, heads, row0);
}

// Sparse attention over a batch of queries, each over its own keys. q = [rows, heads, dim],
// keys = [N, dim]; query r attends over keys starts[r] .. starts[r+1] (n_r of them), key i being
// row ids[i] of `keys` (row i when ids is null; with ids, queries share key rows: a prefill
// chunk's rows of one sequence read the same window and compressed entries). The
// logits/weights scratch holds query r's [heads, n_r] doubles at heads·starts[r], sinkw [rows,
// heads], out [rows, heads, dim]. Each launch covers queries row0 + (its row grid index), so a
// batch of more than 65535 queries is a few launches.
//
// Launch 1: logits[h, s] = (q_h·K_s)·scale, each dot over the channels in order. One thread per
// (key, group of ATTN_HT heads, query): grid (ceil(max n_r/128), ceil(heads/ATTN_HT), rows) × 128.
// The group's queries are staged in shared memory as acc_t when ATTN_HT·dim fits. Each key row
// of `keys` (`stride` bytes apart) is read through K: f32 rows, or KV cache entries read in place
// (the _bf16 / _kv_fp8 variants, with the format's sizes a, b), as for the indexer.
template <typename K>
__device__ __forceinline__ void attn_logits_impl(const float* __restrict__ q,
                                                 const u8* __restrict__ keys, u32 stride, u32 a,
                                                 u32 b, const u32* __restrict__ starts,
                                                 const u32* __restrict__ ids,
                                                 double* __restrict__ logits, u32 dim, u32 heads,
                                                 float scale, u32 row0) {
    __shared__ acc_t sq[ATTN_Q_SHARED];
    const u32 r = row0 + blockIdx.z;
    const u32 k0 = starts[r];
    const u32 n = starts[r + 1u] - k0;
    // The whole block leaves together (before the barrier) when it has no key of this query.
    if ((u64)blockIdx.x * blockDim.x >= n) return;
    const u64 s = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 h0 = blockIdx.y * ATTN_HT;
    const u32 hn = min(heads - h0, (u32)ATTN_HT);
    const float* qh = q + ((u64)r * heads + h0) * dim;
    const bool staged = (u64)ATTN_HT * dim <= ATTN_Q_SHARED;
    if (staged) {
        for (u32 i = threadIdx.x; i < hn * dim; i += blockDim.x) sq[i] = (acc_t)__ldg(qh + i);
    }
    __syncthreads();
    if (s >= n) return;
    const u64 ki = (u64)k0 + s;
    const K ks(keys + (ids ? (u64)ids[ki] : ki) * stride, a, b);
    double* lr = logits + (u64)heads * k0;
    acc_t d[ATTN_HT];
    if (staged) {
        attn_head_dots<acc_t>(sq, hn, ks, dim, d);
    } else {
        attn_head_dots(qh, hn, ks, dim, d);
    }
#pragma unroll
    for (u32 i = 0; i < ATTN_HT; ++i) {
        if (i < hn) lr[(u64)(h0 + i) * n + s] = (double)(d[i] * (acc_t)scale);
    }
}

extern "C" __global__ void attn_logits(const float* __restrict__ q, const float* __restrict__ keys,
                                       const u32* __restrict__ starts,
                                       const u32* __restrict__ ids,
                                       double* __restrict__ logits, u32 dim, u32 heads,
                                       float scale, u32 row0) {
    attn_logits_impl<attn_f32_key>(q, reinterpret_cast<const u8*>(keys), dim * 4u, 0u, 0u,
                                   starts, ids, logits, dim, heads, scale, row0);
}
extern "C" __global__ void attn_logits_bf16(const float* __restrict__ q,
                                            const u8* __restrict__ keys,
                                            const u32* __restrict__ starts,
                                            const u32* __restrict__ ids,
                                            double* __restrict__ logits, u32 dim, u32 heads,
                                            float scale, u32 row0, u32 stride, u32 a, u32 b) {
    attn_logits_impl<cache_bf16>(q, keys, stride, a, b, starts, ids, logits, dim, heads, scale,
                                 row0);
}
extern "C" __global__ void attn_logits_kv_fp8(const float* __restrict__ q,
                                              const u8* __restrict__ keys,
                                              const u32* __restrict__ starts,
                                              const u32* __restrict__ ids,
                                              double* __restrict__ logits, u32 dim, u32 heads,
                                              float scale, u32 row0, u32 stride, u32 a, u32 b) {
    attn_logits_impl<cache_kv_fp8>(q, keys, stride, a, b, starts, ids, logits, dim, heads, scale,
                                   row0);
}

// Launch 2: one 256-thread block per (head, query): grid (heads, rows). mx = max(sink_h,
// max_s logits[h, s]) (NaN ignored, as f64::max does), then logits[h, s] ← e^(logits[h, s] − mx)
// in place and sinkw[r, h] = e^(sink_h − mx), all in f64.
extern "C" __global__ void attn_softmax(double* __restrict__ logits,
                                        const u32* __restrict__ starts,
                                        const float* __restrict__ sink,
                                        double* __restrict__ sinkw, u32 heads, u32 row0) {
    __shared__ double part[32];
    const u32 r = row0 + blockIdx.y;
    const u32 k0 = starts[r];
    const u32 n = starts[r + 1u] - k0;
    const u64 h = blockIdx.x;
    double* lh = logits + (u64)heads * k0 + h * n;
    const double sk = (double)sink[h];
    double mx = attn_neg_inf_d();
    for (u32 s = threadIdx.x; s < n; s += blockDim.x) mx = fmax(mx, lh[s]);
    for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = sk;
    for (u32 wi = 0; wi < (blockDim.x >> 5); ++wi) mx = fmax(mx, part[wi]);
    for (u32 s = threadIdx.x; s < n; s += blockDim.x) lh[s] = exp(lh[s] - mx);
    if (threadIdx.x == 0) sinkw[(u64)r * heads + h] = exp(sk - mx);
}

// Launch 3: out[r, h, c] = Σ_s w[h, s]·K[s, c] / (Σ_s w[h, s] + sinkw[r, h]), both sums over s in
// order (each thread forms its heads' denominators). One thread per (channel, group of ATTN_HT
// heads, query), so each key value is read (decoded, for entries) and converted once for the
// group; the group's weights are staged in shared memory as acc_t, ATTN_OUT_KEYS keys at a time,
// so each is converted once per block rather than once per thread (and the keys' rows, with
// their ids, read once per block). Keys as for attn_logits.
// Grid (ceil(dim/256), ceil(heads/ATTN_HT), rows) × 256.
#define ATTN_OUT_KEYS 256
template <typename K>
__device__ __forceinline__ void attn_out_impl(const double* __restrict__ wts,
                                              const double* __restrict__ sinkw,
                                              const u8* __restrict__ keys, u32 stride, u32 a,
                                              u32 b, const u32* __restrict__ starts,
                                              const u32* __restrict__ ids,
                                              float* __restrict__ out, u32 dim, u32 heads,
                                              u32 row0) {
    __shared__ acc_t sw[ATTN_HT * ATTN_OUT_KEYS];
    __shared__ u32 sid[ATTN_OUT_KEYS];
    const u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 h0 = blockIdx.y * ATTN_HT;
    const u32 r = row0 + blockIdx.z;
    const bool live = c < dim;
    const u32 hn = min(heads - h0, (u32)ATTN_HT);
    const u32 k0 = starts[r];
    const u32 n = starts[r + 1u] - k0;
    const double* wh = wts + (u64)heads * k0 + (u64)h0 * n;
    const u32 cc = live ? (u32)c : 0u;
    acc_t num[ATTN_HT], den[ATTN_HT];
#pragma unroll
    for (u32 i = 0; i < ATTN_HT; ++i) num[i] = den[i] = (acc_t)-0.0;
    for (u32 s0 = 0; s0 < n; s0 += ATTN_OUT_KEYS) {
        const u32 sn = min(n - s0, (u32)ATTN_OUT_KEYS);
        __syncthreads(); // every thread is done with the previous keys' weights
        for (u32 t = threadIdx.x; t < hn * sn; t += blockDim.x) {
            const u32 i = t / sn, s = t % sn;
            sw[i * ATTN_OUT_KEYS + s] = (acc_t)wh[(u64)i * n + s0 + s];
        }
        for (u32 s = threadIdx.x; s < sn; s += blockDim.x) {
            const u32 ki = k0 + s0 + s;
            sid[s] = ids ? ids[ki] : ki;
        }
        __syncthreads();
        for (u32 s = 0; live && s < sn; ++s) {
            const K key(keys + (u64)sid[s] * stride, a, b);
            const acc_t kv = (acc_t)key(cc);
#pragma unroll
            for (u32 i = 0; i < ATTN_HT; ++i) {
                if (i < hn) {
                    const acc_t wv = sw[i * ATTN_OUT_KEYS + s];
                    num[i] += wv * kv;
                    den[i] += wv;
                }
            }
        }
    }
#pragma unroll
    for (u32 i = 0; live && i < ATTN_HT; ++i) {
        if (i < hn) {
            const u64 rh = (u64)r * heads + h0 + i;
            out[rh * dim + c] = (float)(num[i] / (den[i] + (acc_t)sinkw[rh]));
        }
    }
}

extern "C" __global__ void attn_out(const double* __restrict__ wts, const double* __restrict__ sinkw,
                                    const float* __restrict__ keys,
                                    const u32* __restrict__ starts,
                                    const u32* __restrict__ ids, float* __restrict__ out,
                                    u32 dim, u32 heads, u32 row0) {
    attn_out_impl<attn_f32_key>(wts, sinkw, reinterpret_cast<const u8*>(keys), dim * 4u, 0u, 0u,
                                starts, ids, out, dim, heads, row0);
}
extern "C" __global__ void attn_out_bf16(const double* __restrict__ wts,
                                         const double* __restrict__ sinkw,
                                         const u8* __restrict__ keys,
                                         const u32* __restrict__ starts,
                                         const u32* __restrict__ ids, float* __restrict__ out,
                                         u32 dim, u32 heads, u32 row0, u32 stride, u32 a, u32 b) {
    attn_out_impl<cache_bf16>(wts, sinkw, keys, stride, a, b, starts, ids, out, dim, heads, row0);
}
extern "C" __global__ void attn_out_kv_fp8(const double* __restrict__ wts,
                                           const double* __restrict__ sinkw,
                                           const u8* __restrict__ keys,
                                           const u32* __restrict__ starts,
                                           const u32* __restrict__ ids, float* __restrict__ out,
                                           u32 dim, u32 heads, u32 row0, u32 stride, u32 a, u32 b) {
    attn_out_impl<cache_kv_fp8>(wts, sinkw, keys, stride, a, b, starts, ids, out, dim, heads,
                                row0);
}

// Attention-side kernels: compressor softmax pooling, indexer scores, and the three launches of
// sparse attention with a per-head sink (logits, then max and e^(l−max) per head, then the
// weighted sum and denominator). Every sum runs in the reference's order (with f64
// accumulation the results are the reference's bits), so it never depends on the batch.
// Sums start at −0.0 as Rust's f64 `Sum` does, so even signed zeros match the reference.
#include "common.cuh"

// Query floats the indexer keeps in shared memory (heads·dim up to this; else read from global).
#define ATTN_Q_SHARED 8192
// Heads one thread of the indexer and of attn_logits handles at a time (a key row is read once
// per this many heads; the head dots run side by side, each in channel order).
#define ATTN_HT 8

// −∞ as a float / double.
__device__ __forceinline__ float attn_neg_inf_f() { return __uint_as_float(0xff800000u); }
__device__ __forceinline__ double attn_neg_inf_d() {
    return __longlong_as_double((long long)0xfff0000000000000ull);
}

// attn_softmax_pool: a, z = [rows, width]; out[c] = Σ_r e^(z_rc − max_c)·a_rc / Σ_r e^(z_rc − max_c)
// over the rows with z_rc ≠ −∞ (0 when there are none). One thread per column, rows in order;
// grid ceil(width/256) × 256.
extern "C" __global__ void attn_softmax_pool(const float* __restrict__ a,
                                             const float* __restrict__ z, float* __restrict__ out,
                                             u32 rows, u32 width) {
    const u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    float mx = attn_neg_inf_f();
    for (u32 r = 0; r < rows; ++r) mx = fmaxf(mx, __ldg(z + (u64)r * width + c));
    acc_t num = (acc_t)-0.0;
    acc_t den = (acc_t)-0.0;
    for (u32 r = 0; r < rows; ++r) {
        const float zr = __ldg(z + (u64)r * width + c);
        if (zr == attn_neg_inf_f()) continue;
        const acc_t e = (acc_t)exp((double)zr - (double)mx);
        num += e * (acc_t)__ldg(a + (u64)r * width + c);
        den += e;
    }
    out[c] = den > (acc_t)0.0 ? (float)(num / den) : 0.0f;
}

// attn_indexer_scores: q = [heads, dim], w = [heads], keys = [n, dim];
// out[j] = Σ_h w[h]·max(q_h·K_j, 0). One thread per key: each dot runs over the channels in
// order and the heads are summed in order, as the reference does. The queries sit in shared
// memory (read as broadcasts). Grid ceil(n/128) × 128.
extern "C" __global__ void attn_indexer_scores(const float* __restrict__ q,
                                               const float* __restrict__ w,
                                               const float* __restrict__ keys,
                                               float* __restrict__ out, u32 n, u32 dim,
                                               u32 heads) {
    __shared__ float sq[ATTN_Q_SHARED];
    const u64 hd = (u64)heads * dim;
    const bool shared_q = hd <= ATTN_Q_SHARED;
    if (shared_q) {
        for (u32 i = threadIdx.x; i < hd; i += blockDim.x) sq[i] = __ldg(q + i);
    }
    __syncthreads();
    const float* qq = shared_q ? sq : q;
    const u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) {
        const float* kj = keys + j * dim;
        acc_t total = (acc_t)-0.0;
        for (u32 h0 = 0; h0 < heads; h0 += ATTN_HT) {
            const u32 hn = min(heads - h0, (u32)ATTN_HT);
            const float* qh = qq + (u64)h0 * dim;
            acc_t d[ATTN_HT];
#pragma unroll
            for (u32 i = 0; i < ATTN_HT; ++i) d[i] = (acc_t)-0.0;
            for (u32 c = 0; c < dim; ++c) {
                const acc_t kv = (acc_t)__ldg(kj + c);
#pragma unroll
                for (u32 i = 0; i < ATTN_HT; ++i) {
                    if (i < hn) d[i] += (acc_t)qh[(u64)i * dim + c] * kv;
                }
            }
#pragma unroll
            for (u32 i = 0; i < ATTN_HT; ++i) {
                if (i < hn) total += (acc_t)__ldg(w + h0 + i) * fmax(d[i], (acc_t)0.0);
            }
        }
        out[j] = (float)total;
    }
}

// Sparse attention, launch 1: q = [heads, dim], keys = [n, dim];
// logits[h·n + s] = (q_h·K_s)·scale, each dot over the channels in order. One thread per
// (key, group of ATTN_HT heads): grid (ceil(n/128), ceil(heads/ATTN_HT)) × 128.
extern "C" __global__ void attn_logits(const float* __restrict__ q, const float* __restrict__ keys,
                                       double* __restrict__ logits, u32 n, u32 dim, u32 heads,
                                       float scale) {
    const u64 s = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 h0 = blockIdx.y * ATTN_HT;
    if (s >= n) return;
    const u32 hn = min(heads - h0, (u32)ATTN_HT);
    const float* ks = keys + s * dim;
    const float* qh = q + (u64)h0 * dim;
    acc_t d[ATTN_HT];
#pragma unroll
    for (u32 i = 0; i < ATTN_HT; ++i) d[i] = (acc_t)-0.0;
    for (u32 c = 0; c < dim; ++c) {
        const acc_t kv = (acc_t)__ldg(ks + c);
#pragma unroll
        for (u32 i = 0; i < ATTN_HT; ++i) {
            if (i < hn) d[i] += (acc_t)__ldg(qh + (u64)i * dim + c) * kv;
        }
    }
#pragma unroll
    for (u32 i = 0; i < ATTN_HT; ++i) {
        if (i < hn) logits[(u64)(h0 + i) * n + s] = (double)(d[i] * (acc_t)scale);
    }
}

// Launch 2: one 256-thread block per head. mx = max(sink_h, max_s logits[h, s]) (NaN ignored, as
// f64::max does), then logits[h, s] ← e^(logits[h, s] − mx) in place and
// sinkw[h] = e^(sink_h − mx), all in f64.
extern "C" __global__ void attn_softmax(double* __restrict__ logits, const float* __restrict__ sink,
                                        double* __restrict__ sinkw, u32 n) {
    __shared__ double part[32];
    const u64 h = blockIdx.x;
    double* lh = logits + h * n;
    const double sk = (double)sink[h];
    double mx = attn_neg_inf_d();
    for (u32 s = threadIdx.x; s < n; s += blockDim.x) mx = fmax(mx, lh[s]);
    for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = sk;
    for (u32 wi = 0; wi < (blockDim.x >> 5); ++wi) mx = fmax(mx, part[wi]);
    for (u32 s = threadIdx.x; s < n; s += blockDim.x) lh[s] = exp(lh[s] - mx);
    if (threadIdx.x == 0) sinkw[h] = exp(sk - mx);
}

// Launch 3: out[h, c] = Σ_s w[h, s]·K[s, c] / (Σ_s w[h, s] + sinkw[h]), both sums over s in
// order (each thread of head h forms the same denominator). One thread per (head, channel):
// grid (ceil(dim/256), heads).
extern "C" __global__ void attn_out(const double* __restrict__ wts, const double* __restrict__ sinkw,
                                    const float* __restrict__ keys, float* __restrict__ out, u32 n,
                                    u32 dim) {
    const u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 h = blockIdx.y;
    if (c >= dim) return;
    const double* wh = wts + h * n;
    acc_t num = (acc_t)-0.0;
    acc_t den = (acc_t)-0.0;
    for (u32 s = 0; s < n; ++s) {
        const acc_t wv = (acc_t)wh[s];
        num += wv * (acc_t)__ldg(keys + (u64)s * dim + c);
        den += wv;
    }
    out[h * dim + c] = (float)(num / (den + (acc_t)sinkw[h]));
}

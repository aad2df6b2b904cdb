// Row-wise and element-wise kernels: act_quant_fp8, rms_norm, rope, hadamard, router_scores,
// swiglu (and swiglu_rows) and round_index_rows (bf16 / fp8 / fp4). Every one works in place or
// writes a separate output; none mixes rows. Codecs come from namespace codec (linear.cu).
//
// Launch shapes (ops/rows.rs): element kernels 256 threads per block, one thread per value;
// act_quant_fp8 and round_index_fp4 one warp per block of 128 / 32 values of a row (4 warps per
// block); round_index_fp8 one warp per row; rms_norm and hadamard one 256-thread block per row.
#include "common.cuh"
#include "codec.cuh"

#define ROWS_THREADS 256
#define ROWS_WARPS (ROWS_THREADS / DSV4_WARP)
#define HAD_MAX 1024

// act_quant_fp8 in place: x is [rows, dim]; each row is cut into 1×128 blocks (the last may be
// shorter), one warp per block. The scale is 2^ceil(log2(max(amax, 1e-4)/448)), the quotient in
// f64 as the reference forms it.
extern "C" __global__ void act_quant_fp8(float* __restrict__ x, u32 rows, u32 dim) {
    const u32 lane = threadIdx.x % DSV4_WARP;
    const u64 wid = (u64)blockIdx.x * (blockDim.x / DSV4_WARP) + threadIdx.x / DSV4_WARP;
    const u32 nb = (dim + 127u) / 128u;
    if (wid >= (u64)rows * nb) return; // whole warps
    const u32 row = (u32)(wid / nb);
    const u32 b0 = (u32)(wid % nb) * 128u;
    const u32 len = min(128u, dim - b0);
    float* blk = x + (u64)row * dim + b0;
    float v[4];
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const u32 j = lane + 32u * (u32)k;
        v[k] = j < len ? blk[j] : 0.0f;
        m = fmaxf(m, fabsf(v[k]));
    }
    const float amax = warp_max(m);
    const double q = (double)fmaxf(amax, 1e-4f) / 448.0;
    const int e = isinf(amax) ? 127 : codec::ceil_log2(q);
    const float scale = codec::pow2f(e);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const u32 j = lane + 32u * (u32)k;
        if (j < len) blk[j] = codec::e4m3_to_f32(codec::f32_to_e4m3(v[k] / scale)) * scale;
    }
}

// rms_norm: out = x / sqrt(mean(x²) + eps) · w (w when has_w); one block per row. Each thread
// sums its strided squares, warps reduce with warp_sum, warp partials are added in warp order.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ out, u32 dim, float eps, u32 has_w) {
    __shared__ acc_t part[ROWS_WARPS];
    const u64 base = (u64)blockIdx.x * dim;
    acc_t s = (acc_t)0;
    for (u32 c = threadIdx.x; c < dim; c += ROWS_THREADS) {
        const acc_t v = (acc_t)x[base + c];
        s += v * v;
    }
    s = warp_sum(s);
    if (threadIdx.x % DSV4_WARP == 0u) part[threadIdx.x / DSV4_WARP] = s;
    __syncthreads();
    acc_t tot = (acc_t)0;
#pragma unroll
    for (int k = 0; k < ROWS_WARPS; k++) tot += part[k];
    const acc_t r = (acc_t)1 / sqrt(tot / (acc_t)dim + (acc_t)eps);
    for (u32 c = threadIdx.x; c < dim; c += ROWS_THREADS) {
        const acc_t wv = has_w != 0u ? (acc_t)w[c] : (acc_t)1;
        out[base + c] = (float)((acc_t)x[base + c] * r * wv);
    }
}

// rope in place: rotate pair i of the last rd dims of each row by ±p·θ_i; one thread per
// (row, pair). The angle, sin and cos are formed in f64 (positions reach 2^20 and beyond).
extern "C" __global__ void rope(float* __restrict__ x, const u64* __restrict__ pos,
                                const double* __restrict__ theta, u32 rows, u32 dim, u32 rd,
                                u32 pairs, u32 inverse) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)rows * pairs) return;
    const u32 row = (u32)(t / pairs);
    const u32 i = (u32)(t % pairs);
    const double p = (double)pos[row];
    const double angle = inverse != 0u ? -p * theta[i] : p * theta[i];
    const double s = sin(angle);
    const double c = cos(angle);
    float* tail = x + (u64)row * dim + (dim - rd) + 2u * i;
    const double a = (double)tail[0];
    const double b = (double)tail[1];
    tail[0] = (float)(a * c - b * s);
    tail[1] = (float)(a * s + b * c);
}

// hadamard in place: one 256-thread block per row runs the log2(dim) butterfly stages of the
// Sylvester transform in shared memory (dim a power of two ≤ HAD_MAX), then scales by
// 1/sqrt(dim).
extern "C" __global__ void hadamard(float* __restrict__ x, u32 dim) {
    __shared__ acc_t h[HAD_MAX];
    const u64 base = (u64)blockIdx.x * dim;
    for (u32 c = threadIdx.x; c < dim; c += ROWS_THREADS) h[c] = (acc_t)x[base + c];
    __syncthreads();
    for (u32 s = 1; s < dim; s *= 2u) {
        for (u32 k = threadIdx.x; k < dim / 2u; k += ROWS_THREADS) {
            const u32 i = (k / s) * 2u * s + (k % s);
            const acc_t a = h[i];
            const acc_t b = h[i + s];
            h[i] = a + b;
            h[i + s] = a - b;
        }
        __syncthreads();
    }
    const acc_t norm = (acc_t)1 / sqrt((acc_t)dim);
    for (u32 c = threadIdx.x; c < dim; c += ROWS_THREADS) x[base + c] = (float)(h[c] * norm);
}

// router_scores: sqrt(softplus(x)) element-wise, in f64 (softplus without overflow).
extern "C" __global__ void router_scores(const float* __restrict__ logits, float* __restrict__ out,
                                         u64 n) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double x = (double)logits[i];
    const double sp = x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
    out[i] = (float)sqrt(sp);
}

// silu(min(g, L))·clamp(u, −L, L)·weight of one value, in f64. min ignores a NaN g as f32::min
// does; the clamp keeps a NaN u as f32::clamp does.
__device__ __forceinline__ float swiglu_one(float g, float u, float limit, float weight) {
    const double gv = (double)fminf(g, limit);
    const float uc = u < -limit ? -limit : (u > limit ? limit : u);
    const double silu = gv / (1.0 + exp(-gv));
    return (float)(silu * (double)uc * (double)weight);
}

// swiglu: swiglu_one element-wise with one weight.
extern "C" __global__ void swiglu(const float* __restrict__ g, const float* __restrict__ u,
                                  float* __restrict__ out, u64 n, float limit, float weight) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = swiglu_one(g[i], u[i], limit, weight);
}

// swiglu_rows: swiglu_one element-wise over rows of `width` values, row r weighted by w[r] (the
// device-resident form of one swiglu call per row). No __restrict__: out may be g or u (each
// thread reads its own element before it writes it).
extern "C" __global__ void swiglu_rows(const float* g, const float* u, float* out,
                                       const float* __restrict__ w, u64 n, u32 width,
                                       float limit) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = swiglu_one(g[i], u[i], limit, w[i / width]);
}

// round_index_rows, bf16: round every value to bf16 in place.
extern "C" __global__ void round_index_bf16(float* __restrict__ x, u64 n) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = codec::bf16_to_f32(codec::f32_to_bf16(x[i]));
}

// round_index_rows, fp8: one warp per row; scale = max(amax, 1e-4)/448 in f32, values
// e4m3(x / scale)·scale.
extern "C" __global__ void round_index_fp8(float* __restrict__ x, u32 rows, u32 dim) {
    const u32 lane = threadIdx.x % DSV4_WARP;
    const u64 row = (u64)blockIdx.x * (blockDim.x / DSV4_WARP) + threadIdx.x / DSV4_WARP;
    if (row >= rows) return; // whole warps
    float* xr = x + row * dim;
    float m = 0.0f;
    for (u32 j = lane; j < dim; j += DSV4_WARP) m = fmaxf(m, fabsf(xr[j]));
    const float scale = fmaxf(warp_max(m), 1e-4f) / 448.0f;
    for (u32 j = lane; j < dim; j += DSV4_WARP) {
        xr[j] = codec::e4m3_to_f32(codec::f32_to_e4m3(xr[j] / scale)) * scale;
    }
}

// round_index_rows, fp4: one warp per block of 32 values of a row (a shorter last block is its
// own block), lane = value. A block holding NaN reads back as NaN (scale code 255, codes 0).
extern "C" __global__ void round_index_fp4(float* __restrict__ x, u32 rows, u32 dim) {
    const u32 lane = threadIdx.x % DSV4_WARP;
    const u64 wid = (u64)blockIdx.x * (blockDim.x / DSV4_WARP) + threadIdx.x / DSV4_WARP;
    const u32 nb = (dim + 31u) / 32u;
    if (wid >= (u64)rows * nb) return; // whole warps
    const u32 b0 = (u32)(wid % nb) * 32u;
    const bool live = b0 + lane < dim;
    float* p = x + (wid / nb) * dim + b0 + lane;
    const float v = live ? *p : 0.0f;
    const bool nan = codec::warp_any(live && isnan(v));
    const float amax = warp_max(fabsf(v));
    const int e = codec::pow2_scale_exponent(amax, codec::e2m1_floor(), 6.0f);
    const float scale = nan ? codec::nan_f32() : codec::pow2_scale(e);
    const u32 code = nan ? 0u : codec::f32_to_e2m1(v / scale);
    if (live) *p = codec::e2m1_to_f32(code) * scale;
}

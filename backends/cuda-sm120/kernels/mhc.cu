// mHC kernels (spec §3.1): the mixing logits of each token's flattened streams, the per-token
// coefficients (pre, post, Sinkhorn-normalised comb), the pre-weighted stream sum u (or the
// head's merge), and the post mix. Mixing logits and pre coefficients stay on the device in f64
// scratch between launches. Every output's reduction order depends only on the shapes (M, D),
// never on the token count T, so a token's result is the same alone or inside a batch.
#include "common.cuh"

// Threads per block of mhc_mix (a multiple of 32, at most 32 warps).
#define MHC_MIX_THREADS 256
// Largest stream count M (the Sinkhorn matrix is M×M in registers / local memory).
#define MHC_MAX_M 8

// Block-wide sum of one acc_t per thread in a fixed order: each warp by the xor butterfly, then
// the warp totals in warp order. `part` is the kernel's shared scratch of at least 32 entries.
// Every thread of the block must call it; every thread gets the same bits.
__device__ __forceinline__ acc_t mhc_block_sum(acc_t v, acc_t* part) {
    const u32 lane = threadIdx.x & 31u;
    const u32 warp = threadIdx.x >> 5;
    const u32 warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    acc_t s = part[0];
    for (u32 w = 1; w < warps; ++w) s += part[w];
    __syncthreads();
    return s;
}

// Mixing outputs one mhc_mix block computes: each x value is read and converted once for all of
// them (with f64 sums the f32→f64 conversions, not the FP64 work, bound this kernel).
#define MHC_MIX_OUTS 8

// mhc_mix: x = streams [T, md], fn_w = [nout, md]; mix[t·nout + o] = (fn_w[o]·x̂_t)·r_t with
// r_t = 1/sqrt(mean(x̂_t²) + norm_eps). Grid (T, ceil(nout/MHC_MIX_OUTS)) blocks (block (t, g) →
// token t, outputs g·MHC_MIX_OUTS ..) of MHC_MIX_THREADS threads; for x̂_t² and each output, each
// thread sums a strided slice in order, then the block sum: the same order whatever the grid.
extern "C" __global__ void mhc_mix(const float* __restrict__ x, const float* __restrict__ fn_w,
                                   double* __restrict__ mix, u32 md, u32 nout, float norm_eps) {
    __shared__ acc_t part[32];
    const u64 ti = blockIdx.x;
    const u32 o0 = blockIdx.y * MHC_MIX_OUTS;
    const u32 on = min(nout - o0, (u32)MHC_MIX_OUTS);
    const float* xt = x + ti * (u64)md;
    const float* w = fn_w + (u64)o0 * md;
    acc_t ss = (acc_t)-0.0;
    acc_t dot[MHC_MIX_OUTS];
#pragma unroll
    for (u32 j = 0; j < MHC_MIX_OUTS; ++j) dot[j] = (acc_t)-0.0;
    for (u32 c = threadIdx.x; c < md; c += blockDim.x) {
        const acc_t v = (acc_t)__ldg(xt + c);
        ss = acc_mac(v, v, ss);
#pragma unroll
        for (u32 j = 0; j < MHC_MIX_OUTS; ++j) {
            if (j < on) dot[j] = acc_mac((acc_t)__ldg(w + (u64)j * md + c), v, dot[j]);
        }
    }
    ss = mhc_block_sum(ss, part);
    const acc_t r = (acc_t)1.0 / sqrt(ss / (acc_t)md + (acc_t)norm_eps);
    for (u32 j = 0; j < on; ++j) { // `on` is the block's: every thread reaches each block sum
        const acc_t d = mhc_block_sum(dot[j], part);
        if (threadIdx.x == 0) mix[ti * nout + o0 + j] = (double)(d * r);
    }
}

__device__ __forceinline__ double mhc_sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

// mhc_coef: one thread per token, all in f64 (M×M work per token). coef = [base (nout), scale…].
// pre[t·m + j] = σ(mix_j·scale0 + base_j) + hc_eps. With full != 0 (a sublayer, nout = (2+M)·M)
// also post[t·m + k] = 2σ(mix_{M+k}·scale1 + base_{M+k}) and comb[t, M, M] = Sinkhorn of
// mix_{2M+i}·scale2 + base_{2M+i}, exactly as dsv4_kernels::mhc::sinkhorn.
// Grid ceil(T/64) blocks of 64 threads.
extern "C" __global__ void mhc_coef(const double* __restrict__ mix, const float* __restrict__ coef,
                                    double* __restrict__ pre, float* __restrict__ post,
                                    float* __restrict__ comb, u32 t, u32 m, u32 nout, u32 iters,
                                    float hc_eps, u32 full) {
    const u32 ti = blockIdx.x * blockDim.x + threadIdx.x;
    if (ti >= t) return;
    const double* mx = mix + (u64)ti * nout;
    const double eps = (double)hc_eps;
    const double s0 = (double)coef[nout];
    for (u32 j = 0; j < m; ++j) {
        pre[(u64)ti * m + j] = mhc_sigmoid(mx[j] * s0 + (double)coef[j]) + eps;
    }
    if (full == 0) return;
    const double s1 = (double)coef[nout + 1];
    const double s2 = (double)coef[nout + 2];
    for (u32 k = 0; k < m; ++k) {
        post[(u64)ti * m + k] = (float)(2.0 * mhc_sigmoid(mx[m + k] * s1 + (double)coef[m + k]));
    }
    double c[MHC_MAX_M * MHC_MAX_M];
    for (u32 j = 0; j < m; ++j) {
        double mxv = __longlong_as_double((long long)0xfff0000000000000ull);  // -inf
        for (u32 k = 0; k < m; ++k) {
            const u32 i = j * m + k;
            c[i] = mx[2 * m + i] * s2 + (double)coef[2 * m + i];
            mxv = fmax(mxv, c[i]);
        }
        double sum = -0.0;
        for (u32 k = 0; k < m; ++k) sum += exp(c[j * m + k] - mxv);
        for (u32 k = 0; k < m; ++k) c[j * m + k] = exp(c[j * m + k] - mxv) / sum + eps;
    }
    for (u32 it = 0; it < max(iters, 1u); ++it) {
        if (it > 0) {
            for (u32 j = 0; j < m; ++j) {
                double s = -0.0;
                for (u32 k = 0; k < m; ++k) s += c[j * m + k];
                for (u32 k = 0; k < m; ++k) c[j * m + k] /= s + eps;
            }
        }
        for (u32 k = 0; k < m; ++k) {
            double s = -0.0;
            for (u32 j = 0; j < m; ++j) s += c[j * m + k];
            for (u32 j = 0; j < m; ++j) c[j * m + k] /= s + eps;
        }
    }
    for (u32 i = 0; i < m * m; ++i) comb[(u64)ti * m * m + i] = (float)c[i];
}

// mhc_weighted: out[t, c] = Σ_j pre[t, j]·x[t, j, c] (j in order): u of mhc_pre, or the head's
// merge. x = [T, M, D], pre = [T, M]. One thread per (token, channel); grid ceil(T·D/256) × 256.
extern "C" __global__ void mhc_weighted(const float* __restrict__ x, const double* __restrict__ pre,
                                        float* __restrict__ out, u32 t, u32 m, u32 d) {
    const u64 id = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (u64)t * d) return;
    const u64 ti = id / d;
    const u64 c = id % d;
    const float* xt = x + ti * m * (u64)d;
    acc_t s = (acc_t)-0.0;
    for (u32 j = 0; j < m; ++j) s += (acc_t)pre[ti * m + j] * (acc_t)__ldg(xt + (u64)j * d + c);
    out[id] = (float)s;
}

// mhc_post: out[t, k, c] = post[t, k]·y[t, c] + Σ_j comb[t, j, k]·x[t, j, c] (j in order).
// x, out = [T, M, D], y = [T, D], post = [T, M], comb = [T, M, M]. One thread per output
// element; grid ceil(T·M·D/256) × 256.
extern "C" __global__ void mhc_post(const float* __restrict__ x, const float* __restrict__ y,
                                    const float* __restrict__ post,
                                    const float* __restrict__ comb, float* __restrict__ out, u32 t,
                                    u32 m, u32 d) {
    const u64 id = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 md = (u64)m * d;
    if (id >= (u64)t * md) return;
    const u64 ti = id / md;
    const u64 k = (id / d) % m;
    const u64 c = id % d;
    const float* xt = x + ti * md;
    const float* ct = comb + ti * m * m;
    acc_t mixed = (acc_t)-0.0;
    for (u32 j = 0; j < m; ++j) mixed += (acc_t)ct[(u64)j * m + k] * (acc_t)__ldg(xt + (u64)j * d + c);
    out[id] = (float)((acc_t)post[ti * m + k] * (acc_t)__ldg(y + ti * d + c) + mixed);
}

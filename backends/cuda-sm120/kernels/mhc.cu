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

// Mixing outputs and tokens one mhc_mix block computes: each x value is read and converted once
// for the outputs, each fn_w value once for the tokens (with f64 sums the f32→f64 conversions,
// not the FP64 work, bound this kernel; with f32 sums the fn_w rereads per token do).
#define MHC_MIX_OUTS 8
#define MHC_MIX_TOKENS 4
// Sums per thread: per token, its squares and its MHC_MIX_OUTS dot products.
#define MHC_MIX_SUMS (MHC_MIX_TOKENS * (1 + MHC_MIX_OUTS))

// mhc_mix: x = streams [t, md], fn_w = [nout, md]; mix[i·nout + o] = (fn_w[o]·x̂_i)·r_i with
// r_i = 1/sqrt(mean(x̂_i²) + norm_eps). Grid (ceil(t/MHC_MIX_TOKENS), ceil(nout/MHC_MIX_OUTS))
// blocks of MHC_MIX_THREADS threads; block (g, h) computes tokens g·4 .. and outputs h·8 ... For
// each token's squares and each (token, output) dot product, each thread sums a strided slice in
// order, then the block sum (each warp by the xor butterfly, then the warp totals in warp order),
// all the block's sums sharing its barriers: the same bits whatever the grid, so a token's result
// never depends on its batch.
extern "C" __global__ void mhc_mix(const float* __restrict__ x, const float* __restrict__ fn_w,
                                   double* __restrict__ mix, u32 md, u32 nout, float norm_eps,
                                   u32 t) {
    __shared__ acc_t part[MHC_MIX_SUMS][32];
    __shared__ acc_t total[MHC_MIX_SUMS];
    const u32 t0 = blockIdx.x * MHC_MIX_TOKENS;
    const u32 tn = min(t - t0, (u32)MHC_MIX_TOKENS);
    const u32 o0 = blockIdx.y * MHC_MIX_OUTS;
    const u32 on = min(nout - o0, (u32)MHC_MIX_OUTS);
    const float* w = fn_w + (u64)o0 * md;
    const float* xt = x + (u64)t0 * md;
    acc_t sums[MHC_MIX_TOKENS][1 + MHC_MIX_OUTS];
#pragma unroll
    for (u32 k = 0; k < MHC_MIX_TOKENS; ++k) {
#pragma unroll
        for (u32 j = 0; j <= MHC_MIX_OUTS; ++j) sums[k][j] = (acc_t)-0.0;
    }
    for (u32 c = threadIdx.x; c < md; c += blockDim.x) {
        acc_t wv[MHC_MIX_OUTS];
#pragma unroll
        for (u32 j = 0; j < MHC_MIX_OUTS; ++j) {
            wv[j] = j < on ? (acc_t)__ldg(w + (u64)j * md + c) : (acc_t)0.0;
        }
#pragma unroll
        for (u32 k = 0; k < MHC_MIX_TOKENS; ++k) {
            if (k < tn) {
                const acc_t v = (acc_t)__ldg(xt + (u64)k * md + c);
                sums[k][0] = acc_mac(v, v, sums[k][0]);
#pragma unroll
                for (u32 j = 0; j < MHC_MIX_OUTS; ++j) {
                    sums[k][1 + j] = acc_mac(wv[j], v, sums[k][1 + j]);
                }
            }
        }
    }
    // Each warp's totals (every lane gets them), lane 0 keeps them; then thread s adds sum s's
    // warp totals in warp order.
    const u32 lane = threadIdx.x & 31u;
    const u32 warp = threadIdx.x >> 5;
    const u32 warps = blockDim.x >> 5;
#pragma unroll
    for (u32 k = 0; k < MHC_MIX_TOKENS; ++k) {
#pragma unroll
        for (u32 j = 0; j <= MHC_MIX_OUTS; ++j) {
            const acc_t v = warp_sum(sums[k][j]);
            if (lane == 0) part[k * (1 + MHC_MIX_OUTS) + j][warp] = v;
        }
    }
    __syncthreads();
    if (threadIdx.x < MHC_MIX_SUMS) {
        acc_t s = part[threadIdx.x][0];
        for (u32 wi = 1; wi < warps; ++wi) s += part[threadIdx.x][wi];
        total[threadIdx.x] = s;
    }
    __syncthreads();
    if (threadIdx.x < MHC_MIX_TOKENS * MHC_MIX_OUTS) {
        const u32 k = threadIdx.x / MHC_MIX_OUTS;
        const u32 j = threadIdx.x % MHC_MIX_OUTS;
        if (k < tn && j < on) {
            const acc_t ss = total[k * (1 + MHC_MIX_OUTS)];
            const acc_t r = (acc_t)1.0 / sqrt(ss / (acc_t)md + (acc_t)norm_eps);
            const acc_t d = total[k * (1 + MHC_MIX_OUTS) + 1 + j];
            mix[(u64)(t0 + k) * nout + o0 + j] = (double)(d * r);
        }
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

#include "common.cuh"
// Kernels that measure the device itself for `dsv4 bench --backend cuda-sm120`: the copy
// bandwidth decode GEMV is judged against, the SIMT f32 and f64 FMA rates, and the tensor-core
// (mma.sync) bf16 and fp8 rates prefill GEMM is judged against. The mma kernels are inline PTX,
// so they only exist on the device (sm_80+ for bf16, sm_89+ for fp8); the emulator compiles an
// empty body and the host does not time them there.

struct alignas(16) dsv4_v4 {
    u32 x, y, z, w;
};

// dst = src, `n_vec` 16-byte vectors, grid-stride loop (coalesced 128-bit loads and stores).
extern "C" __global__ void bench_copy(const dsv4_v4* __restrict__ src, dsv4_v4* __restrict__ dst,
                                      u64 n_vec) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += stride) dst[i] = src[i];
}

// Eight independent FMA chains of `iters` steps per thread in T (float or double): 16·iters
// flops per thread.
template <typename T>
__device__ __forceinline__ void bench_fma_chains(T* out, u32 iters, T b, T c) {
    u32 t = blockIdx.x * blockDim.x + threadIdx.x;
    T a0 = (T)(t & 7), a1 = a0 + (T)1, a2 = a0 + (T)2, a3 = a0 + (T)3;
    T a4 = a0 + (T)4, a5 = a0 + (T)5, a6 = a0 + (T)6, a7 = a0 + (T)7;
    for (u32 i = 0; i < iters; ++i) {
        a0 = fma(a0, b, c);
        a1 = fma(a1, b, c);
        a2 = fma(a2, b, c);
        a3 = fma(a3, b, c);
        a4 = fma(a4, b, c);
        a5 = fma(a5, b, c);
        a6 = fma(a6, b, c);
        a7 = fma(a7, b, c);
    }
    out[t] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

// The SIMT f32 FMA rate.
extern "C" __global__ void bench_fma(float* out, u32 iters, float b, float c) {
    bench_fma_chains<float>(out, iters, b, c);
}

// The SIMT f64 FMA rate, which f64-sum kernels (sm_80/sm_90) are judged against.
extern "C" __global__ void bench_fma64(double* out, u32 iters, double b, double c) {
    bench_fma_chains<double>(out, iters, b, c);
}

// The body of an mma peak kernel: four independent accumulator chains of `iters` steps per warp,
// each step one `INSTR` (an m16n8kK mma.sync with f32 accumulators) per chain, operands `A`
// (4 registers) and `B` (2 registers); the sum is stored so nothing is optimized away.
#define DSV4_MMA_PEAK(INSTR, A, B)                                                            \
    u32 a = (A) + (t & 1u), b = (B);                                                         \
    float d[4][4];                                                                           \
    for (int j = 0; j < 4; ++j)                                                              \
        for (int k = 0; k < 4; ++k) d[j][k] = 0.0f;                                          \
    for (u32 i = 0; i < iters; ++i) {                                                        \
        _Pragma("unroll") for (int j = 0; j < 4; ++j) asm volatile(                          \
            INSTR " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                  \
            : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])                     \
            : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b));                               \
    }                                                                                        \
    float s = 0.0f;                                                                          \
    for (int j = 0; j < 4; ++j)                                                              \
        for (int k = 0; k < 4; ++k) s += d[j][k];                                            \
    out[t] = s;

// m16n8k16 bf16 mma.sync: 4·4096 flops per warp-step.
extern "C" __global__ void bench_mma_bf16(float* out, u32 iters) {
    u32 t = blockIdx.x * blockDim.x + threadIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    DSV4_MMA_PEAK("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 0x3c003c00u, 0x3c003c00u)
#else
    out[t] = (float)iters;
#endif
}

// m16n8k32 e4m3 mma.sync (sm_89+): 4·8192 flops per warp-step.
extern "C" __global__ void bench_mma_fp8(float* out, u32 iters) {
    u32 t = blockIdx.x * blockDim.x + threadIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    DSV4_MMA_PEAK("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", 0x30303030u, 0x30303030u)
#else
    out[t] = (float)iters;
#endif
}

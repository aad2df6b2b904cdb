// Shared helpers of the dsv4 CUDA kernels.
//
// Every .cu file is compiled twice: by NVRTC for the device's own architecture (sm_80 … sm_120),
// and by the host C++ compiler under emu/shim.h for the CPU emulator (cuda-emu) that the tests
// diff against the reference backend. Use only what both provide (see emu/shim.h for the list):
// no CUDA headers, bf16/e4m3/e2m1 through bit manipulation. NVRTC runs with --fmad=false and the
// emulator with -ffp-contract=off, so both round every operation the same way.
//
// DSV4_ACC_F64 (defined by the host on devices with full-rate FP64: sm_80, sm_90, sm_100, and on
// request) makes acc_t double: sums of exact f32 products in f64, as the reference does.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#ifdef DSV4_ACC_F64
typedef double acc_t;
#else
typedef float acc_t;
#endif

// acc + a·b for f32 values a, b (given as acc_t). With f64 sums the product of two f32 values is
// exact, so one fma rounds exactly as the reference's acc + a·b and takes one FP64 instruction
// instead of two; with f32 sums it stays a multiply and an add (an fma would round differently).
__device__ __forceinline__ acc_t acc_mac(acc_t a, acc_t b, acc_t acc) {
#ifdef DSV4_ACC_F64
    return fma(a, b, acc);
#else
    return acc + a * b;
#endif
}

// Threads per warp.
#define DSV4_WARP 32

// Sum over the 32 lanes of a warp by an xor butterfly; every lane gets the same bits (a + b ==
// b + a at every step), and the order does not depend on anything but the lane values.
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Max over the 32 lanes of a warp (every lane gets it).
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

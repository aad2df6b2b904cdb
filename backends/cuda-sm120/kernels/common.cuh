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
// instead of two; with f32 sums it stays a multiply and an add (the attention-side kernels; the
// linear kernels fuse theirs, lin_mac in lin_decode.cuh).
__device__ __forceinline__ acc_t acc_mac(acc_t a, acc_t b, acc_t acc) {
#ifdef DSV4_ACC_F64
    return fma(a, b, acc);
#else
    return acc + a * b;
#endif
}

// Threads per warp.
#define DSV4_WARP 32

// PTX prmt.b32 in its generic mode: byte n of the result is byte (s >> 4n) & 7 of the 8 bytes
// b:a (a's low byte is byte 0), or, when bit 3 of that selector nibble is set, that byte's bit
// 7 copied into all 8 bits. (__byte_perm has no sign-copy mode, hence the asm.)
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 s) {
#if defined(__CUDA_ARCH__)
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
#else
    const u64 v = ((u64)b << 32) | a;
    u32 r = 0u;
    for (int n = 0; n < 4; n++) {
        const u32 sel = (s >> (4 * n)) & 0xfu;
        u32 byte = (u32)(v >> (8u * (sel & 7u))) & 0xffu;
        if (sel & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
        r |= byte << (8 * n);
    }
    return r;
#endif
}


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

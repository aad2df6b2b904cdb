// The CUDA kernel dialect on the host: force-included (g++ -include shim.h) before the kernel
// translation unit when the cuda-emu CPU emulator builds it. Blocks run one after another; the
// threads of a block run as cooperative fibers (emu/runtime.cpp) that switch only inside
// __syncthreads, __syncwarp, the warp shuffles/votes and at thread exit. So:
//   - `__shared__` is `static`: a function-static array is exactly the running block's shared
//     memory (poisoned before each launch, NOT cleared between blocks; reading shared memory
//     before writing it is undefined on a GPU too);
//   - threadIdx/blockIdx/blockDim/gridDim are globals the scheduler sets before a fiber runs;
//   - integer atomics are plain read-modify-writes (no fiber can interrupt them).
// Only what common.cuh documents as the kernel dialect is promised to match NVRTC.
#pragma once

#include <math.h> // the float overloads (sqrt(float) -> float, ...) in the global namespace
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// Every __shared__ array lives in one section, which the scheduler fills with 0xFF bytes (NaN,
// -1) before each launch: a kernel reading shared memory it never wrote gets garbage, as on a
// GPU, instead of the zeros of static storage.
#define __shared__ __attribute__((section("dsv4_shared"))) static

struct dsv4_emu_dim3 {
    unsigned int x, y, z;
};
typedef dsv4_emu_dim3 dim3;
typedef dsv4_emu_dim3 uint3;

// Set by the scheduler (emu/runtime.cpp) before each fiber runs.
extern dsv4_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
static const int warpSize = 32;

extern "C" {
// The scheduler: runs `body(ctx)` once per thread of `grid` x `block`; 0 = ok, else err is set.
int dsv4_emu_schedule(const char* name, dsv4_emu_dim3 grid, dsv4_emu_dim3 block,
                      void (*body)(void*), void* ctx, char* err, size_t errlen);
void dsv4_emu_syncthreads(void);
void dsv4_emu_syncwarp(void);
// Warp exchanges of an 8-byte slot: kind 0 = idx (arg = source lane), 1 = xor (arg = lane
// mask), 2 = up (arg = delta), 3 = down (arg = delta).
uint64_t dsv4_emu_shfl(uint64_t bits, int kind, int arg, int width);
// Warp votes: the ballot of `pred` over the lanes of the caller's warp.
unsigned int dsv4_emu_ballot(int pred);
void dsv4_emu_trap(void);
}

// A compiler barrier around every switch point: memory written before a barrier by one fiber
// must be re-read after it, never kept in a register across the switch.
#define DSV4_EMU_FENCE() __asm__ __volatile__("" ::: "memory")

static inline void __syncthreads() {
    DSV4_EMU_FENCE();
    dsv4_emu_syncthreads();
    DSV4_EMU_FENCE();
}
static inline void __syncwarp(unsigned int mask = 0xffffffffu) {
    (void)mask;
    DSV4_EMU_FENCE();
    dsv4_emu_syncwarp();
    DSV4_EMU_FENCE();
}
static inline void __threadfence() { DSV4_EMU_FENCE(); }
static inline void __threadfence_block() { DSV4_EMU_FENCE(); }
static inline void __trap() { dsv4_emu_trap(); }

template <typename T>
static inline T dsv4_emu_shfl_t(T v, int kind, int arg, int width) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    DSV4_EMU_FENCE();
    bits = dsv4_emu_shfl(bits, kind, arg, width);
    DSV4_EMU_FENCE();
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}
template <typename T>
static inline T __shfl_sync(unsigned int, T v, int src, int width = 32) {
    return dsv4_emu_shfl_t(v, 0, src, width);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned int, T v, int mask, int width = 32) {
    return dsv4_emu_shfl_t(v, 1, mask, width);
}
template <typename T>
static inline T __shfl_up_sync(unsigned int, T v, unsigned int delta, int width = 32) {
    return dsv4_emu_shfl_t(v, 2, (int)delta, width);
}
template <typename T>
static inline T __shfl_down_sync(unsigned int, T v, unsigned int delta, int width = 32) {
    return dsv4_emu_shfl_t(v, 3, (int)delta, width);
}
static inline unsigned int __ballot_sync(unsigned int, int pred) {
    DSV4_EMU_FENCE();
    unsigned int b = dsv4_emu_ballot(pred);
    DSV4_EMU_FENCE();
    return b;
}
static inline int __any_sync(unsigned int m, int pred) { return __ballot_sync(m, pred) != 0; }
static inline int __all_sync(unsigned int m, int pred) {
    return __ballot_sync(m, !pred) == 0;
}

// Bit casts.
template <typename To, typename From>
static inline To dsv4_emu_bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between different sizes");
    To t;
    memcpy(&t, &v, sizeof(To));
    return t;
}
static inline unsigned int __float_as_uint(float v) { return dsv4_emu_bits<unsigned int>(v); }
static inline float __uint_as_float(unsigned int v) { return dsv4_emu_bits<float>(v); }
static inline int __float_as_int(float v) { return dsv4_emu_bits<int>(v); }
static inline float __int_as_float(int v) { return dsv4_emu_bits<float>(v); }
static inline long long __double_as_longlong(double v) { return dsv4_emu_bits<long long>(v); }
static inline double __longlong_as_double(long long v) { return dsv4_emu_bits<double>(v); }
static inline int __double2hiint(double v) { return (int)(__double_as_longlong(v) >> 32); }
static inline int __double2loint(double v) { return (int)__double_as_longlong(v); }
static inline double __hiloint2double(int hi, int lo) {
    return __longlong_as_double((long long)(((unsigned long long)(unsigned int)hi << 32) |
                                            (unsigned int)lo));
}

// Integer bit utilities.
static inline int __popc(unsigned int v) { return __builtin_popcount(v); }
static inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
static inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned int)v); }
static inline int __clzll(long long v) {
    return v == 0 ? 64 : __builtin_clzll((unsigned long long)v);
}
static inline int __ffs(int v) { return __builtin_ffs(v); }
static inline int __ffsll(long long v) { return __builtin_ffsll(v); }
static inline unsigned int __brev(unsigned int v) {
    v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
    v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
    v = ((v >> 4) & 0x0f0f0f0fu) | ((v & 0x0f0f0f0fu) << 4);
    v = ((v >> 8) & 0x00ff00ffu) | ((v & 0x00ff00ffu) << 8);
    return (v >> 16) | (v << 16);
}

template <typename T>
static inline T __ldg(const T* p) {
    return *p;
}

// min/max as CUDA overloads them (mixed signed/unsigned -> unsigned, mixed float/double -> double).
#define DSV4_EMU_MINMAX(R, A, B)                                    \
    static inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; } \
    static inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
DSV4_EMU_MINMAX(int, int, int)
DSV4_EMU_MINMAX(unsigned int, unsigned int, unsigned int)
DSV4_EMU_MINMAX(unsigned int, int, unsigned int)
DSV4_EMU_MINMAX(unsigned int, unsigned int, int)
DSV4_EMU_MINMAX(long, long, long)
DSV4_EMU_MINMAX(unsigned long, unsigned long, unsigned long)
DSV4_EMU_MINMAX(long long, long long, long long)
DSV4_EMU_MINMAX(unsigned long long, unsigned long long, unsigned long long)
DSV4_EMU_MINMAX(unsigned long long, long long, unsigned long long)
DSV4_EMU_MINMAX(unsigned long long, unsigned long long, long long)
#undef DSV4_EMU_MINMAX
// fminf/fmaxf semantics (a NaN operand yields the other operand), as CUDA's float min/max.
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(float a, double b) { return fmin((double)a, b); }
static inline double max(float a, double b) { return fmax((double)a, b); }
static inline double min(double a, float b) { return fmin(a, (double)b); }
static inline double max(double a, float b) { return fmax(a, (double)b); }

// Integer atomics: fibers never switch inside these, so a plain read-modify-write is atomic.
#define DSV4_EMU_ATOMIC(T)                                                        \
    static inline T atomicAdd(T* p, T v) { T o = *p; *p = (T)(o + v); return o; } \
    static inline T atomicSub(T* p, T v) { T o = *p; *p = (T)(o - v); return o; } \
    static inline T atomicMax(T* p, T v) { T o = *p; *p = o > v ? o : v; return o; } \
    static inline T atomicMin(T* p, T v) { T o = *p; *p = o < v ? o : v; return o; } \
    static inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }         \
    static inline T atomicAnd(T* p, T v) { T o = *p; *p = o & v; return o; }      \
    static inline T atomicOr(T* p, T v) { T o = *p; *p = o | v; return o; }       \
    static inline T atomicXor(T* p, T v) { T o = *p; *p = o ^ v; return o; }      \
    static inline T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
DSV4_EMU_ATOMIC(int)
DSV4_EMU_ATOMIC(unsigned int)
DSV4_EMU_ATOMIC(unsigned long long)
#undef DSV4_EMU_ATOMIC

// The launcher the generated registry instantiates per kernel: unpack cuLaunchKernel-style
// params (params[i] points at argument i) once, then run the kernel body on every thread.
template <typename Tuple, typename F>
struct dsv4_emu_call {
    F f;
    Tuple args;
    static void run(void* self) {
        dsv4_emu_call* c = static_cast<dsv4_emu_call*>(self);
        std::apply(c->f, c->args);
    }
};
template <typename... A, size_t... I>
static inline std::tuple<std::decay_t<A>...> dsv4_emu_unpack(void** p, std::index_sequence<I...>) {
    return std::tuple<std::decay_t<A>...>(*static_cast<std::decay_t<A>*>(p[I])...);
}
// The byte size of each of a kernel's parameters, in order (what a driver copies when a graph
// node is added); returns the parameter count, writing at most `cap` sizes.
template <typename... A>
static inline int dsv4_emu_param_sizes(void (*)(A...), size_t* out, int cap) {
    const size_t sizes[] = {sizeof(std::decay_t<A>)..., 0};
    for (int i = 0; i < (int)sizeof...(A) && i < cap; i++) out[i] = sizes[i];
    return (int)sizeof...(A);
}
template <typename... A>
static inline int dsv4_emu_launch_kernel(const char* name, void (*f)(A...), dsv4_emu_dim3 grid,
                                         dsv4_emu_dim3 block, void** params, char* err,
                                         size_t errlen) {
    typedef std::tuple<std::decay_t<A>...> Tuple;
    dsv4_emu_call<Tuple, void (*)(A...)> call{f, dsv4_emu_unpack<A...>(params, std::index_sequence_for<A...>{})};
    return dsv4_emu_schedule(name, grid, block, &dsv4_emu_call<Tuple, void (*)(A...)>::run, &call,
                             err, errlen);
}

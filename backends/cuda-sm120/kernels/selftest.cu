// Test-only kernels for the cuda-emu emulator's self-tests (tests/emu_runtime.rs) and the NVRTC
// dialect check (tests/nvrtc_compile.rs). NOT part of kernels.rs SOURCES: the backend never
// loads them. They exercise every construct of the kernel dialect common.cuh documents.
#include "common.cuh"

// Each block fills shared memory with its own values, then every thread reads two other
// threads' entries (other warps included) after the barrier; a second round reuses the array.
extern "C" __global__ void st_shared_rounds(u32* out) {
    __shared__ u32 s[256];
    u32 t = threadIdx.x;
    s[t] = blockIdx.x * 1000u + t * 3u + 1u;
    __syncthreads();
    u32 a = s[(t + 37u) % blockDim.x] + s[blockDim.x - 1u - t];
    __syncthreads();
    s[t] = a;
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = s[(t + 100u) % blockDim.x] ^ (a << 1);
}

// Warp shuffles of every supported type: xor with `mask`, indexed from lane (lane * 7 + src) % 32.
extern "C" __global__ void st_shuffles(const float* fin, const double* din, float* fxor, float* fidx,
                                       double* dxor, double* didx, i32* ixor, u32* uidx, u32 mask,
                                       u32 src) {
    u32 g = blockIdx.x * blockDim.x + threadIdx.x;
    u32 lane = threadIdx.x % 32u;
    u32 from = (lane * 7u + src) % 32u;
    fxor[g] = __shfl_xor_sync(0xffffffffu, fin[g], (int)mask);
    fidx[g] = __shfl_sync(0xffffffffu, fin[g], (int)from);
    dxor[g] = __shfl_xor_sync(0xffffffffu, din[g], (int)mask);
    didx[g] = __shfl_sync(0xffffffffu, din[g], (int)from);
    ixor[g] = __shfl_xor_sync(0xffffffffu, (int)g * -3, (int)mask);
    uidx[g] = __shfl_sync(0xffffffffu, g * 5u, (int)from);
    __syncwarp();
}

// warp_sum / warp_max of common.cuh: every lane writes its result.
extern "C" __global__ void st_warp_reduce(const float* x, acc_t* sum, float* mx) {
    u32 g = blockIdx.x * blockDim.x + threadIdx.x;
    sum[g] = warp_sum((acc_t)x[g]);
    mx[g] = warp_max(x[g]);
}

// Every thread of a 3-D grid of 3-D blocks records who it is.
extern "C" __global__ void st_indices(u32* out) {
    u32 bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;
    u32 block = (bz * gridDim.y + by) * gridDim.x + bx;
    u32 local = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    u32 threads = blockDim.x * blockDim.y * blockDim.z;
    u32* o = out + 4u * (block * threads + local);
    o[0] = threadIdx.x | (threadIdx.y << 10) | (threadIdx.z << 20);
    o[1] = bx | (by << 10) | (bz << 20);
    o[2] = blockDim.x | (blockDim.y << 10) | (blockDim.z << 20);
    o[3] = gridDim.x | (gridDim.y << 10) | (gridDim.z << 20);
}

// Integer atomics from every thread of every block.
extern "C" __global__ void st_atomics(u32* count, u64* total, u32* maxv, u32* order) {
    u32 g = blockIdx.x * blockDim.x + threadIdx.x;
    u32 ticket = atomicAdd(count, 1u);
    atomicAdd(total, (u64)g * 4294967296ull + 1ull);
    atomicMax(maxv, (g * 2654435761u) >> 7);
    order[ticket] = g;
}

// Thread 5 leaves before a barrier the others wait at (undefined on a GPU; an error here).
extern "C" __global__ void st_exit_before_barrier(float* out) {
    if (threadIdx.x == 5u) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Lanes of one warp wait at a shuffle while another waits at __syncthreads: a deadlock.
extern "C" __global__ void st_split_barrier(float* out) {
    float v = 1.0f;
    if (threadIdx.x == 3u) {
        __syncthreads();
    } else {
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    }
    out[threadIdx.x] = v;
}

// out[g] = g for every thread: no barriers at all (the cost of plain fiber switches).
extern "C" __global__ void st_fill(u32* out, u32 n) {
    u32 g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g < n) out[g] = g;
}

// Scalar parameter passing and the dialect's math and bit casts (float and double overloads).
extern "C" __global__ void st_math(float* f, double* d, u32* u, u64 big, i32 neg, float x,
                                   double y) {
    if (threadIdx.x != 0u) return;
    f[0] = sqrt(x);
    f[1] = (float)exp((double)x);
    f[2] = fmaxf(x, -x) + fminf(x, 2.0f) + fabsf(-x) + floorf(x) + ceilf(x);
    f[3] = min(x, 0.5f) + max(x, 0.5f) + ldexpf(x, 3) + fmaf(x, x, 1.0f);
    f[4] = __uint_as_float(__float_as_uint(x) + 1u);
    f[5] = __int_as_float(__float_as_int(-x));
    f[6] = tanh(x) + log1pf(x) + logf(x) + sinf(x) + cosf(x) + expf(x) + sqrtf(x);
    d[0] = sqrt(y) + log(y) + log1p(y) + sin(y) + cos(y) + fabs(-y) + fmax(y, 1.0) + fmin(y, 1.0);
    d[1] = __longlong_as_double(__double_as_longlong(y) + 1ll);
    d[2] = ldexp(y, -2) + floor(y) + ceil(y) + tanh(y) + fma(y, y, 1.0) + exp(y);
    u[0] = (u32)min(neg, 3) + (u32)max(neg, 3) * 16u;
    u[1] = min(7u, (u32)big) + max(7u, (u32)(big >> 32)) * 65536u;
    u[2] = (u32)(isnan(x - x) ? 1 : 0) + (u32)(isinf(x * __uint_as_float(0x7f800000u)) ? 2 : 0) +
           (u32)(isnan(__uint_as_float(0x7fc00000u)) ? 4 : 0) + (u32)(isinf(y) ? 8 : 0);
    u[3] = __ldg(u + 1);
    u[4] = (u32)(big >> 32);
    u[5] = (u32)neg;
}

// Thread 0 writes out[index] (out of bounds when index < 0 or past the buffer).
extern "C" __global__ void st_write_at(u32* out, i32 index) {
    if (threadIdx.x == 0u) out[index] = 7u;
}

// A 16-byte vector as the backend's kernels load them (linear.cu's lin_f4).
struct alignas(16) st_vec4 {
    float x, y, z, w;
};

// Thread 1 loads a 16-byte vector from bytes + at and stores a u64 at bytes + 64 + store_at:
// a GPU faults on either when the address is not a multiple of the access's size.
extern "C" __global__ void st_vector_at(u8* bytes, u32 at, u32 store_at, float* out) {
    if (threadIdx.x != 1u) return;
    const st_vec4 v = *reinterpret_cast<const st_vec4*>(bytes + at);
    out[0] = v.x + v.y + v.z + v.w;
    *reinterpret_cast<u64*>(bytes + 64u + store_at) = 42ull;
}

// Kernels of the device-resident op set only (DeviceOps in src/resident/): moving rows between
// the buffers of a step, and the element-wise add and scale. Pure data movement and single
// roundings, so each equals its host definition bit for bit.
//
// Launch shapes (src/ops/resident.rs): one thread per destination value, 256 per block.
#include "common.cuh"

// copy2d: for r < rows, c < fill: dst[r·dst_stride + c] = c < width ? src[r·src_stride + c] : 0
// (fill > width zero-pads each row, as linear's inputs are padded to the weight's pitch).
// Source and destination do not overlap.
extern "C" __global__ void copy2d(const float* __restrict__ src, u64 src_stride,
                                  float* __restrict__ dst, u64 dst_stride, u32 rows, u32 width,
                                  u32 fill) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * fill) return;
    const u64 r = i / fill;
    const u64 c = i % fill;
    dst[r * dst_stride + c] = c < width ? src[r * src_stride + c] : 0.0f;
}

// gather_rows: dst[r, c] = src[idx[r], c] for r < rows, c < width.
extern "C" __global__ void gather_rows(const float* __restrict__ src, const u32* __restrict__ idx,
                                       float* __restrict__ dst, u32 rows, u32 width) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * width) return;
    const u64 r = i / width;
    const u64 c = i % width;
    dst[i] = src[(u64)idx[r] * width + c];
}

// scatter_add_rows: dst[idx[r], c] += src[r, c] (f32) for r < rows, c < width; the indices are
// distinct, so no two threads touch one value.
extern "C" __global__ void scatter_add_rows(const float* __restrict__ src,
                                            const u32* __restrict__ idx, float* __restrict__ dst,
                                            u32 rows, u32 width) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * width) return;
    const u64 r = i / width;
    const u64 c = i % width;
    float* d = dst + (u64)idx[r] * width + c;
    *d = *d + src[i];
}

// scatter_add_ordered (DeviceOps::scatter_add_groups in one launch): destination k, row
// dests[k] of dst, gets the source rows order[offsets[k] .. offsets[k+1]] added in that order
// (the groups' order), one thread per (destination, column) holding the running sum: the same
// f32 additions in the same order as one scatter_add_rows per group, and no two threads touch
// one value. Grid ceil(ndest·width/256) × 256.
extern "C" __global__ void scatter_add_ordered(const float* __restrict__ src,
                                               const u32* __restrict__ dests,
                                               const u32* __restrict__ offsets,
                                               const u32* __restrict__ order,
                                               float* __restrict__ dst, u32 ndest, u32 width) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)ndest * width) return;
    const u64 k = i / width;
    const u64 c = i % width;
    float* d = dst + (u64)dests[k] * width + c;
    float a = *d;
    for (u32 j = offsets[k]; j < offsets[k + 1u]; ++j) a = a + src[(u64)order[j] * width + c];
    *d = a;
}

// add_f32: out = a + b element-wise (out may be a or b: each thread reads its element first).
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, u64 n) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = a[i] + b[i];
}

// scale_f64: x = (float)((double)x · s) in place.
extern "C" __global__ void scale_f64(float* __restrict__ x, u64 n, double s) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = (float)((double)x[i] * s);
}

// copy_words: dst[i] = src[i] for i < n, 32-bit words copied as integers (any bytes, bit for
// bit): a page arena's slots moved into the arena that replaces it when it grows.
extern "C" __global__ void copy_words(const u32* __restrict__ src, u32* __restrict__ dst, u64 n) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dst[i] = src[i];
}

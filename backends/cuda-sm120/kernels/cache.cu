// Cache row codecs (spec §4): encode one entry into its exact bytes — the slot's data row
// followed by its scale row, as dsv4_core::cache lays them out — and decode an entry's bytes.
// The host (ops/cache.rs) validates the layout and copies the bytes to and from the page.
// Codecs come from namespace codec (linear.cu).
//
// Launch shapes: the encoders take a batch of rows, row row0 + blockIdx.y (grid.y rows per
// launch, so more than 65535 rows are a few launches) reading its width values at v[r·width ..]
// and writing its entry at out[r·stride ..] (stride = the entry's bytes). Per row: bf16 encode
// one thread per value (256 per block); kv_fp8 encode one 256-thread block (a warp per 64-value
// block, then the bf16 rope part); index_fp8 encode one warp; index_fp4 encode one warp per
// 32-value block. The decoders take a batch: `rows` entries of `stride` bytes each, entry r's
// values to out[r·width ..], one thread per value of the batch (grid ceil(rows·width/256) × 256).
#include "common.cuh"
#include "codec.cuh"

#define CACHE_THREADS 256

// An encoder block's row: row0 + blockIdx.y.
__device__ __forceinline__ u64 cache_encode_row(u32 row0) {
    return (u64)row0 + blockIdx.y;
}

// A decoder thread's place in the batch: the value t of rows·width (its output index).
__device__ __forceinline__ u64 cache_decode_thread() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}

// Readers of one entry's values, one per format: constructed from the entry's first byte and the
// format's sizes (a, b: nd and rd for KV fp8, the width otherwise), value i by operator(). The
// decoders below and the indexer's fused scorers (attention.cu) both read entries through these,
// so a value read in place is bitwise the decoded one.
struct cache_bf16 {
    const u8* e;
    __device__ __forceinline__ cache_bf16(const u8* entry, u32, u32) : e(entry) {}
    __device__ __forceinline__ float operator()(u32 i) const {
        return codec::bf16_to_f32((u32)e[2u * i] | ((u32)e[2u * i + 1u] << 8));
    }
};
// KV fp8: data row = nd e4m3 codes (ue8m0 scale per 64) then rd bf16 values; scale row after.
struct cache_kv_fp8 {
    const u8* e;
    u32 nd, rd;
    __device__ __forceinline__ cache_kv_fp8(const u8* entry, u32 a, u32 b)
        : e(entry), nd(a), rd(b) {}
    __device__ __forceinline__ float operator()(u32 i) const {
        if (i < nd) return codec::e4m3_to_f32(e[i]) * codec::ue8m0_to_f32(e[nd + 2u * rd + i / 64u]);
        const u32 k = nd + 2u * (i - nd);
        return codec::bf16_to_f32((u32)e[k] | ((u32)e[k + 1u] << 8));
    }
};
// Index-K fp8: dim e4m3 codes, then the entry's f32 scale (read once, at construction).
struct cache_index_fp8 {
    const u8* e;
    float scale;
    __device__ __forceinline__ cache_index_fp8(const u8* entry, u32 dim, u32) : e(entry) {
        const u32 sb = (u32)e[dim] | ((u32)e[dim + 1u] << 8) | ((u32)e[dim + 2u] << 16) |
                       ((u32)e[dim + 3u] << 24);
        scale = __uint_as_float(sb);
    }
    __device__ __forceinline__ float operator()(u32 i) const {
        return codec::e4m3_to_f32(e[i]) * scale;
    }
};
// Index-K fp4: dim/2 bytes of e2m1 pairs (low nibble first), then a ue8m0 code per 32 values.
struct cache_index_fp4 {
    const u8* e;
    u32 dim;
    __device__ __forceinline__ cache_index_fp4(const u8* entry, u32 a, u32) : e(entry), dim(a) {}
    __device__ __forceinline__ float operator()(u32 i) const {
        const u32 code = ((u32)e[i / 2u] >> ((i % 2u) * 4u)) & 0xfu;
        return codec::e2m1_to_f32(code) * codec::ue8m0_to_f32(e[dim / 2u + i / 32u]);
    }
};

// The decoders: value t of the batch is value t % width of entry t / width, through reader R.
template <typename R>
__device__ __forceinline__ void cache_decode(const u8* __restrict__ in, float* __restrict__ out,
                                             u32 width, u32 a, u32 b, u32 rows, u32 stride) {
    const u64 t = cache_decode_thread();
    if (t >= (u64)rows * width) return;
    const R entry(in + (t / width) * stride, a, b);
    out[t] = entry((u32)(t % width));
}

// bf16 entries (KV bf16 and index-K bf16): value i → bytes 2i, 2i+1 (little endian).
extern "C" __global__ void cache_encode_bf16(const float* __restrict__ v, u8* __restrict__ out,
                                             u32 n, u32 row0, u32 stride) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u64 r = cache_encode_row(row0);
    v += r * n;
    out += r * stride;
    const u32 b = codec::f32_to_bf16(v[i]);
    out[2u * i] = (u8)(b & 0xffu);
    out[2u * i + 1u] = (u8)(b >> 8);
}

extern "C" __global__ void cache_decode_bf16(const u8* __restrict__ in, float* __restrict__ out,
                                             u32 n, u32 rows, u32 stride) {
    cache_decode<cache_bf16>(in, out, n, n, 0u, rows, stride);
}

// fp8 KV entry: data row = nd e4m3 codes (64-value blocks, power-of-two scales with floor 1e-4)
// then rd bf16 values; scale row = nd/64 ue8m0 codes then one zero pad byte. One block.
extern "C" __global__ void cache_encode_kv_fp8(const float* __restrict__ v, u8* __restrict__ out,
                                               u32 nd, u32 rd, u32 row0, u32 stride) {
    const u64 r = cache_encode_row(row0);
    v += r * (nd + rd);
    out += r * stride;
    const u32 lane = threadIdx.x % DSV4_WARP;
    const u32 warp = threadIdx.x / DSV4_WARP;
    const u32 data_row = nd + 2u * rd;
    const u32 nblk = nd / 64u;
    for (u32 b = warp; b < nblk; b += CACHE_THREADS / DSV4_WARP) { // uniform per warp
        const float x0 = v[b * 64u + lane];
        const float x1 = v[b * 64u + 32u + lane];
        const float amax = warp_max(fmaxf(fabsf(x0), fabsf(x1)));
        const int e = codec::pow2_scale_exponent(fmaxf(amax, 0.0f), 1e-4f, 448.0f);
        const float scale = codec::pow2_scale(e);
        out[b * 64u + lane] = (u8)codec::f32_to_e4m3(x0 / scale);
        out[b * 64u + 32u + lane] = (u8)codec::f32_to_e4m3(x1 / scale);
        if (lane == 0u) out[data_row + b] = (u8)(e + 127);
    }
    for (u32 k = threadIdx.x; k < rd; k += CACHE_THREADS) {
        const u32 bf = codec::f32_to_bf16(v[nd + k]);
        out[nd + 2u * k] = (u8)(bf & 0xffu);
        out[nd + 2u * k + 1u] = (u8)(bf >> 8);
    }
    if (threadIdx.x == 0u) out[data_row + nblk] = 0;
}

extern "C" __global__ void cache_decode_kv_fp8(const u8* __restrict__ in, float* __restrict__ out,
                                               u32 nd, u32 rd, u32 rows, u32 stride) {
    cache_decode<cache_kv_fp8>(in, out, nd + rd, nd, rd, rows, stride);
}

// fp8 index-K entry: dim e4m3 codes of x / scale, then the f32 scale max(amax, 1e-4)/448
// (little endian). One warp.
extern "C" __global__ void cache_encode_index_fp8(const float* __restrict__ v,
                                                  u8* __restrict__ out, u32 dim, u32 row0,
                                                  u32 stride) {
    const u64 r = cache_encode_row(row0);
    v += r * dim;
    out += r * stride;
    const u32 lane = threadIdx.x % DSV4_WARP;
    float m = 0.0f;
    for (u32 j = lane; j < dim; j += DSV4_WARP) m = fmaxf(m, fabsf(v[j]));
    const float scale = fmaxf(warp_max(m), 1e-4f) / 448.0f;
    for (u32 j = lane; j < dim; j += DSV4_WARP) out[j] = (u8)codec::f32_to_e4m3(v[j] / scale);
    if (lane < 4u) out[dim + lane] = (u8)((__float_as_uint(scale) >> (8u * lane)) & 0xffu);
}

extern "C" __global__ void cache_decode_index_fp8(const u8* __restrict__ in,
                                                  float* __restrict__ out, u32 dim, u32 rows,
                                                  u32 stride) {
    cache_decode<cache_index_fp8>(in, out, dim, dim, 0u, rows, stride);
}

// fp4 index-K entry: dim/2 bytes of e2m1 pairs (low nibble first), then dim/32 ue8m0 codes (255
// for a block holding NaN, whose codes are 0). One warp per 32-value block, lane = value.
extern "C" __global__ void cache_encode_index_fp4(const float* __restrict__ v,
                                                  u8* __restrict__ out, u32 dim, u32 row0,
                                                  u32 stride) {
    const u32 lane = threadIdx.x % DSV4_WARP;
    const u32 b = blockIdx.x * (blockDim.x / DSV4_WARP) + threadIdx.x / DSV4_WARP;
    if (b >= dim / 32u) return; // whole warps
    const u64 r = cache_encode_row(row0);
    v += r * dim;
    out += r * stride;
    const float x = v[b * 32u + lane];
    const bool nan = codec::warp_any(isnan(x));
    const float amax = warp_max(fabsf(x));
    const int e = codec::pow2_scale_exponent(amax, codec::e2m1_floor(), 6.0f);
    const u32 code = nan ? 0u : codec::f32_to_e2m1(x / codec::pow2_scale(e));
    const u32 hi = (u32)__shfl_xor_sync(0xffffffffu, code, 1);
    if (lane % 2u == 0u) out[b * 16u + lane / 2u] = (u8)(code | (hi << 4));
    if (lane == 0u) out[dim / 2u + b] = (u8)(nan ? 255 : e + 127);
}

extern "C" __global__ void cache_decode_index_fp4(const u8* __restrict__ in,
                                                  float* __restrict__ out, u32 dim, u32 rows,
                                                  u32 stride) {
    cache_decode<cache_index_fp4>(in, out, dim, dim, 0u, rows, stride);
}

// The canary's page checksum (dsv4_core::cache::page_checksum): per page, a sequential
// FNV-style fold over its little-endian u64 words, rotating left by 29 after each multiply,
// then over the tail bytes without rotation. One thread per page.
#include "common.cuh"

#define CKS_OFFSET 0xcbf29ce484222325ull
#define CKS_PRIME 0x00000100000001b3ull

// page_checksums: bytes = pages × page_bytes; out[p] = checksum of page p.
// Grid ceil(pages/128) × 128.
extern "C" __global__ void page_checksums(const u8* __restrict__ bytes, u64* __restrict__ out,
                                          u64 page_bytes, u64 pages) {
    const u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= pages) return;
    const u8* b = bytes + p * page_bytes;
    const u64 words = page_bytes >> 3;
    u64 h = CKS_OFFSET;
    if ((page_bytes & 7u) == 0) {
        // Every page starts 8-aligned (device allocations are): whole-word loads.
        const u64* w = (const u64*)b;
        for (u64 i = 0; i < words; ++i) {
            const u64 x = (h ^ __ldg(w + i)) * CKS_PRIME;
            h = (x << 29) | (x >> 35);
        }
    } else {
        for (u64 i = 0; i < words; ++i) {
            u64 v = 0;
            for (u32 j = 0; j < 8u; ++j) v |= (u64)__ldg(b + 8 * i + j) << (8u * j);
            const u64 x = (h ^ v) * CKS_PRIME;
            h = (x << 29) | (x >> 35);
        }
    }
    for (u64 i = words * 8; i < page_bytes; ++i) h = (h ^ (u64)__ldg(b + i)) * CKS_PRIME;
    out[p] = h;
}

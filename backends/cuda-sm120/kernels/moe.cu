// MoE routing on the device (DeviceOps::route_experts / routed_experts, src/resident/moe.rs): a
// layer's routes, the order of its routed rows by expert and the grouped launches' tables are
// computed here, so a decode layer's experts run without the host seeing the router's scores.
// Every result is bitwise what the host form computes (dsv4-model's choose_experts, routes_of
// and routed): the same top-k order, the same f64 weight arithmetic, the same summation order.
#include "common.cuh"

#define MOE_NONE 0xffffffffu
// Most experts a token routes to (the spec's k is 6; the host checks k against this).
#define MOE_MAX_K 16

// Routes [rows, 2k] from router scores [rows, experts]: per row, k expert ids (as f32 bits)
// then their weights s_j / Σ s (summed in f64 in id order) · scale, rounded to f32. The ids are
// `fixed[r·k ..]` when `fixed` is given (hash routing, or pinned experts), each wrapped into
// the experts, else the top-k of s + bias (f32 sums) by topk.cu's order (larger first, ties to
// the lower id, NaN last) in ascending id order. One thread per row.
extern "C" __global__ void moe_route(const float* __restrict__ scores,
                                     const float* __restrict__ bias,
                                     const u32* __restrict__ fixed, float* __restrict__ routes,
                                     u32 rows, u32 experts, u32 k, double scale) {
    const u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* s = scores + (u64)r * experts;
    u32 ids[MOE_MAX_K];
    if (fixed != nullptr) {
        for (u32 j = 0; j < k; ++j) ids[j] = fixed[(u64)r * k + j] % experts;
    } else {
        // k passes of a selection: the best key not yet taken, the lowest id among equals.
        for (u32 j = 0; j < k; ++j) {
            u32 best = MOE_NONE, best_key = 0;
            for (u32 e = 0; e < experts; ++e) {
                bool taken = false;
                for (u32 i = 0; i < j; ++i) taken = taken || ids[i] == e;
                if (taken) continue;
                const u32 key = topk_key(s[e] + bias[e]);
                if (best == MOE_NONE || key > best_key) {
                    best = e;
                    best_key = key;
                }
            }
            ids[j] = best;
        }
        // Ascending ids (insertion sort of at most MOE_MAX_K).
        for (u32 j = 1; j < k; ++j) {
            const u32 v = ids[j];
            u32 i = j;
            while (i > 0 && ids[i - 1] > v) {
                ids[i] = ids[i - 1];
                --i;
            }
            ids[i] = v;
        }
    }
    double total = 0.0;
    for (u32 j = 0; j < k; ++j) total += (double)s[ids[j]];
    float* out = routes + (u64)r * 2u * k;
    for (u32 j = 0; j < k; ++j) {
        out[j] = __uint_as_float(ids[j]);
        out[k + j] = (float)((double)s[ids[j]] / total * scale);
    }
}

// Whether slot j of a route row is the first with its expert (the host's expert_rows takes a
// token's first slot naming an expert; a repeated id adds nothing).
__device__ __forceinline__ bool moe_first(const float* __restrict__ row, u32 j, u32 experts) {
    const u32 e = __float_as_uint(row[j]) % experts;
    for (u32 i = 0; i < j; ++i)
        if (__float_as_uint(row[i]) % experts == e) return false;
    return true;
}

// The routed rows in expert order, from routes [rows, 2k]: starts[e] .. starts[e+1] are expert
// e's rows (ascending experts, each expert's tokens ascending, as the host groups them);
// idx[p] is the token of routed row p and w[p] its weight; pos[r·k + j] the routed row of
// token r's slot j (MOE_NONE for a repeated id). Rows past starts[experts], up to rows·k, get
// token 0 and weight 0 (they are computed and never added). One block; thread t takes the
// t-th chunk of consecutive tokens and counts its slots per expert in cnt[t·experts ..]
// (blockDim·experts u32 of scratch); a scan over the chunks per expert turns the counts into
// each chunk's first place, so every thread then places its own slots in token order.
extern "C" __global__ void moe_order(const float* __restrict__ routes, u32 rows, u32 k,
                                     u32 experts, u32* __restrict__ starts,
                                     u32* __restrict__ idx, float* __restrict__ w,
                                     u32* __restrict__ pos, u32* __restrict__ cnt) {
    const u32 n = rows * k, t = threadIdx.x, threads = blockDim.x;
    const u32 chunk = (rows + threads - 1) / threads;
    const u32 r0 = min(t * chunk, rows), r1 = min(r0 + chunk, rows);
    u32* mine = cnt + (u64)t * experts;
    for (u32 e = 0; e < experts; ++e) mine[e] = 0;
    for (u32 r = r0; r < r1; ++r) {
        const float* row = routes + (u64)r * 2u * k;
        for (u32 j = 0; j < k; ++j) {
            if (moe_first(row, j, experts))
                ++mine[__float_as_uint(row[j]) % experts];
            else
                pos[(u64)r * k + j] = MOE_NONE;
        }
    }
    __syncthreads();
    for (u32 e = t; e < experts; e += threads) {
        u32 run = 0;
        for (u32 c = 0; c < threads; ++c) {
            const u32 v = cnt[(u64)c * experts + e];
            cnt[(u64)c * experts + e] = run;
            run += v;
        }
        starts[e + 1] = run;
    }
    __syncthreads();
    if (t == 0) {
        starts[0] = 0;
        for (u32 e = 0; e < experts; ++e) starts[e + 1] += starts[e];
    }
    __syncthreads();
    for (u32 r = r0; r < r1; ++r) {
        const float* row = routes + (u64)r * 2u * k;
        for (u32 j = 0; j < k; ++j) {
            if (!moe_first(row, j, experts)) continue;
            const u32 e = __float_as_uint(row[j]) % experts;
            const u32 at = starts[e] + mine[e]++;
            idx[at] = r;
            w[at] = row[k + j];
            pos[(u64)r * k + j] = at;
        }
    }
    for (u32 p = starts[experts] + t; p < n; p += threads) {
        idx[p] = 0;
        w[p] = 0.0f;
    }
}

// A grouped launch's table (lin_group entries, linear.cu) over the expert groups of `starts`:
// each non-empty group split into entries of at most `per_entry` rows, weight addresses from
// `addrs` (per expert: weight bytes, scale bytes); the rest of the `entries` entries run no
// rows. One thread (the experts in order, as the host builds its tables).
extern "C" __global__ void moe_table(const u32* __restrict__ starts,
                                     const u64* __restrict__ addrs, u32 experts,
                                     u32 per_entry, lin_group* __restrict__ table, u32 entries) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    u32 t = 0;
    for (u32 e = 0; e < experts; ++e) {
        for (u32 row0 = starts[e]; row0 < starts[e + 1] && t < entries; row0 += per_entry) {
            const u32 left = starts[e + 1] - row0;
            table[t].wdata = (const u8*)addrs[2u * e];
            table[t].scale = (const u8*)addrs[2u * e + 1u];
            table[t].row0 = row0;
            table[t].rows = left < per_entry ? left : per_entry;
            ++t;
        }
    }
    for (; t < entries; ++t) {
        table[t].wdata = (const u8*)addrs[0];
        table[t].scale = (const u8*)addrs[1];
        table[t].row0 = 0;
        table[t].rows = 0;
    }
}

// y[r] = the routed rows of token r added in ascending expert order, from 0 (the host's
// routed: y starts at zero and adds each expert's output in turn): ys [rows·k, width] in the
// order of moe_order, pos as it wrote them, routes for the slots' experts. Grid rows ·
// ceil(width / blockDim) blocks: block b covers row b / per_row.
extern "C" __global__ void moe_scatter(const float* __restrict__ ys, const u32* __restrict__ pos,
                                       const float* __restrict__ routes, u32 k, u32 experts,
                                       u32 width, float* __restrict__ y) {
    const u32 per_row = (width + blockDim.x - 1) / blockDim.x;
    const u32 r = blockIdx.x / per_row;
    const u32 c = (blockIdx.x % per_row) * blockDim.x + threadIdx.x;
    if (c >= width) return;
    const float* row = routes + (u64)r * 2u * k;
    // The slots in ascending expert order (k is small: a selection each time).
    float acc = 0.0f;
    u32 last = 0;
    bool any = false;
    for (u32 m = 0; m < k; ++m) {
        u32 best = MOE_NONE, best_e = 0;
        for (u32 j = 0; j < k; ++j) {
            const u32 p = pos[(u64)r * k + j];
            if (p == MOE_NONE) continue;
            const u32 e = __float_as_uint(row[j]) % experts;
            if ((any && e <= last) || (best != MOE_NONE && e >= best_e)) continue;
            best = p;
            best_e = e;
        }
        if (best == MOE_NONE) break;
        acc += ys[(u64)best * width + c];
        last = best_e;
        any = true;
    }
    y[(u64)r * width + c] = acc;
}

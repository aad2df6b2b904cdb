// Cache row codecs (spec §4): encode entries into their exact bytes (data row then scale row,
// as dsv4_core::cache lays them out), decode an entry's bytes, and round indexer query rows as
// index keys are rounded. Kinds: 0 KV bf16, 1 KV fp8, 2 index-K bf16, 3 index-K fp8,
// 4 index-K fp4.

@group(0) @binding(1) var<storage, read> vals: array<f32>;
@group(0) @binding(2) var<storage, read> bytes_in: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> bytes_out: array<u32>;

const E2M1_FLOOR_BITS: u32 = 0x01c00000u; // 6·f32::MIN_POSITIVE

// x / 2^e for a power-of-two scale exponent in −127..=127 (exact in the normal range).
fn div_pow2(x: f32, e: i32) -> f32 {
    if (e >= 127) { return x * pow2f(-126) * 0.5; }
    if (e <= -127) { return x * pow2f(126) * 2.0; }
    return x * pow2f(-e);
}

fn amax_range(lo: u32, hi: u32) -> f32 {
    var m = 0.0;
    for (var j = lo; j < hi; j = j + 1u) { m = rmax(m, abs(vals[j])); }
    return m;
}

fn has_nan(lo: u32, hi: u32) -> bool {
    for (var j = lo; j < hi; j = j + 1u) { if (is_nan32(vals[j])) { return true; } }
    return false;
}

// The index-K fp8 entry scale: max(amax, 1e-4)/448 as an f32 division (formed in `acc` and
// rounded once, which equals the f32 quotient).
fn fp8_entry_scale(lo: u32, hi: u32) -> f32 {
    return f32(acc(rmax(amax_range(lo, hi), 1e-4)) / acc(448.0));
}

fn div_acc(x: f32, y: f32) -> f32 { return f32(acc(x) / acc(y)); }

// The e2m1 block exponent of values[lo..hi] (−1000 when the block holds a NaN).
fn e2m1_exponent(lo: u32, hi: u32) -> i32 {
    if (has_nan(lo, hi)) { return -1000; }
    return pow2_scale_exponent(amax_range(lo, hi), bitcast<f32>(E2M1_FLOOR_BITS), 6.0);
}

fn e2m1_code(x: f32, e: i32) -> u32 {
    if (e == -1000) { return 0u; }
    return f32_to_e2m1(div_pow2(x, e));
}

// Byte i of the encoded entry of the row whose values start at vals[v0]; params 0 kind, 1 nd
// (or dim), 2 rd, 4 data row bytes.
fn entry_byte(v0: u32, i: u32) -> u32 {
    let kind = pu(0u);
    let nd = pu(1u);
    let data_row = pu(4u);
    switch kind {
        case 0u, 2u: {
            if (i >= data_row) { return 0u; }
            return (f32_to_bf16(vals[v0 + i / 2u]) >> ((i % 2u) * 8u)) & 0xffu;
        }
        case 1u: {
            if (i < nd) {
                let blk = v0 + (i / 64u) * 64u;
                let e = pow2_scale_exponent(amax_range(blk, blk + 64u), 1e-4, 448.0);
                return f32_to_e4m3(div_pow2(vals[v0 + i], e));
            }
            if (i < data_row) {
                let k = i - nd;
                return (f32_to_bf16(vals[v0 + nd + k / 2u]) >> ((k % 2u) * 8u)) & 0xffu;
            }
            let j = i - data_row;
            if (j >= nd / 64u) { return 0u; }
            let blk = v0 + j * 64u;
            let e = pow2_scale_exponent(amax_range(blk, blk + 64u), 1e-4, 448.0);
            return u32(e + 127);
        }
        case 3u: {
            let scale = fp8_entry_scale(v0, v0 + nd);
            if (i < nd) { return f32_to_e4m3(div_acc(vals[v0 + i], scale)); }
            return (bitcast<u32>(scale) >> ((i - nd) * 8u)) & 0xffu;
        }
        default: {
            if (i < data_row) {
                let blk = v0 + ((2u * i) / 32u) * 32u;
                let e = e2m1_exponent(blk, blk + 32u);
                let x = v0 + 2u * i;
                return e2m1_code(vals[x], e) | (e2m1_code(vals[x + 1u], e) << 4u);
            }
            let blk = v0 + (i - data_row) * 32u;
            let e = e2m1_exponent(blk, blk + 32u);
            if (e == -1000) { return 255u; }
            return u32(e + 127);
        }
    }
}

// cache_encode: params 0 kind, 1 nd/dim, 2 rd, 3 entry bytes e, 4 data row bytes, 5 rows,
// 6 width (values a row), 7 first output word. `vals` holds the rows' values back to back; row
// r's entry goes to bytes [r·e, (r + 1)·e) after the first word of `bytes_out`. One thread per
// output word (four bytes, which may straddle two entries when e is not a multiple of 4).
@compute @workgroup_size(64)
fn cache_encode(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = flat_id(gid, nwg, 64u);
    let e = pu(3u);
    let total = e * pu(5u);
    if (w >= total / 4u + min(total % 4u, 1u)) { return; }
    let width = pu(6u);
    var word = 0u;
    for (var k = 0u; k < 4u; k = k + 1u) {
        let b = w * 4u + k;
        if (b < total) {
            let r = b / e;
            word = word | (entry_byte(r * width, b - r * e) << (8u * k));
        }
    }
    bytes_out[pu(7u) + w] = word;
}

fn byte_in(i: u32) -> u32 { return (bytes_in[i / 4u] >> ((i % 4u) * 8u)) & 0xffu; }

// cache_decode: params 0 kind, 1 nd/dim, 2 width, 3 rows. `bytes_in`
// holds the entries' bytes (whole pages, or gathered entries); `row_at[2r]` and `row_at[2r + 1]`
// are the byte offsets of row r's data row and scale row in it. Row r decodes into
// out[r·width ..]. One thread per value.
@group(0) @binding(5) var<storage, read> row_at: array<u32>;

@compute @workgroup_size(64)
fn cache_decode(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = flat_id(gid, nwg, 64u);
    let kind = pu(0u);
    let nd = pu(1u);
    let width = pu(2u);
    if (id >= width * pu(3u)) { return; }
    let r = id / width;
    let i = id % width;
    let d0 = row_at[2u * r];
    let s0 = row_at[2u * r + 1u];
    switch kind {
        case 0u, 2u: { out[id] = bf16_to_f32(byte_in(d0 + 2u * i) | (byte_in(d0 + 2u * i + 1u) << 8u)); }
        case 1u: {
            if (i < nd) {
                out[id] = e4m3_to_f32(byte_in(d0 + i)) * ue8m0_to_f32(byte_in(s0 + i / 64u));
            } else {
                let k = d0 + nd + 2u * (i - nd);
                out[id] = bf16_to_f32(byte_in(k) | (byte_in(k + 1u) << 8u));
            }
        }
        case 3u: {
            let sb = byte_in(s0) | (byte_in(s0 + 1u) << 8u) | (byte_in(s0 + 2u) << 16u)
                | (byte_in(s0 + 3u) << 24u);
            out[id] = e4m3_to_f32(byte_in(d0 + i)) * bitcast<f32>(sb);
        }
        default: {
            let code = (byte_in(d0 + i / 2u) >> ((i % 2u) * 4u)) & 0xfu;
            out[id] = e2m1_to_f32(code) * ue8m0_to_f32(byte_in(s0 + i / 32u));
        }
    }
}

// round_index: params 0 kind (2, 3 or 4 as above), 1 dim, 2 n values. One thread per value;
// each row of `dim` values is rounded on its own.
@compute @workgroup_size(256)
fn round_index(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    let kind = pu(0u);
    let dim = pu(1u);
    if (i >= pu(2u)) { return; }
    let row0 = (i / dim) * dim;
    let x = vals[i];
    switch kind {
        case 2u: { out[i] = bf16_to_f32(f32_to_bf16(x)); }
        case 3u: {
            let scale = fp8_entry_scale(row0, row0 + dim);
            out[i] = e4m3_to_f32(f32_to_e4m3(div_acc(x, scale))) * scale;
        }
        default: {
            let blk = row0 + ((i - row0) / 32u) * 32u;
            let e = e2m1_exponent(blk, min(blk + 32u, row0 + dim));
            var s = f32_nan();
            if (e != -1000) { s = ue8m0_to_f32(u32(e + 127)); }
            out[i] = e2m1_to_f32(e2m1_code(x, e)) * s;
        }
    }
}

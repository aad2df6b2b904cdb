// linear: out[r, o] = Σ_i W[o, i]·x[r, i], weights dequantized in-shader from their stored
// format. One thread owns one output column o for up to ROWS_PER_THREAD rows, so each decoded
// weight is used that many times; each output is a sequential sum over i in `acc` (the
// reference's order), which keeps a row's result independent of the batch it is in.
//
// params: 0 format (0 f32, 1 bf16, 2 fp8 block, 3 mxfp4), 1 output row stride, 2 in_dim,
// 3 rows, 4 first output column of this weight chunk, 5 output columns in this chunk.
// Dispatch: x = ceil(cols / 64), y = ceil(rows / ROWS_PER_THREAD).

@group(0) @binding(1) var<storage, read> wdata: array<u32>;
@group(0) @binding(2) var<storage, read> wscale: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const ROWS_PER_THREAD: u32 = 4u;

fn byte_at(buf_is_scale: bool, i: u32) -> u32 {
    var word: u32;
    if (buf_is_scale) { word = wscale[i / 4u]; } else { word = wdata[i / 4u]; }
    return (word >> ((i % 4u) * 8u)) & 0xffu;
}

fn weight(format: u32, o: u32, i: u32, in_dim: u32) -> f32 {
    switch format {
        case 0u: { return bitcast<f32>(wdata[o * in_dim + i]); }
        case 1u: {
            let e = o * in_dim + i;
            return bf16_to_f32(wdata[e / 2u] >> ((e % 2u) * 16u));
        }
        case 2u: {
            let sc = (in_dim + 127u) / 128u;
            let s = ue8m0_to_f32(byte_at(true, (o / 128u) * sc + i / 128u));
            return e4m3_to_f32(byte_at(false, o * in_dim + i)) * s;
        }
        default: {
            let b = byte_at(false, o * (in_dim / 2u) + i / 2u);
            let code = (b >> ((i % 2u) * 4u)) & 0xfu;
            let s = ue8m0_to_f32(byte_at(true, o * (in_dim / 32u) + i / 32u));
            return e2m1_to_f32(code) * s;
        }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let format = pu(0u);
    let stride = pu(1u);
    let in_dim = pu(2u);
    let rows = pu(3u);
    let col0 = pu(4u);
    let cols = pu(5u);
    let o = gid.x;
    if (o >= cols) { return; }
    let r0 = gid.y * ROWS_PER_THREAD;
    if (r0 >= rows) { return; }
    let nr = min(ROWS_PER_THREAD, rows - r0);
    var s = array<acc, 4>(acc(0.0), acc(0.0), acc(0.0), acc(0.0));
    for (var i = 0u; i < in_dim; i = i + 1u) {
        let w = acc(weight(format, o, i, in_dim));
        for (var k = 0u; k < nr; k = k + 1u) {
            s[k] = s[k] + w * acc(x[(r0 + k) * in_dim + i]);
        }
    }
    for (var k = 0u; k < nr; k = k + 1u) {
        out[(r0 + k) * stride + col0 + o] = f32(s[k]);
    }
}

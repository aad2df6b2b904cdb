// linear: out[r, o] = Σ_i W[o, i]·x[r, i], weights dequantized in-shader from their stored
// format. One thread owns one output column o for up to ROWS_PER_THREAD rows, so each decoded
// weight is used that many times; each output is a sequential sum over i in `acc` (the
// reference's order), which keeps a row's result independent of the batch it is in.
//
// params: 0 format (0 f32, 1 bf16, 2 fp8 block, 3 mxfp4), 1 output row stride, 2 in_dim,
// 3 rows, 4 first output column of this weight chunk, 5 output columns in this chunk.
// Dispatch: x = ceil(cols / 64), y = ceil(rows / ROWS_PER_THREAD).

// The weight chunk lives in its own bind group, created once per chunk and reused by every call
// (bind groups naming a long-lived buffer are otherwise re-created per call).
@group(1) @binding(0) var<storage, read> wdata: array<u32>;
@group(1) @binding(1) var<storage, read> wscale: array<u32>;
// read_write: a resident op may bind x and out as ranges of one buffer (see mhc.wgsl).
@group(0) @binding(3) var<storage, read_write> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const ROWS_PER_THREAD: u32 = 4u;

fn byte_at(buf_is_scale: bool, i: u32) -> u32 {
    var word: u32;
    if (buf_is_scale) { word = wscale[i / 4u]; } else { word = wdata[i / 4u]; }
    return (word >> ((i % 4u) * 8u)) & 0xffu;
}

fn weight(format: u32, o: u32, i: u32, in_dim: u32) -> f32 {
    if (format == 0u) { return bitcast<f32>(wdata[o * in_dim + i]); }
    if (format == 1u) {
        let e = o * in_dim + i;
        return bf16_to_f32(wdata[e / 2u] >> ((e % 2u) * 16u));
    }
    if (format == 2u) {
        let sc = (in_dim + 127u) / 128u;
        let s = ue8m0_to_f32(byte_at(true, (o / 128u) * sc + i / 128u));
        return e4m3_to_f32(byte_at(false, o * in_dim + i)) * s;
    }
    let b = byte_at(false, o * (in_dim / 2u) + i / 2u);
    let code = (b >> ((i % 2u) * 4u)) & 0xfu;
    let s = ue8m0_to_f32(byte_at(true, o * (in_dim / 32u) + i / 32u));
    return e2m1_to_f32(code) * s;
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
    // Four named accumulators rather than a private array: lavapipe leaks memory on every
    // dispatch of a shader that indexes a private array dynamically.
    var s0 = acc(0.0);
    var s1 = acc(0.0);
    var s2 = acc(0.0);
    var s3 = acc(0.0);
    let x0 = r0 * in_dim;
    let x1 = min(r0 + 1u, rows - 1u) * in_dim;
    let x2 = min(r0 + 2u, rows - 1u) * in_dim;
    let x3 = min(r0 + 3u, rows - 1u) * in_dim;
    for (var i = 0u; i < in_dim; i = i + 1u) {
        let w = acc(weight(format, o, i, in_dim));
        s0 = s0 + w * acc(x[x0 + i]);
        s1 = s1 + w * acc(x[x1 + i]);
        s2 = s2 + w * acc(x[x2 + i]);
        s3 = s3 + w * acc(x[x3 + i]);
    }
    out[r0 * stride + col0 + o] = f32(s0);
    if (nr > 1u) { out[(r0 + 1u) * stride + col0 + o] = f32(s1); }
    if (nr > 2u) { out[(r0 + 2u) * stride + col0 + o] = f32(s2); }
    if (nr > 3u) { out[(r0 + 3u) * stride + col0 + o] = f32(s3); }
}

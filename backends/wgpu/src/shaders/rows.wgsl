// Row-wise and element-wise kernels: act_quant_fp8, rms_norm, rope, hadamard, router_scores,
// swiglu. Element kernels use 256 threads per workgroup on a 2-D grid (`flat_id`).

// Inputs are read_write too: a resident op binds ranges of one buffer for inputs and outputs,
// and wgpu refuses a buffer bound read-only and read-write in the same dispatch.
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
// swiglu_rows: one weight per row.
@group(0) @binding(4) var<storage, read> row_w: array<f32>;

// ceil(log2 q) for q > 0 in `acc` (the reference's pow2_ceil_exponent on an f64 quotient):
// an estimate from the f32 rounding, corrected by exact power-of-two comparisons.
fn ceil_log2_acc(q: acc) -> i32 {
    var e = ceil_log2_f32(f32(q));
    loop {
        if (ldexp(acc(1.0), e) < q) { e = e + 1; } else { break; }
    }
    loop {
        if (ldexp(acc(1.0), e - 1) >= q) { e = e - 1; } else { break; }
    }
    return e;
}

// act_quant_fp8 in place on a copy: params 0 n (elements), 1 dim. Each thread finds its 1×128
// block's maximum (blocks restart at every row) and quantize-dequantizes one element.
@compute @workgroup_size(256)
fn act_quant(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    let n = pu(0u);
    let dim = pu(1u);
    if (i >= n) { return; }
    let row0 = (i / dim) * dim;
    let c0 = row0 + ((i - row0) / 128u) * 128u;
    let c1 = min(c0 + 128u, row0 + dim);
    var amax = 0.0;
    for (var j = c0; j < c1; j = j + 1u) { amax = rmax(amax, abs(a[j])); }
    let q = acc(rmax(amax, 1e-4)) / acc(448.0);
    var e = 127;
    if (!is_inf32(amax)) { e = clamp(ceil_log2_acc(q), -126, 127); }
    let v = a[i] * pow2f(-e);
    out[i] = e4m3_to_f32(f32_to_e4m3(v)) * pow2f(e);
}

var<workgroup> row_sum: acc;

// rms_norm: params 0 rows, 1 dim, 2 eps (f32 bits), 3 has weight. One workgroup per row: the
// first thread sums squares in order (the reference's order), then 64 threads scale.
@compute @workgroup_size(64)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let rows = pu(0u);
    let dim = pu(1u);
    let valid = row < rows;
    if (li == 0u && valid) {
        var s = acc(0.0);
        for (var c = 0u; c < dim; c = c + 1u) {
            let v = acc(a[row * dim + c]);
            s = s + v * v;
        }
        row_sum = s;
    }
    workgroupBarrier();
    if (!valid) { return; }
    let r = acc(1.0) / sqrt(row_sum / acc(f32(dim)) + acc(pf(2u)));
    for (var c = li; c < dim; c = c + 64u) {
        var w = acc(1.0);
        if (pu(3u) != 0u) { w = acc(b[c]); }
        out[row * dim + c] = f32(acc(a[row * dim + c]) * r * w);
    }
}

// frac(x) − 0.5 ≤ … : x − round(x), exact in f32.
fn centred_frac(x: f32) -> f32 { return x - round(x); }

// p·τ·2π reduced to about [−π, π] in f32 alone (devices without f64), τ = θ/2π in three f32 parts:
// p < 2^24 and τ₁ are split into 12-bit halves so every partial product is exact, and only the
// fractional turns of each are kept.
fn turns_angle(p: u32, t1: f32, t2: f32, t3: f32) -> f32 {
    let ph = f32(p & 0xfff000u);
    let pl = f32(p & 0xfffu);
    let th = bitcast<f32>(bitcast<u32>(t1) & 0xfffff000u);
    let tl = t1 - th;
    let pf = f32(p);
    var f = centred_frac(ph * th) + centred_frac(ph * tl) + centred_frac(pl * th)
        + centred_frac(pl * tl) + centred_frac(pf * t2) + pf * t3;
    f = centred_frac(f);
    return f * 6.28318530717958647692;
}

// rope: params 0 rows, 1 dim, 2 rd, 3 inverse, 4 f32 angles. `b` holds positions (as f32 bit
// patterns of u32) for each row, then per pair θ_i split in three f32 parts (hi, mid, lo) that sum
// exactly to the f64 θ, then θ_i/2π split the same way (used when `acc` is f32).
// One thread per (row, pair); the tail of `out` starts as a copy of the input row.
@compute @workgroup_size(256)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_id(gid, nwg, 256u);
    let rows = pu(0u);
    let dim = pu(1u);
    let rd = pu(2u);
    let half = rd / 2u;
    if (t >= rows * half) { return; }
    let row = t / half;
    let i = t % half;
    let pos = bitcast<u32>(b[row]);
    let tb = rows + 6u * i;
    var angle: acc;
    if (pu(4u) == 0u) {
        let theta = (acc(b[tb]) + acc(b[tb + 1u])) + acc(b[tb + 2u]);
        angle = acc(pos) * theta;
    } else {
        angle = acc(turns_angle(pos, b[tb + 3u], b[tb + 4u], b[tb + 5u]));
    }
    if (pu(3u) != 0u) { angle = -angle; }
    let sc = sincos_acc(angle);
    let base = row * dim + dim - rd + 2u * i;
    let x0 = acc(a[base]);
    let x1 = acc(a[base + 1u]);
    out[base] = f32(x0 * sc.y - x1 * sc.x);
    out[base + 1u] = f32(x0 * sc.x + x1 * sc.y);
}

const HAD_MAX: u32 = 1024u;
var<workgroup> had: array<acc, HAD_MAX>;

// hadamard: params 0 rows, 1 dim (a power of two ≤ 1024). One workgroup per row runs the
// log2(dim) butterfly stages of the Sylvester transform in workgroup memory; every partial sum
// of f32 inputs is exact in f64, so the result equals the reference's ordered d-term sums.
@compute @workgroup_size(256)
fn hadamard(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let rows = pu(0u);
    let dim = pu(1u);
    let valid = row < rows;
    for (var c = li; c < dim; c = c + 256u) {
        if (valid) { had[c] = acc(a[row * dim + c]); }
    }
    workgroupBarrier();
    for (var h = 1u; h < dim; h = h * 2u) {
        for (var k = li; k < dim / 2u; k = k + 256u) {
            let i = (k / h) * 2u * h + (k % h);
            let x = had[i];
            let y = had[i + h];
            had[i] = x + y;
            had[i + h] = x - y;
        }
        workgroupBarrier();
    }
    if (!valid) { return; }
    let norm = acc(1.0) / sqrt(acc(f32(dim)));
    for (var c = li; c < dim; c = c + 256u) {
        out[row * dim + c] = f32(had[c] * norm);
    }
}

// router_scores: sqrt(softplus(x)) element-wise; params 0 n.
@compute @workgroup_size(256)
fn router_scores(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    if (i >= pu(0u)) { return; }
    let x = acc(a[i]);
    var sp: acc;
    if (x > acc(0.0)) { sp = x + log1p_acc(exp_acc(-x)); } else { sp = log1p_acc(exp_acc(x)); }
    out[i] = f32(sqrt(sp));
}

// silu(min(g, L))·clamp(u, −L, L)·weight of element i.
fn swiglu_at(i: u32, lim: f32, weight: f32) -> f32 {
    let g = acc(min(a[i], lim));
    let u = acc(clamp(b[i], -lim, lim));
    let silu = g / (acc(1.0) + exp_acc(-g));
    return f32(silu * u * acc(weight));
}

// swiglu: silu(min(g, L))·clamp(u, −L, L)·weight; params 0 n, 1 limit, 2 weight (f32 bits).
@compute @workgroup_size(256)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    if (i >= pu(0u)) { return; }
    out[i] = swiglu_at(i, pf(1u), pf(2u));
}

// swiglu_rows: swiglu with row r (of `width` values) weighted by row_w[r]; params 0 n,
// 1 limit (f32 bits), 2 width.
@compute @workgroup_size(256)
fn swiglu_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    if (i >= pu(0u)) { return; }
    out[i] = swiglu_at(i, pf(1u), row_w[i / pu(2u)]);
}

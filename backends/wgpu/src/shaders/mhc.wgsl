// mHC kernels (spec §3.1): the mixing logits of each token's flattened streams, the per-token
// coefficients (post, Sinkhorn-normalised comb), the pre-weighted stream sum u, the post mix,
// and the head's merge. Mixing logits stay in `acc` between passes.

// Inputs are read_write too: a resident op binds ranges of one buffer for inputs and outputs,
// and wgpu refuses a buffer bound read-only and read-write in the same dispatch.
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> wt: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> mix: array<acc>;
@group(0) @binding(5) var<storage, read_write> out2: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
@group(0) @binding(7) var<storage, read_write> comb: array<f32>;

// mhc_mix: params 0 t, 1 md (M·D), 2 n_out, 3 norm_eps; x = streams [T, M·D], wt = fn [n_out, M·D].
// One thread per (token, output): (W_n·x̂)·r with r = 1/sqrt(mean(x̂²) + eps), ordered sums.
@compute @workgroup_size(64)
fn mhc_mix(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = flat_id(gid, nwg, 64u);
    let t = pu(0u);
    let md = pu(1u);
    let nout = pu(2u);
    if (id >= t * nout) { return; }
    let ti = id / nout;
    let o = id % nout;
    var ss = acc(0.0);
    var d = acc(0.0);
    for (var c = 0u; c < md; c = c + 1u) {
        let v = acc(x[ti * md + c]);
        ss = ss + v * v;
        d = d + acc(wt[o * md + c]) * v;
    }
    let r = acc(1.0) / sqrt(ss / acc(f32(md)) + acc(pf(3u)));
    mix[id] = d * r;
}

// pre_j of token ti: σ(mix_j·scale0 + base_j) + hc_eps. `wt` here holds [base…, scale…].
fn pre_coef(ti: u32, j: u32, nout: u32, nbase: u32) -> acc {
    let z = mix[ti * nout + j] * acc(wt[nbase]) + acc(wt[j]);
    return sigmoid_acc(z) + acc(pf(4u));
}

// mhc_coef: params 0 t, 1 m, 2 n_out, 3 sinkhorn iters, 4 hc_eps; wt = [base (n_out), scale (3)].
// One thread per token: out = post [T, M], out2 = comb [T, M, M] (Sinkhorn in `acc`, M ≤ 8).
@compute @workgroup_size(64)
fn mhc_coef(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ti = gid.x;
    let t = pu(0u);
    let m = pu(1u);
    let nout = pu(2u);
    let iters = pu(3u);
    let eps = acc(pf(4u));
    if (ti >= t) { return; }
    let s1 = acc(wt[nout + 1u]);
    let s2 = acc(wt[nout + 2u]);
    for (var k = 0u; k < m; k = k + 1u) {
        let z = mix[ti * nout + m + k] * s1 + acc(wt[m + k]);
        out[ti * m + k] = f32(acc(2.0) * sigmoid_acc(z));
    }
    var c: array<acc, 64>;
    for (var j = 0u; j < m; j = j + 1u) {
        var mx = acc(0.0);
        var first = true;
        for (var k = 0u; k < m; k = k + 1u) {
            let l = mix[ti * nout + 2u * m + j * m + k] * s2 + acc(wt[2u * m + j * m + k]);
            c[j * m + k] = l;
            if (first || l > mx) { mx = l; first = false; }
        }
        var sum = acc(0.0);
        for (var k = 0u; k < m; k = k + 1u) { sum = sum + exp_acc(c[j * m + k] - mx); }
        for (var k = 0u; k < m; k = k + 1u) {
            c[j * m + k] = exp_acc(c[j * m + k] - mx) / sum + eps;
        }
    }
    for (var it = 0u; it < max(iters, 1u); it = it + 1u) {
        if (it > 0u) {
            for (var j = 0u; j < m; j = j + 1u) {
                var sr = acc(0.0);
                for (var k = 0u; k < m; k = k + 1u) { sr = sr + c[j * m + k]; }
                for (var k = 0u; k < m; k = k + 1u) { c[j * m + k] = c[j * m + k] / (sr + eps); }
            }
        }
        for (var k = 0u; k < m; k = k + 1u) {
            var sc = acc(0.0);
            for (var j = 0u; j < m; j = j + 1u) { sc = sc + c[j * m + k]; }
            for (var j = 0u; j < m; j = j + 1u) { c[j * m + k] = c[j * m + k] / (sc + eps); }
        }
    }
    for (var i = 0u; i < m * m; i = i + 1u) { out2[ti * m * m + i] = f32(c[i]); }
}

// mhc_weighted: params 0 t, 1 m, 2 n_out, 3 d, 4 hc_eps, 5 index of scale0 in wt;
// wt = [base…, scale…]. One thread per (token, channel): Σ_j pre_j·x[t, j, c] (u, or the head).
@compute @workgroup_size(64)
fn mhc_weighted(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = flat_id(gid, nwg, 64u);
    let t = pu(0u);
    let m = pu(1u);
    let nout = pu(2u);
    let d = pu(3u);
    if (id >= t * d) { return; }
    let ti = id / d;
    let c = id % d;
    var s = acc(0.0);
    for (var j = 0u; j < m; j = j + 1u) {
        s = s + pre_coef(ti, j, nout, pu(5u)) * acc(x[ti * m * d + j * d + c]);
    }
    out[id] = f32(s);
}

// mhc_post: params 0 t, 1 m, 2 d; x = streams [T, M, D], y = block output [T, D],
// wt = post [T, M], comb [T, M, M]. One thread per (token, stream k, channel).
@compute @workgroup_size(64)
fn mhc_post(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = flat_id(gid, nwg, 64u);
    let t = pu(0u);
    let m = pu(1u);
    let d = pu(2u);
    if (id >= t * m * d) { return; }
    let ti = id / (m * d);
    let k = (id / d) % m;
    let c = id % d;
    var mixed = acc(0.0);
    for (var j = 0u; j < m; j = j + 1u) {
        mixed = mixed + acc(comb[ti * m * m + j * m + k]) * acc(x[ti * m * d + j * d + c]);
    }
    let post = acc(wt[ti * m + k]);
    out[id] = f32(post * acc(y[ti * d + c]) + mixed);
}

// Attention-side kernels: compressor softmax pooling, indexer scores, top-k selection and the
// three passes of sparse attention with a sink. Scratch between passes is kept in `acc`.

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> s: array<acc>;

// softmax_pool: params 0 rows, 1 width; a = values, b = logits z, both [rows, width].
// One thread per channel: max, then the ordered sums of e^(z−max)·a and e^(z−max).
@compute @workgroup_size(64)
fn softmax_pool(@builtin(global_invocation_id) gid: vec3<u32>) {
    let rows = pu(0u);
    let width = pu(1u);
    let c = gid.x;
    if (c >= width) { return; }
    var mx = -f32_inf();
    for (var r = 0u; r < rows; r = r + 1u) { mx = rmax(mx, b[r * width + c]); }
    var num = acc(0.0);
    var den = acc(0.0);
    for (var r = 0u; r < rows; r = r + 1u) {
        let z = b[r * width + c];
        if (z == -f32_inf()) { continue; }
        let e = exp_acc(acc(z) - acc(mx));
        num = num + e * acc(a[r * width + c]);
        den = den + e;
    }
    if (den > acc(0.0)) { out[c] = f32(num / den); } else { out[c] = 0.0; }
}

// indexer_scores: params 0 n keys, 1 dim, 2 heads; a = q [heads, dim] then w [heads],
// b = keys [n, dim]. One thread per key.
@compute @workgroup_size(64)
fn indexer_scores(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = flat_id(gid, nwg, 64u);
    let n = pu(0u);
    let dim = pu(1u);
    let heads = pu(2u);
    if (j >= n) { return; }
    var total = acc(0.0);
    for (var h = 0u; h < heads; h = h + 1u) {
        var d = acc(0.0);
        for (var c = 0u; c < dim; c = c + 1u) {
            d = d + acc(a[h * dim + c]) * acc(b[j * dim + c]);
        }
        total = total + acc(a[heads * dim + h]) * max(d, acc(0.0));
    }
    out[j] = f32(total);
}

// Whether score i ranks before score j: larger first, NaN last, ties to the lower index.
fn ranks_before(si: f32, i: u32, sj: f32, j: u32) -> bool {
    let ni = is_nan32(si);
    let nj = is_nan32(sj);
    if (ni != nj) { return nj; }
    if (!ni && si != sj) { return si > sj; }
    return i < j;
}

// topk: params 0 n, 1 k; a = scores. One thread per index counts the entries ranked before it;
// out[i] = 1 when fewer than k are (the host lists the selected indices in ascending order).
@compute @workgroup_size(64)
fn topk(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 64u);
    let n = pu(0u);
    let k = pu(1u);
    if (i >= n) { return; }
    let si = a[i];
    var rank = 0u;
    for (var j = 0u; j < n && rank < k; j = j + 1u) {
        if (j != i && ranks_before(a[j], j, si, i)) { rank = rank + 1u; }
    }
    out[i] = select(0.0, 1.0, rank < k);
}

// Sparse attention pass 1: params 0 n keys, 1 dim, 2 heads, 3 scale (f32 bits);
// a = q [heads, dim], b = keys [n, dim]; s[h·n + t] = scale·q_h·K_t. One thread per (h, t).
@compute @workgroup_size(64)
fn attn_logits(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = flat_id(gid, nwg, 64u);
    let n = pu(0u);
    let dim = pu(1u);
    let heads = pu(2u);
    if (id >= n * heads) { return; }
    let h = id / n;
    let t = id % n;
    var d = acc(0.0);
    for (var c = 0u; c < dim; c = c + 1u) {
        d = d + acc(a[h * dim + c]) * acc(b[t * dim + c]);
    }
    s[id] = d * acc(pf(3u));
}

// Pass 2: params as pass 1, plus a = sinks [heads] here. One thread per head turns its logits
// into e^(l−max) in place and stores the denominator (with the sink) at s[heads·n + h].
@compute @workgroup_size(64)
fn attn_weights(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = pu(0u);
    let heads = pu(2u);
    let h = gid.x;
    if (h >= heads) { return; }
    let sink = acc(a[h]);
    var mx = sink;
    for (var t = 0u; t < n; t = t + 1u) {
        let l = s[h * n + t];
        if (l > mx || mx != mx) { mx = l; }
    }
    var den = acc(0.0);
    for (var t = 0u; t < n; t = t + 1u) {
        let e = exp_acc(s[h * n + t] - mx);
        s[h * n + t] = e;
        den = den + e;
    }
    s[heads * n + h] = den + exp_acc(sink - mx);
}

// Pass 3: params as pass 1; b = keys (= values). One thread per (h, c): Σ_t w_t·K[t, c] / den.
@compute @workgroup_size(64)
fn attn_out(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = flat_id(gid, nwg, 64u);
    let n = pu(0u);
    let dim = pu(1u);
    let heads = pu(2u);
    if (id >= heads * dim) { return; }
    let h = id / dim;
    let c = id % dim;
    var num = acc(0.0);
    for (var t = 0u; t < n; t = t + 1u) {
        num = num + s[h * n + t] * acc(b[t * dim + c]);
    }
    out[id] = f32(num / s[heads * n + h]);
}

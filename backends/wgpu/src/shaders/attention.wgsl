// Attention-side kernels: compressor softmax pooling, indexer scores, top-k selection and the
// three passes of sparse attention with a sink. Scratch between passes is kept in `acc`.

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> s: array<acc>;

// Key (or score) ranges of the row-batched kernels: row r owns entries starts[r] .. starts[r+1]
// (rows = param 4).
@group(0) @binding(5) var<storage, read> starts: array<u32>;

// The row whose range holds entry t (the last r with starts[r] ≤ t).
fn row_of_key(t: u32) -> u32 {
    var lo = 0u;
    var hi = pu(4u);
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (starts[mid] <= t) { lo = mid; } else { hi = mid; }
    }
    return lo;
}

// softmax_pool: params 0 rows, 1 width, 2 windows; a = values, b = logits z, both
// [windows, rows, width]; out [windows, width]. One thread per (window, channel): max, then the
// ordered sums of e^(z−max)·a and e^(z−max) over the window's rows.
@compute @workgroup_size(64)
fn softmax_pool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let rows = pu(0u);
    let width = pu(1u);
    let t = flat_id(gid, nwg, 64u);
    if (t >= width * pu(2u)) { return; }
    let c = t % width;
    let base = (t / width) * rows * width + c;
    var mx = -f32_inf();
    for (var r = 0u; r < rows; r = r + 1u) { mx = rmax(mx, b[base + r * width]); }
    var num = acc(0.0);
    var den = acc(0.0);
    for (var r = 0u; r < rows; r = r + 1u) {
        let z = b[base + r * width];
        if (z == -f32_inf()) { continue; }
        let e = exp_acc(acc(z) - acc(mx));
        num = num + e * acc(a[base + r * width]);
        den = den + e;
    }
    if (den > acc(0.0)) { out[t] = f32(num / den); } else { out[t] = 0.0; }
}

// indexer_scores: params 0 N keys in all, 1 dim, 2 heads, 4 rows; a = q [rows, heads, dim] then
// w [rows, heads], b = keys [N, dim]; `starts` [rows + 1]: query r scores keys starts[r] ..
// starts[r+1]. One thread per key. The head sum starts at −0 as Rust's float `sum` does, so a key
// whose every head term is −0 (negative weights, no positive dot) scores −0 like the reference.
@compute @workgroup_size(64)
fn indexer_scores(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = flat_id(gid, nwg, 64u);
    let n = pu(0u);
    let dim = pu(1u);
    let heads = pu(2u);
    if (j >= n) { return; }
    let r = row_of_key(j);
    let q0 = r * heads * dim;
    let w0 = pu(4u) * heads * dim + r * heads;
    var total = acc(bitcast<f32>(0x80000000u));
    for (var h = 0u; h < heads; h = h + 1u) {
        var d = acc(0.0);
        for (var c = 0u; c < dim; c = c + 1u) {
            d = d + acc(a[q0 + h * dim + c]) * acc(b[j * dim + c]);
        }
        total = total + acc(a[w0 + h]) * max(d, acc(0.0));
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

// topk: params 0 N scores in all, 1 k, 4 rows; a = scores [N]; `starts` [rows + 1]: range r is
// starts[r] .. starts[r+1]. One thread per index counts the entries of its range ranked before
// it; out[i] = 1 when fewer than k are (the host lists each range's selected indices in
// ascending order).
@compute @workgroup_size(64)
fn topk(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 64u);
    let n = pu(0u);
    let k = pu(1u);
    if (i >= n) { return; }
    let r = row_of_key(i);
    let end = starts[r + 1u];
    let si = a[i];
    var rank = 0u;
    for (var j = starts[r]; j < end && rank < k; j = j + 1u) {
        if (j != i && ranks_before(a[j], j, si, i)) { rank = rank + 1u; }
    }
    out[i] = select(0.0, 1.0, rank < k);
}

// Sparse attention of `rows` queries, each over its own keys, in three passes. Params: 0 N keys
// in all, 1 dim, 2 heads, 3 scale (f32 bits), 4 rows; `starts` [rows + 1]: query r attends over
// keys starts[r] .. starts[r+1]. Scratch: query r's logits (then weights) of head h at
// s[heads·starts[r] + h·n_r + t]; its denominators at s[heads·N + r·heads + h].

// Pass 1: a = q [rows, heads, dim], b = keys [N, dim]; the logit scale·q_h·K_t of every (h, t).
// One thread per (h, t).
@compute @workgroup_size(64)
fn attn_logits(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = flat_id(gid, nwg, 64u);
    let total = pu(0u);
    let dim = pu(1u);
    let heads = pu(2u);
    if (id >= total * heads) { return; }
    let h = id / total;
    let t = id % total;
    let r = row_of_key(t);
    let k0 = starts[r];
    let n = starts[r + 1u] - k0;
    let q0 = (r * heads + h) * dim;
    var d = acc(0.0);
    for (var c = 0u; c < dim; c = c + 1u) {
        d = d + acc(a[q0 + c]) * acc(b[t * dim + c]);
    }
    s[heads * k0 + h * n + (t - k0)] = d * acc(pf(3u));
}

// Pass 2: params as pass 1, plus a = sinks [heads] here. One thread per (r, h) turns its logits
// into e^(l−max) in place and stores the denominator (with the sink).
@compute @workgroup_size(64)
fn attn_weights(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = flat_id(gid, nwg, 64u);
    let total = pu(0u);
    let heads = pu(2u);
    if (id >= pu(4u) * heads) { return; }
    let r = id / heads;
    let h = id % heads;
    let k0 = starts[r];
    let n = starts[r + 1u] - k0;
    let base = heads * k0 + h * n;
    let sink = acc(a[h]);
    var mx = sink;
    for (var t = 0u; t < n; t = t + 1u) {
        let l = s[base + t];
        if (l > mx || mx != mx) { mx = l; }
    }
    var den = acc(0.0);
    for (var t = 0u; t < n; t = t + 1u) {
        let e = exp_acc(s[base + t] - mx);
        s[base + t] = e;
        den = den + e;
    }
    s[heads * total + id] = den + exp_acc(sink - mx);
}

// Pass 3: params as pass 1; b = keys (= values). One thread per (r, h, c):
// Σ_t w_t·K[t, c] / den into out[(r·heads + h)·dim + c]. The sum starts at −0 as Rust's float
// `sum` does (−0 + x = x for every x), so a query without keys gives −0 like the reference.
@compute @workgroup_size(64)
fn attn_out(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = flat_id(gid, nwg, 64u);
    let total = pu(0u);
    let dim = pu(1u);
    let heads = pu(2u);
    if (id >= pu(4u) * heads * dim) { return; }
    let rh = id / dim;
    let c = id % dim;
    let r = rh / heads;
    let h = rh % heads;
    let k0 = starts[r];
    let n = starts[r + 1u] - k0;
    let base = heads * k0 + h * n;
    var num = acc(bitcast<f32>(0x80000000u));
    for (var t = 0u; t < n; t = t + 1u) {
        num = num + s[base + t] * acc(b[(k0 + t) * dim + c]);
    }
    out[id] = f32(num / s[heads * total + rh]);
}

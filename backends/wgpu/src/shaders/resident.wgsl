// Data-movement and element-wise kernels of the device-resident ops (no host-op twin): strided
// copies, row gathers and scatter-adds, sums and scaling. 256 threads per workgroup on a 2-D
// grid (`flat_id`). Every binding is read_write: a resident op binds ranges of one buffer.

@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// copy2d: params 0 rows, 1 width, 2 src stride, 3 src column, 4 dst stride, 5 dst column;
// out[r·ds + dc + c] = a[r·ss + sc + c].
@compute @workgroup_size(256)
fn copy2d(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    let width = pu(1u);
    if (i >= pu(0u) * width) { return; }
    let r = i / width;
    let c = i % width;
    out[r * pu(4u) + pu(5u) + c] = a[r * pu(2u) + pu(3u) + c];
}

// gather_rows: params 0 rows, 1 width; b = row indices (u32 bits); out[r] = a[b[r]].
@compute @workgroup_size(256)
fn gather_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    let width = pu(1u);
    if (i >= pu(0u) * width) { return; }
    let r = i / width;
    let c = i % width;
    out[i] = a[bitcast<u32>(b[r]) * width + c];
}

// scatter_add_rows: params 0 rows, 1 width; b = distinct row indices (u32 bits);
// out[b[r]] += a[r] in f32.
@compute @workgroup_size(256)
fn scatter_add_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    let width = pu(1u);
    if (i >= pu(0u) * width) { return; }
    let r = i / width;
    let c = i % width;
    let o = bitcast<u32>(b[r]) * width + c;
    out[o] = out[o] + a[i];
}

// add: params 0 n; out = a + b in f32.
@compute @workgroup_size(256)
fn add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    if (i >= pu(0u)) { return; }
    out[i] = a[i] + b[i];
}

// scale: params 0 n, 1–3 the factor in three f32 parts whose sum in `acc` is exactly the f64
// factor; out = f32(acc(out) · s), in place. With f32 `acc` only dispatched for a factor that is
// an f32 (parts 2 and 3 zero), where the f32 product equals the f64 one rounded to f32.
@compute @workgroup_size(256)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_id(gid, nwg, 256u);
    if (i >= pu(0u)) { return; }
    let s = (acc(pf(1u)) + acc(pf(2u))) + acc(pf(3u));
    out[i] = f32(acc(out[i]) * s);
}

//! Host glue of the linear, row-wise and element-wise kernels (the cache codecs are in
//! ops_cache.rs): upload the op's inputs, encode its dispatches into one command buffer, submit
//! once, read the output back. The `enc_*` functions encode an op's dispatches over bound buffer
//! ranges; the device-resident ops (resident_ops.rs) call the same functions on their slices.

use crate::gpu::{Gpu, Step, copy_f32, f32_bytes, grid};
use crate::setup::Bind;
use crate::weights::DeviceWeight;
use dsv4_core::IndexKDtype;
use dsv4_kernels::{Linear, RopeTable};

/// Rows one linear thread accumulates (ROWS_PER_THREAD in linear.wgsl).
const LINEAR_ROWS_PER_THREAD: usize = 4;
/// Largest Hadamard width the workgroup-memory butterfly holds (HAD_MAX in rows.wgsl).
pub(crate) const HADAMARD_MAX: usize = 1024;

/// Upload f32 values as a storage buffer, refusing what one binding cannot hold.
pub(crate) fn upload_f32(gpu: &Gpu, what: &str, v: &[f32]) -> wgpu::Buffer {
    upload_bytes(gpu, what, f32_bytes(v))
}

/// Upload bytes as a storage buffer, refusing what one binding cannot hold.
pub(crate) fn upload_bytes(gpu: &Gpu, what: &str, v: &[u8]) -> wgpu::Buffer {
    fits(gpu, what, v.len());
    gpu.count(|s| {
        s.writes += 1;
        s.write_bytes += v.len() as u64;
    });
    gpu.upload(what, v)
}

/// A zeroed output buffer of `bytes`, refusing what one binding cannot hold.
pub(crate) fn scratch(gpu: &Gpu, what: &str, bytes: usize) -> wgpu::Buffer {
    fits(gpu, what, bytes);
    gpu.scratch(what, bytes)
}

fn fits(gpu: &Gpu, what: &str, bytes: usize) {
    let max = gpu.max_binding_bytes() as usize;
    assert!(
        bytes <= max,
        "wgpu backend: {what} needs {bytes} bytes in one binding, more than this device's {max}; \
         the batch or context does not fit this device"
    );
}

/// One element-wise kernel over `n` values: inputs at bindings 1 (and 2), output at 3.
fn elementwise(
    gpu: &Gpu,
    kernel: &'static str,
    params: &[u32],
    a: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
) {
    let n = out.len();
    if n == 0 {
        return;
    }
    let ab = upload_f32(gpu, kernel, a);
    let bb = b.map(|b| upload_f32(gpu, kernel, b));
    let ob = scratch(gpu, kernel, n * 4);
    let mut binds = vec![(1, Bind::whole(&ab))];
    if let Some(bb) = &bb {
        binds.push((2, Bind::whole(bb)));
    }
    binds.push((3, Bind::whole(&ob)));
    let mut step = gpu.step();
    step.dispatch(kernel, params, &binds, grid(n, 256));
    copy_f32(&step.finish(&[(&ob, n * 4)])[0], out);
}

pub fn linear(gpu: &Gpu, w: &Linear, dw: &DeviceWeight, x: &[f32], rows: usize, out: &mut [f32]) {
    let (o, i) = (w.out_dim, w.in_dim);
    assert_eq!(
        x.len(),
        rows * i,
        "linear {}: input is not [rows, in]",
        w.name
    );
    assert_eq!(
        out.len(),
        rows * o,
        "linear {}: output is not [rows, out]",
        w.name
    );
    if out.is_empty() {
        return;
    }
    let xb = upload_f32(gpu, "linear input", x);
    let ob = scratch(gpu, "linear output", out.len() * 4);
    let mut step = gpu.step();
    enc_linear(
        &mut step,
        dw,
        o,
        i,
        rows,
        Bind::whole(&xb),
        Bind::whole(&ob),
    );
    copy_f32(&step.finish(&[(&ob, out.len() * 4)])[0], out);
}

/// Encode `out [rows, o] = x [rows, i] · Wᵀ`, one dispatch per weight chunk.
pub(crate) fn enc_linear(
    step: &mut Step<'_>,
    dw: &DeviceWeight,
    o: usize,
    i: usize,
    rows: usize,
    x: Bind<'_>,
    out: Bind<'_>,
) {
    let gy = rows.div_ceil(LINEAR_ROWS_PER_THREAD) as u32;
    for c in &dw.chunks {
        let params = [
            dw.format,
            o as u32,
            i as u32,
            rows as u32,
            c.col0 as u32,
            c.cols as u32,
        ];
        let gx = c.cols.div_ceil(64) as u32;
        step.dispatch_with(
            "linear",
            &params,
            &[(3, x), (4, out)],
            Some(&c.bind),
            [gx, gy, 1],
        );
    }
}

pub fn act_quant_fp8(gpu: &Gpu, x: &mut [f32], dim: usize) {
    if x.is_empty() || dim == 0 {
        return;
    }
    let n = x.len();
    let xb = upload_f32(gpu, "act_quant input", x);
    let ob = scratch(gpu, "act_quant output", n * 4);
    let mut step = gpu.step();
    enc_act_quant(&mut step, n, dim, Bind::whole(&xb), Bind::whole(&ob));
    copy_f32(&step.finish(&[(&ob, n * 4)])[0], x);
}

/// Encode act_quant_fp8 of the `n` values of `input` into `out` (different ranges).
pub(crate) fn enc_act_quant(
    step: &mut Step<'_>,
    n: usize,
    dim: usize,
    input: Bind<'_>,
    out: Bind<'_>,
) {
    step.dispatch(
        "act_quant",
        &[n as u32, dim as u32],
        &[(1, input), (3, out)],
        grid(n, 256),
    );
}

pub fn rms_norm(
    gpu: &Gpu,
    x: &[f32],
    weight: Option<&[f32]>,
    dim: usize,
    eps: f32,
    out: &mut [f32],
) {
    if x.is_empty() || dim == 0 {
        return;
    }
    let rows = x.len() / dim;
    let xb = upload_f32(gpu, "rms_norm input", x);
    let wb = upload_f32(gpu, "rms_norm weight", weight.unwrap_or(&[0.0]));
    let ob = scratch(gpu, "rms_norm output", out.len() * 4);
    let mut step = gpu.step();
    enc_rms_norm(
        &mut step,
        rows,
        dim,
        eps,
        weight.is_some(),
        [Bind::whole(&xb), Bind::whole(&wb), Bind::whole(&ob)],
    );
    copy_f32(&step.finish(&[(&ob, out.len() * 4)])[0], out);
}

/// Encode rms_norm of `rows` rows: `[x, weight (one word when absent), out]`.
pub(crate) fn enc_rms_norm(
    step: &mut Step<'_>,
    rows: usize,
    dim: usize,
    eps: f32,
    has_weight: bool,
    [x, w, out]: [Bind<'_>; 3],
) {
    let params = [
        rows as u32,
        dim as u32,
        eps.to_bits(),
        u32::from(has_weight),
    ];
    step.dispatch(
        "rms_norm",
        &params,
        &[(1, x), (2, w), (3, out)],
        grid(rows, 1),
    );
}

/// θ split in three f32 parts whose f64 sum is exactly θ (see rows.wgsl `rope`).
pub(crate) fn split3(theta: f64) -> [f32; 3] {
    let hi = theta as f32;
    let r1 = theta - f64::from(hi);
    let mid = r1 as f32;
    let lo = (r1 - f64::from(mid)) as f32;
    [hi, mid, lo]
}

pub fn rope(
    gpu: &Gpu,
    x: &mut [f32],
    dim: usize,
    positions: &[usize],
    table: &RopeTable,
    inverse: bool,
) {
    if x.is_empty() || dim == 0 || table.rd == 0 {
        return;
    }
    let rows = x.len() / dim;
    let (aux, f32_angles) = rope_aux(gpu, rows, positions, table).unwrap_or_else(|e| panic!("{e}"));
    let xb = upload_f32(gpu, "rope input", x);
    let ab = upload_f32(gpu, "rope table", &aux);
    let ob = upload_f32(gpu, "rope output", x);
    let mut step = gpu.step();
    let binds = [Bind::whole(&xb), Bind::whole(&ab), Bind::whole(&ob)];
    enc_rope(&mut step, rows, dim, table.rd, inverse, f32_angles, binds);
    let n = x.len() * 4;
    copy_f32(&step.finish(&[(&ob, n)])[0], x);
}

/// The rope kernel's table (positions of `rows` rows as u32 bits, then θ and θ/2π of each
/// pair in three f32 parts) and whether angles are reduced in f32; Err on positions it cannot
/// take.
pub(crate) fn rope_aux(
    gpu: &Gpu,
    rows: usize,
    positions: &[usize],
    table: &RopeTable,
) -> Result<(Vec<f32>, bool), String> {
    if positions.len() < rows {
        return Err(format!(
            "rope: {rows} rows but {} positions",
            positions.len()
        ));
    }
    let f32_angles = !gpu.report().f64_accumulation;
    let mut aux = Vec::with_capacity(rows + 6 * table.freqs.len());
    for &p in &positions[..rows] {
        let p = u32::try_from(p).map_err(|_| format!("rope: position {p} beyond 2^32"))?;
        if f32_angles && p >= 1 << 24 {
            return Err("wgpu rope without f64: positions must be below 2^24".to_string());
        }
        aux.push(f32::from_bits(p));
    }
    aux.extend(table.freqs.iter().flat_map(|&t| {
        let [a, b, c] = split3(t);
        let [d, e, f] = split3(t / std::f64::consts::TAU);
        [a, b, c, d, e, f]
    }));
    Ok((aux, f32_angles))
}

/// Encode rope over `rows` rows: `[input, table, out]` (out may be the input's range: each
/// thread reads and writes only its own pair).
pub(crate) fn enc_rope(
    step: &mut Step<'_>,
    rows: usize,
    dim: usize,
    rd: usize,
    inverse: bool,
    f32_angles: bool,
    [x, aux, out]: [Bind<'_>; 3],
) {
    let params = [
        rows as u32,
        dim as u32,
        rd as u32,
        u32::from(inverse),
        u32::from(f32_angles),
    ];
    step.dispatch(
        "rope",
        &params,
        &[(1, x), (2, aux), (3, out)],
        grid(rows * rd / 2, 256),
    );
}

pub fn hadamard(gpu: &Gpu, x: &mut [f32], dim: usize) {
    check_hadamard(dim).unwrap_or_else(|e| panic!("{e}"));
    if x.is_empty() {
        return;
    }
    let rows = x.len() / dim;
    let xb = upload_f32(gpu, "hadamard input", x);
    let ob = scratch(gpu, "hadamard output", x.len() * 4);
    let mut step = gpu.step();
    enc_hadamard(&mut step, rows, dim, Bind::whole(&xb), Bind::whole(&ob));
    let n = x.len() * 4;
    copy_f32(&step.finish(&[(&ob, n)])[0], x);
}

/// Whether the Hadamard kernel takes width `dim`.
pub(crate) fn check_hadamard(dim: usize) -> Result<(), String> {
    if !dim.is_power_of_two() {
        return Err(format!("hadamard needs a power-of-two width, got {dim}"));
    }
    if dim > HADAMARD_MAX {
        return Err(format!(
            "wgpu hadamard: width {dim} is above the {HADAMARD_MAX} the kernel holds in workgroup memory"
        ));
    }
    Ok(())
}

/// Encode the Hadamard transform of `rows` rows from `x` into `out` (may be the same range: a
/// workgroup reads its row into workgroup memory before writing it).
pub(crate) fn enc_hadamard(
    step: &mut Step<'_>,
    rows: usize,
    dim: usize,
    x: Bind<'_>,
    out: Bind<'_>,
) {
    step.dispatch(
        "hadamard",
        &[rows as u32, dim as u32],
        &[(1, x), (3, out)],
        grid(rows, 1),
    );
}

pub fn router_scores(gpu: &Gpu, logits: &[f32], out: &mut [f32]) {
    elementwise(gpu, "router_scores", &[out.len() as u32], logits, None, out);
}

pub fn swiglu(gpu: &Gpu, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]) {
    let params = [out.len() as u32, limit.to_bits(), weight.to_bits()];
    elementwise(gpu, "swiglu", &params, g, Some(u), out);
}

/// The cache kernels' kind number of an index-K dtype.
pub(crate) fn index_kind(d: IndexKDtype) -> u32 {
    match d {
        IndexKDtype::Bf16 => 2,
        IndexKDtype::Fp8 => 3,
        IndexKDtype::Fp4 => 4,
    }
}

pub fn round_index_rows(gpu: &Gpu, dtype: IndexKDtype, x: &mut [f32], dim: usize) {
    if x.is_empty() || dim == 0 {
        return;
    }
    let n = x.len();
    let vb = upload_f32(gpu, "index rows", x);
    let ob = scratch(gpu, "index rows", n * 4);
    let mut step = gpu.step();
    enc_round_index(&mut step, dtype, dim, n, Bind::whole(&vb), Bind::whole(&ob));
    copy_f32(&step.finish(&[(&ob, n * 4)])[0], x);
}

/// Encode index-K rounding of the `n` values of `input` into `out` (different ranges).
pub(crate) fn enc_round_index(
    step: &mut Step<'_>,
    dtype: IndexKDtype,
    dim: usize,
    n: usize,
    input: Bind<'_>,
    out: Bind<'_>,
) {
    step.dispatch(
        "round_index",
        &[index_kind(dtype), dim as u32, n as u32],
        &[(1, input), (3, out)],
        grid(n, 256),
    );
}

//! Row-wise and element-wise ops on the device (kernels/rows.cu): act_quant_fp8, rms_norm,
//! rope, hadamard, router_scores, swiglu and round_index_rows. Each host op uploads its input,
//! calls the op's `launch_*` function (which the device-resident ops of `resident/` call on
//! their own buffers) and reads the result back.

use crate::device::{DevPtr, KArg, blocks_for};
use crate::{Core, CudaError};
use dsv4_core::IndexKDtype;
use dsv4_kernels::RopeTable;

/// Threads per block of the row kernels (ROWS_THREADS).
pub(crate) const THREADS: u32 = 256;
/// Threads per block of the kernels that give each warp one block of values or one row.
const WARP_THREADS: u32 = 128;
/// Warps per such block.
const WARPS: usize = WARP_THREADS as usize / 32;
/// Largest Hadamard width the shared-memory butterfly holds (HAD_MAX).
const HADAMARD_MAX: usize = 1024;

/// A `BadOperands` error.
pub(crate) fn bad(msg: String) -> CudaError {
    CudaError::BadOperands(msg)
}

/// `v` as a u32 kernel argument, or an error naming `what`.
pub(crate) fn u32_of(what: &str, v: usize) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| bad(format!("{what} {v} is beyond 2^32")))
}

/// Rows of `x` at width `dim`, or an error when `x` is not whole rows.
pub(crate) fn rows_of(op: &str, x: usize, dim: usize) -> Result<usize, CudaError> {
    if dim == 0 || !x.is_multiple_of(dim) {
        return Err(bad(format!("{op}: {x} values are not rows of width {dim}")));
    }
    Ok(x / dim)
}

/// Launch one kernel on a 1-D grid.
fn launch1(c: &Core, kernel: &str, grid: u32, block: u32, a: &[KArg<'_>]) -> Result<(), CudaError> {
    // SAFETY: every caller builds `a` in the kernel's parameter order, with buffers whose sizes
    // it checked against the launch.
    unsafe { c.dev.launch(kernel, (grid, 1, 1), (block, 1, 1), a) }
}

/// Run `launch` on a device copy of `x`, then read it back into `x`.
fn in_place(
    c: &Core,
    x: &mut [f32],
    launch: impl FnOnce(DevPtr) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    let xb = c.dev.temp_f32(x)?;
    launch(xb.at())?;
    c.dev.download_f32(&xb, x)
}

/// Check `p` holds `words` f32 (device-side guard of every launch function).
pub(crate) fn fits(op: &str, p: DevPtr, words: usize) -> Result<(), CudaError> {
    if p.bytes < words * 4 {
        return Err(bad(format!(
            "{op}: a device operand of {} bytes is too small for {words} values",
            p.bytes
        )));
    }
    Ok(())
}

/// act_quant_fp8 over `rows` rows of width `dim` at `x` (in place).
pub(crate) fn launch_act_quant(
    c: &Core,
    x: DevPtr,
    rows: usize,
    dim: usize,
) -> Result<(), CudaError> {
    fits("act_quant_fp8", x, rows * dim)?;
    let (rows32, dim32) = (u32_of("rows", rows)?, u32_of("dim", dim)?);
    let grid = blocks_for(rows * dim.div_ceil(128), WARPS);
    launch1(
        c,
        "act_quant_fp8",
        grid,
        WARP_THREADS,
        &[KArg::Ptr(x), KArg::U32(rows32), KArg::U32(dim32)],
    )
}

/// Quantize-dequantize each 1×128 block of every row of width `dim` to e4m3, in place.
pub fn act_quant_fp8(c: &Core, x: &mut [f32], dim: usize) -> Result<(), CudaError> {
    if x.is_empty() {
        return Ok(());
    }
    let rows = rows_of("act_quant_fp8", x.len(), dim)?;
    in_place(c, x, |xb| launch_act_quant(c, xb, rows, dim))
}

/// Check an rms_norm weight against width `dim`.
pub(crate) fn check_norm_weight(weight: Option<&[f32]>, dim: usize) -> Result<(), CudaError> {
    if weight.is_some_and(|w| w.len() < dim) {
        return Err(bad(format!("rms_norm: weight shorter than width {dim}")));
    }
    Ok(())
}

/// rms_norm of `rows` rows of width `dim`: x → out, with weight `w` when `has_w` (else `w` is
/// any valid address).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_rms_norm(
    c: &Core,
    x: DevPtr,
    w: DevPtr,
    out: DevPtr,
    rows: usize,
    dim: usize,
    eps: f32,
    has_w: bool,
) -> Result<(), CudaError> {
    fits("rms_norm", x, rows * dim)?;
    fits("rms_norm", out, rows * dim)?;
    fits("rms_norm", w, if has_w { dim } else { 0 })?;
    let args = [
        KArg::Ptr(x),
        KArg::Ptr(w),
        KArg::Ptr(out),
        KArg::U32(u32_of("dim", dim)?),
        KArg::F32(eps),
        KArg::U32(u32::from(has_w)),
    ];
    launch1(c, "rms_norm", u32_of("rows", rows)?, THREADS, &args)
}

/// RMSNorm of each row: x / sqrt(mean(x²) + eps), times `weight` when given.
pub fn rms_norm(
    c: &Core,
    x: &[f32],
    weight: Option<&[f32]>,
    dim: usize,
    eps: f32,
    out: &mut [f32],
) -> Result<(), CudaError> {
    if out.len() != x.len() {
        return Err(bad(format!(
            "rms_norm: {} inputs but {} outputs",
            x.len(),
            out.len()
        )));
    }
    if x.is_empty() {
        return Ok(());
    }
    let rows = rows_of("rms_norm", x.len(), dim)?;
    check_norm_weight(weight, dim)?;
    let xb = c.dev.temp_f32(x)?;
    let wb = c.dev.temp_f32(weight.map_or(&[][..], |w| &w[..dim]))?;
    let ob = c.dev.temp(x.len() * 4)?;
    launch_rms_norm(
        c,
        xb.at(),
        wb.at(),
        ob.at(),
        rows,
        dim,
        eps,
        weight.is_some(),
    )?;
    c.dev.download_f32(&ob, out)
}

/// The device operands of a rope: positions (u64 bytes) and θ (f64 bytes).
pub(crate) struct RopeParams {
    pub(crate) pos: Vec<u8>,
    pub(crate) theta: Vec<u8>,
}

/// The checked rope operands of `rows` rows, or None when there is nothing to rotate.
pub(crate) fn rope_params(
    rows: usize,
    dim: usize,
    positions: &[usize],
    table: &RopeTable,
) -> Result<Option<RopeParams>, CudaError> {
    let pairs = table.freqs.len();
    if rows == 0 || pairs == 0 {
        return Ok(None);
    }
    if table.rd > dim || 2 * pairs > table.rd {
        return Err(bad(format!(
            "rope: {pairs} frequency pairs over rd {} of width {dim}",
            table.rd
        )));
    }
    if positions.len() < rows {
        return Err(bad(format!(
            "rope: {rows} rows but {} positions",
            positions.len()
        )));
    }
    let pos = positions[..rows]
        .iter()
        .flat_map(|&p| (p as u64).to_le_bytes())
        .collect();
    let theta = table.freqs.iter().flat_map(|t| t.to_le_bytes()).collect();
    Ok(Some(RopeParams { pos, theta }))
}

/// rope over `rows` rows of width `dim` at `x` (in place), positions `pos` (u64) and θ `theta`
/// (f64) on the device.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_rope(
    c: &Core,
    x: DevPtr,
    pos: DevPtr,
    theta: DevPtr,
    rows: usize,
    dim: usize,
    table: &RopeTable,
    inverse: bool,
) -> Result<(), CudaError> {
    let pairs = table.freqs.len();
    fits("rope", x, rows * dim)?;
    fits("rope", pos, rows * 2)?;
    fits("rope", theta, pairs * 2)?;
    let (rows32, dim32) = (u32_of("rows", rows)?, u32_of("dim", dim)?);
    let (rd32, pairs32) = (u32_of("rd", table.rd)?, u32_of("pairs", pairs)?);
    let grid = blocks_for(rows * pairs, THREADS as usize);
    let args = [
        KArg::Ptr(x),
        KArg::Ptr(pos),
        KArg::Ptr(theta),
        KArg::U32(rows32),
        KArg::U32(dim32),
        KArg::U32(rd32),
        KArg::U32(pairs32),
        KArg::U32(u32::from(inverse)),
    ];
    launch1(c, "rope", grid, THREADS, &args)
}

/// Rotate the last `table.rd` dims of each row by ±p·θ_i on interleaved pairs, in place.
pub fn rope(
    c: &Core,
    x: &mut [f32],
    dim: usize,
    positions: &[usize],
    table: &RopeTable,
    inverse: bool,
) -> Result<(), CudaError> {
    if x.is_empty() || table.freqs.is_empty() {
        return Ok(());
    }
    let rows = rows_of("rope", x.len(), dim)?;
    let Some(RopeParams { pos, theta }) = rope_params(rows, dim, positions, table)? else {
        return Ok(());
    };
    let pb = c.dev.temp_upload(&pos)?;
    let tb = c.dev.temp_upload(&theta)?;
    in_place(c, x, |xb| {
        launch_rope(c, xb, pb.at(), tb.at(), rows, dim, table, inverse)
    })
}

/// Check a Hadamard width.
pub(crate) fn check_hadamard(dim: usize) -> Result<(), CudaError> {
    if !dim.is_power_of_two() || dim > HADAMARD_MAX {
        return Err(bad(format!(
            "hadamard needs a power-of-two width of at most {HADAMARD_MAX}, got {dim}"
        )));
    }
    Ok(())
}

/// hadamard over `rows` rows of width `dim` at `x` (in place).
pub(crate) fn launch_hadamard(
    c: &Core,
    x: DevPtr,
    rows: usize,
    dim: usize,
) -> Result<(), CudaError> {
    check_hadamard(dim)?;
    fits("hadamard", x, rows * dim)?;
    let args = [KArg::Ptr(x), KArg::U32(u32_of("dim", dim)?)];
    launch1(c, "hadamard", u32_of("rows", rows)?, THREADS, &args)
}

/// Multiply each row of width `dim` (a power of two ≤ 1024) by the Sylvester Hadamard matrix
/// / sqrt(dim), in place.
pub fn hadamard(c: &Core, x: &mut [f32], dim: usize) -> Result<(), CudaError> {
    check_hadamard(dim)?;
    if x.is_empty() {
        return Ok(());
    }
    let rows = rows_of("hadamard", x.len(), dim)?;
    in_place(c, x, |xb| launch_hadamard(c, xb, rows, dim))
}

/// One element-wise kernel: inputs `a` (and `b`), output `out`, then `extra` scalars.
fn elementwise(
    c: &Core,
    kernel: &str,
    a: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    extra: &[KArg<'_>],
) -> Result<(), CudaError> {
    let n = out.len();
    if a.len() != n || b.is_some_and(|b| b.len() != n) {
        return Err(bad(format!(
            "{kernel}: inputs and output of different lengths"
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let ab = c.dev.temp_f32(a)?;
    let bb = b.map(|b| c.dev.temp_f32(b)).transpose()?;
    let ob = c.dev.temp(n * 4)?;
    let mut args = vec![KArg::Buf(&ab)];
    if let Some(bb) = &bb {
        args.push(KArg::Buf(bb));
    }
    args.push(KArg::Buf(&ob));
    args.push(KArg::U64(n as u64));
    args.extend_from_slice(extra);
    launch1(c, kernel, blocks_for(n, THREADS as usize), THREADS, &args)?;
    c.dev.download_f32(&ob, out)
}

/// Router scores sqrt(softplus(x)) element-wise.
pub fn router_scores(c: &Core, logits: &[f32], out: &mut [f32]) -> Result<(), CudaError> {
    elementwise(c, "router_scores", logits, None, out, &[])
}

/// Router scores of `n` logits at `logits` into `out` (device-resident operands).
pub(crate) fn launch_router_scores(
    c: &Core,
    logits: DevPtr,
    out: DevPtr,
    n: usize,
) -> Result<(), CudaError> {
    for p in [logits, out] {
        fits("router_scores", p, n)?;
    }
    let args = [KArg::Ptr(logits), KArg::Ptr(out), KArg::U64(n as u64)];
    let grid = blocks_for(n, THREADS as usize);
    launch1(c, "router_scores", grid, THREADS, &args)
}

/// Clamped SwiGLU: out = silu(min(g, L))·clamp(u, −L, L)·weight.
pub fn swiglu(
    c: &Core,
    g: &[f32],
    u: &[f32],
    limit: f32,
    weight: f32,
    out: &mut [f32],
) -> Result<(), CudaError> {
    elementwise(
        c,
        "swiglu",
        g,
        Some(u),
        out,
        &[KArg::F32(limit), KArg::F32(weight)],
    )
}

/// SwiGLU of `weights`-many rows of `width` values, row r scaled by `weights[r]` (an f32
/// array on the device): the `swiglu` kernel's formula, row by row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_swiglu_rows(
    c: &Core,
    g: DevPtr,
    u: DevPtr,
    out: DevPtr,
    weights: DevPtr,
    rows: usize,
    width: usize,
    limit: f32,
) -> Result<(), CudaError> {
    let n = rows * width;
    for p in [g, u, out] {
        fits("swiglu_rows", p, n)?;
    }
    fits("swiglu_rows", weights, rows)?;
    let args = [
        KArg::Ptr(g),
        KArg::Ptr(u),
        KArg::Ptr(out),
        KArg::Ptr(weights),
        KArg::U64(n as u64),
        KArg::U32(u32_of("width", width)?),
        KArg::F32(limit),
    ];
    launch1(
        c,
        "swiglu_rows",
        blocks_for(n, THREADS as usize),
        THREADS,
        &args,
    )
}

/// round_index_rows over `rows` rows of width `dim` at `x` (in place).
pub(crate) fn launch_round_index(
    c: &Core,
    dtype: IndexKDtype,
    x: DevPtr,
    rows: usize,
    dim: usize,
) -> Result<(), CudaError> {
    let n = rows * dim;
    fits("round_index_rows", x, n)?;
    let (rows32, dim32) = (u32_of("rows", rows)?, u32_of("dim", dim)?);
    let (kernel, grid, block, args) = match dtype {
        IndexKDtype::Bf16 => (
            "round_index_bf16",
            blocks_for(n, THREADS as usize),
            THREADS,
            vec![KArg::Ptr(x), KArg::U64(n as u64)],
        ),
        IndexKDtype::Fp8 => (
            "round_index_fp8",
            blocks_for(rows, WARPS),
            WARP_THREADS,
            vec![KArg::Ptr(x), KArg::U32(rows32), KArg::U32(dim32)],
        ),
        IndexKDtype::Fp4 => (
            "round_index_fp4",
            blocks_for(rows * dim.div_ceil(32), WARPS),
            WARP_THREADS,
            vec![KArg::Ptr(x), KArg::U32(rows32), KArg::U32(dim32)],
        ),
    };
    launch1(c, kernel, grid, block, &args)
}

/// Round each row of width `dim` as index-K entries are rounded (bf16; fp8 with one f32 scale
/// per row; fp4 per 32 values), in place.
pub fn round_index_rows(
    c: &Core,
    dtype: IndexKDtype,
    x: &mut [f32],
    dim: usize,
) -> Result<(), CudaError> {
    if x.is_empty() {
        return Ok(());
    }
    let rows = rows_of("round_index_rows", x.len(), dim)?;
    in_place(c, x, |xb| launch_round_index(c, dtype, xb, rows, dim))
}

//! Row-wise and element-wise ops on the device (kernels/rows.cu): act_quant_fp8, rms_norm,
//! rope, hadamard, router_scores, swiglu and round_index_rows. Each uploads its input, launches
//! one kernel and reads the result back.

use crate::device::{KArg, blocks_for};
use crate::{Core, CudaError};
use dsv4_core::IndexKDtype;
use dsv4_kernels::RopeTable;

/// Threads per block of the row kernels (ROWS_THREADS).
const THREADS: u32 = 256;
/// Threads per block of the kernels that give each warp one block of values or one row.
const WARP_THREADS: u32 = 128;
/// Warps per such block.
const WARPS: usize = WARP_THREADS as usize / 32;
/// Largest Hadamard width the shared-memory butterfly holds (HAD_MAX).
const HADAMARD_MAX: usize = 1024;

fn bad(msg: String) -> CudaError {
    CudaError::BadOperands(msg)
}

fn u32_of(what: &str, v: usize) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| bad(format!("{what} {v} is beyond 2^32")))
}

/// Rows of `x` at width `dim`, or an error when `x` is not whole rows.
fn rows_of(op: &str, x: usize, dim: usize) -> Result<usize, CudaError> {
    if dim == 0 || !x.is_multiple_of(dim) {
        return Err(bad(format!("{op}: {x} values are not rows of width {dim}")));
    }
    Ok(x / dim)
}

/// Run `kernel` over `x` in place: upload x, launch with (x, `rest`…), download x.
fn in_place(
    c: &Core,
    x: &mut [f32],
    kernel: &str,
    grid: u32,
    block: u32,
    rest: &[KArg<'_>],
) -> Result<(), CudaError> {
    let xb = c.dev.upload_f32(x)?;
    let mut a = vec![KArg::Buf(&xb)];
    a.extend_from_slice(rest);
    // SAFETY: every caller builds `a` in the kernel's parameter order, with sizes that match
    // the buffer it uploaded (checked before the call).
    unsafe { c.dev.launch(kernel, (grid, 1, 1), (block, 1, 1), &a)? };
    c.dev.download_f32(&xb, x)
}

/// Quantize-dequantize each 1×128 block of every row of width `dim` to e4m3, in place.
pub fn act_quant_fp8(c: &Core, x: &mut [f32], dim: usize) -> Result<(), CudaError> {
    if x.is_empty() {
        return Ok(());
    }
    let rows = rows_of("act_quant_fp8", x.len(), dim)?;
    let (rows32, dim32) = (u32_of("rows", rows)?, u32_of("dim", dim)?);
    let grid = blocks_for(rows * dim.div_ceil(128), WARPS);
    in_place(
        c,
        x,
        "act_quant_fp8",
        grid,
        WARP_THREADS,
        &[KArg::U32(rows32), KArg::U32(dim32)],
    )
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
    if weight.is_some_and(|w| w.len() < dim) {
        return Err(bad(format!("rms_norm: weight shorter than width {dim}")));
    }
    let xb = c.dev.upload_f32(x)?;
    let wb = c.dev.upload_f32(weight.unwrap_or(&[]))?;
    let ob = c.dev.alloc(x.len() * 4)?;
    let args = [
        KArg::Buf(&xb),
        KArg::Buf(&wb),
        KArg::Buf(&ob),
        KArg::U32(u32_of("dim", dim)?),
        KArg::F32(eps),
        KArg::U32(u32::from(weight.is_some())),
    ];
    // SAFETY: parameter order of rms_norm; x and out hold rows·dim f32, w dim f32 when used.
    unsafe {
        c.dev.launch(
            "rms_norm",
            (u32_of("rows", rows)?, 1, 1),
            (THREADS, 1, 1),
            &args,
        )?
    };
    c.dev.download_f32(&ob, out)
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
    let pairs = table.freqs.len();
    if x.is_empty() || pairs == 0 {
        return Ok(());
    }
    let rows = rows_of("rope", x.len(), dim)?;
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
    let pos: Vec<u8> = positions[..rows]
        .iter()
        .flat_map(|&p| (p as u64).to_le_bytes())
        .collect();
    let theta: Vec<u8> = table.freqs.iter().flat_map(|t| t.to_le_bytes()).collect();
    let pb = c.dev.upload(&pos)?;
    let tb = c.dev.upload(&theta)?;
    let (rows32, dim32) = (u32_of("rows", rows)?, u32_of("dim", dim)?);
    let (rd32, pairs32) = (u32_of("rd", table.rd)?, u32_of("pairs", pairs)?);
    let grid = blocks_for(rows * pairs, THREADS as usize);
    in_place(
        c,
        x,
        "rope",
        grid,
        THREADS,
        &[
            KArg::Buf(&pb),
            KArg::Buf(&tb),
            KArg::U32(rows32),
            KArg::U32(dim32),
            KArg::U32(rd32),
            KArg::U32(pairs32),
            KArg::U32(u32::from(inverse)),
        ],
    )
}

/// Multiply each row of width `dim` (a power of two ≤ 1024) by the Sylvester Hadamard matrix
/// / sqrt(dim), in place.
pub fn hadamard(c: &Core, x: &mut [f32], dim: usize) -> Result<(), CudaError> {
    if !dim.is_power_of_two() || dim > HADAMARD_MAX {
        return Err(bad(format!(
            "hadamard needs a power-of-two width of at most {HADAMARD_MAX}, got {dim}"
        )));
    }
    if x.is_empty() {
        return Ok(());
    }
    let rows = rows_of("hadamard", x.len(), dim)?;
    let dim32 = u32_of("dim", dim)?;
    in_place(
        c,
        x,
        "hadamard",
        u32_of("rows", rows)?,
        THREADS,
        &[KArg::U32(dim32)],
    )
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
    let ab = c.dev.upload_f32(a)?;
    let bb = b.map(|b| c.dev.upload_f32(b)).transpose()?;
    let ob = c.dev.alloc(n * 4)?;
    let mut args = vec![KArg::Buf(&ab)];
    if let Some(bb) = &bb {
        args.push(KArg::Buf(bb));
    }
    args.push(KArg::Buf(&ob));
    args.push(KArg::U64(n as u64));
    args.extend_from_slice(extra);
    let grid = blocks_for(n, THREADS as usize);
    // SAFETY: parameter order (inputs, output, n, scalars) of router_scores and swiglu; every
    // buffer holds n f32.
    unsafe { c.dev.launch(kernel, (grid, 1, 1), (THREADS, 1, 1), &args)? };
    c.dev.download_f32(&ob, out)
}

/// Router scores sqrt(softplus(x)) element-wise.
pub fn router_scores(c: &Core, logits: &[f32], out: &mut [f32]) -> Result<(), CudaError> {
    elementwise(c, "router_scores", logits, None, out, &[])
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
    let (rows32, dim32) = (u32_of("rows", rows)?, u32_of("dim", dim)?);
    let n = x.len() as u64;
    match dtype {
        IndexKDtype::Bf16 => in_place(
            c,
            x,
            "round_index_bf16",
            blocks_for(x.len(), THREADS as usize),
            THREADS,
            &[KArg::U64(n)],
        ),
        IndexKDtype::Fp8 => in_place(
            c,
            x,
            "round_index_fp8",
            blocks_for(rows, WARPS),
            WARP_THREADS,
            &[KArg::U32(rows32), KArg::U32(dim32)],
        ),
        IndexKDtype::Fp4 => in_place(
            c,
            x,
            "round_index_fp4",
            blocks_for(rows * dim.div_ceil(32), WARPS),
            WARP_THREADS,
            &[KArg::U32(rows32), KArg::U32(dim32)],
        ),
    }
}

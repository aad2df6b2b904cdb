//! Launches of the kernels only the device-resident ops use (kernels/resident.cu): strided and
//! indexed row copies, element-wise add and scale. Callers (`src/resident/`) check the operands
//! against the op's definition; these check only that every launch stays inside its operands.

use crate::device::{DevPtr, KArg, blocks_for};
use crate::ops::rows::{THREADS, bad, fits, u32_of};
use crate::{Core, CudaError};

fn launch1(c: &Core, kernel: &str, n: usize, args: &[KArg<'_>]) -> Result<(), CudaError> {
    let grid = blocks_for(n, THREADS as usize);
    // SAFETY: every caller passes `args` in the kernel's parameter order and has checked each
    // operand holds what the launch's n threads read or write.
    unsafe { c.dev.launch(kernel, (grid, 1, 1), (THREADS, 1, 1), args) }
}

/// Words a strided operand of `rows` rows of `width` at `stride` spans.
pub(crate) fn extent(rows: usize, stride: usize, width: usize) -> usize {
    if rows == 0 || width == 0 {
        0
    } else {
        (rows - 1) * stride + width
    }
}

/// For r < rows, c < fill: dst[r·dst_stride + c] = c < width ? src[r·src_stride + c] : 0.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_copy2d(
    c: &Core,
    src: DevPtr,
    src_stride: usize,
    dst: DevPtr,
    dst_stride: usize,
    rows: usize,
    width: usize,
    fill: usize,
) -> Result<(), CudaError> {
    if fill < width {
        return Err(bad(format!("copy2d: fill {fill} below width {width}")));
    }
    fits("copy2d source", src, extent(rows, src_stride, width))?;
    fits("copy2d destination", dst, extent(rows, dst_stride, fill))?;
    let args = [
        KArg::Ptr(src),
        KArg::U64(src_stride as u64),
        KArg::Ptr(dst),
        KArg::U64(dst_stride as u64),
        KArg::U32(u32_of("rows", rows)?),
        KArg::U32(u32_of("width", width)?),
        KArg::U32(u32_of("fill", fill)?),
    ];
    launch1(c, "copy2d", rows * fill, &args)
}

/// dst[i] = src[i] for the first `words` 32-bit words (bit for bit; they do not overlap).
pub(crate) fn launch_copy_words(
    c: &Core,
    src: DevPtr,
    dst: DevPtr,
    words: usize,
) -> Result<(), CudaError> {
    fits("copy_words source", src, words)?;
    fits("copy_words destination", dst, words)?;
    if words == 0 {
        return Ok(());
    }
    let args = [KArg::Ptr(src), KArg::Ptr(dst), KArg::U64(words as u64)];
    launch1(c, "copy_words", words, &args)
}

/// gather_rows (`scatter` false: dst[r] = src[idx[r]]) or scatter_add_rows (`scatter` true:
/// dst[idx[r]] += src[r]) of `rows` rows of `width`; `idx` holds `rows` u32 on the device, each
/// below `table_rows` (the row count of the indexed operand).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_rows_by_index(
    c: &Core,
    scatter: bool,
    src: DevPtr,
    idx: DevPtr,
    dst: DevPtr,
    rows: usize,
    table_rows: usize,
    width: usize,
) -> Result<(), CudaError> {
    let (kernel, src_rows, dst_rows) = if scatter {
        ("scatter_add_rows", rows, table_rows)
    } else {
        ("gather_rows", table_rows, rows)
    };
    fits(kernel, src, src_rows * width)?;
    fits(kernel, dst, dst_rows * width)?;
    if idx.bytes < rows * 4 {
        return Err(bad(format!(
            "{kernel}: {} index bytes for {rows} rows",
            idx.bytes
        )));
    }
    let args = [
        KArg::Ptr(src),
        KArg::Ptr(idx),
        KArg::Ptr(dst),
        KArg::U32(u32_of("rows", rows)?),
        KArg::U32(u32_of("width", width)?),
    ];
    launch1(c, kernel, rows * width, &args)
}

/// scatter_add_groups in one launch: destination k (row `dests[k]` of `dst`) gets the source
/// rows `order[offsets[k] .. offsets[k+1]]` added in that order; `dests` holds `ndest` u32,
/// `offsets` ndest + 1 (ending at `rows`), `order` the `rows` source rows, all below the
/// operands' row counts (the caller built them from checked indices).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_scatter_add_ordered(
    c: &Core,
    src: DevPtr,
    dests: DevPtr,
    offsets: DevPtr,
    order: DevPtr,
    dst: DevPtr,
    ndest: usize,
    rows: usize,
    width: usize,
) -> Result<(), CudaError> {
    let kernel = "scatter_add_ordered";
    fits(kernel, src, rows * width)?;
    if dests.bytes < ndest * 4 || offsets.bytes < (ndest + 1) * 4 || order.bytes < rows * 4 {
        return Err(bad(format!(
            "{kernel}: index arrays of {}, {} and {} bytes for {ndest} destinations and {rows} rows",
            dests.bytes, offsets.bytes, order.bytes
        )));
    }
    let args = [
        KArg::Ptr(src),
        KArg::Ptr(dests),
        KArg::Ptr(offsets),
        KArg::Ptr(order),
        KArg::Ptr(dst),
        KArg::U32(u32_of("destinations", ndest)?),
        KArg::U32(u32_of("width", width)?),
    ];
    launch1(c, kernel, ndest * width, &args)
}

/// out = a + b over `n` f32.
pub(crate) fn launch_add(
    c: &Core,
    a: DevPtr,
    b: DevPtr,
    out: DevPtr,
    n: usize,
) -> Result<(), CudaError> {
    for p in [a, b, out] {
        fits("add", p, n)?;
    }
    let args = [
        KArg::Ptr(a),
        KArg::Ptr(b),
        KArg::Ptr(out),
        KArg::U64(n as u64),
    ];
    launch1(c, "add_f32", n, &args)
}

/// x = (f64(x)·s) as f32 over `n` f32, in place.
pub(crate) fn launch_scale(c: &Core, x: DevPtr, n: usize, s: f64) -> Result<(), CudaError> {
    fits("scale", x, n)?;
    let args = [KArg::Ptr(x), KArg::U64(n as u64), KArg::F64(s)];
    launch1(c, "scale_f64", n, &args)
}

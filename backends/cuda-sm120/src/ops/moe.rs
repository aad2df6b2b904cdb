//! Launches of the MoE routing kernels (kernels/moe.cu) that only the device-resident ops use
//! (`src/resident/moe.rs`): routes from scores, the routed rows' order by expert, a grouped
//! launch's table built on the device, and the routed rows added back per token. Callers check
//! the operands against the op's definition; these check that every launch stays inside them.

use crate::device::{DevPtr, KArg, blocks_for};
use crate::ops::rows::{THREADS, bad, fits, u32_of};
use crate::{Core, CudaError};

/// Threads of the one-block `moe_order` launch.
const ORDER_THREADS: u32 = 256;

/// Where `moe_route` takes each row's experts from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Choice {
    /// rows·k expert ids (u32).
    Fixed(DevPtr),
    /// The top-k of the scores plus this bias (experts f32).
    Biased(DevPtr),
}

/// `moe_route`: routes [rows, 2k] at `routes` from scores [rows, experts] at `scores`, the
/// experts as `choice` says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_route(
    c: &Core,
    scores: DevPtr,
    choice: Choice,
    routes: DevPtr,
    rows: usize,
    experts: usize,
    k: usize,
    scale: f64,
) -> Result<(), CudaError> {
    fits("moe_route scores", scores, rows * experts)?;
    fits("moe_route routes", routes, rows * 2 * k)?;
    let (bias, fixed) = match choice {
        Choice::Fixed(fixed) => {
            fits("moe_route fixed ids", fixed, rows * k)?;
            (KArg::U64(0), KArg::Ptr(fixed))
        }
        Choice::Biased(bias) => {
            fits("moe_route bias", bias, experts)?;
            (KArg::Ptr(bias), KArg::U64(0))
        }
    };
    let args = [
        KArg::Ptr(scores),
        bias,
        fixed,
        KArg::Ptr(routes),
        KArg::U32(u32_of("rows", rows)?),
        KArg::U32(u32_of("experts", experts)?),
        KArg::U32(u32_of("k", k)?),
        KArg::F64(scale),
    ];
    let grid = blocks_for(rows, THREADS as usize);
    // SAFETY: the arguments follow moe_route's parameter list and every operand was checked
    // to hold what its rows threads read or write (the null pointer is the unused choice).
    unsafe {
        c.dev
            .launch("moe_route", (grid, 1, 1), (THREADS, 1, 1), &args)
    }
}

/// Where `moe_order` writes: expert starts (experts + 1 u32), each routed row's token and
/// weight (rows·k each), each slot's routed row (rows·k u32), and its scratch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Order {
    /// Expert e's routed rows are `starts[e] .. starts[e+1]`.
    pub starts: DevPtr,
    /// The token of each routed row.
    pub idx: DevPtr,
    /// The routing weight of each routed row.
    pub w: DevPtr,
    /// The routed row of each (token, slot).
    pub pos: DevPtr,
    /// Scratch: per thread of the launch, a count per expert ([`order_scratch_words`]).
    pub cnt: DevPtr,
}

/// Words of `moe_order`'s scratch for `experts` experts.
pub(crate) fn order_scratch_words(experts: usize) -> usize {
    ORDER_THREADS as usize * experts
}

/// `moe_order` of routes [rows, 2k] at `routes` into `o`.
pub(crate) fn launch_order(
    c: &Core,
    routes: DevPtr,
    rows: usize,
    k: usize,
    experts: usize,
    o: Order,
) -> Result<(), CudaError> {
    let n = rows * k;
    fits("moe_order routes", routes, 2 * n)?;
    fits("moe_order starts", o.starts, experts + 1)?;
    for p in [o.idx, o.w, o.pos] {
        fits("moe_order", p, n)?;
    }
    fits("moe_order scratch", o.cnt, order_scratch_words(experts))?;
    let args = [
        KArg::Ptr(routes),
        KArg::U32(u32_of("rows", rows)?),
        KArg::U32(u32_of("k", k)?),
        KArg::U32(u32_of("experts", experts)?),
        KArg::Ptr(o.starts),
        KArg::Ptr(o.idx),
        KArg::Ptr(o.w),
        KArg::Ptr(o.pos),
        KArg::Ptr(o.cnt),
    ];
    // SAFETY: the arguments follow moe_order's parameter list; every operand was checked.
    unsafe {
        c.dev
            .launch("moe_order", (1, 1, 1), (ORDER_THREADS, 1, 1), &args)
    }
}

/// `moe_table`: `entries` grouped-launch entries (24 bytes each) at `table` over the expert
/// groups at `starts`, each expert's weight and scale addresses at `addrs` (2·experts u64),
/// at most `per_entry` rows an entry.
pub(crate) fn launch_table(
    c: &Core,
    starts: DevPtr,
    addrs: DevPtr,
    experts: usize,
    per_entry: usize,
    table: DevPtr,
    entries: usize,
) -> Result<(), CudaError> {
    fits("moe_table starts", starts, experts + 1)?;
    if addrs.bytes < experts * 16 || table.bytes < entries * 24 || per_entry == 0 {
        return Err(bad(format!(
            "moe_table: {} address bytes for {experts} experts, {} table bytes for {entries} \
             entries, {per_entry} rows an entry",
            addrs.bytes, table.bytes
        )));
    }
    let args = [
        KArg::Ptr(starts),
        KArg::Ptr(addrs),
        KArg::U32(u32_of("experts", experts)?),
        KArg::U32(u32_of("rows an entry", per_entry)?),
        KArg::Ptr(table),
        KArg::U32(u32_of("entries", entries)?),
    ];
    // SAFETY: the arguments follow moe_table's parameter list; every operand was checked.
    unsafe { c.dev.launch("moe_table", (1, 1, 1), (32, 1, 1), &args) }
}

/// `moe_scatter`: y [rows, width] from the routed rows ys [rows·k, width] through `pos`
/// (rows·k u32) and the routes' expert ids.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_scatter(
    c: &Core,
    ys: DevPtr,
    pos: DevPtr,
    routes: DevPtr,
    rows: usize,
    k: usize,
    experts: usize,
    width: usize,
    y: DevPtr,
) -> Result<(), CudaError> {
    fits("moe_scatter rows", ys, rows * k * width)?;
    fits("moe_scatter slots", pos, rows * k)?;
    fits("moe_scatter routes", routes, rows * 2 * k)?;
    fits("moe_scatter output", y, rows * width)?;
    if rows == 0 || width == 0 {
        return Ok(());
    }
    let args = [
        KArg::Ptr(ys),
        KArg::Ptr(pos),
        KArg::Ptr(routes),
        KArg::U32(u32_of("k", k)?),
        KArg::U32(u32_of("experts", experts)?),
        KArg::U32(u32_of("width", width)?),
        KArg::Ptr(y),
    ];
    let per_row = width.div_ceil(THREADS as usize);
    let grid = (u32_of("blocks", rows * per_row)?, 1, 1);
    // SAFETY: the arguments follow moe_scatter's parameter list; every operand was checked.
    unsafe { c.dev.launch("moe_scatter", grid, (THREADS, 1, 1), &args) }
}

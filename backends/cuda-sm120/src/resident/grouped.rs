//! The row-group resident ops, one launch each: `grouped_linear` (a layer's routed experts'
//! projections) and `scatter_add_groups` (their rows added into the output in expert order).

use super::ops::{disjoint, padded_input, resident_weight};
use super::{Ctx, op_err};
use crate::device::DevPtr;
use crate::ops::{linear as lin, resident as res};
use dsv4_kernels::device::{check_groups, check_scatter_groups};
use dsv4_kernels::{DevSlice, KernelError, Linear};
use std::collections::HashMap;

/// `DeviceOps::grouped_linear`: one launch over every group, its table of weight addresses
/// and row ranges a per-call parameter.
pub(super) fn grouped_linear(
    cx: &mut Ctx<'_>,
    weights: &[&Linear],
    x: DevSlice,
    starts: &[usize],
    out: DevSlice,
) -> Result<(), KernelError> {
    let (rows, i, o) = check_groups(weights, x, starts, out)?;
    let (xp, op) = (cx.slice("x", x)?, cx.slice("out", out)?);
    disjoint(cx, op, &[xp], false)?;
    if rows == 0 || o == 0 {
        return Ok(());
    }
    let rws = weights
        .iter()
        .map(|w| resident_weight(cx, w))
        .collect::<Result<Vec<_>, _>>()?;
    let input = padded_input(cx, xp, rows, i, rws[0].xpitch())?;
    let table = lin::GroupedTable::new(cx.core.linear, &rws, starts)
        .map_err(|e| op_err(format!("{}: {e}", cx.op)))?;
    let at = cx.param(&table.bytes)?;
    let r = lin::launch_grouped(cx.core, &rws[0], table.layout, at, input, op, rows);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

/// `DeviceOps::scatter_add_groups`: the destinations in order of first appearance, each with
/// its source rows in group order (one per-call parameter), added by one launch.
pub(super) fn scatter_add_groups(
    cx: &mut Ctx<'_>,
    src: DevSlice,
    idx: &[u32],
    starts: &[usize],
    width: usize,
    dst: DevSlice,
) -> Result<(), KernelError> {
    let op = cx.op;
    check_scatter_groups(src, idx, starts, width)?;
    let (s, d) = (cx.slice("src", src)?, cx.slice("dst", dst)?);
    if width == 0 || !dst.len.is_multiple_of(width) {
        return if dst.len == 0 {
            Ok(())
        } else {
            Err(op_err(format!(
                "{op}: {} words are not rows of width {width}",
                dst.len
            )))
        };
    }
    let dst_rows = dst.len / width;
    if let Some(&bad) = idx.iter().find(|&&i| i as usize >= dst_rows) {
        return Err(op_err(format!("{op}: row index {bad} of {dst_rows} rows")));
    }
    disjoint(cx, d, &[s], false)?;
    if idx.is_empty() {
        return Ok(());
    }
    // Groups are consecutive ranges in order, so source rows in index order are in group order.
    let mut slot = HashMap::new();
    let mut lists: Vec<(u32, Vec<u32>)> = Vec::new();
    for (r, &i) in idx.iter().enumerate() {
        let k = *slot.entry(i).or_insert_with(|| {
            lists.push((i, Vec::new()));
            lists.len() - 1
        });
        lists[k].1.push(r as u32);
    }
    let ndest = lists.len();
    let mut words: Vec<u32> = lists.iter().map(|(i, _)| *i).collect();
    let mut at = 0u32;
    words.push(at);
    for (_, rows) in &lists {
        at += rows.len() as u32;
        words.push(at);
    }
    words.extend(lists.iter().flat_map(|(_, rows)| rows.iter().copied()));
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let p = cx.param(&bytes)?;
    let part = |first: usize, n: usize| DevPtr {
        ptr: p.ptr + 4 * first as u64,
        bytes: 4 * n,
    };
    let (dests, offsets, order) = (
        part(0, ndest),
        part(ndest, ndest + 1),
        part(2 * ndest + 1, idx.len()),
    );
    let r = res::launch_scatter_add_ordered(
        cx.core,
        s,
        dests,
        offsets,
        order,
        d,
        ndest,
        idx.len(),
        width,
    );
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

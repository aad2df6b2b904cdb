//! MoE routing on the device: `route_experts` (routes from the router's scores, kernels/moe.cu
//! `moe_route`) and `routed_experts` (the routed rows ordered by expert, the grouped launches'
//! tables built and run, and the rows added back per token, all without the host seeing the
//! routes). Bitwise what the host-built groups give: the same grouped kernels over the same
//! rows, the same summation order.

use super::ops::{disjoint, padded_input, resident_weight};
use super::{Ctx, ParamKey};
use crate::device::DevPtr;
use crate::ops::linear::{GroupedLayout, ResidentWeight, launch_grouped};
use crate::ops::moe::{self, Choice, Order};
use crate::ops::{resident as res, rows};
use dsv4_kernels::moe_device::{check_route, work_parts};
use dsv4_kernels::{DevSlice, KernelError, RouteChoice, RoutedExperts, WeightKey};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

/// `DeviceOps::route_experts`.
pub(super) fn route_experts(
    cx: &mut Ctx<'_>,
    scores: DevSlice,
    experts: usize,
    k: usize,
    choice: RouteChoice<'_>,
    scale: f64,
    routes: DevSlice,
) -> Result<(), KernelError> {
    let rows = check_route(scores.len, experts, k, choice, routes.len)?;
    let (sp, rp) = (cx.slice("scores", scores)?, cx.slice("routes", routes)?);
    disjoint(cx, rp, &[sp], false)?;
    if rows == 0 {
        return Ok(());
    }
    let choice = match choice {
        RouteChoice::Fixed(ids) => {
            let bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
            Choice::Fixed(cx.param(&bytes)?)
        }
        RouteChoice::Biased(bias) => Choice::Biased(cx.cached(crate::device::f32_bytes(bias))?),
    };
    let r = moe::launch_route(cx.core, sp, choice, rp, rows, experts, k, scale);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

/// `DeviceOps::routed_experts`.
pub(super) fn routed_experts(
    cx: &mut Ctx<'_>,
    e: &RoutedExperts<'_>,
    x: DevSlice,
    routes: DevSlice,
    work: DevSlice,
    y: DevSlice,
) -> Result<(), KernelError> {
    let (experts, dim, inter, rows) = e.check_call(x, routes, work, y)?;
    let k = e.k;
    let n = rows * k;
    let parts = work_parts(n, dim, inter);
    let (xp, rp) = (cx.slice("x", x)?, cx.slice("routes", routes)?);
    let (wp, yp) = (cx.slice("work", work)?, cx.slice("y", y)?);
    disjoint(cx, yp, &[xp, rp, wp], false)?;
    disjoint(cx, wp, &[xp, rp], false)?;
    if rows == 0 {
        return Ok(());
    }
    let mut at = wp.ptr;
    let [xs, g, u, h, ys] = parts.map(|words| {
        let p = DevPtr {
            ptr: at,
            bytes: words * 4,
        };
        at += (words * 4) as u64;
        p
    });
    let order = Order {
        starts: cx.scratch((experts + 1) * 4)?,
        idx: cx.scratch(n * 4)?,
        w: cx.scratch(n * 4)?,
        pos: cx.scratch(n * 4)?,
        cnt: cx.scratch(moe::order_scratch_words(experts) * 4)?,
    };
    let addrs = expert_addresses(cx, e, experts)?;
    let first = [e.w1[0], e.w3[0], e.w2[0]].map(|w| resident_weight(cx, w));
    let [f1, f3, f2] = first;
    let (f1, f3, f2) = (f1?, f3?, f2?);
    let c = cx.core;
    let r = moe::launch_order(c, rp, rows, k, experts, order)
        .and_then(|()| res::launch_rows_by_index(c, false, xp, order.idx, xs, n, rows, dim))
        .and_then(|()| quant(c, e.quant, xs, n, dim));
    cx.run(r)?;
    cx.dispatched(2 + u64::from(e.quant));
    let group = Group {
        order,
        experts,
        rows,
        n,
    };
    group.launch(cx, &f1, addrs, 0, xs, dim, g)?;
    group.launch(cx, &f3, addrs, 1, xs, dim, u)?;
    let c = cx.core;
    let r = rows::launch_swiglu_rows(c, g, u, h, order.w, n, inter, e.limit)
        .and_then(|()| quant(c, e.quant, h, n, inter));
    cx.run(r)?;
    cx.dispatched(1 + u64::from(e.quant));
    group.launch(cx, &f2, addrs, 2, h, inter, ys)?;
    let r = moe::launch_scatter(cx.core, ys, order.pos, rp, rows, k, experts, dim, yp);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

/// act_quant_fp8 of `n` rows of `dim` at `p`, in place, when `on`.
fn quant(
    c: &crate::Core,
    on: bool,
    p: DevPtr,
    n: usize,
    dim: usize,
) -> Result<(), crate::CudaError> {
    if on {
        rows::launch_act_quant(c, p, n, dim)
    } else {
        Ok(())
    }
}

/// The routed rows of one `routed_experts` call, grouped by expert on the device.
struct Group {
    order: Order,
    experts: usize,
    rows: usize,
    n: usize,
}

impl Group {
    /// The grouped launch of projection `which` (0 gate, 1 up, 2 down; `first` is its first
    /// expert's weight) over the routed rows `input` of width `width` into `out`: its table
    /// built on the device from the order's starts, then the grouped kernel.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        cx: &mut Ctx<'_>,
        first: &ResidentWeight,
        addrs: DevPtr,
        which: usize,
        input: DevPtr,
        width: usize,
        out: DevPtr,
    ) -> Result<(), KernelError> {
        // An expert takes at most one row per token.
        let layout = GroupedLayout::bound(
            cx.core.linear,
            first.format(),
            self.n,
            self.experts,
            self.rows,
        );
        let table = cx.scratch(layout.bytes())?;
        let span = (self.experts * 16) as u64;
        let addrs = DevPtr {
            ptr: addrs.ptr + which as u64 * span,
            bytes: self.experts * 16,
        };
        let input = padded_input(cx, input, self.n, width, first.xpitch())?;
        let c = cx.core;
        let r = moe::launch_table(
            c,
            self.order.starts,
            addrs,
            self.experts,
            layout.per_entry,
            table,
            layout.entries,
        )
        .and_then(|()| launch_grouped(c, first, layout, table, input, out, self.n));
        cx.run(r)?;
        cx.dispatched(2);
        Ok(())
    }
}

/// The device addresses (weight bytes, scale bytes) of every expert's gate, up and down
/// weights, in that order, on the device: cached per set of weights, keyed by the host
/// weights' addresses and shapes and by the first and last weight's contents (as the weight
/// cache keys them), so a step looks up no weight but the first of each projection.
fn expert_addresses(
    cx: &mut Ctx<'_>,
    e: &RoutedExperts<'_>,
    experts: usize,
) -> Result<DevPtr, KernelError> {
    let lists = [e.w1, e.w3, e.w2];
    let mut h = DefaultHasher::new();
    for w in lists.iter().flat_map(|l| l.iter()) {
        (w.data.as_ptr() as usize, w.scale.as_ptr() as usize).hash(&mut h);
        (w.out_dim, w.in_dim).hash(&mut h);
    }
    let mut s = DefaultHasher::new();
    for l in lists {
        for w in [l[0], l[experts - 1]] {
            WeightKey::of(w).hash(&mut s);
        }
    }
    // Address 0 never names a host array, so these keys meet no other cached parameter's.
    let key = [
        ParamKey {
            ptr: 0,
            bytes: 3 * experts,
            hash: h.finish(),
        },
        ParamKey {
            ptr: 0,
            bytes: 0,
            hash: s.finish(),
        },
    ];
    if let Some(b) = cx.st.cache.get(&key) {
        return Ok(b.at());
    }
    let mut bytes = Vec::with_capacity(3 * experts * 16);
    for w in lists.iter().flat_map(|l| l.iter()) {
        let rw: Arc<ResidentWeight> = resident_weight(cx, w)?;
        bytes.extend(rw.addresses().iter().flat_map(|a| a.to_le_bytes()));
    }
    cx.cached_as(key, || bytes)
}

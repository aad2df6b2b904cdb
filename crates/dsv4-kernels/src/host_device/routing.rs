//! [`HostDevice`]'s routing ops (with [`HostDevice::with_device_routing`]): the executable
//! specification of `DeviceOps::route_experts` and `routed_experts`, the host forms of
//! [`crate::moe_device`] over the device's buffers.

use super::{HostDevice, R};
use crate::device::{DevSlice, ensure};
use crate::moe_device::{check_route, routed_host, routes_host};
use crate::{RouteChoice, RoutedExperts};

/// `DeviceOps::route_experts`: [`routes_host`] of the scores.
pub(super) fn route_experts(
    dev: &HostDevice,
    scores: DevSlice,
    experts: usize,
    k: usize,
    choice: RouteChoice<'_>,
    scale: f64,
    routes: DevSlice,
) -> R<()> {
    let op = "route_experts";
    ensure(dev.routes, op, || "not supported on this device".into())?;
    check_route(scores.len, experts, k, choice, routes.len)?;
    let [s] = dev.load(op, [("scores", scores)])?;
    dev.check_out(op, &[("routes", routes)])?;
    let r = dev.host(op, |be| routes_host(be, &s, experts, k, choice, scale))?;
    dev.store(op, &[(routes, &r)])
}

/// `DeviceOps::routed_experts`: [`routed_host`] of the operands.
pub(super) fn routed_experts(
    dev: &HostDevice,
    experts: &RoutedExperts<'_>,
    x: DevSlice,
    routes: DevSlice,
    work: DevSlice,
    y: DevSlice,
) -> R<()> {
    let op = "routed_experts";
    ensure(dev.routes, op, || "not supported on this device".into())?;
    experts.check_call(x, routes, work, y)?;
    let [xv, rv] = dev.load(op, [("x", x), ("routes", routes)])?;
    dev.check_out(op, &[("work", work), ("y", y)])?;
    let out = dev.host(op, |be| routed_host(be, experts, &xv, &rv))??;
    dev.store(op, &[(y, &out)])
}

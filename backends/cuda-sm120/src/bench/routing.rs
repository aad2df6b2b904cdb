//! The routing case of the device bench: one MoE layer's routed experts for a decode batch,
//! timed with the routing on the device (`route_experts` then `routed_experts`) and from
//! host-built groups (gather, three grouped launches, SwiGLU, scatter: what a device that does
//! not route runs after reading its scores back). Only the device work is timed; the host
//! round trip the second needs is not, so the ratio is what the routing kernels add or save
//! on the device itself.

use super::{bench_weight, time_op};
use crate::{CudaBackend, CudaError};
use dsv4_kernels::{Backend, DevBufId, DevSlice, DeviceOps, KernelError, Linear, RouteChoice};
use dsv4_kernels::{RoutedExperts, WeightFormat};
use serde::Serialize;
use std::cell::RefCell;

/// One MoE layer timed both ways on the device.
#[derive(Debug, Clone, Serialize)]
pub struct RoutingTiming {
    /// What was timed ("MXFP4 experts 64 x (4096 -> 2048), k = 6, 16 tokens").
    pub case: String,
    /// Seconds per layer with the routing on the device: `route_experts` (biased top-k) and
    /// `routed_experts` (order, tables, gather, grouped launches, SwiGLU, scatter).
    pub device_seconds: f64,
    /// Of which `route_experts`.
    pub route_seconds: f64,
    /// Seconds per layer from host-built groups (the same routes): gather, three grouped
    /// launches, SwiGLU, zeroing and the grouped scatter.
    pub host_grouped_seconds: f64,
    /// device_seconds / host_grouped_seconds.
    pub ratio: f64,
}

/// The layer's shape: experts, dim, inter, k, tokens.
fn shape(emulated: bool) -> (usize, usize, usize, usize, usize) {
    if emulated {
        (4, 128, 128, 2, 3)
    } else {
        // DSV4-Flash's expert shape and k, 64 of its 256 experts (855 MB of MXFP4 weights,
        // far past any L2 cache), a batch-16 decode step.
        (64, 4096, 2048, 6, 16)
    }
}

fn dev_err(e: KernelError) -> CudaError {
    CudaError::BadOperands(format!("routing bench: {e}"))
}

/// Time the routing case on `backend`.
pub(super) fn time_routing(backend: &CudaBackend) -> Result<RoutingTiming, CudaError> {
    let dev = backend.device();
    let emulated = dev.info().emulated;
    let (e, dim, inter, k, t) = shape(emulated);
    let batches = if emulated { 1 } else { 5 };
    let fmt = WeightFormat::Mxfp4;
    let mk = |w: &str, x: usize, o: usize, i: usize| {
        bench_weight(&format!("routing {w}[{x}]"), o, i, fmt)
    };
    let (mut w1, mut w3, mut w2) = (Vec::new(), Vec::new(), Vec::new());
    for x in 0..e {
        w1.push(mk("w1", x, inter, dim)?);
        w3.push(mk("w3", x, inter, dim)?);
        w2.push(mk("w2", x, dim, inter)?);
    }
    let (r1, r3, r2): (Vec<&Linear>, Vec<&Linear>, Vec<&Linear>) = (
        w1.iter().collect(),
        w3.iter().collect(),
        w2.iter().collect(),
    );
    let spec = RoutedExperts {
        w1: &r1,
        w3: &r3,
        w2: &r2,
        k,
        limit: 7.0,
        quant: true,
    };
    let ops: &dyn DeviceOps = Backend::device(backend)
        .ok_or_else(|| CudaError::BadOperands("routing bench: no device op set".into()))?;
    let mut g = dsv4_core::SplitMix64::new(0x2077);
    let scores: Vec<f32> = (0..t * e).map(|_| 0.5 + g.uniform_sym(0.4)).collect();
    let bias: Vec<f32> = (0..e).map(|_| g.uniform_sym(0.1)).collect();
    let x: Vec<f32> = (0..t * dim).map(|_| g.uniform_sym(1.0)).collect();
    let held = Held {
        ops,
        bufs: RefCell::new(Vec::new()),
    };
    let put = |v: &[f32]| held.put(v);
    let zeros = |n: usize| put(&vec![0f32; n]);
    let r = (|| -> Result<RoutingTiming, KernelError> {
        let (ds, dx) = (put(&scores)?, put(&x)?);
        let (routes, y) = (zeros(t * 2 * k)?, zeros(t * dim)?);
        let work = zeros(spec.work_words(t, dim, inter))?;
        let choice = RouteChoice::Biased(&bias);
        let route = || ops.route_experts(ds, e, k, choice, 1.5, routes);
        let run = || ops.routed_experts(&spec, dx, routes, work, y);
        let k_err = |r: Result<(), KernelError>| r.map_err(dev_err);
        let route_seconds = time_op(dev, batches, || k_err(route())).map_err(to_k)?;
        let device_seconds =
            time_op(dev, batches, || k_err(route().and_then(|()| run()))).map_err(to_k)?;
        // The same routes grouped on the host.
        let back = ops.read(routes)?;
        let (mut idx, mut wts, mut starts, mut group) = (vec![], vec![], vec![0usize], vec![]);
        for ex in 0..e {
            for (r, row) in back.chunks(2 * k).enumerate() {
                if let Some(p) = row[..k].iter().position(|v| v.to_bits() as usize == ex) {
                    idx.push(r as u32);
                    wts.push(row[k + p]);
                }
            }
            if idx.len() > *starts.last().unwrap_or(&0) {
                starts.push(idx.len());
                group.push(ex);
            }
        }
        let n = idx.len();
        let g1: Vec<&Linear> = group.iter().map(|&i| &w1[i]).collect();
        let g3: Vec<&Linear> = group.iter().map(|&i| &w3[i]).collect();
        let g2: Vec<&Linear> = group.iter().map(|&i| &w2[i]).collect();
        let (xs, gs, us, hs, ys) = (
            zeros(n * dim)?,
            zeros(n * inter)?,
            zeros(n * inter)?,
            zeros(n * inter)?,
            zeros(n * dim)?,
        );
        let grouped = || -> Result<(), KernelError> {
            ops.gather_rows(dx, &idx, dim, xs)?;
            ops.act_quant_fp8(xs, dim)?;
            ops.grouped_linear(&g1, xs, &starts, gs)?;
            ops.grouped_linear(&g3, xs, &starts, us)?;
            ops.swiglu_rows(gs, us, 7.0, &wts, inter, hs)?;
            ops.act_quant_fp8(hs, inter)?;
            ops.grouped_linear(&g2, hs, &starts, ys)?;
            ops.scale(y, 0.0)?;
            ops.scatter_add_groups(ys, &idx, &starts, dim, y)
        };
        let host_grouped_seconds = time_op(dev, batches, || k_err(grouped())).map_err(to_k)?;
        Ok(RoutingTiming {
            case: format!("MXFP4 experts {e} x ({dim} -> {inter}), k = {k}, {t} tokens"),
            device_seconds,
            route_seconds,
            host_grouped_seconds,
            ratio: device_seconds / host_grouped_seconds,
        })
    })();
    r.map_err(dev_err)
}

/// The bench's device buffers, freed when it ends (however it ends).
struct Held<'a> {
    ops: &'a dyn DeviceOps,
    bufs: RefCell<Vec<DevBufId>>,
}

impl Held<'_> {
    /// `v` in a fresh buffer.
    fn put(&self, v: &[f32]) -> Result<DevSlice, KernelError> {
        let b = self.ops.alloc(v.len().max(1))?;
        self.bufs.borrow_mut().push(b);
        let s = DevSlice::whole(b, v.len());
        self.ops.write(s, v)?;
        Ok(s)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for b in self.bufs.borrow_mut().drain(..) {
            self.ops.free(b);
        }
    }
}

fn to_k(e: CudaError) -> KernelError {
    KernelError::Device {
        message: e.to_string(),
    }
}

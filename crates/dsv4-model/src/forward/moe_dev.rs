//! The device forms of the MoE router and routed experts. Where the device routes
//! ([`dsv4_kernels::DeviceOps::routes_on_device`]), the router's routes stay on the device and the routed
//! experts group their rows there, so a layer's MoE reads nothing back; elsewhere the router
//! reads its scores back, ranks and weights them as the host form does, and the routed experts
//! group their rows on the host.

use super::ForwardError;
use super::moe::{decode_routes, expert_rows, hash_experts, pinned_experts};
use super::op::BlockRef;
use super::resident_ops::{Dev, Res};
use super::run::{Run, lock};
use crate::weights::{ExpertWeights, Routing};
use dsv4_core::ActQuant;
use dsv4_kernels::moe_device::check_k;
use dsv4_kernels::{Copy2d, DevSlice, Linear, RouteChoice, RoutedExperts};

impl Run<'_> {
    /// `[xn, (tokens)] → [routes]` on the device: gate and scores run there. Where the device
    /// routes, the routes are computed there too ([`Self::route_on_device`]); else the scores
    /// (and the token ids of hash routing) are read back, ranked and weighted as the host form
    /// does, and the routes written.
    pub(super) fn router_dev(
        &self,
        d: &Dev<'_>,
        b: Option<BlockRef>,
        ins: &[DevSlice],
        out: DevSlice,
    ) -> Res {
        let w = &self.weights(b)?.moe;
        let t = self.bound.rows;
        let e = self.model.cfg.n_routed_experts;
        let logits = d.tmp(t * e)?;
        let scores = d.tmp(t * e)?;
        d.ops.linear(&w.gate, ins[0], t, logits.s)?;
        d.ops.router_scores(logits.s, scores.s)?;
        if self.route_on_device(d, b, ins, scores.s, out)? {
            return Ok(());
        }
        // The token ids from their host copy (the upload wrote them), else read back with
        // the scores in one read.
        let tokens = ins.get(1).map(|&tok| (tok, d.mem.host_copy(tok)));
        let unread = tokens
            .iter()
            .filter(|(_, copy)| copy.is_none())
            .map(|&(tok, _)| tok);
        let srcs: Vec<DevSlice> = std::iter::once(scores.s).chain(unread).collect();
        let mut back = d.ops.read_many(&srcs)?.into_iter();
        let s = back
            .next()
            .filter(|s| s.len() == t * e)
            .ok_or_else(|| ForwardError::Plan {
                message: "the router's scores did not come back from the device".into(),
            })?;
        let ids = match tokens {
            Some((_, copy)) => {
                Some(
                    copy.or_else(|| back.next())
                        .ok_or_else(|| ForwardError::Plan {
                            message: "the router's token ids did not come back from the device"
                                .into(),
                        })?,
                )
            }
            None => None,
        };
        let ids = self.routing_tokens(ids.as_deref());
        let routes = self.choose_routes(b, &s, &ids)?;
        // Kept as the buffer's host copy: the routed experts read the routes from it.
        d.mem.write_slice(out, &self.encode_routes(routes))
    }

    /// The routes of the router's `scores` written into `out` on the device, when the device
    /// routes and the call needs no scores on the host (false: nothing was done). Hash routing
    /// looks its experts up by the token ids' host copy (without one, the host routes);
    /// pinned experts are given as fixed; the router's own choice, when the call records it,
    /// is read back (a biased layer's top-k on the device, beside the pins when pinned).
    fn route_on_device(
        &self,
        d: &Dev<'_>,
        b: Option<BlockRef>,
        ins: &[DevSlice],
        scores: DevSlice,
        out: DevSlice,
    ) -> Result<bool, ForwardError> {
        let cfg = &self.model.cfg;
        let (e, k, t) = (
            cfg.n_routed_experts,
            cfg.num_experts_per_tok,
            self.bound.rows,
        );
        if !d.ops.routes_on_device()
            || self.choices.record_scores
            || check_k(k, e).is_err()
            || out.len != t * 2 * k
        {
            return Ok(false);
        }
        let w = &self.weights(b)?.moe;
        let scale = cfg.routed_scaling_factor;
        let bias = match &w.routing {
            Routing::Hash(tid2eid) => {
                let Some(tokens) = ins.get(1).and_then(|&tok| d.mem.host_copy(tok)) else {
                    return Ok(false);
                };
                let ids: Vec<u32> = hash_experts(tid2eid, &self.routing_tokens(Some(&tokens)), k)
                    .into_iter()
                    .flatten()
                    .map(|j| j as u32)
                    .collect();
                d.ops
                    .route_experts(scores, e, k, RouteChoice::Fixed(&ids), scale, out)?;
                return Ok(true);
            }
            Routing::Bias(bias) => bias,
        };
        let layer = match b {
            Some(BlockRef::Main(layer)) => Some(layer),
            _ => None,
        };
        let pins = layer.and_then(|l| Some((l, self.choices.pinned_experts?.get(&l)?)));
        let record = layer.filter(|_| self.choices.record_experts);
        let biased = RouteChoice::Biased(bias);
        let Some((l, pins)) = pins else {
            d.ops.route_experts(scores, e, k, biased, scale, out)?;
            if let Some(l) = record {
                self.record_own(l, &d.ops.read(out)?, k);
            }
            return Ok(true);
        };
        let fixed: Vec<u32> = pinned_experts(l, pins, t, e, k)?
            .into_iter()
            .flatten()
            .map(|j| j as u32)
            .collect();
        if record.is_some() {
            let own = d.tmp(out.len)?;
            d.ops.route_experts(scores, e, k, biased, scale, own.s)?;
            self.record_own(l, &d.ops.read(own.s)?, k);
        }
        d.ops
            .route_experts(scores, e, k, RouteChoice::Fixed(&fixed), scale, out)?;
        Ok(true)
    }

    /// Record layer `layer`'s own choice of experts from its `routes` read back.
    fn record_own(&self, layer: usize, routes: &[f32], k: usize) {
        let own = routes
            .chunks(2 * k)
            .map(|r| r[..k].iter().map(|v| v.to_bits()).collect())
            .collect();
        lock(&self.out.experts).insert(layer, own);
    }

    /// `[xn, routes] → [yr]` on the device. Routes the router left on the device (no host
    /// copy) on a device that routes are grouped and run there
    /// ([`dsv4_kernels::DeviceOps::routed_experts`]). Else the routes come from their host copy
    /// (the router wrote them from the host), or are read back (a few words per row), and each
    /// expert's rows are gathered, run and added into `y` in ascending expert order.
    pub(super) fn routed_dev(
        &self,
        d: &Dev<'_>,
        b: Option<BlockRef>,
        ins: &[DevSlice],
        y: DevSlice,
    ) -> Res {
        let w = &self.weights(b)?.moe;
        let cfg = &self.model.cfg;
        let dim = cfg.hidden_size;
        let host = d.mem.host_copy(ins[1]);
        if host.is_none() && d.ops.routes_on_device() && !w.experts.is_empty() {
            let of = |f: fn(&ExpertWeights) -> &Linear| w.experts.iter().map(f).collect();
            let (w1, w3, w2): (Vec<&Linear>, Vec<&Linear>, Vec<&Linear>) =
                (of(|e| &e.w1), of(|e| &e.w3), of(|e| &e.w2));
            let low = w1[0].format.is_low_precision();
            let experts = RoutedExperts {
                w1: &w1,
                w3: &w3,
                w2: &w2,
                k: cfg.num_experts_per_tok,
                limit: cfg.swiglu_limit as f32,
                quant: self.model.numerics.act_quant == ActQuant::Fp8 && low,
            };
            let work = d.tmp(experts.work_words(self.bound.rows, dim, w1[0].out_dim))?;
            return Ok(d.ops.routed_experts(&experts, ins[0], ins[1], work.s, y)?);
        }
        let routes = match host {
            Some(v) => v,
            None => d.ops.read(ins[1])?,
        };
        let routes = decode_routes(
            &routes,
            cfg.num_experts_per_tok,
            w.experts.len(),
            self.bound.rows,
        );
        d.ops.write(y, &vec![0f32; y.len])?;
        // Every routed row at once, grouped by expert in ascending order: one gather, one
        // grouped launch per projection, one SwiGLU, and one grouped add into `y` that adds a
        // token's experts in that order (the host form's).
        let (mut idx, mut weights, mut starts, mut experts) = (vec![], vec![], vec![0], vec![]);
        for (e, ew) in w.experts.iter().enumerate() {
            let (rows, wr) = expert_rows(&routes, e);
            if rows.is_empty() {
                continue;
            }
            idx.extend(rows.iter().map(|&r| r as u32));
            weights.extend(wr);
            starts.push(idx.len());
            experts.push(ew);
        }
        if idx.is_empty() {
            return Ok(());
        }
        let n = idx.len();
        let inter = experts[0].w1.out_dim;
        let xs = d.tmp(n * dim)?;
        d.ops.gather_rows(ins[0], &idx, dim, xs.s)?;
        let (g, u, h) = (d.tmp(n * inter)?, d.tmp(n * inter)?, d.tmp(n * inter)?);
        let ys = d.tmp(n * dim)?;
        let of = |f: fn(&ExpertWeights) -> &Linear| experts.iter().map(|ew| f(ew)).collect();
        let (w1, w3, w2): (Vec<&Linear>, Vec<&Linear>, Vec<&Linear>) =
            (of(|e| &e.w1), of(|e| &e.w3), of(|e| &e.w2));
        self.project_grouped_dev(d, &w1, xs.s, &starts, g.s)?;
        self.project_grouped_dev(d, &w3, xs.s, &starts, u.s)?;
        let limit = cfg.swiglu_limit as f32;
        d.ops.swiglu_rows(g.s, u.s, limit, &weights, inter, h.s)?;
        self.project_grouped_dev(d, &w2, h.s, &starts, ys.s)?;
        Ok(d.ops.scatter_add_groups(ys.s, &idx, &starts, dim, y)?)
    }

    /// [`Self::project_dev`] of several weights of one shape over consecutive row groups of
    /// `x` (`starts` as `DeviceOps::grouped_linear` takes them), in one grouped launch.
    fn project_grouped_dev(
        &self,
        d: &Dev<'_>,
        ws: &[&Linear],
        x: DevSlice,
        starts: &[usize],
        out: DevSlice,
    ) -> Res {
        let low = ws.first().is_some_and(|w| w.format.is_low_precision());
        if self.model.numerics.act_quant == ActQuant::Fp8 && low {
            let xq = d.tmp(x.len)?;
            d.ops.copy2d(x, xq.s, Copy2d::contiguous(x.len))?;
            d.ops.act_quant_fp8(xq.s, ws[0].in_dim)?;
            Ok(d.ops.grouped_linear(ws, xq.s, starts, out)?)
        } else {
            Ok(d.ops.grouped_linear(ws, x, starts, out)?)
        }
    }
}

//! The operands of MoE routing on the device ([`crate::DeviceOps::route_experts`] and
//! [`crate::DeviceOps::routed_experts`]): how a layer's tokens choose their experts, the experts
//! they run, and the checks every backend applies before it launches anything.

use crate::device::{DevSlice, check_len};
use crate::{KernelError, Linear};

/// Most experts a token routes to on the device (the kernels keep a token's choice in
/// registers; DeepSeek-V4 routes to 6).
pub const MAX_ROUTED_K: usize = 16;

/// How [`crate::DeviceOps::route_experts`] chooses each row's experts.
#[derive(Debug, Clone, Copy)]
pub enum RouteChoice<'a> {
    /// Given: k expert ids per row (hash routing's lookup by token id, or pinned experts),
    /// each wrapped into the experts.
    Fixed(&'a [u32]),
    /// The top-k of each row's scores plus this bias (one per expert, added in f32), as
    /// [`crate::Backend::topk`] ranks them (larger first, ties to the lower id, NaN last), in
    /// ascending id order.
    Biased(&'a [f32]),
}

/// A layer's routed experts for [`crate::DeviceOps::routed_experts`]: per expert its gate
/// (`w1`), up (`w3`) and down (`w2`) projection; every expert's of one shape and format.
#[derive(Debug, Clone, Copy)]
pub struct RoutedExperts<'a> {
    /// Gate projections [inter, dim], one per expert.
    pub w1: &'a [&'a Linear],
    /// Up projections [inter, dim].
    pub w3: &'a [&'a Linear],
    /// Down projections [dim, inter].
    pub w2: &'a [&'a Linear],
    /// Experts per token (the routes' k).
    pub k: usize,
    /// The SwiGLU clamp L.
    pub limit: f32,
    /// Whether each projection's input is first quantized to fp8 blocks
    /// ([`crate::DeviceOps::act_quant_fp8`] over its width), as the host form does for
    /// low-precision weights under fp8 activations.
    pub quant: bool,
}

/// Words each part of the `work` slice is rounded up to (256 bytes, so every part is aligned
/// for any kernel).
const PART: usize = 64;

impl RoutedExperts<'_> {
    /// (experts, dim, inter) after checking the experts: at least one, as many gates, ups and
    /// downs, all of one format, gates and ups [inter, dim], downs [dim, inter], and k within
    /// 1..=min(experts, [`MAX_ROUTED_K`]).
    pub fn check(&self) -> Result<(usize, usize, usize), KernelError> {
        let bad = |m: String| {
            Err(KernelError::Device {
                message: format!("routed_experts: {m}"),
            })
        };
        let e = self.w1.len();
        if e == 0 || self.w3.len() != e || self.w2.len() != e {
            return bad(format!(
                "{} gates, {} ups and {} downs (one each per expert, at least one expert)",
                self.w1.len(),
                self.w3.len(),
                self.w2.len()
            ));
        }
        let (inter, dim, fmt) = (self.w1[0].out_dim, self.w1[0].in_dim, self.w1[0].format);
        let all = self.w1.iter().chain(self.w3).map(|w| (w, inter, dim));
        let all = all.chain(self.w2.iter().map(|w| (w, dim, inter)));
        for (w, o, i) in all {
            if (w.out_dim, w.in_dim) != (o, i) || w.format != fmt {
                return bad(format!(
                    "expert weight `{}` is [{}, {}] {:?}, the layer's are [{o}, {i}] {fmt:?}",
                    w.name, w.out_dim, w.in_dim, w.format
                ));
            }
        }
        check_k(self.k, e)?;
        Ok((e, dim, inter))
    }

    /// (experts, dim, inter, rows) after checking a `routed_experts` call's operands: the
    /// experts ([`Self::check`]), routes of whole rows of k slots, x and y of that many rows of
    /// dim, and work of [`Self::work_words`].
    pub fn check_call(
        &self,
        x: DevSlice,
        routes: DevSlice,
        work: DevSlice,
        y: DevSlice,
    ) -> Result<(usize, usize, usize, usize), KernelError> {
        let (experts, dim, inter) = self.check()?;
        let k = self.k;
        if !routes.len.is_multiple_of(2 * k) {
            return Err(KernelError::Device {
                message: format!(
                    "routed_experts: routes of {} words are not rows of {k} experts",
                    routes.len
                ),
            });
        }
        let rows = routes.len / (2 * k);
        check_len("routed_experts", "x", x, rows * dim)?;
        check_len("routed_experts", "y", y, rows * dim)?;
        check_len(
            "routed_experts",
            "work",
            work,
            self.work_words(rows, dim, inter),
        )?;
        Ok((experts, dim, inter, rows))
    }

    /// Words of the `work` slice [`crate::DeviceOps::routed_experts`] takes for `rows` tokens
    /// of width `dim` through experts of width `inter`: the gathered rows, gate, up, SwiGLU and
    /// down outputs of every routed row.
    pub fn work_words(&self, rows: usize, dim: usize, inter: usize) -> usize {
        work_parts(rows * self.k, dim, inter).iter().sum()
    }
}

/// The parts of a `work` slice for `n` routed rows, in words (each a multiple of 64): the
/// gathered inputs [n, dim], gate, up and SwiGLU outputs [n, inter], down outputs [n, dim].
pub fn work_parts(n: usize, dim: usize, inter: usize) -> [usize; 5] {
    let r = |w: usize| (n * w).next_multiple_of(PART);
    [r(dim), r(inter), r(inter), r(inter), r(dim)]
}

/// An error unless 1 ≤ k ≤ min(experts, [`MAX_ROUTED_K`]).
pub fn check_k(k: usize, experts: usize) -> Result<(), KernelError> {
    if k == 0 || k > experts || k > MAX_ROUTED_K {
        return Err(KernelError::Device {
            message: format!(
                "routing: {k} experts per token of {experts} (the device routes 1 to \
                 {MAX_ROUTED_K}, at most the experts)"
            ),
        });
    }
    Ok(())
}

/// The operands of [`crate::DeviceOps::route_experts`] checked: `scores` [rows, experts],
/// `routes` [rows, 2k], a bias of one per expert or k fixed ids per row. Returns rows.
pub fn check_route(
    scores_len: usize,
    experts: usize,
    k: usize,
    choice: RouteChoice<'_>,
    routes_len: usize,
) -> Result<usize, KernelError> {
    check_k(k, experts)?;
    let bad = |m: String| {
        Err(KernelError::Device {
            message: format!("route_experts: {m}"),
        })
    };
    if !scores_len.is_multiple_of(experts) {
        return bad(format!(
            "{scores_len} scores are not rows of {experts} experts"
        ));
    }
    let rows = scores_len / experts;
    if routes_len != rows * 2 * k {
        return bad(format!(
            "routes of {routes_len} words for {rows} rows of {k} experts (needs {})",
            rows * 2 * k
        ));
    }
    match choice {
        RouteChoice::Fixed(ids) if ids.len() != rows * k => bad(format!(
            "{} fixed expert ids for {rows} rows of {k}",
            ids.len()
        )),
        RouteChoice::Biased(b) if b.len() != experts => {
            bad(format!("a bias of {} for {experts} experts", b.len()))
        }
        _ => Ok(rows),
    }
}

/// The routing weights of one token routed to experts `ids` with router scores `s` (one per
/// expert): `s_j / Σ s · scale`, summed over `ids` in order and divided in f64, rounded to f32
/// (the model's routing, on the host and on every device).
pub fn route_weights(s: &[f32], ids: &[usize], scale: f64) -> Vec<f32> {
    let total: f64 = ids.iter().map(|&j| f64::from(s[j])).sum();
    ids.iter()
        .map(|&j| (f64::from(s[j]) / total * scale) as f32)
        .collect()
}

/// Each row's expert ids under `choice` from router scores `s` [rows, experts] on the host
/// backend `be` (fixed ids wrapped into the experts; biased ones ranked by `be.topk`).
pub fn route_ids(
    be: &dyn crate::Backend,
    s: &[f32],
    experts: usize,
    k: usize,
    choice: RouteChoice<'_>,
) -> Vec<Vec<usize>> {
    match choice {
        RouteChoice::Fixed(f) => f
            .chunks(k.max(1))
            .map(|r| r.iter().map(|&j| j as usize % experts.max(1)).collect())
            .collect(),
        RouteChoice::Biased(bias) => s
            .chunks(experts.max(1))
            .map(|si| {
                let b: Vec<f32> = si.iter().zip(bias).map(|(a, b)| a + b).collect();
                be.topk(&b, k)
            })
            .collect(),
    }
}

/// Routes [rows, 2k] (ids as f32 bits, then weights) from router scores `s` on the host
/// backend `be`: what [`crate::DeviceOps::route_experts`] computes.
pub fn routes_host(
    be: &dyn crate::Backend,
    s: &[f32],
    experts: usize,
    k: usize,
    choice: RouteChoice<'_>,
    scale: f64,
) -> Vec<f32> {
    let ids = route_ids(be, s, experts, k, choice);
    let mut out = Vec::with_capacity(ids.len() * 2 * k);
    for (r, idx) in ids.iter().enumerate() {
        let si = &s[r * experts..(r + 1) * experts];
        out.extend(idx.iter().map(|&j| f32::from_bits(j as u32)));
        out.extend(route_weights(si, idx, scale));
    }
    out
}

/// The routed experts' sum y [rows, dim] of x [rows, dim] under `routes` on the host backend
/// `be`: per expert in ascending id order, the rows routed to it (a token's first slot naming
/// it), through gate and up, SwiGLU weighted by the slot's weight, and down, added into y
/// (from zero); each projection's input quantized to fp8 blocks first under `e.quant`. What
/// [`crate::DeviceOps::routed_experts`] computes.
pub fn routed_host(
    be: &dyn crate::Backend,
    e: &RoutedExperts<'_>,
    x: &[f32],
    routes: &[f32],
) -> Result<Vec<f32>, KernelError> {
    let (experts, dim, inter) = e.check()?;
    let k = e.k;
    let rows = routes.len() / (2 * k);
    let mut y = vec![0f32; rows * dim];
    for ex in 0..experts {
        let mine: Vec<(usize, f32)> = routes
            .chunks(2 * k)
            .enumerate()
            .filter_map(|(r, row)| {
                let p = row[..k]
                    .iter()
                    .position(|v| v.to_bits() as usize % experts == ex)?;
                Some((r, row[k + p]))
            })
            .collect();
        if mine.is_empty() {
            continue;
        }
        let n = mine.len();
        let mut xs: Vec<f32> = mine
            .iter()
            .flat_map(|&(r, _)| x[r * dim..(r + 1) * dim].iter().copied())
            .collect();
        if e.quant {
            be.act_quant_fp8(&mut xs, dim);
        }
        let (mut g, mut u) = (vec![0f32; n * inter], vec![0f32; n * inter]);
        be.linear(e.w1[ex], &xs, n, &mut g);
        be.linear(e.w3[ex], &xs, n, &mut u);
        let mut h = vec![0f32; n * inter];
        for (i, &(_, w)) in mine.iter().enumerate() {
            let s = i * inter..(i + 1) * inter;
            be.swiglu(&g[s.clone()], &u[s.clone()], e.limit, w, &mut h[s]);
        }
        if e.quant {
            be.act_quant_fp8(&mut h, inter);
        }
        let mut o = vec![0f32; n * dim];
        be.linear(e.w2[ex], &h, n, &mut o);
        for (i, &(r, _)) in mine.iter().enumerate() {
            for (yv, ov) in y[r * dim..(r + 1) * dim].iter_mut().zip(&o[i * dim..]) {
                *yv += ov;
            }
        }
    }
    Ok(y)
}

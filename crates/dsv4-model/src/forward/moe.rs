//! The MoE sublayer (spec §3.6): sqrt-softplus router, hash or biased top-k routing, clamped
//! SwiGLU experts and the shared expert; and the plan launches that run them (router, shared
//! expert, routed experts).

use super::op::BlockRef;
use super::run::{Run, lock};
use super::{ForwardError, Model};
use crate::weights::{ExpertWeights, MoeWeights, Routing};
use dsv4_kernels::moe_device::route_weights;

/// Per-token expert choice: (expert ids, their weights).
pub type Route = (Vec<usize>, Vec<f32>);

/// The rows routed to expert `e` and their routing weights, in row order.
pub(crate) fn expert_rows(routes: &[Route], e: usize) -> (Vec<usize>, Vec<f32>) {
    let (mut rows, mut weights) = (Vec::new(), Vec::new());
    for (i, (idx, wt)) in routes.iter().enumerate() {
        if let Some(pos) = idx.iter().position(|&j| j == e) {
            rows.push(i);
            weights.push(wt[pos]);
        }
    }
    (rows, weights)
}

/// Hash routing's experts of each token: its k entries of the `tid2eid` table.
pub(crate) fn hash_experts(tid2eid: &[i64], tokens: &[u32], k: usize) -> Vec<Vec<usize>> {
    tokens
        .iter()
        .map(|&tok| {
            let row = tok as usize * k;
            tid2eid[row..row + k].iter().map(|&x| x as usize).collect()
        })
        .collect()
}

/// The routes of the first `rows` rows of a `routes` buffer (per row, k expert ids as bits
/// then k weights); a corrupted id is wrapped into the `experts`.
pub(crate) fn decode_routes(routes: &[f32], k: usize, experts: usize, rows: usize) -> Vec<Route> {
    let experts = experts.max(1);
    routes
        .chunks(2 * k)
        .take(rows)
        .map(|r| {
            let ids = r[..k]
                .iter()
                .map(|v| v.to_bits() as usize % experts)
                .collect();
            (ids, r[k..].to_vec())
        })
        .collect()
}

impl Model {
    /// Router scores of T tokens of normalised input `x` [T, D]: [T, n_routed_experts].
    pub(crate) fn router_scores(&self, w: &MoeWeights, x: &[f32], t: usize) -> Vec<f32> {
        let e = self.cfg.n_routed_experts;
        let mut logits = vec![0f32; t * e];
        self.backend.linear(&w.gate, x, t, &mut logits);
        let mut s = vec![0f32; t * e];
        self.backend.router_scores(&logits, &mut s);
        s
    }

    /// The experts of T tokens with router scores `s` [T, n_routed_experts]: looked up by token
    /// id under hash routing (with `None`), else the top-k of the biased scores `s + bias`
    /// (ascending ids; ranked in one call, one submission on a GPU backend) with those scores.
    pub(crate) fn choose_experts(
        &self,
        w: &MoeWeights,
        s: &[f32],
        tokens: &[u32],
    ) -> (Vec<Vec<usize>>, Option<Vec<f32>>) {
        let (e, k, t) = (
            self.cfg.n_routed_experts,
            self.cfg.num_experts_per_tok,
            tokens.len(),
        );
        match &w.routing {
            Routing::Hash(tid2eid) => (hash_experts(tid2eid, tokens, k), None),
            Routing::Bias(bias) => {
                let biased: Vec<f32> = s
                    .chunks(e.max(1))
                    .flat_map(|si| si.iter().zip(bias).map(|(a, b)| a + b))
                    .collect();
                let starts: Vec<usize> = (0..=t).map(|i| i * e).collect();
                (self.backend.topk_rows(&biased, &starts, k), Some(biased))
            }
        }
    }

    /// Routes of tokens with router scores `s` [T, n_routed_experts] to the experts `chosen`
    /// per token: weights are the chosen experts' scores normalised (in f64) and scaled.
    pub(crate) fn routes_of(&self, s: &[f32], chosen: Vec<Vec<usize>>) -> Vec<Route> {
        let e = self.cfg.n_routed_experts;
        let scale = self.cfg.routed_scaling_factor;
        chosen
            .into_iter()
            .enumerate()
            .map(|(i, idx)| {
                let weights = route_weights(&s[i * e..(i + 1) * e], &idx, scale);
                (idx, weights)
            })
            .collect()
    }

    /// One expert over `rows` tokens with one routing weight per row: W2·(silu(min(W1x, L))·clamp(W3x)·w).
    fn expert(&self, ew: &ExpertWeights, x: &[f32], weights: &[f32]) -> Vec<f32> {
        let rows = weights.len();
        let i = ew.w1.out_dim;
        let g = self.project(&ew.w1, x, rows);
        let u = self.project(&ew.w3, x, rows);
        let limit = self.cfg.swiglu_limit as f32;
        let mut h = vec![0f32; rows * i];
        for (((hr, gr), ur), &wr) in h
            .chunks_mut(i)
            .zip(g.chunks(i))
            .zip(u.chunks(i))
            .zip(weights)
        {
            self.backend.swiglu(gr, ur, limit, wr, hr);
        }
        self.project(&ew.w2, &h, rows)
    }

    /// The routed experts' sum for T tokens of normalised input `x` [T, D], experts in
    /// ascending id order (so each token sums its experts in the same order however the batch
    /// is made up).
    fn routed(&self, w: &MoeWeights, x: &[f32], routes: &[Route]) -> Vec<f32> {
        let d = self.cfg.hidden_size;
        let mut y = vec![0f32; routes.len() * d];
        for (e, ew) in w.experts.iter().enumerate() {
            let (rows, weights) = expert_rows(routes, e);
            if rows.is_empty() {
                continue;
            }
            let xs: Vec<f32> = rows
                .iter()
                .flat_map(|&i| x[i * d..(i + 1) * d].iter().copied())
                .collect();
            let out = self.expert(ew, &xs, &weights);
            for (r, &i) in rows.iter().enumerate() {
                for c in 0..d {
                    y[i * d + c] += out[r * d + c];
                }
            }
        }
        y
    }
}

impl Run<'_> {
    fn moe_weights(&self, b: Option<BlockRef>) -> Result<&MoeWeights, ForwardError> {
        Ok(&self.weights(b)?.moe)
    }

    /// `[xn, (tokens)] → [routes]`: per row, k expert ids (as bits) then k weights.
    pub(crate) fn router(
        &self,
        b: Option<BlockRef>,
        xn: &[f32],
        tokens: Option<&[f32]>,
    ) -> Result<Vec<f32>, ForwardError> {
        let w = self.moe_weights(b)?;
        let s = self.model.router_scores(w, xn, self.bound.rows);
        let routes = self.choose_routes(b, &s, &self.routing_tokens(tokens))?;
        Ok(self.encode_routes(routes))
    }

    /// Routes of the step's rows from their router scores `s`: the router's own top-k (recorded
    /// per main layer, with its scores when asked for), or the experts the caller pinned.
    pub(crate) fn choose_routes(
        &self,
        b: Option<BlockRef>,
        s: &[f32],
        tokens: &[u32],
    ) -> Result<Vec<Route>, ForwardError> {
        let w = self.moe_weights(b)?;
        let (rows, e) = (tokens.len(), self.model.cfg.n_routed_experts);
        let (ranked, biased) = self.model.choose_experts(w, s, tokens);
        let (Some(biased), Some(BlockRef::Main(layer))) = (biased, b) else {
            return Ok(self.model.routes_of(s, ranked));
        };
        if self.choices.record_experts {
            let own = ranked
                .iter()
                .map(|r| r.iter().map(|&j| j as u32).collect())
                .collect();
            lock(&self.out.experts).insert(layer, own);
        }
        if self.choices.record_scores {
            let per_row = biased.chunks(e.max(1)).map(<[f32]>::to_vec).collect();
            lock(&self.out.router_scores).insert(layer, per_row);
        }
        let pins = self.choices.pinned_experts.and_then(|p| p.get(&layer));
        let chosen = match pins {
            Some(p) => pinned_experts(layer, p, rows, e, self.model.cfg.num_experts_per_tok)?,
            None => ranked,
        };
        Ok(self.model.routes_of(s, chosen))
    }

    /// The step's token ids from a `tokens` operand (all 0 without one: biased routing does
    /// not read them); a corrupted id is wrapped into the vocabulary (hash routing indexes by
    /// it).
    pub(crate) fn routing_tokens(&self, tokens: Option<&[f32]>) -> Vec<u32> {
        let vocab = self.model.cfg.vocab_size as u32;
        match tokens {
            Some(tok) => tok.iter().map(|v| v.to_bits() % vocab.max(1)).collect(),
            None => vec![0; self.bound.rows],
        }
    }

    /// A `routes` buffer: per row, k expert ids (as bits) then k weights.
    pub(crate) fn encode_routes(&self, routes: Vec<Route>) -> Vec<f32> {
        let k = self.model.cfg.num_experts_per_tok;
        let mut out = Vec::with_capacity(routes.len() * 2 * k);
        for (idx, wt) in routes {
            out.extend(idx.iter().map(|&j| f32::from_bits(j as u32)));
            out.extend(wt);
        }
        out
    }

    /// `[xn] → [ys]`: the shared expert with weight 1.
    pub(crate) fn shared_expert(
        &self,
        b: Option<BlockRef>,
        xn: &[f32],
    ) -> Result<Vec<f32>, ForwardError> {
        let w = self.moe_weights(b)?;
        Ok(self
            .model
            .expert(&w.shared, xn, &vec![1.0; self.bound.rows]))
    }

    /// `[xn, routes] → [yr]`.
    pub(crate) fn routed_experts(
        &self,
        b: Option<BlockRef>,
        xn: &[f32],
        routes: &[f32],
    ) -> Result<Vec<f32>, ForwardError> {
        let w = self.moe_weights(b)?;
        let k = self.model.cfg.num_experts_per_tok;
        let decoded = decode_routes(routes, k, w.experts.len(), self.bound.rows);
        Ok(self.model.routed(w, xn, &decoded))
    }
}

/// Layer `layer`'s pinned experts, checked against the step's `rows`, the `experts` and `k`.
pub(crate) fn pinned_experts(
    layer: usize,
    pins: &[Vec<u32>],
    rows: usize,
    experts: usize,
    k: usize,
) -> Result<Vec<Vec<usize>>, ForwardError> {
    let bad = |message: String| Err(ForwardError::Plan { message });
    if pins.len() != rows {
        return bad(format!(
            "layer {layer}'s pinned experts cover {} tokens, the step has {rows}",
            pins.len()
        ));
    }
    let mut out = Vec::with_capacity(rows);
    for (row, ids) in pins.iter().enumerate() {
        let mut ids: Vec<usize> = ids.iter().map(|&j| j as usize).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != k || pins[row].len() != k {
            return bad(format!(
                "layer {layer}, token {row}: {} pinned experts, the router chooses {k} distinct",
                pins[row].len()
            ));
        }
        if let Some(&j) = ids.iter().find(|&&j| j >= experts) {
            return bad(format!(
                "layer {layer}, token {row}: pinned expert {j} is past the {experts} experts"
            ));
        }
        out.push(ids);
    }
    Ok(out)
}

//! The device forms of the row-wise launches: each computes what its host form in
//! [`super::dense`] / [`super::moe`] computes, with the backend's device ops on device-resident
//! operands, so nothing is read back (on a device that does not route, the router reads back
//! its scores and the routed experts their routes: `moe_dev.rs`). Launches without a device
//! form (embedding, cache stores, compressor pooling, the indexer's top-k, attention, the MTP
//! input) run their host form on operands read back from the device.

use super::ForwardError;
use super::dense::{ape_row, no_weights, repeat};
use super::op::{BlockRef, Chain, Op, OpKind, Sub};
use super::resident::{DeviceMemory, Scratch};
use super::run::Run;
use crate::weights::ExpertWeights;
use dsv4_core::ActQuant;
use dsv4_kernels::{Copy2d, DevSlice, DeviceOps, Linear};

/// Whether launches of `kind` run as device ops.
pub(crate) fn has_device_form(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::HcPre(_)
            | OpKind::Norm(_)
            | OpKind::QA
            | OpKind::QB
            | OpKind::Kv
            | OpKind::CompressorIn(_)
            | OpKind::IndexerQ
            | OpKind::IndexerWeights
            | OpKind::OutA
            | OpKind::OutB
            | OpKind::HcPost(_)
            | OpKind::Router
            | OpKind::SharedExpert
            | OpKind::RoutedExperts
            | OpKind::MoeSum
            | OpKind::HeadRows
            | OpKind::HcHead
            | OpKind::FinalNorm
            | OpKind::Logits
    )
}

/// The order the serial executor runs `plan` in on a device: its host launches (no device
/// form) as late as what reads their results allows ([`dsv4_plan::deferred`]), so a run of
/// them reads its operands back in one wait.
pub fn host_last_order(plan: &dsv4_plan::Plan<Op>) -> Result<Vec<usize>, dsv4_plan::PlanError> {
    dsv4_plan::deferred(plan, |l| !has_device_form(l.op.kind))
}

pub(super) type Res = Result<(), ForwardError>;

/// The device, scratch pool and plan stream a launch runs with.
pub(super) struct Dev<'a> {
    pub(super) ops: &'a dyn DeviceOps,
    /// The step's device memory (for host copies of what the host writes and reads).
    pub(super) mem: &'a DeviceMemory<'a>,
    scratch: &'a Scratch,
    stream: usize,
}

impl Run<'_> {
    /// Run `op`'s device form: `ins` and `outs` are its transient operands, in order.
    pub(crate) fn dispatch_resident(
        &self,
        dm: &DeviceMemory<'_>,
        op: Op,
        stream: usize,
        ins: &[DevSlice],
        outs: &[DevSlice],
    ) -> Res {
        let dev = Dev {
            ops: dm.dev,
            mem: dm,
            scratch: dm.scratch(),
            stream,
        };
        let b = op.block;
        let m = self.model;
        let (t, eps) = (self.bound.rows, m.eps());
        let d = &dev;
        match op.kind {
            OpKind::HcPre(sub) => {
                let w = self.weights(b)?;
                let hc = match sub {
                    Sub::Attn => &w.hc_attn,
                    Sub::Ffn => &w.hc_ffn,
                };
                let p = m.hc_params(hc);
                Ok(d.ops.mhc_pre(&p, ins[0], t, outs[0], outs[1], outs[2])?)
            }
            OpKind::Norm(sub) => {
                let w = self.weights(b)?;
                let weight = match sub {
                    Sub::Attn => &w.attn_norm,
                    Sub::Ffn => &w.ffn_norm,
                };
                Ok(d.ops
                    .rms_norm(ins[0], Some(weight), m.cfg.hidden_size, eps, outs[0])?)
            }
            OpKind::QA => {
                let w = &self.weights(b)?.attn;
                let raw = d.tmp(outs[0].len)?;
                self.project_dev(d, &w.wq_a, ins[0], raw.s)?;
                Ok(d.ops
                    .rms_norm(raw.s, Some(&w.q_norm), m.cfg.q_lora_rank, eps, outs[0])?)
            }
            OpKind::QB => {
                let w = &self.weights(b)?.attn;
                let hd = m.cfg.head_dim;
                let raw = d.tmp(outs[0].len)?;
                self.project_dev(d, &w.wq_b, ins[0], raw.s)?;
                d.ops.rms_norm(raw.s, None, hd, eps, outs[0])?;
                let hp = repeat(&self.bound.positions[..t], m.cfg.num_attention_heads);
                Ok(d.ops.rope(outs[0], hd, &hp, self.rope_of(b)?, false)?)
            }
            OpKind::Kv => {
                let w = &self.weights(b)?.attn;
                let hd = m.cfg.head_dim;
                let raw = d.tmp(outs[0].len)?;
                self.project_dev(d, &w.wkv, ins[0], raw.s)?;
                d.ops.rms_norm(raw.s, Some(&w.kv_norm), hd, eps, outs[0])?;
                let pos = &self.bound.positions[..t];
                Ok(d.ops.rope(outs[0], hd, pos, self.rope_of(b)?, false)?)
            }
            OpKind::CompressorIn(chain) => self.compressor_in_dev(d, b, chain, ins, outs),
            OpKind::IndexerQ => {
                let iw = self.weights(b)?.attn.indexer.as_ref();
                let iw = iw.ok_or_else(|| no_weights(b, "indexer"))?;
                let (inh, id) = (m.cfg.index_n_heads, m.cfg.index_head_dim);
                self.project_dev(d, &iw.wq_b, ins[0], outs[0])?;
                let ipos = repeat(&self.bound.positions[..t], inh);
                d.ops.rope(outs[0], id, &ipos, &m.rope_compress, false)?;
                d.ops.hadamard(outs[0], id)?;
                Ok(d.ops
                    .round_index_rows(m.numerics.index_k_dtype, outs[0], id)?)
            }
            OpKind::IndexerWeights => {
                let iw = self.weights(b)?.attn.indexer.as_ref();
                let iw = iw.ok_or_else(|| no_weights(b, "indexer"))?;
                d.ops.linear(&iw.weights_proj, ins[0], t, outs[0])?;
                Ok(d.ops.scale(outs[0], m.indexer_weight_scale())?)
            }
            OpKind::OutA => self.out_a_dev(d, b, ins[0], outs[0]),
            OpKind::OutB => {
                let w = &self.weights(b)?.attn;
                self.project_dev(d, &w.wo_b, ins[0], outs[0])
            }
            OpKind::HcPost(_) => {
                let (hm, hd) = (m.cfg.hc_mult, m.cfg.hidden_size);
                Ok(d.ops
                    .mhc_post(ins[0], ins[1], ins[2], ins[3], hm, hd, outs[0])?)
            }
            OpKind::SharedExpert => {
                let w = &self.weights(b)?.moe.shared;
                self.expert_dev(d, w, ins[0], &vec![1.0; t], outs[0])
            }
            OpKind::Router => self.router_dev(d, b, ins, outs[0]),
            OpKind::RoutedExperts => self.routed_dev(d, b, ins, outs[0]),
            OpKind::MoeSum => Ok(d.ops.add(ins[0], ins[1], outs[0])?),
            OpKind::HeadRows => {
                let w = m.cfg.hc_mult * m.cfg.hidden_size;
                let mut at = 0;
                for &(first, n) in self.bound.head.as_deref().unwrap_or_default() {
                    let (src, dst) = (ins[0].sub(first * w, n * w), outs[0].sub(at * w, n * w));
                    d.ops.copy2d(src, dst, Copy2d::contiguous(n * w))?;
                    at += n;
                }
                Ok(())
            }
            OpKind::HcHead => {
                let hc = match b {
                    Some(BlockRef::Mtp) => {
                        &m.weights.mtp.first().ok_or(ForwardError::Empty)?.hc_head
                    }
                    _ => &m.weights.hc_head,
                };
                let rows = self.bound.head_rows();
                Ok(d.ops.hc_head(&m.hc_params(hc), ins[0], rows, outs[0])?)
            }
            OpKind::FinalNorm => {
                let norm = match b {
                    Some(BlockRef::Mtp) => &m.weights.mtp.first().ok_or(ForwardError::Empty)?.norm,
                    _ => &m.weights.norm,
                };
                Ok(d.ops
                    .rms_norm(ins[0], Some(norm), m.cfg.hidden_size, eps, outs[0])?)
            }
            OpKind::Logits => {
                let rows = self.bound.head_rows();
                Ok(d.ops.linear(&m.weights.head, ins[0], rows, outs[0])?)
            }
            other => Err(ForwardError::Plan {
                message: format!("launch `{}` has no device form", other.name()),
            }),
        }
    }

    /// [`super::Model::project`] on the device: fp8 activation quantization (on a copy) before
    /// low-precision weights when the numerics ask for it. Rows = out.len / out_dim.
    pub(super) fn project_dev(&self, d: &Dev<'_>, w: &Linear, x: DevSlice, out: DevSlice) -> Res {
        let rows = out.len / w.out_dim.max(1);
        if self.model.numerics.act_quant == ActQuant::Fp8 && w.format.is_low_precision() {
            let xq = d.tmp(x.len)?;
            d.ops.copy2d(x, xq.s, Copy2d::contiguous(x.len))?;
            d.ops.act_quant_fp8(xq.s, w.in_dim)?;
            Ok(d.ops.linear(w, xq.s, rows, out)?)
        } else {
            Ok(d.ops.linear(w, x, rows, out)?)
        }
    }

    /// `[xn] → [a, z]` on the device (the ape rows are written from the host).
    fn compressor_in_dev(
        &self,
        d: &Dev<'_>,
        b: Option<BlockRef>,
        chain: Chain,
        ins: &[DevSlice],
        outs: &[DevSlice],
    ) -> Res {
        let w = &self.weights(b)?.attn;
        let cw = match chain {
            Chain::Attn => w.compressor.as_ref(),
            Chain::Indexer => w.indexer.as_ref().map(|i| &i.compressor),
        }
        .ok_or_else(|| no_weights(b, "compressor"))?;
        let t = self.bound.rows;
        d.ops.linear(&cw.wkv, ins[0], t, outs[0])?;
        let z = d.tmp(outs[1].len)?;
        d.ops.linear(&cw.wgate, ins[0], t, z.s)?;
        let ape: Vec<f32> = self.bound.positions[..t]
            .iter()
            .flat_map(|&p| ape_row(cw, p).iter().copied())
            .collect();
        let ape_dev = d.tmp(ape.len())?;
        d.ops.write(ape_dev.s, &ape)?;
        Ok(d.ops.add(z.s, ape_dev.s, outs[1])?)
    }

    /// `[o] → [ou]` on the device: each group's columns copied out, projected, copied in.
    fn out_a_dev(&self, d: &Dev<'_>, b: Option<BlockRef>, o: DevSlice, u: DevSlice) -> Res {
        let w = &self.weights(b)?.attn;
        let cfg = &self.model.cfg;
        let t = self.bound.rows;
        let (h, hd, ol) = (cfg.num_attention_heads, cfg.head_dim, cfg.o_lora_rank);
        let groups = w.wo_a.len();
        let gw = h * hd / groups.max(1);
        let og = d.tmp(t * gw)?;
        let ug = d.tmp(t * ol)?;
        for (g, wg) in w.wo_a.iter().enumerate() {
            let take = Copy2d {
                rows: t,
                width: gw,
                src_stride: h * hd,
                src_col: g * gw,
                dst_stride: gw,
                dst_col: 0,
            };
            d.ops.copy2d(o, og.s, take)?;
            d.ops.linear(wg, og.s, t, ug.s)?;
            let put = Copy2d {
                rows: t,
                width: ol,
                src_stride: ol,
                src_col: 0,
                dst_stride: groups * ol,
                dst_col: g * ol,
            };
            d.ops.copy2d(ug.s, u, put)?;
        }
        Ok(())
    }

    /// One expert on the device over `x` [rows, D], row r weighted by `weights[r]`.
    pub(super) fn expert_dev(
        &self,
        d: &Dev<'_>,
        ew: &ExpertWeights,
        x: DevSlice,
        weights: &[f32],
        out: DevSlice,
    ) -> Res {
        let rows = weights.len();
        let i = ew.w1.out_dim;
        let g = d.tmp(rows * i)?;
        let u = d.tmp(rows * i)?;
        let h = d.tmp(rows * i)?;
        self.project_dev(d, &ew.w1, x, g.s)?;
        self.project_dev(d, &ew.w3, x, u.s)?;
        let limit = self.model.cfg.swiglu_limit as f32;
        d.ops.swiglu_rows(g.s, u.s, limit, weights, i, h.s)?;
        self.project_dev(d, &ew.w2, h.s, out)
    }
}

impl Dev<'_> {
    /// A scratch slice of `words` words for the rest of the launch.
    pub(super) fn tmp(&self, words: usize) -> Result<super::resident::Tmp<'_>, ForwardError> {
        self.scratch.take(self.ops, self.stream, words)
    }
}

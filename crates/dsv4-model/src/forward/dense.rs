//! Row-wise launches of a plan (no cache access): embedding, mHC, norms, the attention's
//! projections, the compressors' inputs, the indexer's queries and weights, the output
//! projection and the head. Each computes exactly what spec §3 says, with the backend's ops.

use super::ForwardError;
use super::op::{BlockRef, Chain, Sub};
use super::run::Run;
use dsv4_kernels::{MhcPre, RopeTable};

type Res = Result<Vec<f32>, ForwardError>;

/// Each position repeated `n` times (one per head).
pub(crate) fn repeat(positions: &[usize], n: usize) -> Vec<usize> {
    positions
        .iter()
        .flat_map(|&p| std::iter::repeat_n(p, n))
        .collect()
}

impl Run<'_> {
    fn t(&self) -> usize {
        self.bound.rows
    }

    fn positions(&self) -> &[usize] {
        &self.bound.positions[..self.bound.rows]
    }

    pub(crate) fn rope_of(&self, b: Option<BlockRef>) -> Result<&RopeTable, ForwardError> {
        let ratio = self.weights(b)?.ratio;
        Ok(if ratio == 0 {
            &self.model.rope_plain
        } else {
            &self.model.rope_compress
        })
    }

    fn token_ids(&self, tokens: &[f32]) -> Result<Vec<usize>, ForwardError> {
        let vocab = self.model.cfg.vocab_size;
        tokens
            .iter()
            .enumerate()
            .map(|(index, t)| {
                let id = t.to_bits();
                (id as usize)
                    .lt(&vocab)
                    .then_some(id as usize)
                    .ok_or(ForwardError::InvalidToken { id, index, vocab })
            })
            .collect()
    }

    /// `[tokens] → [x]`.
    pub(crate) fn embed(&self, tokens: &[f32]) -> Res {
        let (m, d) = (self.model.cfg.hc_mult, self.model.cfg.hidden_size);
        let embed = &self.model.weights.embed;
        let mut x = Vec::with_capacity(tokens.len() * m * d);
        for tok in self.token_ids(tokens)? {
            let row = &embed[tok * d..(tok + 1) * d];
            for _ in 0..m {
                x.extend_from_slice(row);
            }
        }
        Ok(x)
    }

    /// `[tokens, residual] → [x]` of the MTP layer (spec §3.7).
    pub(crate) fn mtp_input(&self, tokens: &[f32], residual: &[f32]) -> Res {
        let model = self.model;
        let mw = model.weights.mtp.first().ok_or(ForwardError::Empty)?;
        let (t, m, d) = (self.t(), model.cfg.hc_mult, model.cfg.hidden_size);
        let eps = model.eps();
        let be = model.backend.as_ref();
        let emb: Vec<f32> = self
            .token_ids(tokens)?
            .into_iter()
            .flat_map(|tok| model.weights.embed[tok * d..(tok + 1) * d].iter().copied())
            .collect();
        let mut en = vec![0f32; t * d];
        be.rms_norm(&emb, Some(&mw.enorm), d, eps, &mut en);
        let e = model.project(&mw.e_proj, &en, t);
        let mut hn = vec![0f32; t * m * d];
        be.rms_norm(residual, Some(&mw.hnorm), d, eps, &mut hn);
        let mut x = model.project(&mw.h_proj, &hn, t * m);
        for i in 0..t {
            for j in 0..m {
                for c in 0..d {
                    x[(i * m + j) * d + c] += e[i * d + c];
                }
            }
        }
        Ok(x)
    }

    /// `[x] → [u, post, comb]`.
    pub(crate) fn hc_pre(
        &self,
        b: Option<BlockRef>,
        sub: Sub,
        x: &[f32],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let w = self.weights(b)?;
        let hc = match sub {
            Sub::Attn => &w.hc_attn,
            Sub::Ffn => &w.hc_ffn,
        };
        let pre = self
            .model
            .backend
            .mhc_pre(&self.model.hc_params(hc), x, self.t());
        Ok(vec![pre.u, pre.post, pre.comb])
    }

    /// `[u] → [xn]`.
    pub(crate) fn norm(&self, b: Option<BlockRef>, sub: Sub, u: &[f32]) -> Res {
        let w = self.weights(b)?;
        let weight = match sub {
            Sub::Attn => &w.attn_norm,
            Sub::Ffn => &w.ffn_norm,
        };
        let d = self.model.cfg.hidden_size;
        let mut xn = vec![0f32; u.len()];
        self.model
            .backend
            .rms_norm(u, Some(weight), d, self.model.eps(), &mut xn);
        Ok(xn)
    }

    /// `[xn] → [cq]`.
    pub(crate) fn q_a(&self, b: Option<BlockRef>, xn: &[f32]) -> Res {
        let w = &self.weights(b)?.attn;
        let m = self.model;
        let raw = m.project(&w.wq_a, xn, self.t());
        let mut cq = vec![0f32; raw.len()];
        m.backend
            .rms_norm(&raw, Some(&w.q_norm), m.cfg.q_lora_rank, m.eps(), &mut cq);
        Ok(cq)
    }

    /// `[cq] → [q]`.
    pub(crate) fn q_b(&self, b: Option<BlockRef>, cq: &[f32]) -> Res {
        let w = &self.weights(b)?.attn;
        let m = self.model;
        let hd = m.cfg.head_dim;
        let raw = m.project(&w.wq_b, cq, self.t());
        let mut q = vec![0f32; raw.len()];
        m.backend.rms_norm(&raw, None, hd, m.eps(), &mut q);
        let hp = repeat(self.positions(), m.cfg.num_attention_heads);
        m.backend.rope(&mut q, hd, &hp, self.rope_of(b)?, false);
        Ok(q)
    }

    /// `[xn] → [kv]`.
    pub(crate) fn kv(&self, b: Option<BlockRef>, xn: &[f32]) -> Res {
        let w = &self.weights(b)?.attn;
        let m = self.model;
        let hd = m.cfg.head_dim;
        let raw = m.project(&w.wkv, xn, self.t());
        let mut kv = vec![0f32; raw.len()];
        m.backend
            .rms_norm(&raw, Some(&w.kv_norm), hd, m.eps(), &mut kv);
        m.backend
            .rope(&mut kv, hd, self.positions(), self.rope_of(b)?, false);
        Ok(kv)
    }

    /// `[xn] → [a, z]`: a = W_kv·x, z = W_gate·x + ape[pos mod ratio].
    pub(crate) fn compressor_in(
        &self,
        b: Option<BlockRef>,
        chain: Chain,
        xn: &[f32],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let w = &self.weights(b)?.attn;
        let cw = match chain {
            Chain::Attn => w.compressor.as_ref(),
            Chain::Indexer => w.indexer.as_ref().map(|i| &i.compressor),
        }
        .ok_or_else(|| no_weights(b, "compressor"))?;
        let t = self.t();
        let width = cw.coff * cw.dim;
        let (mut a, mut z) = (vec![0f32; t * width], vec![0f32; t * width]);
        let be = self.model.backend.as_ref();
        be.linear(&cw.wkv, xn, t, &mut a);
        be.linear(&cw.wgate, xn, t, &mut z);
        for (i, &p) in self.positions().iter().enumerate() {
            for (zv, av) in z[i * width..(i + 1) * width].iter_mut().zip(ape_row(cw, p)) {
                *zv += av;
            }
        }
        Ok(vec![a, z])
    }

    /// `[cq] → [qi]`.
    pub(crate) fn indexer_q(&self, b: Option<BlockRef>, cq: &[f32]) -> Res {
        let iw = self.weights(b)?.attn.indexer.as_ref();
        let iw = iw.ok_or_else(|| no_weights(b, "indexer"))?;
        let m = self.model;
        let (inh, id) = (m.cfg.index_n_heads, m.cfg.index_head_dim);
        let mut qi = m.project(&iw.wq_b, cq, self.t());
        let ipos = repeat(self.positions(), inh);
        m.backend.rope(&mut qi, id, &ipos, &m.rope_compress, false);
        m.backend.hadamard(&mut qi, id);
        m.backend
            .round_index_rows(m.numerics.index_k_dtype, &mut qi, id);
        Ok(qi)
    }

    /// `[xn] → [hw]`: weights_proj(x)·Id^−½·In^−½.
    pub(crate) fn indexer_weights(&self, b: Option<BlockRef>, xn: &[f32]) -> Res {
        let iw = self.weights(b)?.attn.indexer.as_ref();
        let iw = iw.ok_or_else(|| no_weights(b, "indexer"))?;
        let inh = self.model.cfg.index_n_heads;
        let mut hw = vec![0f32; self.t() * inh];
        self.model
            .backend
            .linear(&iw.weights_proj, xn, self.t(), &mut hw);
        let s = self.model.indexer_weight_scale();
        hw.iter_mut().for_each(|v| *v = (f64::from(*v) * s) as f32);
        Ok(hw)
    }

    /// `[o] → [ou]`: u_g = W_oa^(g)·o_g (dequantized, no activation quantization).
    pub(crate) fn out_a(&self, b: Option<BlockRef>, o: &[f32]) -> Res {
        let w = &self.weights(b)?.attn;
        let cfg = &self.model.cfg;
        let t = self.t();
        let (h, hd, ol) = (cfg.num_attention_heads, cfg.head_dim, cfg.o_lora_rank);
        let groups = w.wo_a.len();
        let gw = h * hd / groups;
        let mut u = vec![0f32; t * groups * ol];
        for (g, wg) in w.wo_a.iter().enumerate() {
            let og: Vec<f32> = (0..t)
                .flat_map(|i| {
                    o[i * h * hd + g * gw..i * h * hd + (g + 1) * gw]
                        .iter()
                        .copied()
                })
                .collect();
            let mut ug = vec![0f32; t * ol];
            self.model.backend.linear(wg, &og, t, &mut ug);
            for i in 0..t {
                u[i * groups * ol + g * ol..i * groups * ol + (g + 1) * ol]
                    .copy_from_slice(&ug[i * ol..(i + 1) * ol]);
            }
        }
        Ok(u)
    }

    /// `[ou] → [y]`.
    pub(crate) fn out_b(&self, b: Option<BlockRef>, ou: &[f32]) -> Res {
        let w = &self.weights(b)?.attn;
        Ok(self.model.project(&w.wo_b, ou, self.t()))
    }

    /// `[x, y, post, comb] → [x']`.
    pub(crate) fn hc_post(&self, x: &[f32], y: &[f32], post: &[f32], comb: &[f32]) -> Res {
        let (m, d) = (self.model.cfg.hc_mult, self.model.cfg.hidden_size);
        let pre = MhcPre {
            u: Vec::new(),
            post: post.to_vec(),
            comb: comb.to_vec(),
        };
        let mut out = vec![0f32; x.len()];
        self.model.backend.mhc_post(x, y, &pre, m, d, &mut out);
        Ok(out)
    }

    /// `[x] → [h]`.
    pub(crate) fn hc_head(&self, b: Option<BlockRef>, x: &[f32]) -> Res {
        let m = self.model;
        let hc = match b {
            Some(BlockRef::Mtp) => &m.weights.mtp.first().ok_or(ForwardError::Empty)?.hc_head,
            _ => &m.weights.hc_head,
        };
        let rows = self.bound.head_rows();
        let mut h = vec![0f32; rows * m.cfg.hidden_size];
        m.backend.hc_head(&m.hc_params(hc), x, rows, &mut h);
        Ok(h)
    }

    /// `[h] → [hn]`.
    pub(crate) fn final_norm(&self, b: Option<BlockRef>, h: &[f32]) -> Res {
        let m = self.model;
        let norm = match b {
            Some(BlockRef::Mtp) => &m.weights.mtp.first().ok_or(ForwardError::Empty)?.norm,
            _ => &m.weights.norm,
        };
        let mut hn = vec![0f32; h.len()];
        m.backend
            .rms_norm(h, Some(norm), m.cfg.hidden_size, m.eps(), &mut hn);
        Ok(hn)
    }

    /// `[hn] → [logits]`.
    pub(crate) fn logits(&self, hn: &[f32]) -> Vec<f32> {
        let m = self.model;
        let rows = self.bound.head_rows();
        let mut logits = vec![0f32; rows * m.cfg.vocab_size];
        m.backend.linear(&m.weights.head, hn, rows, &mut logits);
        logits
    }

    /// `[x] → [xs]`: the rows the head computes logits for, in order.
    pub(crate) fn head_rows_of(&self, x: &[f32]) -> Vec<f32> {
        let w = self.model.cfg.hc_mult * self.model.cfg.hidden_size;
        let runs = self.bound.head.as_deref().unwrap_or_default();
        runs.iter()
            .flat_map(|&(first, n)| &x[first * w..(first + n) * w])
            .copied()
            .collect()
    }
}

/// The absolute-position embedding a compressor adds to the gate of a row at position `p`.
pub(crate) fn ape_row(cw: &crate::weights::CompressorWeights, p: usize) -> &[f32] {
    let width = cw.coff * cw.dim;
    &cw.ape[(p % cw.ratio) * width..(p % cw.ratio + 1) * width]
}

impl super::Model {
    /// The indexer's head-weight scale Id^−½·In^−½.
    pub(crate) fn indexer_weight_scale(&self) -> f64 {
        let (inh, id) = (self.cfg.index_n_heads, self.cfg.index_head_dim);
        1.0 / ((id as f64).sqrt() * (inh as f64).sqrt())
    }
}

/// The error of a launch whose block lacks the weights it needs (a plan built for another
/// config).
pub(crate) fn no_weights(b: Option<BlockRef>, what: &str) -> ForwardError {
    ForwardError::Plan {
        message: format!(
            "{} has no {what} weights; the plan was built for another config",
            b.map_or("the model".to_string(), BlockRef::scope)
        ),
    }
}

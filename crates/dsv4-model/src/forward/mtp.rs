//! The MTP draft layer (spec §3.7): from the main model's final residual at position t and the
//! token at t+1, one more ratio-0 block with its own caches, hc head and norm, and the shared head.

use super::state::LayerState;
use super::{ForwardError, Model, RowMap, Taps};

/// The MTP layer's per-sequence state: its own sliding-window cache.
#[derive(Debug, Clone)]
pub struct MtpState {
    /// Drafts made so far (the next draft's position).
    pub pos: usize,
    /// The MTP block's caches.
    pub layer: LayerState,
}

impl Model {
    /// A fresh MTP state, or None when the checkpoint has no MTP layer.
    pub fn new_mtp_state(&self) -> Option<MtpState> {
        self.weights.mtp.first().map(|m| MtpState {
            pos: 0,
            layer: self.layer_state(m.block.ratio),
        })
    }

    /// Draft logits [T, vocab]: row i predicts the token after `next_tokens[i]`, from the main
    /// model's final residual `residual` [T, M, D] at positions st.pos.. and `next_tokens[i]`
    /// (the token that followed each of those positions).
    pub fn mtp_forward(
        &self,
        st: &mut MtpState,
        residual: &[f32],
        next_tokens: &[u32],
    ) -> Result<Vec<f32>, ForwardError> {
        let Some(mw) = self.weights.mtp.first() else {
            return Err(ForwardError::Empty);
        };
        let positions = self.check_tokens(st.pos, next_tokens)?;
        let (t, m, d) = (next_tokens.len(), self.cfg.hc_mult, self.cfg.hidden_size);
        let eps = self.eps();
        let emb: Vec<f32> = next_tokens
            .iter()
            .flat_map(|&tok| {
                self.weights.embed[tok as usize * d..(tok as usize + 1) * d]
                    .iter()
                    .copied()
            })
            .collect();
        let mut en = vec![0f32; t * d];
        self.backend
            .rms_norm(&emb, Some(&mw.enorm), d, eps, &mut en);
        let e = self.project(&mw.e_proj, &en, t);
        let mut hn = vec![0f32; t * m * d];
        self.backend
            .rms_norm(residual, Some(&mw.hnorm), d, eps, &mut hn);
        let hproj = self.project(&mw.h_proj, &hn, t * m);
        let mut x = hproj;
        for i in 0..t {
            for j in 0..m {
                for c in 0..d {
                    x[(i * m + j) * d + c] += e[i * d + c];
                }
            }
        }
        let rows = RowMap {
            seq: vec![0; positions.len()],
            positions,
        };
        let mut states = [&mut st.layer];
        let (x, _) = self.block(
            "mtp.0.",
            &mw.block,
            &x,
            next_tokens,
            &rows,
            &mut states,
            &mut Taps::none(),
        )?;
        st.pos += t;
        Ok(self.head(&mw.hc_head, &mw.norm, &x, t))
    }
}

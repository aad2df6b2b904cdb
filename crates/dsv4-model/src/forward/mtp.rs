//! The MTP draft layer (spec §3.7): from the main model's final residual at position t and the
//! token at t+1, one more ratio-0 block with its own caches, hc head and norm, and the shared
//! head — run through its own plan.

use super::state::LayerState;
use super::{ForwardError, Model};

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
        if self.weights.mtp.is_empty() {
            return Err(ForwardError::Empty);
        }
        let (m, d) = (self.cfg.hc_mult, self.cfg.hidden_size);
        if residual.len() != next_tokens.len() * m * d {
            return Err(ForwardError::Plan {
                message: format!(
                    "the MTP residual has {} values; {} tokens need {}",
                    residual.len(),
                    next_tokens.len(),
                    next_tokens.len() * m * d
                ),
            });
        }
        let logits = self.mtp_step(&mut st.layer, st.pos, residual, next_tokens)?;
        st.pos += next_tokens.len();
        Ok(logits)
    }
}

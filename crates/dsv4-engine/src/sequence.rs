//! One request inside the engine: its tokens (prompt, then generated), its pooled cache state
//! (absent while queued or after preemption), its own random stream, its event channel, stop
//! conditions and timing.

use crate::constraint::{self, ConstraintState};
use crate::request::{
    Event, FinishReason, Finished, Request, RequestId, SamplingParams, Timing, TokenEvent, Usage,
};
use crate::sampling;
use dsv4_core::SplitMix64;
use dsv4_model::SequenceState;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Turns token ids into text (for stop strings and the final text).
pub trait Detokenizer: Send + Sync {
    /// The text of `ids`.
    fn decode(&self, ids: &[u32]) -> String;
}

impl<F: Fn(&[u32]) -> String + Send + Sync> Detokenizer for F {
    fn decode(&self, ids: &[u32]) -> String {
        self(ids)
    }
}

/// A request the engine holds, queued or running.
pub(crate) struct Seq {
    pub id: RequestId,
    pub req: Request,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// The cache state (None while queued, or after preemption).
    pub state: Option<SequenceState>,
    pub rng: SplitMix64,
    pub tx: UnboundedSender<Event>,
    pub submitted: Instant,
    pub admitted: Option<Instant>,
    pub first_token: Option<Instant>,
    /// Prompt tokens reused from the prefix cache at the first admission.
    pub cached_tokens: Option<usize>,
    pub preemptions: usize,
    /// Order of the latest admission (the latest admitted is preempted first).
    pub admit_order: u64,
    /// The request's token constraint state, if it has one.
    pub constraint: Option<Box<dyn ConstraintState>>,
}

/// The next token from `row` under `params`, drawing from `rng`, masked and advanced by the
/// request's token constraint (not advanced by an end-of-sequence that ends the request, given
/// as `(eos, ignore_eos)`). Both schedulers choose tokens through this one function, so a
/// request's tokens are the same whichever thread samples them. An error is the constraint's.
pub(crate) fn choose_token(
    row: &[f32],
    params: &SamplingParams,
    rng: &mut SplitMix64,
    constraint: Option<&mut (dyn ConstraintState + 'static)>,
    (eos, ignore_eos): (u32, bool),
) -> Result<u32, String> {
    let Some(c) = constraint else {
        return Ok(sampling::sample(row, params, rng));
    };
    let masked = constraint::apply(c, row).map_err(|e| format!("token constraint: {e}"))?;
    let tok = sampling::sample(&masked, params, rng);
    if tok != eos || ignore_eos {
        c.advance(tok)
            .map_err(|e| format!("token constraint: {e}"))?;
    }
    Ok(tok)
}

/// What happened after a token was appended.
pub(crate) enum AfterToken {
    Continue,
    Finish(FinishReason),
    /// The token constraint failed (the message says why).
    Fail(String),
}

impl Seq {
    /// A queued request.
    pub fn new(id: RequestId, req: Request, tx: UnboundedSender<Event>) -> Self {
        let rng = SplitMix64::new(req.sampling.seed);
        let constraint = req.constraint.as_ref().map(|c| c.0.start());
        Self {
            id,
            tokens: req.prompt.clone(),
            prompt_len: req.prompt.len(),
            req,
            state: None,
            rng,
            tx,
            submitted: Instant::now(),
            admitted: None,
            first_token: None,
            cached_tokens: None,
            preemptions: 0,
            admit_order: 0,
            constraint,
        }
    }

    /// Tokens already in the cache state.
    pub fn fed(&self) -> usize {
        self.state.as_ref().map_or(0, |s| s.pos)
    }

    /// Generated tokens so far.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Choose the next token from `row`, send it, and check the stop conditions.
    pub fn take_token(
        &mut self,
        row: &[f32],
        eos: u32,
        detok: Option<&Arc<dyn Detokenizer>>,
    ) -> AfterToken {
        let chosen = choose_token(
            row,
            &self.req.sampling,
            &mut self.rng,
            self.constraint.as_deref_mut(),
            (eos, self.req.ignore_eos),
        );
        match chosen {
            Ok(tok) => self.accept_token(tok, row, eos, detok),
            Err(message) => AfterToken::Fail(message),
        }
    }

    /// Record a token chosen by [`choose_token`] from `row`: end on end-of-sequence, else
    /// append it, send it, and check the stop strings and the length limit.
    pub fn accept_token(
        &mut self,
        tok: u32,
        row: &[f32],
        eos: u32,
        detok: Option<&Arc<dyn Detokenizer>>,
    ) -> AfterToken {
        self.first_token.get_or_insert_with(Instant::now);
        if tok == eos && !self.req.ignore_eos {
            return AfterToken::Finish(FinishReason::Eos);
        }
        self.tokens.push(tok);
        let index = self.generated().len() - 1;
        // A closed channel means the client is gone; the engine reaps it before the next step.
        let _ = self.tx.send(Event::Token(TokenEvent {
            token: tok,
            index,
            logits: self.req.return_logits.then(|| row.to_vec()),
        }));
        if let Some(d) = detok.filter(|_| !self.req.stop.is_empty()) {
            let text = d.decode(self.generated());
            if self.req.stop.iter().any(|s| text.contains(s.as_str())) {
                return AfterToken::Finish(FinishReason::Stop);
            }
        }
        if self.generated().len() >= self.req.max_tokens {
            return AfterToken::Finish(FinishReason::Length);
        }
        AfterToken::Continue
    }

    /// Free the cache and build the last event, to be sent on the returned channel.
    pub fn finish(
        mut self,
        reason: FinishReason,
        error: Option<String>,
        detok: Option<&Arc<dyn Detokenizer>>,
    ) -> (UnboundedSender<Event>, Finished) {
        self.state = None;
        let text = detok.map(|d| {
            let mut text = d.decode(self.generated());
            if reason == FinishReason::Stop {
                let cut = self
                    .req
                    .stop
                    .iter()
                    .filter_map(|s| text.find(s.as_str()))
                    .min();
                if let Some(at) = cut {
                    text.truncate(at);
                }
            }
            text
        });
        let ms = |t: Instant| t.duration_since(self.submitted).as_secs_f64() * 1e3;
        let now = Instant::now();
        let finished = Finished {
            reason,
            usage: Usage {
                prompt_tokens: self.prompt_len,
                completion_tokens: self.generated().len(),
                cached_tokens: self.cached_tokens.unwrap_or(0),
                preemptions: self.preemptions,
            },
            timing: Timing {
                queue_ms: ms(self.admitted.unwrap_or(now)),
                ttft_ms: self.first_token.map_or(0.0, ms),
                e2e_ms: ms(now),
            },
            text,
            error,
        };
        (self.tx, finished)
    }
}

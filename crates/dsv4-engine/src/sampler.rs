//! A request's sampling state — its random stream, token constraint and token counts — and
//! [`SamplerState::choose`], the one place a token is chosen; [`choose_all`] makes a step's
//! choices on several threads. The state moves as a whole: the
//! overlap scheduler hands it to its device thread with each step and takes it back, so a
//! request's tokens are the same whichever thread samples them.

use crate::constraint::{self, ConstraintState};
use crate::parallel;
use crate::request::{Request, SamplingParams, TokenLogprob};
use crate::sampling::{self, TokenCounts};
use dsv4_core::SplitMix64;

/// A token chosen for a request, with its log-probability when the request asks for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The token, or the constraint's error.
    pub token: Result<u32, String>,
    /// Its log-probability under the raw row (with `logprobs`).
    pub logprob: Option<TokenLogprob>,
}

/// One request's token choice in a step, for [`choose_all`].
pub struct ChoiceJob<'a> {
    /// The request's sampling state.
    pub state: &'a mut SamplerState,
    /// Its sampling parameters.
    pub params: &'a SamplingParams,
    /// (end-of-sequence id, ignore it).
    pub eos: (u32, bool),
    /// Alternatives to return with the token's log-probability (None: no log-probability).
    pub logprobs: Option<usize>,
    /// Tokens whose log-probabilities come with the token's (`logprob_token_ids`).
    pub token_ids: &'a [u32],
    /// The logits row the token is chosen from.
    pub row: &'a [f32],
    /// The choice, once made.
    pub out: Option<Choice>,
}

/// Threads [`choose_all`] uses for `requests` rows of `vocab` logits: `configured` when
/// non-zero, else one per 131,072 logits, at most the cores (never more than the requests).
pub fn choice_threads(configured: usize, requests: usize, vocab: usize) -> usize {
    parallel::threads_for(configured, requests, vocab)
}

/// Make every job's choice, on [`choice_threads`] threads. Each request's choice depends only
/// on its own row and state, so the threads change nothing but the time.
pub fn choose_all(jobs: &mut [ChoiceJob<'_>], configured: usize) {
    let logits = jobs.first().map_or(0, |j| j.row.len());
    let threads = choice_threads(configured, jobs.len(), logits);
    parallel::for_each_mut(jobs, threads, |j| {
        let token = j.state.choose(j.row, j.params, j.eos);
        let logprob = match (&token, j.logprobs) {
            (Ok(t), Some(top)) => Some(sampling::logprob_with(j.row, *t, top, j.token_ids)),
            _ => None,
        };
        j.out = Some(Choice { token, logprob });
    });
}

/// What a request carries from one token to the next to choose its tokens.
pub struct SamplerState {
    pub(crate) rng: SplitMix64,
    pub(crate) constraint: Option<Box<dyn ConstraintState>>,
    pub(crate) counts: TokenCounts,
}

impl Default for SamplerState {
    /// An inert state, left behind while the real one is away on the device thread.
    fn default() -> Self {
        Self {
            rng: SplitMix64::new(0),
            constraint: None,
            counts: TokenCounts::default(),
        }
    }
}

impl SamplerState {
    /// The state of `req` before its first generated token.
    pub fn new(req: &Request) -> Self {
        Self {
            rng: SplitMix64::new(req.sampling.seed),
            constraint: req.constraint.as_ref().map(|c| c.0.start()),
            counts: TokenCounts::new(&req.prompt, &req.sampling),
        }
    }

    /// The next token from `row` under `params`: logit bias and penalties, the token
    /// constraint's mask, the end tokens (the end-of-sequence token, given as `(eos,
    /// ignore_eos)`, and `stop_token_ids`) held back until `min_tokens` (unless that would leave
    /// nothing), then sampling. The constraint advances past the token unless it ends the
    /// request. An error is the constraint's.
    pub fn choose(
        &mut self,
        row: &[f32],
        params: &SamplingParams,
        (eos, ignore_eos): (u32, bool),
    ) -> Result<u32, String> {
        let hold_eos = (!ignore_eos || !params.stop_token_ids.is_empty())
            && self.counts.generated() < params.min_tokens;
        let tok = if !sampling::processes(params) && !hold_eos && self.constraint.is_none() {
            sampling::sample(row, params, &mut self.rng)
        } else {
            let mut row = match self.constraint.as_deref_mut() {
                Some(c) => constraint::apply(c, row)
                    .map_err(|e| format!("{}{e}", constraint::CONSTRAINT_FAILED))?,
                None => row.to_vec(),
            };
            sampling::process(&mut row, params, &self.counts);
            let end = |i: usize| params.ends(i as u32, (eos, ignore_eos));
            if hold_eos
                && row
                    .iter()
                    .enumerate()
                    .any(|(i, &x)| !end(i) && x > f32::NEG_INFINITY)
            {
                for (i, x) in row.iter_mut().enumerate() {
                    if end(i) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
            sampling::sample(&row, params, &mut self.rng)
        };
        if let Some(c) = self.constraint.as_deref_mut()
            && !params.ends(tok, (eos, ignore_eos))
        {
            c.advance(tok)
                .map_err(|e| format!("{}{e}", constraint::CONSTRAINT_FAILED))?;
        }
        self.counts.record(tok, sampling::penalizes(params));
        Ok(tok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(sampling: SamplingParams) -> Request {
        Request {
            prompt: vec![3, 4],
            max_tokens: 8,
            sampling,
            ..Default::default()
        }
    }

    #[test]
    fn the_end_token_waits_for_min_tokens_unless_it_is_the_only_choice() {
        let p = SamplingParams {
            min_tokens: 2,
            ..Default::default()
        };
        let mut s = SamplerState::new(&request(p.clone()));
        let row = [0.0, 1.0, 5.0];
        assert_eq!(s.choose(&row, &p, (2, false)), Ok(1), "eos held back");
        assert_eq!(s.choose(&row, &p, (2, false)), Ok(1), "eos held back");
        assert_eq!(
            s.choose(&row, &p, (2, false)),
            Ok(2),
            "two tokens generated"
        );
        let mut s = SamplerState::new(&request(p.clone()));
        let only_eos = [f32::NEG_INFINITY, f32::NEG_INFINITY, 5.0];
        assert_eq!(s.choose(&only_eos, &p, (2, false)), Ok(2));
        let mut s = SamplerState::new(&request(p.clone()));
        assert_eq!(
            s.choose(&row, &p, (2, true)),
            Ok(2),
            "with ignore_eos the end token is an ordinary token"
        );
    }

    #[test]
    fn stop_token_ids_are_end_tokens_held_back_until_min_tokens() {
        // Token 3 is a stop token and the most likely; end-of-sequence (2) is kept going past.
        let p = SamplingParams {
            min_tokens: 2,
            stop_token_ids: vec![3],
            ..Default::default()
        };
        let row = [0.0, 1.0, 4.0, 5.0];
        let mut s = SamplerState::new(&request(p.clone()));
        assert_eq!(
            s.choose(&row, &p, (2, true)),
            Ok(2),
            "the stop token held back"
        );
        assert_eq!(s.choose(&row, &p, (2, true)), Ok(2));
        assert_eq!(s.choose(&row, &p, (2, true)), Ok(3), "two tokens generated");
        assert!(p.ends(3, (2, true)) && !p.ends(2, (2, true)) && p.ends(2, (2, false)));
        // Both end tokens held: the next most likely is chosen.
        let mut s = SamplerState::new(&request(p.clone()));
        assert_eq!(s.choose(&row, &p, (2, false)), Ok(1));
        // Only end tokens left: one is chosen.
        let mut s = SamplerState::new(&request(p.clone()));
        let only_ends = [f32::NEG_INFINITY, f32::NEG_INFINITY, 4.0, 5.0];
        assert_eq!(s.choose(&only_ends, &p, (2, false)), Ok(3));
    }

    #[test]
    fn penalties_follow_the_tokens_this_state_chose() {
        // Greedy with a frequency penalty of 2: token 0 leads by 3, so it is chosen twice
        // (penalty 2 < 3, then 4 > 3) before token 1 takes over.
        let p = SamplingParams {
            frequency_penalty: 2.0,
            ..Default::default()
        };
        let mut s = SamplerState::new(&request(p.clone()));
        let row = [4.0, 1.0, -9.0];
        let toks: Vec<u32> = (0..4)
            .map(|_| s.choose(&row, &p, (2, false)).unwrap())
            .collect();
        assert_eq!(toks, [0, 0, 1, 0]);
        // The repetition penalty reads the prompt: tokens 3 and 4 of the prompt lose.
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut s = SamplerState::new(&request(p.clone()));
        let row = [0.0, 0.0, 0.0, 1.5, 1.8, 1.0];
        assert_eq!(s.choose(&row, &p, (0, true)), Ok(5), "1.8/2 and 1.5/2 < 1");
    }
}

//! One request inside the engine: its tokens (prompt, then generated), its pooled cache state
//! (absent while queued or after preemption), its sampling state, its event channel, stop
//! conditions and timing.

use crate::parallel;
use crate::request::{
    Event, FinishReason, Finished, Request, RequestId, Timing, TokenEvent, TokenLogprob, Usage,
};
use crate::sampler::{Choice, SamplerState};
use crate::sampling;
use dsv4_model::SequenceState;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

mod stop;

use stop::first_stop_after;
pub use stop::{Detokenizer, stop_string_ends};

/// A request the engine holds, queued or running.
pub(crate) struct Seq {
    pub id: RequestId,
    pub req: Request,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// The cache state (None while queued, or after preemption).
    pub state: Option<SequenceState>,
    /// Random stream, token constraint and token counts (away on the overlap scheduler's
    /// device thread while a step that samples this request runs).
    pub sampler: SamplerState,
    pub tx: UnboundedSender<Event>,
    pub submitted: Instant,
    pub admitted: Option<Instant>,
    pub first_token: Option<Instant>,
    /// Prompt tokens reused from the prefix cache at the first admission.
    pub cached_tokens: Option<usize>,
    pub preemptions: usize,
    /// Order of the latest admission (the latest admitted is preempted first).
    pub admit_order: u64,
    /// With `prompt_logprobs`: the entries scored so far, in prompt order (entry `k` scores
    /// prompt token `k + 1`); moved into the [`Event::Prompt`] when it is sent.
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// Whether the [`Event::Prompt`] was sent.
    pub prompt_sent: bool,
    /// Whether admission passed it over to wait for a running request's prefill.
    pub waited_for_prefill: bool,
    /// Its position when the overlap scheduler launched the step that holds its state (read
    /// while the state is away on the device thread).
    pub launched_from: usize,
    /// The token that ended it: the end-of-sequence token or one of `stop_token_ids`.
    pub stop_token: Option<u32>,
}

/// The rows of a step to score for `prompt_logprobs`: rows `offset..` of the step's output
/// are prompt positions `first..`, each scored against the prompt token after it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PromptRows {
    /// Alternatives per entry.
    pub top: usize,
    /// The first scored row's index in the step.
    pub offset: usize,
    /// Its position in the prompt.
    pub first: usize,
    /// The prompt token after each scored row.
    pub targets: Vec<u32>,
    /// Tokens whose log-probabilities come with each entry (`logprob_token_ids`).
    pub token_ids: Vec<u32>,
}

impl PromptRows {
    /// The entries, from the step's logits of this request's rows `offset..` (`[rows,
    /// vocab]`, as [`logit_rows`] asks for them), on as many threads as the work is worth
    /// (`configured` when non-zero).
    pub fn score(&self, logits: &[f32], vocab: usize, configured: usize) -> Vec<TokenLogprob> {
        let mut rows: Vec<(usize, u32, Option<TokenLogprob>)> = self
            .targets
            .iter()
            .enumerate()
            .map(|(k, &t)| (k, t, None))
            .collect();
        let threads = parallel::threads_for(configured, rows.len(), vocab);
        parallel::for_each_mut(&mut rows, threads, |(r, t, out)| {
            let row = &logits[*r * vocab..(*r + 1) * vocab];
            *out = Some(sampling::logprob_with(row, *t, self.top, &self.token_ids));
        });
        rows.into_iter().filter_map(|(_, _, e)| e).collect()
    }
}

/// How many of a request's last rows of a step of `n` rows need logits: those from the first
/// row `prompt` scores on, else the last row when the step samples it, else none.
pub(crate) fn logit_rows(n: usize, prompt: Option<&PromptRows>, samples: bool) -> usize {
    match prompt {
        Some(rows) => n - rows.offset,
        None => usize::from(samples),
    }
}

/// The last logits row of a step's output (the row a token is chosen from).
pub(crate) fn last_row(logits: &[f32], vocab: usize) -> &[f32] {
    &logits[logits.len() - vocab..]
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
        let sampler = SamplerState::new(&req);
        Self {
            id,
            tokens: req.prompt.clone(),
            prompt_len: req.prompt.len(),
            req,
            state: None,
            sampler,
            tx,
            submitted: Instant::now(),
            admitted: None,
            first_token: None,
            cached_tokens: None,
            preemptions: 0,
            admit_order: 0,
            prompt_logprobs: Vec::new(),
            prompt_sent: false,
            waited_for_prefill: false,
            launched_from: 0,
            stop_token: None,
        }
    }

    /// Tokens a prefix-cache hit may skip: all but the last, or, while prompt log-probabilities
    /// are owed, only the positions already scored (so every prompt row is computed once).
    pub fn prefix_limit(&self) -> usize {
        let all = self.tokens.len() - 1;
        match self.req.prompt_logprobs {
            Some(_) if !self.prompt_sent => all.min(self.prompt_logprobs.len()),
            _ => all,
        }
    }

    /// The rows of a step running positions `fed..fed + n` that score prompt tokens not
    /// scored yet (None without `prompt_logprobs`, or when there are none).
    pub fn prompt_rows(&self, fed: usize, n: usize) -> Option<PromptRows> {
        let top = self.req.prompt_logprobs.filter(|_| !self.prompt_sent)?;
        let first = fed.max(self.prompt_logprobs.len());
        let end = (fed + n).min(self.prompt_len - 1);
        (first < end).then(|| PromptRows {
            top,
            offset: first - fed,
            first,
            targets: self.tokens[first + 1..=end].to_vec(),
            token_ids: self.req.logprob_token_ids.clone(),
        })
    }

    /// Keep the entries scored for prompt positions `first..` (positions already held, as
    /// after a preemption's recomputation, keep their first entry; they are equal).
    pub fn record_prompt(&mut self, first: usize, entries: Vec<TokenLogprob>) {
        if self.prompt_sent {
            return;
        }
        for (k, e) in entries.into_iter().enumerate() {
            if first + k == self.prompt_logprobs.len() {
                self.prompt_logprobs.push(e);
            }
        }
    }

    /// Tokens already in the cache state.
    pub fn fed(&self) -> usize {
        self.state.as_ref().map_or(0, |s| s.pos)
    }

    /// Tokens in the cache state; while the state is away in a launched step, those it had at
    /// launch (the step's own prefix snapshots arrive when it is collected).
    pub fn progress(&self) -> usize {
        self.state.as_ref().map_or(self.launched_from, |s| s.pos)
    }

    /// Generated tokens so far.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Whether the request generates nothing (`max_tokens` 0) and its whole prompt has run:
    /// it is done once [`Self::prompt_done`] has sent its prompt's entries.
    pub fn prompt_only_done(&self) -> bool {
        self.req.max_tokens == 0 && self.fed() == self.tokens.len()
    }

    /// The whole prompt has been run: its first output is now (the first token, or the
    /// prompt's entries of a request that generates nothing), and the [`Event::Prompt`] owed
    /// under `prompt_logprobs` is sent.
    pub fn prompt_done(&mut self) {
        self.first_token.get_or_insert_with(Instant::now);
        if self.req.prompt_logprobs.is_some() && !self.prompt_sent {
            debug_assert_eq!(self.prompt_logprobs.len(), self.prompt_len - 1);
            self.prompt_sent = true;
            let entries = std::mem::take(&mut self.prompt_logprobs);
            let _ = self.tx.send(Event::Prompt(entries));
        }
    }

    /// Record a choice made by [`crate::sampler::choose_all`] from `row`: fail on the
    /// constraint's error, end on end-of-sequence, else append the token, send it (with its
    /// logits row and log-probability when asked), and check the stop strings and the length
    /// limit.
    pub fn accept(
        &mut self,
        choice: Choice,
        row: &[f32],
        eos: u32,
        detok: Option<&Arc<dyn Detokenizer>>,
    ) -> AfterToken {
        let tok = match choice.token {
            Ok(tok) => tok,
            Err(message) => return AfterToken::Fail(message),
        };
        // The first token was chosen from the last prompt row, so every row is scored.
        self.prompt_done();
        if self.req.sampling.ends(tok, (eos, self.req.ignore_eos)) {
            self.stop_token = Some(tok);
            return AfterToken::Finish(FinishReason::Eos);
        }
        self.tokens.push(tok);
        let index = self.generated().len() - 1;
        // A closed channel means the client is gone; the engine reaps it before the next step.
        let _ = self.tx.send(Event::Token(TokenEvent {
            token: tok,
            index,
            logits: self.req.return_logits.then(|| row.to_vec()),
            logprob: choice.logprob,
        }));
        // Before `min_tokens` tokens, stop strings are not looked for (vLLM): an occurrence
        // that ends in those tokens' text never ends the request.
        if let Some(d) = detok
            && stop_string_ends(
                self.generated(),
                &self.req.stop,
                d.as_ref(),
                self.req.sampling.min_tokens,
            )
        {
            return AfterToken::Finish(FinishReason::Stop);
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
                let ignored = self.req.sampling.min_tokens.saturating_sub(1);
                let cut =
                    first_stop_after(&text, self.generated(), &self.req.stop, d.as_ref(), ignored);
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
            stop_token: self.stop_token,
        };
        (self.tx, finished)
    }
}

#[cfg(test)]
mod tests {
    use super::stop::tests::ByteLevel;
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn prompt_rows_score_each_prompt_position_once_and_bound_prefix_reuse() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let req = Request {
            prompt: vec![1, 2, 3, 4, 5],
            max_tokens: 2,
            prompt_logprobs: Some(1),
            ..Default::default()
        };
        let mut s = Seq::new(RequestId(0), req, tx);
        assert_eq!(s.prefix_limit(), 0, "nothing scored: no row may be skipped");
        let r = s.prompt_rows(0, 3).unwrap();
        assert_eq!((r.offset, r.first, r.targets), (0, 0, vec![2, 3, 4]));
        // Positions 3 and 4: row 3 scores token 5; row 4, the last, scores nothing.
        let r = s.prompt_rows(3, 2).unwrap();
        assert_eq!((r.offset, r.first, r.targets), (0, 3, vec![5]));
        assert!(s.prompt_rows(4, 1).is_none());
        let e = |logprob| TokenLogprob {
            logprob,
            top: Vec::new(),
            rank: 1,
            asked: Vec::new(),
        };
        s.record_prompt(0, vec![e(-1.0), e(-2.0), e(-3.0)]);
        assert_eq!(s.prefix_limit(), 3);
        // A recomputation from position 1 (after a preemption) keeps the first entries.
        let r = s.prompt_rows(1, 4).unwrap();
        assert_eq!((r.offset, r.first, r.targets), (2, 3, vec![5]));
        s.record_prompt(1, vec![e(-9.0), e(-9.0), e(-4.0)]);
        let got: Vec<f32> = s.prompt_logprobs.iter().map(|x| x.logprob).collect();
        assert_eq!(got, [-1.0, -2.0, -3.0, -4.0]);
        assert!(
            s.prompt_rows(0, 5).is_none(),
            "every prompt token is scored"
        );
        assert_eq!(s.prefix_limit(), 4);
    }

    #[test]
    fn stop_strings_are_not_looked_for_before_min_tokens() {
        let d: Arc<dyn Detokenizer> = Arc::new(ByteLevel(AtomicUsize::new(0)));
        let run = |min_tokens: usize| {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let req = Request {
                prompt: vec![3],
                max_tokens: 8,
                stop: vec!["b".into()],
                sampling: crate::SamplingParams {
                    min_tokens,
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut s = Seq::new(RequestId(0), req, tx);
            // a b a b a …: the request stops at the first "b" it looks for.
            for (i, tok) in [0, 1, 0, 1, 0].into_iter().enumerate() {
                let choice = Choice {
                    token: Ok(tok),
                    logprob: None,
                };
                if let AfterToken::Finish(r) = s.accept(choice, &[], 99, Some(&d)) {
                    let (_, f) = s.finish(r, None, Some(&d));
                    return (i + 1, f.text.unwrap());
                }
            }
            panic!("min_tokens {min_tokens}: never stopped");
        };
        assert_eq!(run(0), (2, "a".to_string()));
        assert_eq!(
            run(2),
            (2, "a".to_string()),
            "the second token is looked at"
        );
        // The "b" of token 2 is not looked for; the text is cut at the one that stopped it.
        assert_eq!(run(3), (4, "aba".to_string()));
    }

    #[test]
    fn the_token_that_ends_a_request_is_reported_and_not_generated() {
        // (eos, ignore_eos, stop_token_ids) → (tokens generated, stop_token).
        let run = |ignore_eos: bool, stop_token_ids: Vec<u32>| {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let req = Request {
                prompt: vec![3],
                max_tokens: 8,
                ignore_eos,
                sampling: crate::SamplingParams {
                    stop_token_ids,
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut s = Seq::new(RequestId(0), req, tx);
            for tok in [5, 9, 7, 9, 4] {
                let choice = Choice {
                    token: Ok(tok),
                    logprob: None,
                };
                if let AfterToken::Finish(r) = s.accept(choice, &[], 9, None) {
                    let (_, f) = s.finish(r, None, None);
                    return (f.reason, f.usage.completion_tokens, f.stop_token);
                }
            }
            let (_, f) = s.finish(FinishReason::Length, None, None);
            (f.reason, f.usage.completion_tokens, f.stop_token)
        };
        assert_eq!(run(false, vec![]), (FinishReason::Eos, 1, Some(9)));
        assert_eq!(run(false, vec![7]), (FinishReason::Eos, 1, Some(9)));
        assert_eq!(run(true, vec![7]), (FinishReason::Eos, 2, Some(7)));
        assert_eq!(run(true, vec![]), (FinishReason::Length, 5, None));
    }
}

//! One generation in flight: a submitted engine request, its output decoder and its place in
//! the server's accounting. [`Run::next`] waits for the next piece of answer, with the
//! log-probabilities of the tokens consumed since the last piece. Dropping a run (the client
//! went away, or the answer broke the grammar) drops its engine stream, which cancels the
//! request and frees its cache before the engine's next step. A request with `n` choices is
//! `n` runs ([`start_choices`]) whose steps [`merge`] interleaves as they are produced.

use crate::abort::AbortGuard;
use crate::api::common::StopReason;
use crate::error::ApiError;
use crate::output::{Delta, OutputDecoder};
use crate::state::{AppState, InFlight, Loaded};
use crate::vocab::Vocab;
use dsv4_engine::limits::Limits;
use dsv4_engine::{
    Event, FinishReason, Finished, QUEUE_FULL, Request, RequestStream, TokenLogprob,
};
use futures_util::StreamExt;
use futures_util::stream::{BoxStream, SelectAll};
use std::sync::Arc;

/// A generated token with its log-probability (requests that ask for logprobs).
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    /// The token id.
    pub id: u32,
    /// Bytes it added to the completion text (0 for an end-of-sequence token kept going past
    /// with `ignore_eos`, whose text is left out).
    pub text_len: usize,
    /// Its log-probability and the most likely alternatives.
    pub logprob: TokenLogprob,
}

/// What [`Run::next`] produced.
#[derive(Debug)]
pub struct Step {
    /// More of the answer (empty only on the last step).
    pub deltas: Vec<Delta>,
    /// The tokens consumed since the previous step, with their log-probabilities (empty
    /// unless the request asked for them); text held back by the decoder carries its tokens
    /// forward to the step that shows it.
    pub logprobs: Vec<GeneratedToken>,
    /// With `prompt_logprobs`, on the first step: entry `k` scores prompt token `k + 1`.
    pub prompt_logprobs: Option<Vec<TokenLogprob>>,
    /// The ids of the tokens consumed since the previous step (carried forward as
    /// `logprobs` are); the last step's end with the token that ended the answer (the
    /// end-of-sequence token or a `stop_token_ids` id) when one did, as vLLM's `token_ids`.
    pub token_ids: Vec<u32>,
    /// Tokens generated so far (the token that ended the answer not counted).
    pub generated: usize,
    /// On the last step: the `stop_token_ids` id or stop string that ended the answer.
    pub stop_reason: Option<StopReason>,
    /// How the request ended, on the last step.
    pub finished: Option<Finished>,
}

/// A generation request in flight.
pub struct Run {
    state: AppState,
    loaded: Arc<Loaded>,
    stream: RequestStream,
    decoder: OutputDecoder,
    constrained: bool,
    max_tokens: usize,
    /// The end-of-sequence id when `ignore_eos` keeps it as a token (its text is left out).
    silent: Option<u32>,
    pending: Vec<GeneratedToken>,
    /// The ids of the tokens not yet in a step.
    pending_ids: Vec<u32>,
    /// Tokens generated so far.
    generated: usize,
    /// The prompt's entries, until the step that carries them.
    prompt: Option<Vec<TokenLogprob>>,
    /// Its registration for `/abort_request`.
    abort: AbortGuard,
    /// Whether its end counts in the server's request metrics (a replay's does not: its
    /// engine requests were counted as they ran).
    counted: bool,
    _in_flight: InFlight,
}

impl Run {
    /// Submit `req` as the run `id` of the request `group` (the ids `/abort_request` takes);
    /// its output goes through `decoder`.
    pub fn start(
        state: &AppState,
        loaded: &Arc<Loaded>,
        req: Request,
        (id, group): (String, String),
        decoder: OutputDecoder,
    ) -> Result<Self, ApiError> {
        let shape = (req.constraint.is_some(), req.max_tokens, req.ignore_eos);
        let stream = loaded.engine.submit(req)?;
        tracing::debug!(id = %stream.id(), "submitted");
        Ok(Self::over(
            state,
            loaded,
            stream,
            (id, group),
            decoder,
            shape,
        ))
    }

    /// A run of `events` made by the server, not by the engine (a beam search's hypothesis,
    /// [`crate::beam`]), through `decoder` as the engine request `req` would have run: its
    /// `max_tokens` and `ignore_eos` apply. With `aborted`, the events end as an aborted run
    /// ends (an abort stopped the search). Its end is not counted in the request metrics.
    pub fn replay(
        state: &AppState,
        loaded: &Arc<Loaded>,
        (req, events): (&Request, Vec<Event>),
        (id, group): (String, String),
        decoder: OutputDecoder,
        aborted: bool,
    ) -> Self {
        let stream = RequestStream::replay(events);
        let shape = (false, req.max_tokens, req.ignore_eos);
        let mut run = Self::over(state, loaded, stream, (id, group), decoder, shape);
        run.counted = false;
        if aborted {
            run.abort.mark_aborted();
        }
        run
    }

    /// A run reading `stream`, whose request was constrained or not, asked for at most
    /// `max_tokens` and kept going past the end-of-sequence token or not.
    fn over(
        state: &AppState,
        loaded: &Arc<Loaded>,
        stream: RequestStream,
        (id, group): (String, String),
        decoder: OutputDecoder,
        (constrained, max_tokens, ignore_eos): (bool, usize, bool),
    ) -> Self {
        let in_flight = state.begin_request();
        let abort = state.aborts().register(id, group, stream.id());
        Self {
            state: state.clone(),
            loaded: Arc::clone(loaded),
            stream,
            decoder,
            constrained,
            max_tokens,
            silent: ignore_eos.then_some(loaded.eos),
            pending: Vec::new(),
            pending_ids: Vec::new(),
            generated: 0,
            prompt: None,
            abort,
            counted: true,
            _in_flight: in_flight,
        }
    }

    /// Wait until the engine has queued this run (at once without
    /// `scheduler.max_queued_requests`): the 503 `queue_full` when it refused it at a full
    /// queue, so a stream or a background response is refused before it starts.
    pub async fn queued(&mut self) -> Result<(), ApiError> {
        if self.stream.queued().await {
            return Ok(());
        }
        // Refused (or the engine stopped): the stream ends with why, and holds nothing else.
        match self.next().await {
            Err(e) => Err(e),
            Ok(_) => Err(ApiError::internal(
                "the engine did not queue the request but went on with it",
            )),
        }
    }

    /// The vocabulary the tokens' texts come from.
    pub fn vocab(&self) -> &Vocab {
        &self.loaded.vocab
    }

    /// Wait for the next piece of the answer (tokens that only extend held-back text are
    /// consumed silently, their log-probabilities kept for the next step). Errors: the answer
    /// broke the completion grammar, the engine failed, or it stopped.
    pub async fn next(&mut self) -> Result<Step, ApiError> {
        loop {
            let event = self.stream.next().await;
            match event {
                Some(Event::Prompt(entries)) => self.prompt = Some(entries),
                Some(Event::Token(t)) => {
                    self.pending_ids.push(t.token);
                    self.generated += 1;
                    let hidden = self.silent == Some(t.token)
                        || (self.decoder.skips_special_tokens()
                            && self.loaded.tokenizer.is_special(t.token));
                    let bytes = if hidden {
                        &[]
                    } else {
                        self.loaded.vocab.bytes(t.token)
                    };
                    if let Some(logprob) = t.logprob {
                        self.pending.push(GeneratedToken {
                            id: t.token,
                            text_len: bytes.len(),
                            logprob,
                        });
                    }
                    let deltas = self
                        .decoder
                        .push(bytes)
                        .map_err(|e| self.output_error(&e, None))?;
                    if !deltas.is_empty() {
                        return Ok(self.step(deltas, None));
                    }
                }
                Some(Event::Finished(f)) => {
                    // A request refused at a full queue never ran: `/metrics` counts it apart.
                    let refused = f
                        .error
                        .as_deref()
                        .is_some_and(|e| e.starts_with(QUEUE_FULL));
                    if self.counted && !refused {
                        self.state.stats().finished(&f);
                    }
                    return match f.reason {
                        FinishReason::Error => Err(engine_error(f.error.as_deref())),
                        FinishReason::Cancelled if !self.abort.aborted() => {
                            Err(ApiError::unavailable(
                                "the request was cancelled by the server (shutting down)",
                            ))
                        }
                        // Ended by its length, its end token, a stop, or an abort (which keeps
                        // what it had).
                        _ => {
                            let deltas = self
                                .decoder
                                .finish()
                                .map_err(|e| self.output_error(&e, Some(f.reason)))?;
                            Ok(self.step(deltas, Some(f)))
                        }
                    };
                }
                None => {
                    return Err(ApiError::unavailable(
                        "the engine stopped before the request finished",
                    ));
                }
            }
        }
    }

    fn step(&mut self, deltas: Vec<Delta>, finished: Option<Finished>) -> Step {
        let mut token_ids = std::mem::take(&mut self.pending_ids);
        let stop_token = finished.as_ref().and_then(|f| f.stop_token);
        token_ids.extend(stop_token);
        // vLLM: the end-of-sequence token (when not ignored) is no stop reason.
        let stop_reason = match (stop_token, &finished) {
            (Some(t), _) if t != self.loaded.eos || self.silent.is_some() => {
                Some(StopReason::Token(t))
            }
            (None, Some(f)) if f.reason == FinishReason::Stop => self
                .decoder
                .matched_stop()
                .map(|s| StopReason::Text(s.to_string())),
            _ => None,
        };
        Step {
            deltas,
            logprobs: std::mem::take(&mut self.pending),
            prompt_logprobs: self.prompt.take(),
            token_ids,
            generated: self.generated,
            stop_reason,
            finished,
        }
    }
}

impl Run {
    /// Count a broken answer and say what could help (`ended`: how the answer ended, None
    /// while it goes).
    fn output_error(&self, e: &dsv4_chat::ParseError, ended: Option<FinishReason>) -> ApiError {
        self.state.stats().output_error(e.class.as_str());
        let hint = if ended == Some(FinishReason::Cancelled) {
            "the request was aborted (/abort_request) before the answer was complete".to_string()
        } else if ended == Some(FinishReason::Length) {
            format!(
                "the answer reached its token limit ({} tokens: max_tokens, or \
                 max_output_tokens on /v1/responses) before it was complete; raise it",
                self.max_tokens
            )
        } else if self.constrained {
            "the answer was constrained by a grammar, so stop strings must have cut it: remove \
             them (otherwise this is a bug: please report it)"
                .to_string()
        } else {
            "tool_choice \"required\" (\"any\" on /v1/messages), a named tool or a JSON output \
             format (response_format; text.format on /v1/responses; output_config.format on \
             /v1/messages) constrain the answer to the grammar"
                .to_string()
        };
        ApiError::model_output(e, &hint)
    }
}

/// Start the `n` choices of `req` as the request `rid` (choice k is the run `rid` or, past the
/// first, `rid-k`, the ids `/abort_request` takes), each its own engine request (the prompt is the same, so the
/// prefix cache shares its pages): choice `i` samples with seed `req.sampling.seed + i`
/// (wrapping), so choice `i` of a seeded request is reproducible and does not depend on `n`,
/// and its output goes through its own decoder from `decoder`. Only the first choice scores
/// the prompt (`req.prompt_logprobs`; the entries are the same for all): the others reuse its
/// prefill through the prefix cache, and show its entries ([`SharedScoring`] when streamed).
/// Everything else is the same for every choice (the engine starts a fresh grammar state per
/// request from the shared constraint). If a choice cannot be submitted, the ones already
/// started are dropped, which cancels them.
pub fn start_choices(
    state: &AppState,
    loaded: &Arc<Loaded>,
    req: Request,
    n: usize,
    rid: &str,
    mut decoder: impl FnMut() -> OutputDecoder,
) -> Result<Vec<Run>, ApiError> {
    let base = req.sampling.seed;
    (0..n)
        .map(|i| {
            let mut choice = req.clone();
            choice.sampling.seed = base.wrapping_add(i as u64);
            if i > 0 {
                choice.prompt_logprobs = None;
            }
            let id = match i {
                0 => rid.to_string(),
                i => format!("{rid}-{i}"),
            };
            Run::start(state, loaded, choice, (id, rid.to_string()), decoder())
        })
        .collect()
}

/// A stream's steps of choices that show their prompt's scoring on their first chunk, while only
/// each prompt's first choice scores it ([`start_choices`]): a choice's steps are held back
/// until that first choice's first step has brought the entries, then released with them.
/// The wait is short: the other choices reuse the first one's prefill, so they are behind it.
pub struct SharedScoring {
    /// Per choice: the index of its prompt's first choice.
    first: Vec<usize>,
    /// Per choice: whether its first step must carry the prompt's entries.
    needs: Vec<bool>,
    /// Per first choice: its prompt's entries, once scored.
    entries: Vec<Option<Vec<TokenLogprob>>>,
    /// Per choice: whether a step of it was released.
    released: Vec<bool>,
    /// Per choice: its steps held back, in order.
    held: Vec<Vec<Step>>,
}

impl SharedScoring {
    /// Choices whose prompts' first choices are `first` (per choice), and which of them show
    /// their prompt's entries (`needs`).
    pub fn new(first: Vec<usize>, needs: Vec<bool>) -> Self {
        let n = first.len();
        Self {
            first,
            needs,
            entries: vec![None; n],
            released: vec![false; n],
            held: (0..n).map(|_| Vec::new()).collect(),
        }
    }

    /// Take in choice `i`'s next step; returns the steps ready to show, in order (a choice's
    /// first one carrying its prompt's entries when it needs them).
    pub fn ready(&mut self, i: usize, step: Step) -> Vec<(usize, Step)> {
        let f = self.first[i];
        if i == f && self.entries[f].is_none() {
            self.entries[f] = step.prompt_logprobs.clone();
        }
        if i != f && self.needs[i] && !self.released[i] && !self.released[f] {
            self.held[i].push(step);
            return Vec::new();
        }
        let first_step = !self.released[i];
        let mut out = vec![self.release(i, step)];
        if i == f && first_step {
            for j in 0..self.first.len() {
                if self.first[j] != f || j == f {
                    continue;
                }
                for s in std::mem::take(&mut self.held[j]) {
                    out.push(self.release(j, s));
                }
            }
        }
        out
    }

    fn release(&mut self, i: usize, mut step: Step) -> (usize, Step) {
        if self.needs[i] && !self.released[i] && step.prompt_logprobs.is_none() {
            step.prompt_logprobs = self.entries[self.first[i]].clone();
        }
        self.released[i] = true;
        (i, step)
    }
}

/// The steps of several choices' runs, merged: each item is a choice's index and its next step
/// (or error), in the order they are produced, so a slow choice does not hold back the others.
/// A choice's part ends after its last step or its error; dropping the merged stream drops
/// every run still going, which cancels their engine requests.
pub type Merged = SelectAll<BoxStream<'static, (usize, Result<Step, ApiError>)>>;

/// Wait until the engine has queued every run ([`Run::queued`]); the first refusal.
pub async fn all_queued(runs: &mut [Run]) -> Result<(), ApiError> {
    for run in runs {
        run.queued().await?;
    }
    Ok(())
}

/// Merge `runs` (choice `i` is `runs[i]`); see [`Merged`].
pub fn merge(runs: Vec<Run>) -> Merged {
    futures_util::stream::select_all(runs.into_iter().enumerate().map(|(index, run)| {
        futures_util::stream::unfold(Some(run), move |run| async move {
            let mut run = run?;
            let step = run.next().await;
            let more = matches!(&step, Ok(s) if s.finished.is_none());
            Some(((index, step), more.then_some(run)))
        })
        .boxed()
    }))
}

/// The error of a request the engine ended with an error: a failed token constraint (the
/// request's own grammar: its structured output or required tool calls) is the request's
/// fault, a 400 with code `grammar_failed`; anything else is the server's, a 500.
fn engine_error(error: Option<&str>) -> ApiError {
    let error = error.unwrap_or("no reason given");
    if let Some(why) = error.strip_prefix(dsv4_engine::CONSTRAINT_FAILED) {
        return ApiError::bad_request(format!(
            "the request's grammar (its structured output or required tool calls) could not \
             be followed while generating: {why}"
        ))
        .with_code("grammar_failed");
    }
    if let Some(why) = error.strip_prefix(QUEUE_FULL) {
        return ApiError::unavailable(format!(
            "the server is at capacity: {why} (scheduler.max_queued_requests); retry shortly"
        ))
        .with_code("queue_full");
    }
    ApiError::internal(format!("the engine failed on this request: {error}"))
}

/// OpenAI's `finish_reason` for an engine reason, given whether tool calls were made (an
/// aborted request's is vLLM's `abort`).
pub fn finish_reason(reason: FinishReason, tool_calls: bool) -> &'static str {
    match reason {
        FinishReason::Cancelled => "abort",
        _ if tool_calls => "tool_calls",
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// The largest `max_tokens` up to `upper` that the engine accepts for `prompt` (its pools may
/// hold less than the whole context); `upper` itself when even 1 is refused, so the engine's
/// refusal reaches the client.
pub fn fit_max_tokens(limits: &Limits, prompt: &[u32], upper: usize) -> usize {
    let ok = |n: usize| {
        limits
            .check(&Request {
                prompt: prompt.to_vec(),
                max_tokens: n,
                ..Default::default()
            })
            .is_ok()
    };
    if ok(upper) || !ok(1) {
        return upper;
    }
    let (mut lo, mut hi) = (1, upper);
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of `generated` tokens, carrying prompt entries when `scored`.
    fn step(generated: usize, scored: bool) -> Step {
        Step {
            deltas: Vec::new(),
            logprobs: Vec::new(),
            prompt_logprobs: scored.then(|| {
                vec![TokenLogprob {
                    logprob: -1.5,
                    top: Vec::new(),
                    rank: 1,
                    asked: Vec::new(),
                }]
            }),
            token_ids: Vec::new(),
            generated,
            stop_reason: None,
            finished: None,
        }
    }

    /// (choice, generated, carries entries) of released steps.
    fn seen(out: Vec<(usize, Step)>) -> Vec<(usize, usize, bool)> {
        out.into_iter()
            .map(|(i, s)| (i, s.generated, s.prompt_logprobs.is_some()))
            .collect()
    }

    #[test]
    fn steps_wait_for_their_prompts_first_choice_then_come_out_in_order() {
        // Prompt 0: choices 0–2; prompt 1: choices 3–4, which do not show the entries.
        let mut s = SharedScoring::new(vec![0, 0, 0, 3, 3], vec![true, true, true, false, false]);
        assert!(s.ready(2, step(1, false)).is_empty());
        assert!(s.ready(2, step(2, false)).is_empty());
        assert_eq!(seen(s.ready(4, step(1, false))), [(4, 1, false)]);
        assert!(s.ready(1, step(1, false)).is_empty());
        assert_eq!(
            seen(s.ready(0, step(1, true))),
            [(0, 1, true), (1, 1, true), (2, 1, true), (2, 2, false)],
            "the first choice, then the held steps in order, each choice's first with entries"
        );
        assert_eq!(seen(s.ready(1, step(2, false))), [(1, 2, false)]);
        assert_eq!(seen(s.ready(0, step(2, false))), [(0, 2, false)]);
    }

    #[test]
    fn a_first_choice_without_entries_never_stalls_the_others() {
        let mut s = SharedScoring::new(vec![0, 0], vec![true, true]);
        assert!(s.ready(1, step(1, false)).is_empty());
        assert_eq!(
            seen(s.ready(0, step(1, false))),
            [(0, 1, false), (1, 1, false)]
        );
        assert_eq!(seen(s.ready(1, step(2, false))), [(1, 2, false)]);
    }
}

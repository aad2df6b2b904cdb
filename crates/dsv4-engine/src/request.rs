//! Requests and what comes back: [`Request`] with its [`SamplingParams`], the [`Event`]s of a
//! [`RequestStream`] (tokens, then one [`Finished`] with reason, usage and timing).

use crate::constraint::Constraint;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedReceiver;

/// The engine's id of a submitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// How the next token is chosen. The penalties, `logit_bias` and `min_tokens` change the
/// logits before `temperature`, `top_k`, `top_p` and `min_p` choose from them (vLLM's order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 picks the most likely token (ties to the lower id); above 0 samples from
    /// softmax(logits / temperature).
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose probability reaches top_p (0 < p ≤ 1).
    pub top_p: f32,
    /// Keep only the top_k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep only tokens at least min_p times as likely as the most likely one (0: all).
    pub min_p: f32,
    /// Seed of the request's own random stream (results do not depend on other requests).
    pub seed: u64,
    /// Subtracted once from the logit of every token already generated (−2 to 2, OpenAI).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (−2 to 2, OpenAI).
    pub frequency_penalty: f32,
    /// Tokens of the prompt or the generation: a positive logit is divided by it, a negative
    /// one multiplied (1: off; above 1 discourages repeats, as vLLM and SGLang).
    pub repetition_penalty: f32,
    /// `(token id, bias)` pairs: the bias (−100 to 100) is added to the token's logit.
    pub logit_bias: Vec<(u32, f32)>,
    /// The end tokens (end-of-sequence and `stop_token_ids`) cannot be chosen, and stop
    /// strings are not looked for, before this many tokens are generated (vLLM's semantics).
    pub min_tokens: usize,
    /// More tokens that end the request as the end-of-sequence token does (vLLM's
    /// `stop_token_ids`): never part of the output, held back before `min_tokens`, and not
    /// affected by `ignore_eos`.
    pub stop_token_ids: Vec<u32>,
    /// Only these tokens may be chosen (vLLM's `allowed_token_ids`); empty: any. The end
    /// tokens too: without them the request runs to `max_tokens` or a stop string.
    pub allowed_token_ids: Vec<u32>,
    /// Token sequences never generated (vLLM's `bad_words`, tokenized): a sequence's last
    /// token is banned wherever the generated tokens end with the rest of it (a one-token
    /// sequence is banned everywhere).
    pub bad_words_ids: Vec<Vec<u32>>,
}

impl SamplingParams {
    /// Whether `token` ends a request with end-of-sequence token `eos` (`ignore_eos` keeps
    /// going past that one only).
    pub fn ends(&self, token: u32, (eos, ignore_eos): (u32, bool)) -> bool {
        (token == eos && !ignore_eos) || self.stop_token_ids.contains(&token)
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            allowed_token_ids: Vec::new(),
            bad_words_ids: Vec::new(),
        }
    }
}

/// Most alternatives a request may ask for with each token's log-probability (OpenAI's
/// `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Most token ids a request may ask the log-probability of at every position (SGLang's
/// `token_ids_logprob`).
pub const MAX_LOGPROB_TOKEN_IDS: usize = 256;

/// The log-probability of a generated token under the model (the raw logits row, before
/// penalties, bias, temperature and any token constraint; vLLM's default), with the most
/// likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// ln p(token).
    pub logprob: f32,
    /// The most likely tokens with their ln p, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
    /// The token's place in that order over the whole vocabulary (1: the most likely).
    #[serde(default)]
    pub rank: u32,
    /// ln p of each of the request's `logprob_token_ids`, in that order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asked: Vec<f32>,
}

/// One generation request over token ids.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// Prompt token ids (BOS included when the model wants one), at least one.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most; 0 only runs the prompt (scoring it under
    /// `prompt_logprobs`, and leaving prefix snapshots) and ends with [`FinishReason::Length`].
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop strings: generation ends when the decoded text contains one (the engine needs a
    /// detokenizer for these); the final text is cut before it.
    pub stop: Vec<String>,
    /// Keep going past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Send the logits row each token was chosen from with its event.
    pub return_logits: bool,
    /// Send each token's log-probability with its event, with this many alternatives (at most
    /// [`MAX_TOP_LOGPROBS`]); None: no log-probabilities.
    pub logprobs: Option<usize>,
    /// Send one [`Event::Prompt`] before the first token (or before [`Event::Finished`] when
    /// `max_tokens` is 0) with the log-probability of every
    /// prompt token after the first, each with this many alternatives (at most
    /// [`MAX_TOP_LOGPROBS`]); None: none. Every prompt row is then computed: the prefix cache
    /// does not skip any on the first admission.
    pub prompt_logprobs: Option<usize>,
    /// With `logprobs` or `prompt_logprobs`: the ln p of each of these tokens too, at every
    /// position scored ([`TokenLogprob::asked`]), at most [`MAX_LOGPROB_TOKEN_IDS`].
    pub logprob_token_ids: Vec<u32>,
    /// Restricts which tokens may be generated (grammar-constrained decoding); None: any.
    pub constraint: Option<Constraint>,
    /// Admission order: a waiting request of higher priority is admitted before any of lower
    /// priority (equal ones in the schedule policy's order), and under memory pressure the
    /// lowest-priority running request is preempted first. A running request is preempted to
    /// admit a higher-priority one only with `EngineConfig::priority_preemption`. 0 by default
    /// (SGLang's `priority`, larger first).
    pub priority: i32,
    /// Load shedding (SGLang's `--max-queued-requests`): when this many requests already wait
    /// for a running slot, this one is refused, unless a waiting request of lower priority
    /// that has a limit too and was never admitted gives up its place (the one admitted last
    /// of the lowest priority): that one is refused instead. A refused request's stream ends
    /// with [`FinishReason::Error`] and a message starting with [`crate::QUEUE_FULL`]; see
    /// [`RequestStream::queued`]. None: it always queues.
    pub queue_limit: Option<usize>,
    /// Counts against the yield cap ([`crate::EngineHandle::set_yield_cap`]): past it, it is
    /// preempted (the latest admitted first; cache freed, requeued, output unchanged) and
    /// waits until the cap rises. It does not count against other requests' `queue_limit`. A
    /// server's batch lines yield.
    pub yields: bool,
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end token: its end-of-sequence token, or one of the request's
    /// `stop_token_ids` (not included in the output).
    Eos,
    /// A stop string appeared.
    Stop,
    /// max_tokens were generated.
    Length,
    /// The request was cancelled, or its stream was dropped.
    Cancelled,
    /// The engine could not run it (see the message).
    Error,
}

impl FinishReason {
    /// The lower-case name used in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (the end-of-sequence token not counted).
    pub completion_tokens: usize,
    /// Prompt tokens reused from the prefix cache when the request was first admitted.
    pub cached_tokens: usize,
    /// Times the request was preempted (its cache freed and recomputed later).
    pub preemptions: usize,
}

impl Usage {
    /// cached_tokens / prompt_tokens.
    pub fn prefix_hit_rate(&self) -> f64 {
        self.cached_tokens as f64 / self.prompt_tokens.max(1) as f64
    }
}

/// Wall-clock times of a finished request, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Timing {
    /// Submission to first admission.
    pub queue_ms: f64,
    /// Submission to the first output: the first token chosen (even an end-of-sequence), or
    /// the end of the prompt for a request that generates nothing (`max_tokens` 0); 0 when
    /// the request ended before either.
    pub ttft_ms: f64,
    /// Submission to the end.
    pub e2e_ms: f64,
}

/// The last event of every request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    /// Why it ended.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Times.
    pub timing: Timing,
    /// The generated text (cut before a matched stop string), when the engine has a
    /// detokenizer.
    pub text: Option<String>,
    /// What went wrong, for [`FinishReason::Error`].
    pub error: Option<String>,
    /// With [`FinishReason::Eos`]: the token that ended the request, the end-of-sequence token
    /// or one of `stop_token_ids` (not among the generated tokens nor counted in the usage).
    #[serde(default)]
    pub stop_token: Option<u32>,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// The token id.
    pub token: u32,
    /// Its index among the generated tokens.
    pub index: usize,
    /// The logits row it was chosen from (with `return_logits`).
    pub logits: Option<Vec<f32>>,
    /// Its log-probability and the top alternatives (with `logprobs`).
    pub logprob: Option<TokenLogprob>,
}

/// What a request's stream yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// With `prompt_logprobs`, once before the first token: entry `k` is the log-probability
    /// of prompt token `k + 1` given the tokens before it (the first token has none).
    Prompt(Vec<TokenLogprob>),
    /// A generated token.
    Token(TokenEvent),
    /// The end (always the last event).
    Finished(Finished),
}

/// A finished request, collected from its stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The request's id.
    pub id: RequestId,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// The logits rows of the tokens (with `return_logits`).
    pub logits: Vec<Vec<f32>>,
    /// The log-probabilities of the tokens (with `logprobs`).
    pub logprobs: Vec<TokenLogprob>,
    /// The log-probabilities of the prompt tokens after the first (with `prompt_logprobs`).
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// How it ended.
    pub finished: Finished,
}

/// The events of one submitted request; dropping it cancels the request.
#[derive(Debug)]
pub struct RequestStream {
    pub(crate) id: RequestId,
    pub(crate) rx: UnboundedReceiver<Event>,
    /// With a `queue_limit`: a message once the engine has queued the request; closed
    /// unsent when it refused it.
    pub(crate) queued: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl RequestStream {
    /// The request's id (for [`crate::EngineHandle::cancel`]).
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// A stream of `events` made elsewhere, not by an engine (the server replays a beam
    /// search's hypotheses through its usual output path with it). Its id names no engine
    /// request, so cancelling it does nothing.
    pub fn replay(events: Vec<Event>) -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for e in events {
            // The receiver is alive: it is returned below.
            let _ = tx.send(e);
        }
        Self {
            id: RequestId(u64::MAX),
            rx,
            queued: None,
        }
    }

    /// Whether the engine queued the request: true at once for one without a
    /// [`Request::queue_limit`]; for one with, once the engine has taken it. False: it was
    /// refused at a full queue (its stream holds the refusal), or the engine stopped.
    pub async fn queued(&mut self) -> bool {
        match self.queued.take() {
            None => true,
            Some(rx) => rx.await.is_ok(),
        }
    }

    /// [`Self::queued`], blocking the thread (not for use inside an async runtime).
    pub fn blocking_queued(&mut self) -> bool {
        match self.queued.take() {
            None => true,
            Some(rx) => rx.blocking_recv().is_ok(),
        }
    }

    /// The next event (None after the last one, or when the engine stopped).
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event, blocking the thread (not for use inside an async runtime).
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }

    /// Block until the request finishes and return everything it produced.
    pub fn collect_blocking(mut self) -> Completion {
        let mut c = Completion {
            id: self.id,
            tokens: Vec::new(),
            logits: Vec::new(),
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            finished: stopped(),
        };
        while let Some(ev) = self.blocking_next() {
            match ev {
                Event::Prompt(p) => c.prompt_logprobs = p,
                Event::Token(t) => {
                    c.tokens.push(t.token);
                    c.logits.extend(t.logits);
                    c.logprobs.extend(t.logprob);
                }
                Event::Finished(f) => {
                    c.finished = f;
                    break;
                }
            }
        }
        c
    }
}

/// The Finished of a request whose engine went away before it ended.
fn stopped() -> Finished {
    Finished {
        reason: FinishReason::Error,
        usage: Usage::default(),
        timing: Timing::default(),
        text: None,
        error: Some("the engine stopped before the request finished".into()),
        stop_token: None,
    }
}

//! A streamed chat completion: server-sent `chat.completion.chunk` events of all the request's
//! choices, interleaved as they are produced. Each chunk carries one choice with its `index`;
//! every choice gets its own role chunk first and its own `finish_reason` chunk; then (with
//! `include_usage`) one usage chunk with the totals, and `data: [DONE]` once at the end. With
//! `return_token_ids` the first chunk carries the prompt's ids and each later chunk its tokens'
//! ids; with `continuous_usage_stats` each chunk its choice's usage so far. With SGLang's
//! `stream_reasoning: false` a choice's reasoning is held back and sent as one chunk, with its
//! tokens' entries and ids, once the answer moves past it (or ends).

use super::EventSource;
use super::chat::{Meta, tool_call_body};
use crate::api::chat::{ChatChunk, ChunkChoice, DeltaBody, ToolCallDelta};
use crate::api::common::{StopReason, StreamUsage, UsageBody};
use crate::api::logprobs::ChatLogprobs;
use crate::output::Delta;
use crate::run::{GeneratedToken, Merged, Step, finish_reason};
use crate::state::{AppState, Loaded};
use crate::thinking_budget::{ReasoningCount, reasoning_total};
use axum::response::sse::Event as SseEvent;
use dsv4_chat::dsml::ToolCallPiece as Piece;
use dsv4_engine::Usage;
use futures_util::StreamExt;
use std::sync::Arc;

/// The state of a streamed answer.
pub struct ChatStream {
    state: AppState,
    loaded: Arc<Loaded>,
    runs: Merged,
    meta: Meta,
    usage: StreamUsage,
    started: bool,
    /// Per choice: the tool calls sent so far (the next call's `index`).
    calls: Vec<usize>,
    /// Per choice: its usage once it has finished.
    usages: Vec<Option<Usage>>,
    /// Per choice: its reasoning tokens so far.
    reasoning: Vec<ReasoningCount>,
    /// Per choice, with `stream_reasoning: false`: the reasoning held back so far.
    held: Vec<Held>,
    done: bool,
}

/// Reasoning held back (`stream_reasoning: false`) with the entries and ids of its tokens.
#[derive(Default)]
struct Held {
    text: String,
    logprobs: Vec<GeneratedToken>,
    ids: Vec<u32>,
}

/// What the chunks of one step share: the tokens consumed (each chunk takes what is left, so
/// the first carries them) and the choice's usage so far.
struct StepTokens {
    logprobs: Vec<GeneratedToken>,
    ids: Vec<u32>,
    usage: UsageBody,
}

impl ChatStream {
    /// Stream the `n` choices merged in `runs`.
    pub(super) fn new(
        state: AppState,
        loaded: Arc<Loaded>,
        runs: Merged,
        n: usize,
        meta: Meta,
        usage: StreamUsage,
    ) -> Self {
        let reasoning = (0..n)
            .map(|_| loaded.think_end.counter(meta.thinking))
            .collect();
        Self {
            state,
            loaded,
            runs,
            meta,
            usage,
            started: false,
            calls: vec![0; n],
            usages: vec![None; n],
            reasoning,
            held: (0..n).map(|_| Held::default()).collect(),
            done: false,
        }
    }

    /// A chunk of choice `index` with `delta`; with logprobs asked (or token ids), it carries
    /// the entries (ids) of the tokens in `step`, which it takes, so each is sent once.
    fn chunk(
        &self,
        index: usize,
        delta: DeltaBody,
        finish: Option<(&'static str, Option<StopReason>)>,
        step: &mut StepTokens,
    ) -> SseEvent {
        let logprobs = self.meta.logprobs.then(|| {
            ChatLogprobs::new(
                self.meta.names(&self.loaded),
                &std::mem::take(&mut step.logprobs),
            )
        });
        let token_ids = self
            .meta
            .prompt_ids
            .is_some()
            .then(|| std::mem::take(&mut step.ids));
        let usage = self.usage.every.then(|| step.usage.clone());
        self.event(
            vec![ChunkChoice {
                index,
                delta,
                finish_reason: finish.as_ref().map(|f| f.0),
                logprobs,
                stop_reason: finish.map(|f| f.1),
                token_ids,
            }],
            usage,
            None,
        )
    }

    fn event(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<UsageBody>,
        prompt_token_ids: Option<Vec<u32>>,
    ) -> SseEvent {
        let chunk = ChatChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices,
            usage: self.usage.last.then_some(usage),
            prompt_token_ids,
        };
        SseEvent::default().data(serde_json::to_string(&chunk).unwrap_or_default())
    }

    /// The chunk of delta `d` of choice `index` (none for a streamed call's checked end:
    /// its pieces were sent).
    fn delta(&mut self, index: usize, d: Delta, step: &mut StepTokens) -> Option<SseEvent> {
        let calls = |c: ToolCallDelta| DeltaBody {
            tool_calls: Some(vec![c]),
            ..Default::default()
        };
        let body = match d {
            Delta::Content(c) => DeltaBody {
                content: Some(c),
                ..Default::default()
            },
            Delta::Reasoning(r) => DeltaBody {
                reasoning_content: Some(r),
                ..Default::default()
            },
            // Streamed: its start and pieces were sent.
            Delta::ToolCall(c) if c.index < self.calls[index] => return None,
            Delta::ToolCall(c) => {
                self.calls[index] += 1;
                let body = tool_call_body(&self.state, c.name, c.arguments);
                calls(ToolCallDelta::first(c.index, body))
            }
            Delta::ToolCallPiece(Piece::Start { index: call, name }) => {
                self.calls[index] += 1;
                let body = tool_call_body(&self.state, name, String::new());
                calls(ToolCallDelta::first(call, body))
            }
            Delta::ToolCallPiece(Piece::Arguments { index: call, text }) => {
                calls(ToolCallDelta::more(call, text))
            }
        };
        Some(self.chunk(index, body, None, step))
    }

    /// Send choice `index`'s held reasoning, if any, as one chunk; the held tokens go before
    /// `step`'s, so the next chunk carries them either way.
    fn release(&mut self, index: usize, step: &mut StepTokens, out: &mut Vec<SseEvent>) {
        let Held {
            text,
            mut logprobs,
            mut ids,
        } = std::mem::take(&mut self.held[index]);
        logprobs.append(&mut step.logprobs);
        ids.append(&mut step.ids);
        (step.logprobs, step.ids) = (logprobs, ids);
        if !text.is_empty() {
            out.extend(self.delta(index, Delta::Reasoning(text), step));
        }
    }

    /// The first chunk of every choice: its role (the stream's first chunk carries the
    /// prompt's ids, with `return_token_ids`).
    fn role_chunks(&self) -> Vec<SseEvent> {
        (0..self.calls.len())
            .map(|index| {
                let role = DeltaBody {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Default::default()
                };
                let usage = self
                    .usage
                    .every
                    .then(|| UsageBody::so_far(self.meta.prompt_tokens, 0));
                let prompt_ids = self.meta.prompt_ids.clone().filter(|_| index == 0);
                self.event(
                    vec![ChunkChoice {
                        index,
                        delta: role,
                        finish_reason: None,
                        logprobs: None,
                        stop_reason: None,
                        token_ids: None,
                    }],
                    usage,
                    prompt_ids,
                )
            })
            .collect()
    }

    /// After the last choice: the usage chunk (with `include_usage`) and `[DONE]`.
    fn end(&mut self) -> Vec<SseEvent> {
        self.done = true;
        let mut out = Vec::new();
        if self.usage.last {
            let usages: Vec<Usage> = self.usages.iter().flatten().copied().collect();
            let reasoning = reasoning_total(
                self.reasoning
                    .iter()
                    .zip(&self.usages)
                    .map(|(r, u)| (r, u.map_or(0, |u| u.completion_tokens))),
            );
            let total = UsageBody::total(&usages).with_reasoning(reasoning);
            out.push(self.event(Vec::new(), Some(total), None));
        }
        out.push(SseEvent::default().data("[DONE]"));
        out
    }
}

impl EventSource for ChatStream {
    async fn next_events(&mut self) -> Vec<SseEvent> {
        if self.done {
            return Vec::new();
        }
        if !self.started {
            self.started = true;
            return self.role_chunks();
        }
        let Some((index, step)) = self.runs.next().await else {
            return self.end();
        };
        let mut out = Vec::new();
        match step {
            Ok(Step {
                deltas,
                logprobs,
                token_ids,
                generated,
                stop_reason,
                finished,
                ..
            }) => {
                let usage = match &finished {
                    Some(f) => UsageBody::from(f.usage),
                    None => UsageBody::so_far(self.meta.prompt_tokens, generated),
                };
                self.reasoning[index].push(&token_ids);
                let mut step = StepTokens {
                    logprobs,
                    ids: token_ids,
                    usage,
                };
                let hold = !self.meta.stream_reasoning;
                for d in deltas {
                    match d {
                        Delta::Reasoning(r) if hold => self.held[index].text.push_str(&r),
                        d => {
                            if hold {
                                self.release(index, &mut step, &mut out);
                            }
                            out.extend(self.delta(index, d, &mut step));
                        }
                    }
                }
                if hold && finished.is_some() {
                    self.release(index, &mut step, &mut out);
                } else if hold {
                    // Tokens no chunk took (their text is held): carried to the release.
                    let held = &mut self.held[index];
                    held.logprobs.append(&mut step.logprobs);
                    held.ids.append(&mut step.ids);
                }
                if let Some(f) = finished {
                    self.usages[index] = Some(f.usage);
                    let reason = finish_reason(f.reason, self.calls[index] > 0);
                    let finish = Some((reason, stop_reason));
                    out.push(self.chunk(index, DeltaBody::default(), finish, &mut step));
                }
            }
            Err(e) => {
                out.push(super::error_event(&e));
                out.push(SseEvent::default().data("[DONE]"));
                self.done = true;
            }
        }
        out
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

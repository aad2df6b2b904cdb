//! A streamed chat completion: server-sent `chat.completion.chunk` events of all the request's
//! choices, interleaved as they are produced. Each chunk carries one choice with its `index`;
//! every choice gets its own role chunk first and its own `finish_reason` chunk; then (with
//! `include_usage`) one usage chunk with the totals, and `data: [DONE]` once at the end.

use super::EventSource;
use super::chat::{Meta, tool_call_body};
use crate::api::chat::{ChatChunk, ChunkChoice, DeltaBody};
use crate::api::common::UsageBody;
use crate::api::logprobs::ChatLogprobs;
use crate::output::Delta;
use crate::run::{GeneratedToken, Merged, Step, finish_reason};
use crate::state::{AppState, Loaded};
use axum::response::sse::Event as SseEvent;
use dsv4_engine::Usage;
use futures_util::StreamExt;
use std::sync::Arc;

/// The state of a streamed answer.
pub struct ChatStream {
    state: AppState,
    loaded: Arc<Loaded>,
    runs: Merged,
    meta: Meta,
    include_usage: bool,
    started: bool,
    /// Per choice: the tool calls sent so far (the next call's `index`).
    calls: Vec<usize>,
    /// Per choice: its usage once it has finished.
    usages: Vec<Option<Usage>>,
    done: bool,
}

impl ChatStream {
    /// Stream the `n` choices merged in `runs`.
    pub(super) fn new(
        state: AppState,
        loaded: Arc<Loaded>,
        runs: Merged,
        n: usize,
        meta: Meta,
        include_usage: bool,
    ) -> Self {
        Self {
            state,
            loaded,
            runs,
            meta,
            include_usage,
            started: false,
            calls: vec![0; n],
            usages: vec![None; n],
            done: false,
        }
    }

    /// A chunk of choice `index` with `delta`; with logprobs asked, it carries the entries of
    /// `tokens` (which it takes, so each token's entry is sent once).
    fn chunk(
        &self,
        index: usize,
        delta: DeltaBody,
        finish: Option<&'static str>,
        tokens: &mut Vec<GeneratedToken>,
    ) -> SseEvent {
        let logprobs = self
            .meta
            .logprobs
            .then(|| ChatLogprobs::new(&self.loaded.vocab, &std::mem::take(tokens)));
        self.event(
            vec![ChunkChoice {
                index,
                delta,
                finish_reason: finish,
                logprobs,
            }],
            None,
        )
    }

    fn event(&self, choices: Vec<ChunkChoice>, usage: Option<UsageBody>) -> SseEvent {
        let chunk = ChatChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices,
            usage: self.include_usage.then_some(usage),
        };
        SseEvent::default().data(serde_json::to_string(&chunk).unwrap_or_default())
    }

    /// The chunk of delta `d` of choice `index`.
    fn delta(&mut self, index: usize, d: Delta, tokens: &mut Vec<GeneratedToken>) -> SseEvent {
        let body = match d {
            Delta::Content(c) => DeltaBody {
                content: Some(c),
                ..Default::default()
            },
            Delta::Reasoning(r) => DeltaBody {
                reasoning_content: Some(r),
                ..Default::default()
            },
            Delta::ToolCall(c) => {
                let call = self.calls[index];
                self.calls[index] += 1;
                DeltaBody {
                    tool_calls: Some(vec![tool_call_body(&self.state, c, Some(call))]),
                    ..Default::default()
                }
            }
        };
        self.chunk(index, body, None, tokens)
    }

    /// The first chunk of every choice: its role.
    fn role_chunks(&self) -> Vec<SseEvent> {
        (0..self.calls.len())
            .map(|index| {
                let role = DeltaBody {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Default::default()
                };
                self.event(
                    vec![ChunkChoice {
                        index,
                        delta: role,
                        finish_reason: None,
                        logprobs: None,
                    }],
                    None,
                )
            })
            .collect()
    }

    /// After the last choice: the usage chunk (with `include_usage`) and `[DONE]`.
    fn end(&mut self) -> Vec<SseEvent> {
        self.done = true;
        let mut out = Vec::new();
        if self.include_usage {
            let usages: Vec<Usage> = self.usages.iter().flatten().copied().collect();
            out.push(self.event(Vec::new(), Some(UsageBody::total(&usages))));
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
                logprobs: mut tokens,
                finished,
                ..
            }) => {
                for d in deltas {
                    out.push(self.delta(index, d, &mut tokens));
                }
                if let Some(f) = finished {
                    self.usages[index] = Some(f.usage);
                    let reason = finish_reason(f.reason, self.calls[index] > 0);
                    out.push(self.chunk(index, DeltaBody::default(), Some(reason), &mut tokens));
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

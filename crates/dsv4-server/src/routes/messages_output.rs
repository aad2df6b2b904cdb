//! A Messages API answer as it is produced: [`MessageOutput`] turns the run's steps into
//! content blocks (`thinking`, `text`, `tool_use`, in the order the model wrote them) and the
//! Messages API's stream events: `message_start`, per block `content_block_start`, its
//! `text_delta` / `thinking_delta` / `input_json_delta` deltas (a thinking block ends with a
//! `signature_delta`: empty, as DSV4 signs nothing, or under `display: "omitted"` the
//! signature that holds the block's reasoning, which no `thinking_delta` showed; see
//! [`crate::api::signature`]) and `content_block_stop`, then
//! `message_delta` (stop reason and usage) and `message_stop`. A non-streamed request runs the
//! same machine and answers the final message object.
//!
//! Usage follows Anthropic's definitions: `input_tokens` are the prompt tokens not read from
//! the prefix cache, `cache_read_input_tokens` those that were (`message_start` reports the
//! whole prompt as input: the cache hit is known when the request ends, and `message_delta`
//! carries the final split).

use super::{EventSource, typed_events};
use crate::api::common::{StopReason, random_hex};
use crate::api::signature;
use crate::error::ApiError;
use crate::output::Delta;
use crate::run::{Run, Step};
use crate::state::AppState;
use axum::response::sse::Event as SseEvent;
use dsv4_chat::ToolCall;
use dsv4_chat::dsml::ToolCallPiece as Piece;
use dsv4_engine::{FinishReason, Finished};
use serde_json::{Value, json};

/// One event: its type and its body (which repeats the type).
type Ev = (&'static str, Value);

/// The kind of the block that may still grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
}

/// The answer to one Messages request as its steps arrive.
pub(super) struct MessageOutput {
    state: AppState,
    id: String,
    model: String,
    prompt_tokens: usize,
    blocks: Vec<Value>,
    open: Option<Open>,
    calls: bool,
    /// The block of the tool call whose input is streaming, until the checked call ends it.
    streaming_call: Option<usize>,
    /// The stop string that ended the answer, once it has.
    stop_sequence: Option<String>,
    /// Thinking text is left out of blocks and deltas; `reasoning` keeps the open block's.
    omit: bool,
    reasoning: String,
}

impl MessageOutput {
    /// The output of message `id` answering a prompt of `prompt_tokens` tokens.
    pub(super) fn new(state: AppState, id: String, model: String, prompt_tokens: usize) -> Self {
        Self {
            state,
            id,
            model,
            prompt_tokens,
            blocks: Vec::new(),
            open: None,
            calls: false,
            streaming_call: None,
            stop_sequence: None,
            omit: false,
            reasoning: String::new(),
        }
    }

    /// The same output with thinking text left out (`thinking.display: "omitted"`).
    pub(super) fn omitting_thinking(self, omit: bool) -> Self {
        Self { omit, ..self }
    }

    fn emit(kind: &'static str, body: Value) -> Ev {
        let mut body = body;
        if let Value::Object(o) = &mut body {
            o.insert("type".into(), json!(kind));
        }
        (kind, body)
    }

    /// The message object with the blocks so far.
    fn message(&self, stop_reason: Option<&str>, usage: Value) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.blocks,
            "stop_reason": stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": usage,
        })
    }

    /// The first event: the message, empty.
    pub(super) fn start(&self) -> Vec<Ev> {
        let usage = json!({"input_tokens": self.prompt_tokens, "output_tokens": 0,
                           "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0});
        vec![Self::emit(
            "message_start",
            json!({"message": self.message(None, usage)}),
        )]
    }

    /// The events of one step.
    pub(super) fn step(&mut self, step: Step) -> Vec<Ev> {
        if let Some(StopReason::Text(s)) = step.stop_reason {
            self.stop_sequence = Some(s);
        }
        let mut out = Vec::new();
        for d in step.deltas {
            match d {
                Delta::Reasoning(t) => out.extend(self.text(Open::Thinking, t)),
                Delta::Content(t) => out.extend(self.text(Open::Text, t)),
                Delta::ToolCall(call) => out.extend(self.call(call)),
                Delta::ToolCallPiece(Piece::Start { name, .. }) => {
                    out.extend(self.start_call(name))
                }
                Delta::ToolCallPiece(Piece::Arguments { text, .. }) => {
                    out.extend(self.more_input(text))
                }
            }
        }
        out
    }

    /// More text of a text or thinking block (a new block when the open one is the other
    /// kind).
    fn text(&mut self, kind: Open, text: String) -> Vec<Ev> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.open != Some(kind) {
            out.extend(self.close());
            let block = match kind {
                Open::Text => json!({"type": "text", "text": ""}),
                Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            };
            out.push(Self::emit(
                "content_block_start",
                json!({"index": self.blocks.len(), "content_block": block}),
            ));
            self.blocks.push(block);
            self.open = Some(kind);
        }
        let index = self.blocks.len() - 1;
        if kind == Open::Thinking && self.omit {
            self.reasoning.push_str(&text);
            return out;
        }
        let (field, delta) = match kind {
            Open::Text => ("text", "text_delta"),
            Open::Thinking => ("thinking", "thinking_delta"),
        };
        if let Some(Value::String(s)) = self.blocks[index].get_mut(field) {
            s.push_str(&text);
        }
        out.push(Self::emit(
            "content_block_delta",
            json!({"index": index, "delta": {"type": delta, field: text}}),
        ));
        out
    }

    /// Close the open text or thinking block, if any.
    fn close(&mut self) -> Vec<Ev> {
        let Some(kind) = self.open.take() else {
            return Vec::new();
        };
        let index = self.blocks.len() - 1;
        let mut out = Vec::new();
        if kind == Open::Thinking {
            let reasoning = std::mem::take(&mut self.reasoning);
            let sig = if self.omit {
                signature::sign(&reasoning)
            } else {
                String::new()
            };
            self.blocks[index]["signature"] = json!(sig);
            out.push(Self::emit(
                "content_block_delta",
                json!({"index": index, "delta": {"type": "signature_delta", "signature": sig}}),
            ));
        }
        out.push(Self::emit("content_block_stop", json!({"index": index})));
        out
    }

    /// A tool call of `name` starts: its `tool_use` block opens (its input comes in pieces).
    fn start_call(&mut self, name: String) -> Vec<Ev> {
        let mut out = self.close();
        let id = format!("toolu_{}", random_hex(self.state.next_serial()));
        let index = self.blocks.len();
        let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
        out.push(Self::emit(
            "content_block_start",
            json!({"index": index, "content_block": block}),
        ));
        self.blocks.push(block);
        self.streaming_call = Some(index);
        self.calls = true;
        out
    }

    /// More of the open tool call's input JSON.
    fn more_input(&mut self, partial: String) -> Vec<Ev> {
        let Some(index) = self.streaming_call else {
            return Vec::new();
        };
        vec![Self::emit(
            "content_block_delta",
            json!({"index": index, "delta":
                   {"type": "input_json_delta", "partial_json": partial}}),
        )]
    }

    /// A checked tool call: the end of the one whose input streamed, or a whole call whose
    /// block opens, gets its input in one delta and closes.
    fn call(&mut self, call: ToolCall) -> Vec<Ev> {
        let mut out = Vec::new();
        if self.streaming_call.is_none() {
            out.extend(self.start_call(call.name.clone()));
            out.extend(self.more_input(call.arguments.clone()));
        }
        let Some(index) = self.streaming_call.take() else {
            return out;
        };
        // The parser checked the arguments: a JSON object.
        let input: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
        self.blocks[index]["input"] = input;
        out.push(Self::emit("content_block_stop", json!({"index": index})));
        out
    }

    /// Anthropic's stop reason for how the run ended, with chat's precedence: tool calls
    /// first (the client must answer them), then the token limit, then a stop string. An
    /// answer aborted through `/abort_request` ends `end_turn`: the Messages API has no
    /// reason for it.
    fn stop_reason(&self, f: &Finished) -> &'static str {
        match f.reason {
            FinishReason::Cancelled => "end_turn",
            _ if self.calls => "tool_use",
            FinishReason::Length => "max_tokens",
            _ if self.stop_sequence.is_some() => "stop_sequence",
            _ => "end_turn",
        }
    }

    /// The last events once the run finished, and the final message object.
    pub(super) fn finish(&mut self, f: &Finished) -> (Vec<Ev>, Value) {
        let mut out = self.close();
        let stop_reason = self.stop_reason(f);
        if stop_reason != "stop_sequence" {
            self.stop_sequence = None;
        }
        let cached = f.usage.cached_tokens.min(f.usage.prompt_tokens);
        let usage = json!({
            "input_tokens": f.usage.prompt_tokens - cached,
            "output_tokens": f.usage.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        });
        out.push(Self::emit(
            "message_delta",
            json!({"delta": {"stop_reason": stop_reason, "stop_sequence": self.stop_sequence},
                   "usage": usage}),
        ));
        out.push(Self::emit("message_stop", json!({})));
        (out, self.message(Some(stop_reason), usage))
    }

    /// Run to the end and answer the message object (an error fails the request).
    pub(super) async fn run_to_end(mut self, mut run: Run) -> Result<Value, ApiError> {
        loop {
            let mut step = run.next().await?;
            let finished = step.finished.take();
            self.step(step);
            if let Some(f) = finished {
                return Ok(self.finish(&f).1);
            }
        }
    }

    /// Stream the message's events.
    pub(super) fn stream(self, run: Run) -> MessageStream {
        MessageStream {
            output: self,
            run,
            started: false,
            done: false,
        }
    }
}

/// A streamed message.
pub(super) struct MessageStream {
    output: MessageOutput,
    run: Run,
    started: bool,
    done: bool,
}

/// Anthropic's `error` event of an error after the stream started.
pub(super) fn error_event(e: &ApiError) -> SseEvent {
    e.log();
    let body = super::messages::error_body(e);
    SseEvent::default().event("error").data(body.to_string())
}

impl EventSource for MessageStream {
    async fn next_events(&mut self) -> Vec<SseEvent> {
        if self.done {
            return Vec::new();
        }
        if !self.started {
            self.started = true;
            return typed_events(self.output.start());
        }
        match self.run.next().await {
            Ok(mut step) => {
                let finished = step.finished.take();
                let mut events = self.output.step(step);
                if let Some(f) = finished {
                    events.extend(self.output.finish(&f).0);
                    self.done = true;
                }
                typed_events(events)
            }
            Err(e) => {
                self.done = true;
                vec![error_event(&e)]
            }
        }
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

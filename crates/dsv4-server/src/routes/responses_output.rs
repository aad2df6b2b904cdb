//! A response as it is produced: [`ResponseOutput`] turns the run's steps into output items
//! (reasoning, message, function calls, in the order the model wrote them) and the Responses
//! API's typed stream events: `response.created`, `response.in_progress`, per item
//! `output_item.added`, its content part, text or argument deltas and `*.done` events, then
//! `response.completed` (or `incomplete` at the token limit, `cancelled` when aborted,
//! `failed` on an error). A non-streamed request runs the same machine and answers the final
//! response object. A finished response is stored (`store`) with its conversation. A
//! background response runs the same machine in its own task
//! ([`super::responses_background`]), recording its events as they are made.

use super::responses_envelope::{End, Envelope};
use super::{EventSource, typed_events};
use crate::api::common::random_hex;
use crate::api::logprobs::{ChatLogprobs, ChatTokenLogprob, TokenNames};
use crate::api::responses::{ContentPart, OutputItem, ResponseUsage};
use crate::api::responses_input::ChatMessages;
use crate::error::ApiError;
use crate::output::Delta;
use crate::responses_background::Background;
use crate::responses_store::{Stored, assistant_turn};
use crate::run::{Run, Step};
use crate::state::{AppState, Loaded};
use crate::thinking_budget::ReasoningCount;
use axum::response::sse::Event as SseEvent;
use dsv4_chat::dsml::ToolCallPiece as Piece;
use dsv4_engine::{FinishReason, Finished};
use serde_json::{Value, json};
use std::sync::Arc;

/// What a stored response keeps besides itself.
pub(super) struct ToStore {
    /// The response it continued.
    pub(super) previous: Option<Arc<Stored>>,
    /// Its input as chat messages.
    pub(super) turn: ChatMessages,
    /// Its input items, with ids.
    pub(super) input_items: Arc<Vec<Value>>,
}

/// One event: its type and its body.
type Ev = (&'static str, Value);

/// The output of one response as its steps arrive.
pub(super) struct ResponseOutput {
    state: AppState,
    loaded: Arc<Loaded>,
    env: Envelope,
    /// The message's text carries log-probabilities.
    logprobs: bool,
    /// Counts the reasoning tokens (in thinking mode).
    reasoning: ReasoningCount,
    items: Vec<OutputItem>,
    /// The last item (reasoning or message) may still grow.
    open: bool,
    seq: u64,
    /// A background response: where its events are recorded.
    background: Option<Arc<Background>>,
    /// Items closed so far.
    closed: usize,
    /// The function call item whose arguments are streaming, until the checked call ends it.
    streaming_call: Option<usize>,
}

impl ResponseOutput {
    /// The output of the response `env` describes.
    pub(super) fn new(
        state: AppState,
        loaded: Arc<Loaded>,
        env: Envelope,
        logprobs: bool,
        reasoning: ReasoningCount,
    ) -> Self {
        Self {
            state,
            loaded,
            env,
            logprobs,
            reasoning,
            items: Vec::new(),
            open: false,
            seq: 0,
            background: None,
            closed: 0,
            streaming_call: None,
        }
    }

    /// The same output recording its events in `bg` (a background response).
    pub(super) fn in_background(mut self, bg: Arc<Background>) -> Self {
        self.background = Some(bg);
        self
    }

    /// The response object as of now, in `status`, with the items so far.
    pub(super) fn snapshot(&self, status: &str) -> Value {
        self.env.response(status, &self.items, None)
    }

    /// How many items closed so far.
    pub(super) fn closed(&self) -> usize {
        self.closed
    }

    fn emit(&mut self, kind: &'static str, body: Value) -> Ev {
        let mut body = body;
        if let Value::Object(o) = &mut body {
            o.insert("type".into(), json!(kind));
            o.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        if let Some(bg) = &self.background {
            bg.record(kind, &body);
        }
        (kind, body)
    }

    fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}", random_hex(self.state.next_serial()))
    }

    /// The first events: the response created (queued, in the background) and in progress.
    pub(super) fn start(&mut self) -> Vec<Ev> {
        let created = if self.background.is_some() {
            "queued"
        } else {
            "in_progress"
        };
        let created = self.env.response(created, &[], None);
        let r = self.env.response("in_progress", &[], None);
        vec![
            self.emit("response.created", json!({"response": created})),
            self.emit("response.in_progress", json!({"response": r})),
        ]
    }

    /// The events of one step.
    pub(super) fn step(&mut self, step: Step) -> Vec<Ev> {
        self.reasoning.push(&step.token_ids);
        let mut logprobs = self.logprobs.then(|| {
            let names = TokenNames::text(&self.loaded.vocab);
            ChatLogprobs::new(names, &step.logprobs).content
        });
        let mut out = Vec::new();
        for d in step.deltas {
            match d {
                Delta::Reasoning(text) => out.extend(self.text(false, text, None)),
                Delta::Content(text) => {
                    let lp = logprobs.take();
                    out.extend(self.text(true, text, lp));
                }
                Delta::ToolCall(call) => out.extend(self.call(call)),
                Delta::ToolCallPiece(Piece::Start { name, .. }) => {
                    out.extend(self.start_call(name))
                }
                Delta::ToolCallPiece(Piece::Arguments { text, .. }) => {
                    out.extend(self.more_arguments(text))
                }
            }
        }
        out
    }

    /// More text of the message (`message`) or of the reasoning.
    fn text(
        &mut self,
        message: bool,
        text: String,
        logprobs: Option<Vec<ChatTokenLogprob>>,
    ) -> Vec<Ev> {
        let mut out = Vec::new();
        let same = self.open
            && matches!(
                (self.items.last(), message),
                (Some(OutputItem::Message { .. }), true)
                    | (Some(OutputItem::Reasoning { .. }), false)
            );
        if !same {
            out.extend(self.close("completed"));
            out.extend(self.open_item(message));
        }
        let index = self.items.len() - 1;
        let item_id = self.items[index].id().to_string();
        match self.items.last_mut() {
            Some(OutputItem::Message { content, .. }) => {
                if let Some(ContentPart::OutputText {
                    text: t,
                    logprobs: all,
                    ..
                }) = content.first_mut()
                {
                    t.push_str(&text);
                    if let (Some(all), Some(lp)) = (all.as_mut(), &logprobs) {
                        all.extend(lp.iter().cloned());
                    }
                }
                let body = json!({"item_id": item_id, "output_index": index, "content_index": 0,
                                  "delta": text, "logprobs": logprobs.unwrap_or_default()});
                out.push(self.emit("response.output_text.delta", body));
            }
            Some(OutputItem::Reasoning { content, .. }) => {
                if let Some(ContentPart::ReasoningText { text: t }) = content.first_mut() {
                    t.push_str(&text);
                }
                let body = json!({"item_id": item_id, "output_index": index, "content_index": 0,
                                  "delta": text});
                out.push(self.emit("response.reasoning_text.delta", body));
            }
            _ => {}
        }
        out
    }

    /// Start a message (`message`) or a reasoning item, with its empty content part.
    fn open_item(&mut self, message: bool) -> Vec<Ev> {
        let (item, part) = if message {
            let part = ContentPart::OutputText {
                text: String::new(),
                annotations: Vec::new(),
                logprobs: self.logprobs.then(Vec::new),
            };
            let item = OutputItem::Message {
                id: self.new_id("msg"),
                status: "in_progress",
                role: "assistant",
                content: Vec::new(),
            };
            (item, part)
        } else {
            let item = OutputItem::Reasoning {
                id: self.new_id("rs"),
                summary: Vec::new(),
                content: Vec::new(),
                status: "in_progress",
            };
            (
                item,
                ContentPart::ReasoningText {
                    text: String::new(),
                },
            )
        };
        let index = self.items.len();
        let item_id = item.id().to_string();
        let added = json!({"output_index": index, "item": item});
        let part_added =
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part});
        let mut item = item;
        if let OutputItem::Message { content, .. } | OutputItem::Reasoning { content, .. } =
            &mut item
        {
            content.push(part);
        }
        self.items.push(item);
        self.open = true;
        vec![
            self.emit("response.output_item.added", added),
            self.emit("response.content_part.added", part_added),
        ]
    }

    /// Close the open item, if any, with `status`.
    fn close(&mut self, status: &'static str) -> Vec<Ev> {
        if !self.open {
            return Vec::new();
        }
        self.open = false;
        let index = self.items.len() - 1;
        let mut out = Vec::new();
        let (done, part) = match self.items.last_mut() {
            Some(OutputItem::Message {
                id,
                status: s,
                content,
                ..
            }) => {
                *s = status;
                let part = content.first().cloned();
                let (text, logprobs) = match &part {
                    Some(ContentPart::OutputText { text, logprobs, .. }) => {
                        (text.clone(), logprobs.clone().unwrap_or_default())
                    }
                    _ => Default::default(),
                };
                let done = json!({"item_id": id, "output_index": index, "content_index": 0,
                                  "text": text, "logprobs": logprobs});
                (("response.output_text.done", done), part)
            }
            Some(OutputItem::Reasoning {
                id,
                status: s,
                content,
                ..
            }) => {
                *s = "completed";
                let part = content.first().cloned();
                let text = match &part {
                    Some(ContentPart::ReasoningText { text }) => text.clone(),
                    _ => String::new(),
                };
                let done = json!({"item_id": id, "output_index": index, "content_index": 0,
                                  "text": text});
                (("response.reasoning_text.done", done), part)
            }
            _ => return out,
        };
        let item = self.items[index].clone();
        self.closed += 1;
        out.push(self.emit(done.0, done.1));
        let part_done = json!({"item_id": item.id(), "output_index": index, "content_index": 0,
                               "part": part});
        out.push(self.emit("response.content_part.done", part_done));
        out.push(self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        out
    }

    /// A function call of `name` starts: its item, in progress (its arguments come in pieces).
    fn start_call(&mut self, name: String) -> Vec<Ev> {
        let mut out = self.close("completed");
        let index = self.items.len();
        let item = OutputItem::FunctionCall {
            id: self.new_id("fc"),
            call_id: self.new_id("call"),
            name,
            arguments: String::new(),
            status: "in_progress",
        };
        out.push(self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        self.items.push(item);
        self.streaming_call = Some(index);
        out
    }

    /// More of the streaming call's arguments.
    fn more_arguments(&mut self, piece: String) -> Vec<Ev> {
        let Some(index) = self.streaming_call else {
            return Vec::new();
        };
        let Some(OutputItem::FunctionCall { id, arguments, .. }) = self.items.get_mut(index) else {
            return Vec::new();
        };
        arguments.push_str(&piece);
        let delta = json!({"item_id": id, "output_index": index, "delta": piece});
        vec![self.emit("response.function_call_arguments.delta", delta)]
    }

    /// A checked tool call: the end of the one whose arguments streamed, or a whole call
    /// (its item, its arguments at once, and its end).
    fn call(&mut self, call: dsv4_chat::ToolCall) -> Vec<Ev> {
        let mut out = Vec::new();
        if self.streaming_call.is_none() {
            out.extend(self.start_call(call.name.clone()));
            out.extend(self.more_arguments(call.arguments.clone()));
        }
        let Some(index) = self.streaming_call.take() else {
            return out;
        };
        let Some(OutputItem::FunctionCall {
            id,
            name,
            arguments,
            status,
            ..
        }) = self.items.get_mut(index)
        else {
            return out;
        };
        *arguments = call.arguments;
        *status = "completed";
        let done = json!({"item_id": id, "output_index": index, "name": name,
                          "arguments": arguments});
        let item = self.items[index].clone();
        self.closed += 1;
        out.push(self.emit("response.function_call_arguments.done", done));
        out.push(self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        out
    }

    /// The last events once the run finished, and the final response object, stored first
    /// when `stored` says so (so its `store` is false when it could not be kept).
    pub(super) fn finish(&mut self, f: &Finished, stored: Option<ToStore>) -> (Vec<Ev>, Value) {
        let (status, incomplete) = match f.reason {
            FinishReason::Length => ("incomplete", Some("max_output_tokens")),
            FinishReason::Cancelled => ("cancelled", None),
            _ => ("completed", None),
        };
        let item_status = if status == "completed" {
            "completed"
        } else {
            "incomplete"
        };
        let mut out = Vec::new();
        let answered = self.items.iter().any(|i| {
            matches!(
                i,
                OutputItem::Message { .. } | OutputItem::FunctionCall { .. }
            )
        });
        if !answered {
            // An answer with no text and no call still has its (empty) message.
            out.extend(self.close("completed"));
            out.extend(self.open_item(true));
        }
        out.extend(self.close(item_status));
        let reasoning = self
            .reasoning
            .tokens(f.usage.completion_tokens)
            .unwrap_or(0);
        let end = End {
            usage: Some(ResponseUsage::new(f.usage, reasoning)),
            incomplete,
            error: None,
        };
        let mut response = self.env.response(status, &self.items, Some(&end));
        self.store(&mut response, stored);
        // An aborted response ends as one that did not complete (the stream events have no
        // `response.cancelled`); its status says `cancelled`.
        let kind = match status {
            "completed" => "response.completed",
            _ => "response.incomplete",
        };
        out.push(self.emit(kind, json!({"response": response.clone()})));
        (out, response)
    }

    /// The `response.failed` event of an error after the stream started (its `error` has
    /// OpenAI's `code` and `message`, and the error `type` chat's error objects carry), and the
    /// failed response, stored first when `stored` says so (background responses: polling
    /// must see how they ended).
    pub(super) fn failed(&mut self, e: &ApiError, stored: Option<ToStore>) -> (Ev, Value) {
        let code = e.code.clone().unwrap_or_else(|| "server_error".into());
        let end = End {
            usage: None,
            incomplete: None,
            error: Some(json!({"code": code, "message": e.message, "type": e.kind})),
        };
        let mut response = self.env.response("failed", &self.items, Some(&end));
        self.store(&mut response, stored);
        let ev = self.emit("response.failed", json!({"response": response.clone()}));
        (ev, response)
    }

    /// Keep the finished response (`stored`: what it continued and its input turn); one bigger
    /// than the store's byte budget is not kept and says `"store": false`.
    fn store(&self, response: &mut Value, stored: Option<ToStore>) {
        let Some(ToStore {
            previous,
            mut turn,
            input_items,
        }) = stored
        else {
            return;
        };
        turn.push(assistant_turn(&self.items), "previous_response_id");
        let stored = Stored {
            response: response.clone(),
            previous,
            turn,
            input_items,
            events: self.background.clone().filter(|bg| bg.keeps_events()),
            file: None,
        };
        if !self.state.responses().insert(self.env.id.clone(), stored) {
            tracing::warn!(
                id = %self.env.id,
                "the response is larger than server.responses_store_mib; it is not stored"
            );
            response["store"] = json!(false);
        }
    }

    /// Run to the end and answer the response object (an error fails the request).
    pub(super) async fn run_to_end(
        mut self,
        mut run: Run,
        stored: Option<ToStore>,
    ) -> Result<Value, ApiError> {
        loop {
            let mut step = run.next().await?;
            let finished = step.finished.take();
            self.step(step);
            if let Some(f) = finished {
                let (_, response) = self.finish(&f, stored);
                return Ok(response);
            }
        }
    }

    /// Stream the response's events.
    pub(super) fn stream(self, run: Run, stored: Option<ToStore>) -> ResponseStream {
        ResponseStream {
            output: self,
            run,
            stored,
            started: false,
            done: false,
        }
    }
}

/// A streamed response.
pub(super) struct ResponseStream {
    output: ResponseOutput,
    run: Run,
    stored: Option<ToStore>,
    started: bool,
    done: bool,
}

impl EventSource for ResponseStream {
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
                    let (end, _) = self.output.finish(&f, self.stored.take());
                    events.extend(end);
                    self.done = true;
                }
                typed_events(events)
            }
            Err(e) => {
                self.done = true;
                typed_events(vec![self.output.failed(&e, None).0])
            }
        }
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

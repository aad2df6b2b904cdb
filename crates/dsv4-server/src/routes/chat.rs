//! `POST /v1/chat/completions`: check the request, encode the DSV4 prompt (tools in the system
//! prompt, thinking or chat mode), build the grammar constraint for `tool_choice`
//! required/named or `response_format`, run it, and answer one JSON object or a stream of
//! server-sent `chat.completion.chunk` events. The answer is parsed by the request's own strict
//! DSML parser; an answer that breaks the grammar is an error, never content.

use super::{body_bytes, check_model, json_response, sse_response};
use crate::api::chat::{
    AssistantBody, ChatChunk, ChatCompletion, ChatRequest, ChoiceBody, ChunkChoice, DeltaBody,
    FunctionBody, ResponseFormat, ToolCallBody, ToolChoice,
};
use crate::api::common::{check_n, parse_body, random_hex, stop_strings, unix_now, unsupported};
use crate::api::logprobs::ChatLogprobs;
use crate::api::sampling::check_fit;
use crate::error::ApiError;
use crate::grammar::Target;
use crate::output::{Delta, OutputDecoder};
use crate::run::{GeneratedToken, Run, Step, finish_reason, fit_max_tokens};
use crate::state::{AppState, Loaded};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use axum::response::sse::Event as SseEvent;
use dsv4_chat::{Conversation, EncodeError, ToolSet, encode_prompt_ids};
use dsv4_engine::Request;
use std::sync::Arc;

/// The handler.
pub async fn chat_completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = state
        .loaded()
        .ok_or_else(|| ApiError::unavailable("the model is still loading; retry shortly"))?;
    let req: ChatRequest = parse_body(&body)?;
    check_model(&state, &req.model)?;
    let prepared = prepare(&state, &loaded, &req, &body)?;
    let meta = Meta {
        id: format!("chatcmpl-{}", random_hex(state.next_serial())),
        created: unix_now(),
        model: state.cfg().model_id.clone(),
        thinking: prepared.thinking,
        logprobs: prepared.request.logprobs.is_some(),
    };
    let run = Run::start(&state, &loaded, prepared.request, prepared.decoder)?;
    if req.stream.unwrap_or(false) {
        let usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        Ok(sse_response(ChatStream::new(state, run, meta, usage)))
    } else {
        answer(&state, run, meta).await
    }
}

/// A checked request, ready to run.
struct Prepared {
    request: Request,
    decoder: OutputDecoder,
    thinking: bool,
}

/// Map a prompt-encoding error to the field at fault.
fn encode_error(e: EncodeError) -> ApiError {
    match e {
        EncodeError::Tools(t) => ApiError::bad_param("tools", t.to_string()),
        EncodeError::Message { index, .. } => {
            ApiError::bad_param(format!("messages[{index}]"), e.to_string())
        }
        EncodeError::NoMessages => ApiError::bad_param("messages", e.to_string()),
        EncodeError::Json(_) => ApiError::bad_request(e.to_string()),
        EncodeError::Tokenizer(t) => ApiError::internal(format!("tokenizing the prompt: {t}")),
    }
}

fn prepare(
    state: &AppState,
    loaded: &Loaded,
    req: &ChatRequest,
    body: &[u8],
) -> Result<Prepared, ApiError> {
    check_n(req.n)?;
    unsupported("store", req.store, false)?;
    let logprobs = req.logprobs()?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "`messages` is empty; give at least one user message",
        ));
    }
    let choice = req.tool_choice()?;
    let thinking = req.thinking()?;
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not UTF-8: {e}")))?;
    let mut conv = Conversation::from_json_str(text).map_err(encode_error)?;
    let tools = conv.tools.clone().unwrap_or_default();
    if choice == ToolChoice::None {
        conv.tools = None;
    }
    let parser_tools = if choice == ToolChoice::None {
        Arc::new(ToolSet::default())
    } else {
        Arc::clone(&tools)
    };
    let opts = req.encode_options(thinking);
    let (_, prompt) = encode_prompt_ids(&conv, &opts, &loaded.tokenizer).map_err(encode_error)?;
    let max_tokens = max_tokens(
        loaded,
        &prompt,
        req.max_completion_tokens.or(req.max_tokens),
        "messages",
    )?;
    let stop = stop_strings(req.stop.clone())?;
    let sampling = req.sampling().to_params(state.next_serial())?;
    check_fit(&sampling, loaded.vocab.len(), max_tokens)?;
    let constraint = constraint(loaded, req, &choice, &tools, thinking)?;
    let decoder = OutputDecoder::chat(state.cfg().output, thinking, parser_tools, &stop);
    Ok(Prepared {
        request: Request {
            prompt,
            max_tokens,
            sampling,
            stop,
            ignore_eos: req.ignore_eos.unwrap_or(false),
            logprobs,
            constraint,
            ..Default::default()
        },
        decoder,
        thinking,
    })
}

/// Check the prompt against the context and choose `max_tokens`; `prompt_field` is the request
/// field the prompt came from (`messages`, or `prompt` on /v1/completions), named in errors.
pub(super) fn max_tokens(
    loaded: &Loaded,
    prompt: &[u32],
    asked: Option<u64>,
    prompt_field: &'static str,
) -> Result<usize, ApiError> {
    let context = loaded.context;
    let too_long =
        |m: String| ApiError::bad_param(prompt_field, m).with_code("context_length_exceeded");
    if prompt.len() >= context {
        return Err(too_long(format!(
            "the prompt is {} tokens but the model's context is {context} tokens (room for at \
             least one generated token is needed); shorten the {prompt_field}",
            prompt.len()
        )));
    }
    let room = context - prompt.len();
    match asked {
        Some(0) => Err(ApiError::bad_param(
            "max_tokens",
            "max_tokens must be at least 1",
        )),
        Some(n) if n > room as u64 => Err(too_long(format!(
            "the prompt ({} tokens) plus max_tokens ({n}) exceeds the model's context of \
             {context} tokens; lower max_tokens to at most {room} or shorten the {prompt_field}",
            prompt.len()
        ))),
        Some(n) => Ok(n as usize),
        None => Ok(fit_max_tokens(loaded.engine.limits(), prompt, room)),
    }
}

/// The grammar constraint the request asks for, if any.
fn constraint(
    loaded: &Loaded,
    req: &ChatRequest,
    choice: &ToolChoice,
    tools: &ToolSet,
    thinking: bool,
) -> Result<Option<dsv4_engine::Constraint>, ApiError> {
    let schema = match &req.response_format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(serde_json::json!({"type": "object"})),
        Some(ResponseFormat::JsonSchema { json_schema }) => Some(
            json_schema
                .schema
                .clone()
                .unwrap_or_else(|| serde_json::json!({})),
        ),
    };
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let (target, param) = match (choice, &schema) {
        (ToolChoice::Required | ToolChoice::Named(_), Some(_)) => {
            return Err(ApiError::bad_param(
                "response_format",
                "a JSON response_format cannot be combined with tool_choice \"required\" or a \
                 named tool; use one or the other",
            ));
        }
        (ToolChoice::Required, None) => (
            Target::ToolCalls {
                only: None,
                parallel,
            },
            "tools",
        ),
        (ToolChoice::Named(name), None) => {
            if tools.get(name).is_none() {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!(
                        "tool_choice names `{name}`, which is not among the request's tools ({})",
                        tools.names().join(", ")
                    ),
                ));
            }
            (
                Target::ToolCalls {
                    only: Some(name.as_str()),
                    parallel,
                },
                "tool_choice",
            )
        }
        (_, Some(schema)) => (Target::Json(schema), "response_format"),
        (_, None) => return Ok(None),
    };
    loaded
        .grammars
        .constraint(target, tools, thinking)
        .map(Some)
        .map_err(|e| ApiError::bad_param(param, format!("cannot be enforced by a grammar: {e}")))
}

/// What every chunk and answer repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    thinking: bool,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
}

/// A tool call as the API shows it, with a fresh id.
fn tool_call_body(
    state: &AppState,
    call: dsv4_chat::ToolCall,
    index: Option<usize>,
) -> ToolCallBody {
    ToolCallBody {
        index,
        id: format!("call_{}", random_hex(state.next_serial())),
        kind: "function",
        function: FunctionBody {
            name: call.name,
            arguments: call.arguments,
        },
    }
}

/// Run to the end and answer one `chat.completion`.
async fn answer(state: &AppState, mut run: Run, meta: Meta) -> Result<Response, ApiError> {
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    let mut tokens: Vec<GeneratedToken> = Vec::new();
    let finished = loop {
        let step = run.next().await?;
        tokens.extend(step.logprobs);
        for d in step.deltas {
            match d {
                Delta::Content(c) => content.push_str(&c),
                Delta::Reasoning(r) => reasoning.push_str(&r),
                Delta::ToolCall(c) => calls.push(tool_call_body(state, c, None)),
            }
        }
        if let Some(f) = step.finished {
            break f;
        }
    };
    let body = ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices: vec![ChoiceBody {
            index: 0,
            finish_reason: finish_reason(finished.reason, !calls.is_empty()),
            message: AssistantBody {
                role: "assistant",
                content: (!content.is_empty() || calls.is_empty()).then_some(content),
                reasoning_content: meta.thinking.then_some(reasoning),
                tool_calls: calls,
            },
            logprobs: meta
                .logprobs
                .then(|| ChatLogprobs::new(run.vocab(), &tokens)),
        }],
        usage: finished.usage.into(),
    };
    Ok(json_response(&body))
}

/// The state of a streamed answer.
pub struct ChatStream {
    state: AppState,
    run: Run,
    meta: Meta,
    include_usage: bool,
    started: bool,
    calls: usize,
    done: bool,
}

impl ChatStream {
    fn new(state: AppState, run: Run, meta: Meta, include_usage: bool) -> Self {
        Self {
            state,
            run,
            meta,
            include_usage,
            started: false,
            calls: 0,
            done: false,
        }
    }

    /// A chunk with `delta`; with logprobs asked, it carries the entries of `tokens` (which
    /// it takes, so each token's entry is sent once).
    fn chunk(
        &self,
        delta: DeltaBody,
        finish: Option<&'static str>,
        tokens: &mut Vec<GeneratedToken>,
    ) -> SseEvent {
        let logprobs = self
            .meta
            .logprobs
            .then(|| ChatLogprobs::new(self.run.vocab(), &std::mem::take(tokens)));
        self.event(
            vec![ChunkChoice {
                index: 0,
                delta,
                finish_reason: finish,
                logprobs,
            }],
            None,
        )
    }

    fn event(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<crate::api::common::UsageBody>,
    ) -> SseEvent {
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

    fn delta(&mut self, d: Delta, tokens: &mut Vec<GeneratedToken>) -> SseEvent {
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
                let index = self.calls;
                self.calls += 1;
                DeltaBody {
                    tool_calls: Some(vec![tool_call_body(&self.state, c, Some(index))]),
                    ..Default::default()
                }
            }
        };
        self.chunk(body, None, tokens)
    }
}

impl super::EventSource for ChatStream {
    async fn next_events(&mut self) -> Vec<SseEvent> {
        if self.done {
            return Vec::new();
        }
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            let role = DeltaBody {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Default::default()
            };
            let event = self.event(
                vec![ChunkChoice {
                    index: 0,
                    delta: role,
                    finish_reason: None,
                    logprobs: None,
                }],
                None,
            );
            out.push(event);
            return out;
        }
        match self.run.next().await {
            Ok(Step {
                deltas,
                logprobs: mut tokens,
                finished,
            }) => {
                for d in deltas {
                    out.push(self.delta(d, &mut tokens));
                }
                if let Some(f) = finished {
                    let reason = finish_reason(f.reason, self.calls > 0);
                    out.push(self.chunk(DeltaBody::default(), Some(reason), &mut tokens));
                    if self.include_usage {
                        out.push(self.event(Vec::new(), Some(f.usage.into())));
                    }
                    out.push(SseEvent::default().data("[DONE]"));
                    self.done = true;
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

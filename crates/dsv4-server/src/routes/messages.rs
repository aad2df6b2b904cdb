//! Anthropic's Messages API: `POST /v1/messages` runs one answer to a conversation and answers
//! a `message` object, or streams its events ([`super::messages_output`]);
//! `POST /v1/messages/count_tokens` counts the prompt's tokens. The prompt, the DSML parsing
//! of the answer, tools, thinking and JSON formats are chat's; errors are Anthropic's
//! `{"type": "error", "error": {"type", "message"}}`.

use super::chat::{DecoderSpec, constraint, max_tokens};
use super::messages_output::MessageOutput;
use super::{admission, request_priority};
use super::{body_bytes, check_model, json_response, loaded_model, sse_response};
use crate::api::chat::ToolChoice;
use crate::api::common::{Stop, parse_body, random_hex, random_u64, stop_strings};
use crate::api::messages::{CountTokensRequest, MessagesRequest, PromptFields};
use crate::api::messages_input;
use crate::api::sampling::check_fit;
use crate::batch::BatchLine;
use crate::error::ApiError;
use crate::run::Run;
use crate::state::{AppState, Loaded};
use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dsv4_chat::pyjson::OrderedJson;
use dsv4_chat::{EncodeOptions, ToolSet};
use dsv4_engine::Request;
use serde_json::{Value, json};
use std::sync::Arc;

/// `POST /v1/messages`.
pub async fn create(
    State(state): State<AppState>,
    line: Option<Extension<BatchLine>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(create_message(state, line.is_some(), body).await)
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}`, the prompt's tokens as
/// `/v1/messages` would encode it.
pub async fn count_tokens(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let counted = (|| {
        let body = body_bytes(&state, body)?;
        let loaded = loaded_model(&state)?;
        let req: CountTokensRequest = parse_body(&body)?;
        check_model(&state, &req.model)?;
        let raw = ordered(&body)?;
        let prompt = encode(&loaded, &raw, &req.prompt_fields())?;
        Ok(json_response(&json!({"input_tokens": prompt.ids.len()})))
    })();
    respond(counted)
}

/// The answer, or the error in Anthropic's shape.
fn respond(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(error_response)
}

/// Anthropic's error `type` for a status.
pub(crate) fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error as Anthropic's error object (the message names the field at fault, when one is).
pub(super) fn error_body(e: &ApiError) -> Value {
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(e.status), "message": message}})
}

/// An error answered in Anthropic's shape, with the retry headers [`ApiError`] sets.
pub(crate) fn error_response(e: ApiError) -> Response {
    let body = error_body(&e);
    let status = e.status;
    let headers = e.into_response().headers().clone();
    let mut response = (status, axum::Json(body)).into_response();
    for name in ["retry-after", "x-should-retry"] {
        if let Some(v) = headers.get(name) {
            response.headers_mut().insert(name, v.clone());
        }
    }
    response
}

/// The body again, keys in order (they shape the prompt).
fn ordered(body: &[u8]) -> Result<OrderedJson, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not UTF-8: {e}")))?;
    OrderedJson::parse(text).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A request's prompt and what its encoding decided.
struct Encoded {
    ids: Vec<u32>,
    tools: Arc<ToolSet>,
    choice: ToolChoice,
    parallel: bool,
    /// The answer starts in reasoning (thinking mode, and no prefill).
    thinking: bool,
    /// The reasoning's token budget.
    budget: Option<u64>,
    /// Thinking text is left out of the answer (`display: "omitted"`).
    omit: bool,
}

/// Encode the prompt: `system`, `messages`, and the tools unless `tool_choice` is none.
fn encode(
    loaded: &Loaded,
    raw: &OrderedJson,
    fields: &PromptFields<'_>,
) -> Result<Encoded, ApiError> {
    let (choice, parallel) = fields.tool_choice()?;
    let thinking = fields.thinking()?;
    let tools = match raw.get("tools").filter(|t| **t != OrderedJson::Null) {
        Some(t) => messages_input::tools(t)?,
        None => Arc::new(ToolSet::default()),
    };
    let chat = messages_input::conversation(raw.get("system"), raw.get("messages"))?;
    let opts = EncodeOptions {
        thinking: thinking.on,
        reasoning_effort: thinking.effort,
        ..Default::default()
    };
    let (conv, ids) = chat.encode((&choice, &tools), &opts, &loaded.tokenizer)?;
    // A prefill closes any reasoning (thinking mode renders it as `thinking</think>text`):
    // the answer goes on as text.
    let prefilled = conv.messages.last().is_some_and(|m| m.prefix);
    Ok(Encoded {
        ids,
        tools,
        choice,
        parallel,
        thinking: thinking.on && !prefilled,
        budget: thinking.budget,
        omit: thinking.omit,
    })
}

async fn create_message(
    state: AppState,
    line: bool,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let mut req: MessagesRequest = parse_body(&body)?;
    req.priority = request_priority(&state, req.priority, line)?;
    req.admission = admission(&state, line);
    check_model(&state, &req.model)?;
    let asked = req.check_supported()?;
    let raw = ordered(&body)?;
    let fields = req.prompt_fields();
    let Encoded {
        ids: prompt,
        tools,
        choice,
        parallel,
        thinking,
        budget,
        omit,
    } = encode(&loaded, &raw, &fields)?;
    // 0 runs the prompt only, warming the prefix cache (Anthropic's 0 populates its prompt
    // cache without generating).
    let max_tokens = max_tokens(
        &loaded,
        &prompt,
        Some(asked),
        ("messages", "max_tokens"),
        (asked == 0).then_some(true),
    )?;
    let stop = stop_strings(req.stop_sequences.clone().map(Stop::Many))
        .map_err(|e| e.with_param("stop_sequences"))?;
    let sampling = req.sampling().to_params(random_u64(state.next_serial()))?;
    check_fit(&sampling, loaded.vocab.len(), max_tokens)?;
    let shape = fields.structured()?;
    let constraint = constraint(
        &state,
        &loaded,
        shape.as_ref(),
        parallel,
        &choice,
        &tools,
        thinking,
    )
    .await?;
    let budget = budget.or(state.cfg().thinking_token_budget);
    let constraint = loaded.think_end.budgeted(thinking, budget, constraint);
    let decoder = DecoderSpec::plain(&state, thinking, (&choice, tools), &stop, shape.is_some())
        .with_streamed_arguments(req.stream == Some(true));
    let prompt_tokens = prompt.len();
    let request = Request {
        prompt,
        max_tokens,
        sampling,
        stop,
        constraint,
        priority: req.priority.unwrap_or(0),
        ..req.admission.request()
    };
    let id = format!("msg_{}", random_hex(state.next_serial()));
    let mut run = Run::start(
        &state,
        &loaded,
        request,
        (id.clone(), id.clone()),
        decoder.build(),
    )?;
    run.queued().await?;
    let output = MessageOutput::new(
        state.clone(),
        id,
        state.cfg().model_id.clone(),
        prompt_tokens,
    )
    .omitting_thinking(omit);
    if req.stream.unwrap_or(false) {
        Ok(sse_response(output.stream(run)))
    } else {
        Ok(json_response(&output.run_to_end(run).await?))
    }
}

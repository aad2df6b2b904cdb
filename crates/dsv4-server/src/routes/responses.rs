//! OpenAI's Responses API: `POST /v1/responses` runs one answer to a conversation given as
//! input items (plus, with `previous_response_id`, a stored response's whole conversation) and
//! answers a `response` object, or streams its typed events ([`super::responses_output`]);
//! `GET` and `DELETE /v1/responses/{id}` read and forget stored responses. The prompt, the
//! DSML parsing of the answer, tools and JSON formats are chat's. Background responses:
//! [`super::responses_background`].

use super::chat::{DecoderSpec, constraint, max_tokens};
use super::page::{Page, query_pairs};
use super::responses_envelope::Envelope;
use super::responses_output::{ResponseOutput, ToStore};
use super::responses_truncation::truncated;
use super::{admission, request_priority};
use super::{
    body_bytes, check_model, json_response, loaded_model, responses_background, sse_response,
};
use crate::api::chat::ToolChoice;
use crate::api::common::{random_hex, random_u64, stop_strings, unix_now};
use crate::api::responses::ResponsesRequest;
use crate::api::responses_input::{ChatMessages, chat_tools, input_items};
use crate::api::sampling::check_fit;
use crate::batch::BatchLine;
use crate::error::ApiError;
use crate::responses_store::{Found, Stored};
use crate::run::Run;
use crate::state::{AppState, Loaded};
use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::response::Response;
use dsv4_chat::pyjson::OrderedJson;
use dsv4_chat::{Conversation, EncodeOptions, Message, ToolSet, encode_prompt_ids};
use dsv4_engine::Request;
use serde_json::{Value, json};
use std::sync::Arc;

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    line: Option<Extension<BatchLine>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let line = line.is_some();
    let mut req: ResponsesRequest = crate::api::common::parse_body(&body)?;
    req.priority = request_priority(&state, req.priority, line)?;
    req.admission = admission(&state, line);
    check_model(&state, &req.model)?;
    req.check_supported()?;
    let background = req.background.unwrap_or(false);
    if background {
        check_background(&state, &req)?;
    }
    let Conversed {
        raw,
        previous,
        turn,
    } = conversation(&state, &body, &req)?;
    let (request, decoder) =
        prepare(&state, &loaded, &req, &raw, previous.as_deref(), &turn).await?;
    let id = format!("resp_{}", random_hex(state.next_serial()));
    let store = req.store.unwrap_or(true) && state.responses().enabled();
    let envelope = Envelope::new(&req, id.clone(), unix_now(), store, &raw);
    let logprobs = request.logprobs.is_some();
    let thinking = decoder.thinking;
    let mut run = Run::start(
        &state,
        &loaded,
        request,
        (id.clone(), id.clone()),
        decoder.build(),
    )?;
    run.queued().await?;
    let reasoning = loaded.think_end.counter(thinking);
    let output = ResponseOutput::new(state.clone(), loaded, envelope, logprobs, reasoning);
    let stored = store.then(|| ToStore {
        previous,
        turn,
        input_items: Arc::new(raw.get("input").map_or_else(Vec::new, |input| {
            input_items(input, |kind| {
                let prefix = match kind {
                    "function_call" => "fc",
                    "function_call_output" => "fco",
                    "reasoning" => "rs",
                    _ => "msg",
                };
                format!("{prefix}_{}", random_hex(state.next_serial()))
            })
        })),
    });
    if background && let Some(stored) = stored {
        let stream = req.stream.unwrap_or(false);
        return responses_background::start(&state, id, output, run, stored, stream);
    }
    if req.stream.unwrap_or(false) {
        Ok(sse_response(output.stream(run, stored)))
    } else {
        let body = output.run_to_end(run, stored).await?;
        Ok(json_response(&body))
    }
}

/// 400 unless a background response can be kept: it is stored (polling reads it), so
/// `store` must not be false and the server must store responses.
fn check_background(state: &AppState, req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.store == Some(false) {
        return Err(ApiError::bad_param(
            "background",
            "a background response is stored (GET /v1/responses/{id} polls it); drop \
             \"store\": false or \"background\": true",
        ));
    }
    if !state.responses().enabled() {
        return Err(ApiError::bad_param(
            "background",
            "this server stores no responses (server.responses_store = 0), so it cannot run \
             background ones; leave `background` out",
        ));
    }
    Ok(())
}

/// The stored response `id` that `previous_response_id` names: 404 if there is none, 400 if
/// it is still running in the background or failed.
fn previous(state: &AppState, id: &str) -> Result<Arc<Stored>, ApiError> {
    if let Some(s) = state.responses().get(id) {
        if s.response["status"] == "failed" {
            return Err(ApiError::bad_param(
                "previous_response_id",
                format!("response {id} failed; continue from an earlier one instead"),
            ));
        }
        return Ok(s);
    }
    if let Some(Found::Running(_)) = state.responses().find(id) {
        return Err(ApiError::bad_param(
            "previous_response_id",
            format!(
                "response {id} is still running in the background; wait until GET \
                 /v1/responses/{id} shows it finished"
            ),
        )
        .with_code("previous_response_in_progress"));
    }
    Err({
        let why = if state.responses().enabled() {
            format!(
                "no stored response has id '{id}' (responses are kept in memory, the newest {} \
                 of them, until the server restarts; a response made with \"store\": false is \
                 not kept)",
                state.responses().capacity()
            )
        } else {
            "this server stores no responses (server.responses_store = 0); send the whole \
             conversation as input instead"
                .to_string()
        };
        ApiError::not_found(why)
            .with_param("previous_response_id")
            .with_code("previous_response_not_found")
    })
}

/// A request's conversation: its body in order, the stored response it continues and its own
/// turn (the input as chat messages).
pub(super) struct Conversed {
    pub(super) raw: OrderedJson,
    pub(super) previous: Option<Arc<Stored>>,
    pub(super) turn: ChatMessages,
}

/// Read the conversation of `req`, parsed from `body`.
pub(super) fn conversation(
    state: &AppState,
    body: &[u8],
    req: &ResponsesRequest,
) -> Result<Conversed, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not UTF-8: {e}")))?;
    let raw = OrderedJson::parse(text).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let previous = match &req.previous_response_id {
        None => None,
        Some(id) => Some(previous(state, id)?),
    };
    let mut turn = ChatMessages::default();
    if let Some(input) = raw.get("input") {
        turn.push_input(input)?;
    }
    Ok(Conversed {
        raw,
        previous,
        turn,
    })
}

/// A request's prompt as it runs, and what encoding it decided.
pub(super) struct Encoded {
    /// The prompt's ids (after `truncation: "auto"` dropped what it had to).
    pub(super) prompt: Vec<u32>,
    /// The most tokens the answer may have, or why the prompt does not fit
    /// (`context_length_exceeded`).
    pub(super) max_tokens: Result<usize, ApiError>,
    choice: ToolChoice,
    thinking: bool,
    tools: Arc<ToolSet>,
}

/// Encode the prompt (instructions, the stored conversation, the input; tools unless
/// `tool_choice` is none), dropping the oldest turns under `truncation: "auto"` until it fits.
pub(super) fn encode_input(
    loaded: &Loaded,
    req: &ResponsesRequest,
    raw: &OrderedJson,
    previous: Option<&Stored>,
    turn: &ChatMessages,
) -> Result<Encoded, ApiError> {
    let choice = req.tool_choice()?;
    let (thinking, reasoning_effort) = req.thinking()?;
    let tools = match raw.get("tools").filter(|t| **t != OrderedJson::Null) {
        Some(t) => chat_tools(t)?,
        None => Arc::new(ToolSet::default()),
    };
    let mut all = ChatMessages::default();
    if let Some(instructions) = &req.instructions {
        let system = OrderedJson::Object(vec![
            ("role".into(), OrderedJson::String("system".into())),
            ("content".into(), OrderedJson::String(instructions.clone())),
        ]);
        all.push(system, "instructions");
    }
    if let Some(p) = previous {
        let mut earlier = p.conversation();
        earlier.origins.fill("previous_response_id".into());
        all.extend(&earlier);
    }
    all.extend(turn);
    let opts = EncodeOptions {
        thinking,
        reasoning_effort,
        ..Default::default()
    };
    let (conv, prompt) = all.encode((&choice, &tools), &opts, &loaded.tokenizer)?;
    // The most tokens it may generate, or why not: `context_length_exceeded` when the prompt
    // does not fit the context or the cache.
    let check = |prompt: &[u32]| -> Result<usize, ApiError> {
        let max_tokens = max_tokens(
            loaded,
            prompt,
            req.max_output_tokens,
            ("input", "max_output_tokens"),
            None,
        )?;
        let req = Request {
            prompt: prompt.to_vec(),
            max_tokens,
            ..Default::default()
        };
        loaded.engine.limits().check(&req).map_err(|e| {
            ApiError::from(e)
                .with_param("input")
                .with_code("context_length_exceeded")
        })?;
        Ok(max_tokens)
    };
    let auto = req.truncation.as_deref() == Some("auto");
    let encoded = |prompt: Vec<u32>, max_tokens| Encoded {
        prompt,
        max_tokens,
        choice: choice.clone(),
        thinking,
        tools: Arc::clone(&tools),
    };
    Ok(match check(&prompt) {
        Ok(n) => encoded(prompt, Ok(n)),
        Err(e) if e.code.as_deref() != Some("context_length_exceeded") => return Err(e),
        Err(mut e) if !auto => {
            e.message.push_str(
                " (or send \"truncation\": \"auto\" to drop the oldest turns until it fits)",
            );
            encoded(prompt, Err(e))
        }
        Err(mut e) => {
            let encode = |messages: Vec<Message>| {
                let conv = Conversation {
                    messages,
                    tools: conv.tools.clone(),
                };
                encode_prompt_ids(&conv, &opts, &loaded.tokenizer).ok()
            };
            let fits = |p: &[u32]| check(p).is_ok();
            match truncated(&conv.messages, encode, fits) {
                None => {
                    e.message
                        .push_str(" (truncation auto: even the last user turn alone does not fit)");
                    encoded(prompt, Err(e))
                }
                Some((shorter, dropped)) => {
                    tracing::info!(
                        dropped,
                        from = prompt.len(),
                        to = shorter.len(),
                        "truncation auto: dropped the oldest messages"
                    );
                    let fit = check(&shorter);
                    encoded(shorter, fit)
                }
            }
        }
    })
}

/// Encode the prompt ([`encode_input`]) and check the request: the engine request and the
/// decoder.
async fn prepare(
    state: &AppState,
    loaded: &Loaded,
    req: &ResponsesRequest,
    raw: &OrderedJson,
    previous: Option<&Stored>,
    turn: &ChatMessages,
) -> Result<(Request, DecoderSpec), ApiError> {
    let Encoded {
        prompt,
        max_tokens,
        choice,
        thinking,
        tools,
    } = encode_input(loaded, req, raw, previous, turn)?;
    let max_tokens = max_tokens?;
    let logprobs = req.logprobs()?;
    let stop = stop_strings(req.stop.clone())?;
    let sampling = req.sampling().to_params(random_u64(state.next_serial()))?;
    check_fit(&sampling, loaded.vocab.len(), max_tokens)?;
    let shape = req.structured();
    let constraint = constraint(
        state,
        loaded,
        shape.as_ref(),
        req.parallel_tool_calls.unwrap_or(true),
        &choice,
        &tools,
        thinking,
    )
    .await?;
    // The server's thinking budget (the Responses API has no field for one).
    let constraint =
        loaded
            .think_end
            .budgeted(thinking, state.cfg().thinking_token_budget, constraint);
    let decoder = DecoderSpec::plain(state, thinking, (&choice, tools), &stop, shape.is_some())
        .with_streamed_arguments(req.stream == Some(true));
    let request = Request {
        prompt,
        max_tokens,
        sampling,
        stop,
        logprobs,
        constraint,
        priority: req.priority.unwrap_or(0),
        ..req.admission.request()
    };
    Ok((request, decoder))
}

/// 404 naming a response that is not stored.
pub(super) fn not_stored(id: &str) -> ApiError {
    ApiError::not_found(format!(
        "no stored response has id '{id}' (it was made with \"store\": false, was dropped for \
         newer ones, or the server restarted)"
    ))
    .with_code("not_found")
}

/// Whether `key` names `include` (extra outputs of hosted tools: there are none to add).
fn is_include(key: &str) -> bool {
    matches!(key, "include" | "include[]" | "include%5B%5D")
}

/// `GET /v1/responses/{id}`: a stored response as it was answered, a background one as it is
/// now; with `stream=true`, a background streamed response's events after `starting_after`
/// (all without it), then live until it ends.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
    uri: Uri,
) -> Result<Response, ApiError> {
    let (mut stream, mut starting_after) = (false, None);
    for (key, value) in query_pairs(&uri)? {
        let (key, value) = (key.as_str(), value.as_str());
        match key {
            "stream" => {
                stream = value.parse().map_err(|_| {
                    ApiError::bad_param(
                        "stream",
                        format!("stream must be true or false, not {value:?}"),
                    )
                })?;
            }
            "starting_after" => {
                starting_after = Some(value.parse::<usize>().map_err(|_| {
                    ApiError::bad_param(
                        "starting_after",
                        format!("starting_after must be an event's sequence number, not {value:?}"),
                    )
                })?);
            }
            "include_obfuscation" => {}
            k if is_include(k) => {}
            other => {
                return Err(ApiError::bad_param(
                    other,
                    format!("unknown query parameter {other:?}; use stream and starting_after"),
                ));
            }
        }
    }
    if starting_after.is_some() && !stream {
        return Err(ApiError::bad_param(
            "starting_after",
            "starting_after resumes a stream: send it with stream=true",
        ));
    }
    let found = state.responses().find(&id).ok_or_else(|| not_stored(&id))?;
    if stream {
        return responses_background::follow(&id, found, starting_after);
    }
    Ok(json_response(&match found {
        Found::Running(bg) => bg.response(),
        Found::Stored(s) => s.response.clone(),
    }))
}

/// `DELETE /v1/responses/{id}`: forget a stored response (responses that continue it keep
/// their conversation); a background one still running must be cancelled first.
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if let Some(Found::Running(_)) = state.responses().find(&id) {
        return Err(ApiError::bad_request(format!(
            "response {id} is still running in the background; cancel it first (POST \
             /v1/responses/{id}/cancel)"
        )));
    }
    if !state.responses().remove(&id) {
        return Err(not_stored(&id));
    }
    Ok(json_response(
        &json!({"id": id, "object": "response", "deleted": true}),
    ))
}

/// `GET /v1/responses/{id}/input_items`: a stored response's own input items (not those of the
/// responses it continued), newest first unless `order=asc`, `limit` (1 to 100, default 20) at
/// a time, after the item `after`.
pub async fn list_input_items(
    State(state): State<AppState>,
    Path(id): Path<String>,
    uri: Uri,
) -> Result<Response, ApiError> {
    let page = Page::from_query(&uri, (20, 100), false, "limit, order and after", |k, _| {
        Ok(is_include(k))
    })?;
    let all = match state.responses().find(&id).ok_or_else(|| not_stored(&id))? {
        Found::Running(bg) => Arc::clone(bg.input_items()),
        Found::Stored(s) => Arc::clone(&s.input_items),
    };
    Ok(json_response(&page.list(&all, Value::clone, |a| {
        format!("response {id} has no input item {a:?}")
    })?))
}

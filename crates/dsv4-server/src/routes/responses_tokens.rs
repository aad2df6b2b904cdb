//! `POST /v1/responses/input_tokens` (OpenAI's input token count): how many prompt tokens a
//! `POST /v1/responses` with the same conversation would run — instructions, a stored
//! `previous_response_id` chain, the input and the tools, encoded as that request's prompt is
//! ([`super::responses::encode_input`]), after `truncation: "auto"` dropped what it would. A
//! prompt too long for the context is counted whole (that is what the count is for), and runs
//! nothing.

use super::responses::{Conversed, conversation, encode_input};
use super::{body_bytes, check_model, json_response, loaded_model};
use crate::api::common::parse_body;
use crate::api::responses::ResponsesRequest;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use serde_json::{Value, json};

/// The fields the count takes (OpenAI's): those of a response's conversation.
const FIELDS: [&str; 11] = [
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "conversation",
    "parallel_tool_calls",
    "reasoning",
    "text",
    "tool_choice",
    "tools",
    "truncation",
];

/// The handler: `{"object": "response.input_tokens", "input_tokens": N}`.
pub async fn input_tokens(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let mut fields: serde_json::Map<String, Value> = parse_body(&body)?;
    if let Some(k) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_param(
            k.as_str(),
            format!(
                "`{k}` is not a field of an input token count, which takes {}",
                FIELDS.join(", ")
            ),
        ));
    }
    // `model` is optional here: the served model counts.
    match fields.get("model") {
        None | Some(Value::Null) => {
            fields.insert("model".into(), json!(state.cfg().model_id));
        }
        Some(_) => {}
    }
    let req: ResponsesRequest = parse_body(&serde_json::to_vec(&fields).unwrap_or_default())?;
    check_model(&state, &req.model)?;
    req.check_supported()?;
    let Conversed {
        raw,
        previous,
        turn,
    } = conversation(&state, &body, &req)?;
    let encoded = encode_input(&loaded, &req, &raw, previous.as_deref(), &turn)?;
    Ok(json_response(&json!({
        "object": "response.input_tokens",
        "input_tokens": encoded.prompt.len(),
    })))
}

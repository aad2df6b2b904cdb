//! Amazon SageMaker's container contract, as vLLM and SGLang serve it: `GET`/`POST /ping` is
//! `/health`, and `POST /invocations` runs a chat completion when the body has `messages`, a
//! completion when it has `prompt` (vLLM's order: chat first).

use super::{body_bytes, chat, completions};
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use serde_json::Value;

/// `POST /invocations`.
pub async fn invocations(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&body) else {
        // The endpoint's own parser says what is wrong with it.
        return chat::chat_completions(State(state), None, Ok(body)).await;
    };
    if fields.contains_key("messages") {
        chat::chat_completions(State(state), None, Ok(body)).await
    } else if fields.contains_key("prompt") {
        completions::completions(State(state), None, Ok(body)).await
    } else {
        Err(ApiError::bad_request(
            "an /invocations body is a chat completion request (with `messages`) or a \
             completion request (with `prompt`)",
        ))
    }
}

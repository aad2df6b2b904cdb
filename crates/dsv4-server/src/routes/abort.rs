//! `POST /abort_request` (SGLang's): `{"rid": ID}` aborts the generations with that id (an
//! output's `meta_info.id`, or a request's: a `/generate` `rid`, a completion's `cmpl-…` or a
//! chat's `chatcmpl-…` id, aborting all its choices); `{"abort_all": true}` aborts every one.
//! Each aborted generation ends at once with what it had, finish reason `abort`, and its cache
//! is freed before the engine's next step. Answers `{"status": "ok", "aborted": N}`.

use super::{body_bytes, json_response, loaded_model};
use crate::api::common::parse_body;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use serde::{Deserialize, Serialize};

/// The request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AbortRequest {
    /// The id to abort.
    rid: Option<String>,
    /// Abort every generation in flight.
    abort_all: Option<bool>,
}

/// The answer: how many generations (choices) were aborted.
#[derive(Debug, Serialize)]
struct Aborted {
    status: &'static str,
    aborted: usize,
}

/// The handler.
pub async fn abort_request(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let req: AbortRequest = parse_body(&body)?;
    let rid = match (req.rid, req.abort_all.unwrap_or(false)) {
        (None, true) => None,
        (Some(rid), false) if !rid.is_empty() => Some(rid),
        (Some(_), true) => {
            return Err(ApiError::bad_request(
                "give `rid` or `\"abort_all\": true`, not both",
            ));
        }
        _ => {
            return Err(ApiError::bad_param(
                "rid",
                "name the generation to abort with `rid`, or send `\"abort_all\": true`",
            ));
        }
    };
    let aborted = state.aborts().abort(rid.as_deref(), &loaded.engine);
    tracing::info!(
        rid = rid.as_deref().unwrap_or("*"),
        aborted,
        "abort_request"
    );
    Ok(json_response(&Aborted {
        status: "ok",
        aborted,
    }))
}

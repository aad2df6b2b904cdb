//! OpenAI's Batch API: `POST /v1/batches` (an uploaded file of requests to one endpoint, run in
//! the background, with `output_expires_after` for its output files), `GET /v1/batches`
//! (`limit`, `after`), `GET /v1/batches/{id}` and `POST /v1/batches/{id}/cancel`, over the
//! server's [`crate::batches::BatchStore`]. The answers land in output and error files (`GET
//! /v1/files/{id}/content`).

use super::files::{expiry, files_on, no_file};
use super::page::Page;
use super::{body_bytes, json_response, loaded_model};
use crate::api::common::{check_metadata, parse_body};
use crate::batch::ENDPOINTS;
use crate::batches::{Batch, NewBatch};
use crate::error::ApiError;
use crate::files::UPLOAD_PURPOSE;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::sync::Arc;

/// The body of `POST /v1/batches` (OpenAI's fields).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    output_expires_after: Option<ExpiresAfter>,
}

/// OpenAI's `output_expires_after`: how long a batch's output and error files live.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpiresAfter {
    anchor: Option<String>,
    seconds: Option<u64>,
}

/// `POST /v1/batches`: start a batch; its object (status `validating`).
pub async fn create(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    files_on(&state)?;
    let body = body_bytes(&state, body)?;
    // A batch runs on the loaded model: 503 while it loads.
    loaded_model(&state)?;
    let req: CreateBatch = parse_body(&body)?;
    if !ENDPOINTS.contains(&req.endpoint.as_str()) {
        return Err(ApiError::bad_param(
            "endpoint",
            format!(
                "endpoint {:?} is not supported; a batch goes to {}",
                req.endpoint,
                ENDPOINTS.join(", ")
            ),
        ));
    }
    if req.completion_window != "24h" {
        return Err(ApiError::bad_param(
            "completion_window",
            format!(
                "completion_window must be \"24h\", not {:?}",
                req.completion_window
            ),
        ));
    }
    check_metadata(req.metadata.as_ref())?;
    let output_expires_after = req
        .output_expires_after
        .map(|e| expiry("output_expires_after", e.anchor.as_deref(), e.seconds))
        .transpose()?;
    let input_file = state
        .files()
        .get(&req.input_file_id)
        .ok_or_else(|| no_file(&req.input_file_id, Some("input_file_id")))?;
    if input_file.purpose != UPLOAD_PURPOSE {
        return Err(ApiError::bad_param(
            "input_file_id",
            format!(
                "file {} has purpose {:?}; a batch reads a file uploaded with purpose \"batch\"",
                input_file.id, input_file.purpose
            ),
        ));
    }
    // The output files must have somewhere to go.
    state.files().check_room(0)?;
    let asked = NewBatch {
        input_file_id: input_file.id.clone(),
        endpoint: req.endpoint,
        completion_window: req.completion_window,
        metadata: req.metadata.map_or(Value::Null, Value::Object),
        model: state.cfg().model_id.clone(),
        output_expires_after,
    };
    let batch = state.batches().start(&state, asked, input_file);
    Ok(json_response(&batch.object()))
}

/// The batch `id`, or 404 (a Message Batch is `/v1/messages/batches`'s).
fn find(state: &AppState, id: &str) -> Result<Arc<Batch>, ApiError> {
    files_on(state)?;
    let batch = state.batches().get(id).filter(|b| !b.is_messages());
    batch.ok_or_else(|| {
        ApiError::not_found(format!(
            "no batch {id} on this server (GET /v1/batches lists them)"
        ))
    })
}

/// `GET /v1/batches/{id}`: a batch as it is now.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json_response(&find(&state, &id)?.object()))
}

/// `POST /v1/batches/{id}/cancel`: stop starting lines; the batch, cancelling (it ends
/// cancelled once the lines in flight finish, with their output lines kept).
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let batch = find(&state, &id)?;
    batch.cancel().map_err(|status| {
        ApiError::bad_request(format!(
            "batch {id} has ended ({}); only a validating or running batch can be cancelled",
            status.name()
        ))
        .with_code("batch_not_cancellable")
    })?;
    batch.save(state.files().disk());
    Ok(json_response(&batch.object()))
}

/// `GET /v1/batches`: the batches, newest first (`limit` 1 to 100, default 20, `after`).
pub async fn list(State(state): State<AppState>, uri: Uri) -> Result<Response, ApiError> {
    files_on(&state)?;
    let page = Page::from_query(&uri, (20, 100), false, "limit and after", |_, _| Ok(false))?;
    let batches = state.batches().openai();
    Ok(json_response(&page.list(
        &batches,
        |b| b.object(),
        |a| format!("no batch {a} to list after"),
    )?))
}

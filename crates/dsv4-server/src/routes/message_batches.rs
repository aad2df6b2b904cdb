//! Anthropic's Message Batches API: `POST /v1/messages/batches` (up to 100,000 requests, each
//! `{custom_id, params}` with `params` a `/v1/messages` body), `GET /v1/messages/batches`
//! (`limit`, `after_id`, `before_id`, newest first), `GET` and `DELETE
//! /v1/messages/batches/{id}`, `POST /v1/messages/batches/{id}/cancel` and `GET
//! /v1/messages/batches/{id}/results` (JSONL), over the server's batches
//! ([`crate::batches::messages`]). Errors are Anthropic's.

use super::files::{files_on, over_files_budget};
use super::messages::error_response;
use super::page::query_pairs;
use super::{body_bytes, json_response, loaded_model};
use crate::api::common::{parse_body, random_hex, unix_now};
use crate::batches::Batch;
use crate::batches::messages::{ResultsError, input_jsonl, results};
use crate::error::ApiError;
use crate::files::{FileInfo, MESSAGE_INPUT_PURPOSE};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

/// Most requests in one Message Batch (Anthropic's limit).
pub const MAX_REQUESTS: usize = 100_000;

/// The body of `POST /v1/messages/batches`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBatch {
    requests: Vec<BatchRequest>,
}

/// One request of a batch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    custom_id: String,
    params: Value,
}

/// Whether `id` is a `custom_id` Anthropic takes: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn valid_custom_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The requests as `(custom_id, params)`, checked: at least one, at most [`MAX_REQUESTS`],
/// each `custom_id` valid and its own, each `params` an object. A request's `params` are
/// otherwise checked when it runs (as Anthropic does): one that `/v1/messages` refuses is an
/// `errored` result, not a refused batch.
fn checked(req: CreateBatch) -> Result<Vec<(String, Value)>, ApiError> {
    let n = req.requests.len();
    if n == 0 || n > MAX_REQUESTS {
        return Err(ApiError::bad_param(
            "requests",
            format!("a message batch has 1 to {MAX_REQUESTS} requests, not {n}"),
        ));
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, r) in req.requests.iter().enumerate() {
        if !valid_custom_id(&r.custom_id) {
            return Err(ApiError::bad_param(
                format!("requests.{i}.custom_id"),
                format!(
                    "custom_id {:?} must be 1 to 64 letters, digits, `_` or `-`",
                    r.custom_id
                ),
            ));
        }
        if let Some(first) = seen.insert(&r.custom_id, i) {
            return Err(ApiError::bad_param(
                format!("requests.{i}.custom_id"),
                format!(
                    "custom_id {:?} is on requests {first} and {i}; each request needs its own",
                    r.custom_id
                ),
            ));
        }
        if !r.params.is_object() {
            return Err(ApiError::bad_param(
                format!("requests.{i}.params"),
                "params must be an object: the body of a /v1/messages request",
            ));
        }
    }
    Ok(req
        .requests
        .into_iter()
        .map(|r| (r.custom_id, r.params))
        .collect())
}

/// `POST /v1/messages/batches`: start a Message Batch; its object (`in_progress`).
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let created = async {
        files_on(&state)?;
        let body = match body {
            // A batch may be as large as the files budget, past server.max_request_bytes.
            Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(over_files_budget(&state, "the message batch"));
            }
            other => body_bytes(&state, other)?,
        };
        // A batch runs on the loaded model: 503 while it loads.
        loaded_model(&state)?;
        let requests = checked(parse_body(&body)?)?;
        // The results must have somewhere to go.
        state.files().check_room(0)?;
        let total = requests.len();
        let created_at = unix_now();
        let info = FileInfo {
            id: format!("file-{}", random_hex(state.next_serial())),
            filename: "message_batch_requests.jsonl".to_string(),
            created_at,
            expires_at: None,
        };
        let keeper = state.clone();
        // Written to disk with server.files_dir: off the runtime's workers.
        let input = tokio::task::spawn_blocking(move || {
            let content = Bytes::from(input_jsonl(&requests));
            keeper
                .files()
                .upload_as(info, MESSAGE_INPUT_PURPOSE, content)
        })
        .await
        .map_err(|e| ApiError::internal(format!("keeping the batch's requests failed: {e}")))??;
        let batch = state.batches().start_messages(&state, input, total);
        Ok(json_response(&object(&state, &headers, &batch)))
    };
    created.await.unwrap_or_else(error_response)
}

/// The Message Batch `id`, or 404.
fn find(state: &AppState, id: &str) -> Result<Arc<Batch>, ApiError> {
    files_on(state)?;
    let batch = state.batches().get(id).filter(|b| b.is_messages());
    batch.ok_or_else(|| {
        ApiError::not_found(format!(
            "no message batch {id} on this server (GET /v1/messages/batches lists them)"
        ))
    })
}

/// Where a client reaches the results of batch `id`: an absolute URL from the request's
/// `X-Forwarded-Host` or `Host` (and `X-Forwarded-Proto`, else this server's scheme), as
/// Anthropic gives one; the path alone when the request names no usable host.
fn results_url(state: &AppState, headers: &HeaderMap, id: &str) -> String {
    let path = format!("/v1/messages/batches/{id}/results");
    let header = |name: &str| {
        let v = headers.get(name)?.to_str().ok()?;
        Some(v.split(',').next()?.trim().to_string()).filter(|v| !v.is_empty())
    };
    let host = header("x-forwarded-host")
        .or_else(|| header(header::HOST.as_str()))
        .filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
        });
    let Some(host) = host else {
        return path;
    };
    let scheme = match header("x-forwarded-proto").as_deref() {
        Some("https") => "https",
        Some("http") => "http",
        _ if state.cfg().tls.is_some() => "https",
        _ => "http",
    };
    format!("{scheme}://{host}{path}")
}

/// A batch's object as this request sees it.
fn object(state: &AppState, headers: &HeaderMap, batch: &Batch) -> Value {
    batch.message_object(&results_url(state, headers, &batch.id))
}

/// `GET /v1/messages/batches/{id}`: a Message Batch as it is now.
pub async fn retrieve(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    find(&state, &id)
        .map(|b| json_response(&object(&state, &headers, &b)))
        .unwrap_or_else(error_response)
}

/// `POST /v1/messages/batches/{id}/cancel`: start no more of its requests; the batch,
/// `canceling` (it ends once the requests running finish; those not started are `canceled`),
/// or again as it is when it was canceled already.
pub async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let cancelled = (|| {
        let batch = find(&state, &id)?;
        // A canceled batch answers again; one that ended otherwise cannot be canceled.
        batch.cancel().map_err(|_| {
            ApiError::bad_request(format!(
                "message batch {id} has ended; only a batch still processing can be canceled"
            ))
        })?;
        batch.save(state.files().disk());
        Ok(json_response(&object(&state, &headers, &batch)))
    })();
    cancelled.unwrap_or_else(error_response)
}

/// `DELETE /v1/messages/batches/{id}`: forget an ended batch and its results.
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let deleted = async {
        let batch = find(&state, &id)?;
        if !batch.has_ended() {
            return Err(ApiError::bad_request(format!(
                "message batch {id} is still processing; cancel it (POST \
                 /v1/messages/batches/{id}/cancel) and delete it once it has ended"
            )));
        }
        let disk = state.files().disk();
        if state.batches().remove(&id, disk).is_some() {
            let keeper = state.clone();
            let files = batch.file_ids();
            // Removes files from server.files_dir: off the runtime's workers.
            tokio::task::spawn_blocking(move || {
                for file in files {
                    keeper.files().delete(&file);
                }
            })
            .await
            .map_err(|e| ApiError::internal(format!("deleting the batch's files failed: {e}")))?;
        }
        Ok(json_response(
            &json!({"id": id, "type": "message_batch_deleted"}),
        ))
    };
    deleted.await.unwrap_or_else(error_response)
}

/// `GET /v1/messages/batches/{id}/results`: one JSONL line per request, in request order.
pub async fn results_file(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let read = async {
        let batch = find(&state, &id)?;
        let reader = state.clone();
        let jsonl = tokio::task::spawn_blocking(move || results(&reader, &batch))
            .await
            .map_err(|e| ApiError::internal(format!("reading the results failed: {e}")))?
            .map_err(|e| match e {
                ResultsError::NotEnded(_) => ApiError::bad_request(e.to_string()),
                ResultsError::Unreadable { .. } => ApiError::internal(e.to_string()),
            })?;
        Ok(([(header::CONTENT_TYPE, "application/x-jsonl")], jsonl).into_response())
    };
    read.await.unwrap_or_else(error_response)
}

/// `GET /v1/messages/batches`: the Message Batches, newest first (`limit` 1 to 1000, default
/// 20; `after_id` for the page after an id, `before_id` for the page before one).
pub async fn list(State(state): State<AppState>, headers: HeaderMap, uri: Uri) -> Response {
    let listed = (|| {
        files_on(&state)?;
        let (mut limit, mut after, mut before) = (20usize, None, None);
        for (key, value) in query_pairs(&uri)? {
            match key.as_str() {
                "limit" => {
                    limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| {
                            ApiError::bad_param(
                                "limit",
                                format!("limit must be 1 to 1000, not {value:?}"),
                            )
                        })?;
                }
                "after_id" => after = Some(value),
                "before_id" => before = Some(value),
                k => {
                    return Err(ApiError::bad_param(
                        k,
                        format!("unknown query parameter {k:?}; use limit, after_id, before_id"),
                    ));
                }
            }
        }
        let mut all = state.batches().messages();
        all.reverse();
        let position = |param: &str, id: &str| {
            all.iter().position(|b| b.id == id).ok_or_else(|| {
                ApiError::bad_param(param, format!("no message batch {id} to list from"))
            })
        };
        let (start, end) = match (&after, &before) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "give after_id or before_id, not both",
                ));
            }
            (Some(a), None) => {
                let start = position("after_id", a)? + 1;
                (start, (start + limit).min(all.len()))
            }
            (None, Some(b)) => {
                let end = position("before_id", b)?;
                (end.saturating_sub(limit), end)
            }
            (None, None) => (0, limit.min(all.len())),
        };
        let has_more = if before.is_some() {
            start > 0
        } else {
            end < all.len()
        };
        let page: Vec<Value> = all[start..end]
            .iter()
            .map(|b| object(&state, &headers, b))
            .collect();
        Ok(json_response(&json!({
            "first_id": page.first().map(|b| b["id"].clone()),
            "last_id": page.last().map(|b| b["id"].clone()),
            "has_more": has_more,
            "data": page,
        })))
    })();
    listed.unwrap_or_else(error_response)
}

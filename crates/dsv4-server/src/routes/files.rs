//! OpenAI's Files API, for batches: `POST /v1/files` (multipart/form-data with `file` and
//! `purpose: "batch"`), `GET /v1/files` (`purpose`, `limit`, `order`, `after`), `GET
//! /v1/files/{id}`, `GET /v1/files/{id}/content` and `DELETE /v1/files/{id}`, over the
//! server's [`crate::files::FileStore`] (`server.files_mib`; 0 turns them off).

use super::json_response;
use super::page::Page;
use crate::api::common::{random_hex, unix_now};
use crate::error::ApiError;
use crate::files::{OUTPUT_PURPOSE, StoredFile, UPLOAD_PURPOSE};
use crate::state::AppState;
use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::extract::{Multipart, Path, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;

/// 404 unless the Files and Batch APIs are on (`server.files_mib` > 0).
pub(crate) fn files_on(state: &AppState) -> Result<(), ApiError> {
    if state.files().enabled() {
        return Ok(());
    }
    Err(ApiError::not_found(
        "the Files and Batch APIs are off on this server (server.files_mib = 0)",
    ))
}

/// 404 naming the file.
pub(crate) fn no_file(id: &str, param: Option<&str>) -> ApiError {
    let e = ApiError::not_found(format!(
        "no file {id} on this server (GET /v1/files lists them)"
    ));
    match param {
        Some(p) => e.with_param(p),
        None => e,
    }
}

/// A malformed or oversized multipart body as a 400 or 413.
fn multipart_error(state: &AppState, e: &MultipartError) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::bad_request(format!(
                "the upload is larger than server.files_mib allows ({} bytes)",
                state.cfg().files_bytes
            ))
        }
        .with_code("request_too_large");
    }
    ApiError::bad_request(format!(
        "the multipart body cannot be read: {}",
        e.body_text()
    ))
}

/// `POST /v1/files`: keep an uploaded batch input file; its file object.
pub async fn upload(
    State(state): State<AppState>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    files_on(&state)?;
    let mut form = multipart.map_err(|r| {
        ApiError::bad_request(format!(
            "POST /v1/files takes multipart/form-data with a `file` and a `purpose` field ({})",
            r.body_text()
        ))
    })?;
    let (mut file, mut purpose) = (None, None);
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| multipart_error(&state, &e))?
    {
        let name = field.name().unwrap_or_default().to_string();
        if (name == "file" && file.is_some()) || (name == "purpose" && purpose.is_some()) {
            return Err(ApiError::bad_param(
                name.as_str(),
                format!("the upload has two `{name}` fields; send one file per upload"),
            ));
        }
        match name.as_str() {
            "file" => {
                let filename = field.file_name().unwrap_or("upload.jsonl").to_string();
                let bytes = field
                    .bytes()
                    .await
                    .map_err(|e| multipart_error(&state, &e))?;
                file = Some((filename, bytes));
            }
            "purpose" => {
                purpose = Some(
                    field
                        .text()
                        .await
                        .map_err(|e| multipart_error(&state, &e))?,
                );
            }
            other => {
                return Err(ApiError::bad_param(
                    other,
                    format!(
                        "`{other}` is not a field of a file upload, which takes `file` and `purpose`"
                    ),
                ));
            }
        }
    }
    match purpose.as_deref() {
        Some(UPLOAD_PURPOSE) => {}
        Some(other) => {
            return Err(ApiError::bad_param(
                "purpose",
                format!(
                    "this server keeps files for batches only: purpose must be \"batch\", not \
                     {other:?}"
                ),
            ));
        }
        None => {
            return Err(ApiError::bad_param(
                "purpose",
                "the upload has no `purpose` field; send purpose=batch",
            ));
        }
    }
    let Some((filename, bytes)) = file else {
        return Err(ApiError::bad_param(
            "file",
            "the upload has no `file` field; send the JSONL file as `file`",
        ));
    };
    if bytes.is_empty() {
        return Err(ApiError::bad_param("file", "the uploaded file is empty"));
    }
    let id = format!("file-{}", random_hex(state.next_serial()));
    let keeper = state.clone();
    // With server.files_dir the upload is written to disk: off the runtime's workers.
    let stored =
        tokio::task::spawn_blocking(move || keeper.files().upload(id, filename, bytes, unix_now()))
            .await
            .map_err(|e| ApiError::internal(format!("storing the upload failed: {e}")))??;
    Ok(json_response(&stored.object()))
}

/// `GET /v1/files`: the files, newest first (`purpose`, `limit` up to 10,000, `order`,
/// `after`).
pub async fn list(State(state): State<AppState>, uri: Uri) -> Result<Response, ApiError> {
    files_on(&state)?;
    let mut purpose = None;
    let page = Page::from_query(
        &uri,
        (10_000, 10_000),
        false,
        "purpose, limit, order and after",
        |k, v| {
            if k != "purpose" {
                return Ok(false);
            }
            purpose = Some(match v {
                UPLOAD_PURPOSE => UPLOAD_PURPOSE,
                OUTPUT_PURPOSE => OUTPUT_PURPOSE,
                other => {
                    return Err(ApiError::bad_param(
                        "purpose",
                        format!("purpose must be batch or batch_output, not {other:?}"),
                    ));
                }
            });
            Ok(true)
        },
    )?;
    let files: Vec<Arc<StoredFile>> = state.files().all(purpose);
    Ok(json_response(&page.list(
        &files,
        |f| f.object(),
        |a| format!("no file {a} to list after"),
    )?))
}

/// The stored file `id`, or 404.
fn find(state: &AppState, id: &str) -> Result<Arc<StoredFile>, ApiError> {
    files_on(state)?;
    state.files().get(id).ok_or_else(|| no_file(id, None))
}

/// `GET /v1/files/{id}`: a file's object.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json_response(&find(&state, &id)?.object()))
}

/// `GET /v1/files/{id}/content`: a file's bytes.
pub async fn content(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let file = find(&state, &id)?;
    let bytes = tokio::task::spawn_blocking(move || file.content.read())
        .await
        .map_err(|e| ApiError::internal(format!("reading file {id} failed: {e}")))?
        .map_err(|e| ApiError::internal(format!("file {id} cannot be read: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// `DELETE /v1/files/{id}`: forget a file (a batch already reading it keeps its copy).
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    files_on(&state)?;
    if !state.files().delete(&id) {
        return Err(no_file(&id, None));
    }
    Ok(json_response(
        &json!({"id": id, "object": "file", "deleted": true}),
    ))
}

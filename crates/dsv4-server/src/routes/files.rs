//! OpenAI's Files API, for batches: `POST /v1/files` (multipart/form-data with `file`,
//! `purpose: "batch"` and optionally `expires_after[anchor]`/`expires_after[seconds]`), `GET
//! /v1/files` (`purpose`, `limit`, `order`, `after`), `GET /v1/files/{id}`, `GET
//! /v1/files/{id}/content` and `DELETE /v1/files/{id}`, over the server's
//! [`crate::files::FileStore`] (`server.files_mib`; 0 turns them off).

use super::json_response;
use super::page::Page;
use crate::api::common::{random_hex, unix_now};
use crate::error::ApiError;
use crate::files::{FileInfo, OUTPUT_PURPOSE, StoredFile, UPLOAD_PURPOSE, is_public};
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

/// OpenAI's bounds on an expiry's `seconds`: an hour to 30 days.
const EXPIRY_SECONDS: std::ops::RangeInclusive<u64> = 3600..=2_592_000;

/// The seconds after its creation that a file lives, from an `expires_after` (`param`: the
/// field's name, `expires_after` or `output_expires_after`): anchor `created_at`, seconds from
/// 3600 to 2592000, as OpenAI takes it.
pub(crate) fn expiry(
    param: &str,
    anchor: Option<&str>,
    seconds: Option<u64>,
) -> Result<u64, ApiError> {
    match anchor {
        Some("created_at") => {}
        Some(other) => {
            return Err(ApiError::bad_param(
                format!("{param}.anchor"),
                format!("{param}.anchor must be \"created_at\", not {other:?}"),
            ));
        }
        None => {
            return Err(ApiError::bad_param(
                format!("{param}.anchor"),
                format!("{param} needs an anchor, \"created_at\""),
            ));
        }
    }
    match seconds {
        Some(s) if EXPIRY_SECONDS.contains(&s) => Ok(s),
        Some(s) => Err(ApiError::bad_param(
            format!("{param}.seconds"),
            format!(
                "{param}.seconds must be from {} (an hour) to {} (30 days), not {s}",
                EXPIRY_SECONDS.start(),
                EXPIRY_SECONDS.end()
            ),
        )),
        None => Err(ApiError::bad_param(
            format!("{param}.seconds"),
            format!("{param} needs seconds, from 3600 to 2592000"),
        )),
    }
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

/// 413: `what` (an upload, a message batch) is larger than the files budget allows.
pub(crate) fn over_files_budget(state: &AppState, what: &str) -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        ..ApiError::bad_request(format!(
            "{what} is larger than server.files_mib allows ({} bytes)",
            state.cfg().files_bytes
        ))
    }
    .with_code("request_too_large")
}

/// A malformed or oversized multipart body as a 400 or 413.
fn multipart_error(state: &AppState, e: &MultipartError) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return over_files_budget(state, "the upload");
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
    let (mut anchor, mut seconds) = (None, None);
    let mut seen = std::collections::HashSet::new();
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| multipart_error(&state, &e))?
    {
        let name = field.name().unwrap_or_default().to_string();
        if !seen.insert(name.clone()) {
            return Err(ApiError::bad_param(
                name.as_str(),
                format!("the upload has two `{name}` fields; send each field once"),
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
            "expires_after[anchor]" | "expires_after[seconds]" => {
                let text = field
                    .text()
                    .await
                    .map_err(|e| multipart_error(&state, &e))?;
                if name.ends_with("[anchor]") {
                    anchor = Some(text);
                } else {
                    seconds = Some(text.trim().parse::<u64>().map_err(|_| {
                        ApiError::bad_param(
                            "expires_after.seconds",
                            format!("expires_after[seconds] must be a whole number of seconds, not {text:?}"),
                        )
                    })?);
                }
            }
            other => {
                return Err(ApiError::bad_param(
                    other,
                    format!(
                        "`{other}` is not a field of a file upload, which takes `file`, `purpose` \
                         and `expires_after[anchor]`/`expires_after[seconds]`"
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
    let lives = match (anchor, seconds) {
        (None, None) => None,
        (anchor, seconds) => Some(expiry("expires_after", anchor.as_deref(), seconds)?),
    };
    let created_at = unix_now();
    let info = FileInfo {
        id: format!("file-{}", random_hex(state.next_serial())),
        filename,
        created_at,
        expires_at: lives.map(|s| created_at + s),
    };
    let keeper = state.clone();
    // With server.files_dir the upload is written to disk: off the runtime's workers.
    let stored = tokio::task::spawn_blocking(move || keeper.files().upload(info, bytes))
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
    let mut files: Vec<Arc<StoredFile>> = state.files().all(purpose);
    files.retain(|f| is_public(f.purpose));
    Ok(json_response(&page.list(
        &files,
        |f| f.object(),
        |a| format!("no file {a} to list after"),
    )?))
}

/// The stored file `id`, or 404 (a Message Batch's own files are not the Files API's).
fn find(state: &AppState, id: &str) -> Result<Arc<StoredFile>, ApiError> {
    files_on(state)?;
    state
        .files()
        .get(id)
        .filter(|f| is_public(f.purpose))
        .ok_or_else(|| no_file(id, None))
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
    find(&state, &id)?;
    if !state.files().delete(&id) {
        return Err(no_file(&id, None));
    }
    Ok(json_response(
        &json!({"id": id, "object": "file", "deleted": true}),
    ))
}

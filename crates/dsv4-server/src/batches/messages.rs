//! Anthropic's Message Batches (`/v1/messages/batches`) on the batch machinery: a Message
//! Batch is a batch whose input file the server writes from the request's `requests` (one
//! line per request to [`MESSAGES_ENDPOINT`], purpose [`MESSAGE_INPUT_PURPOSE`]), so it shares
//! the batches' limit of requests in flight, their cancel, their 24 h window and, with
//! `server.files_dir`, their going on after a restart. What differs is only how it is shown:
//! Anthropic's `message_batch` object ([`Batch::message_object`]) and its results JSONL
//! ([`results`]), read from the batch's output and error files.

use super::{Batch, BatchStore, NewBatch, Record, Status, WINDOW_S};
use crate::batch::{self, MESSAGES_ENDPOINT};
use crate::files::{MESSAGE_INPUT_PURPOSE, StoredFile};
use crate::routes::messages::error_type;
use crate::state::AppState;
use axum::http::StatusCode;
use dsv4_core::time::rfc3339;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

/// The input file of a Message Batch: one batch line per `(custom_id, params)`, in order.
pub fn input_jsonl(requests: &[(String, Value)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (custom_id, params) in requests {
        let line = json!({"custom_id": custom_id, "method": "POST",
            "url": MESSAGES_ENDPOINT, "body": params});
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

impl BatchStore {
    /// Start a Message Batch of `total` requests over `input` (written by [`input_jsonl`],
    /// kept with [`MESSAGE_INPUT_PURPOSE`]) on `state`, whose model is loaded.
    pub fn start_messages(
        &self,
        state: &AppState,
        input: Arc<StoredFile>,
        total: usize,
    ) -> Arc<Batch> {
        debug_assert_eq!(input.purpose, MESSAGE_INPUT_PURPOSE);
        let asked = NewBatch {
            input_file_id: input.id.clone(),
            endpoint: MESSAGES_ENDPOINT.to_string(),
            completion_window: "24h".to_string(),
            metadata: Value::Null,
            model: state.cfg().model_id.clone(),
            output_expires_after: None,
        };
        let batch = self.start(state, asked, input);
        // Its requests count as processing from the start (its task sets the same total).
        batch.update(|r| r.counts.total = r.counts.total.max(total));
        batch
    }

    /// The Message Batches, oldest first.
    pub fn messages(&self) -> Vec<Arc<Batch>> {
        self.all().into_iter().filter(|b| b.is_messages()).collect()
    }

    /// The OpenAI batches (not Message Batches), oldest first.
    pub fn openai(&self) -> Vec<Arc<Batch>> {
        self.all()
            .into_iter()
            .filter(|b| !b.is_messages())
            .collect()
    }
}

/// Anthropic's `processing_status` of a batch status.
fn processing_status(status: Status) -> &'static str {
    match status {
        Status::Cancelling => "canceling",
        s if s.is_final() => "ended",
        _ => "in_progress",
    }
}

/// Anthropic's `request_counts`: every request `processing` until the batch ends, then each in
/// the bucket of its result (as Anthropic counts them).
fn request_counts(r: &Record) -> Value {
    let c = &r.counts;
    if !r.status.is_final() {
        return json!({"processing": c.total, "succeeded": 0, "errored": 0, "canceled": 0,
            "expired": 0});
    }
    if r.status == Status::Failed {
        // Its output was not kept: every request errored with it (as its results say).
        return json!({"processing": 0, "succeeded": 0, "errored": c.total, "canceled": 0,
            "expired": 0});
    }
    let (succeeded, errored) = (c.succeeded, c.failed.saturating_sub(r.expired_lines));
    // Requests not started when it was canceled.
    let canceled = c.total.saturating_sub(c.done);
    json!({"processing": 0, "succeeded": succeeded, "errored": errored, "canceled": canceled,
        "expired": r.expired_lines})
}

/// Unix seconds as RFC 3339 (Anthropic's times are strings).
fn at(seconds: u64) -> String {
    rfc3339(i64::try_from(seconds).unwrap_or(i64::MAX))
}

impl Batch {
    /// Anthropic's `message_batch` object; `results_url` is where its results are read, shown
    /// once it has ended.
    pub fn message_object(&self, results_url: &str) -> Value {
        let r = self.record();
        let ended = r.status.is_final();
        let ended_at = ended.then(|| {
            r.completed_at
                .or(r.cancelled_at)
                .or(r.failed_at)
                .or(r.finalizing_at)
                .or(r.expired_at)
                .unwrap_or(self.created_at)
        });
        json!({
            "id": self.id,
            "type": "message_batch",
            "processing_status": processing_status(r.status),
            "request_counts": request_counts(&r),
            "ended_at": ended_at.map(at),
            "created_at": at(self.created_at),
            "expires_at": at(self.created_at + WINDOW_S),
            "archived_at": null,
            "cancel_initiated_at": r.cancelling_at.map(at),
            "results_url": ended.then_some(results_url),
        })
    }

    /// Whether it has ended (its results can be read, and it can be deleted).
    pub fn has_ended(&self) -> bool {
        self.status().is_final()
    }

    /// The ids of its files: input, and output and error when it has them.
    pub fn file_ids(&self) -> Vec<String> {
        let r = self.record();
        std::iter::once(self.asked.input_file_id.clone())
            .chain(r.output_file_id)
            .chain(r.error_file_id)
            .collect()
    }
}

/// An errored result with Anthropic's error response of `kind` and `message`.
fn errored(kind: &str, message: &str) -> Value {
    json!({"type": "errored", "error": {"type": "error",
        "error": {"type": kind, "message": message}}})
}

/// The `result` of one output or error line of the batch (OpenAI's line shape).
fn result_of(line: &Value) -> Value {
    let response = &line["response"];
    if response.is_object() {
        let body = &response["body"];
        let status = response["status_code"]
            .as_u64()
            .and_then(|s| StatusCode::from_u16(s as u16).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status == StatusCode::OK {
            return json!({"type": "succeeded", "message": body});
        }
        if body["type"] == "error" && body["error"].is_object() {
            return json!({"type": "errored", "error": body});
        }
        let message = body["error"]["message"]
            .as_str()
            .map_or_else(|| body.to_string(), str::to_string);
        return errored(error_type(status), &message);
    }
    let error = &line["error"];
    if error["code"] == "batch_expired" {
        return json!({"type": "expired"});
    }
    let kind = if error["code"] == "internal_error" {
        "api_error"
    } else {
        "invalid_request_error"
    };
    let message = error["message"]
        .as_str()
        .unwrap_or("the request could not run");
    // The batch's file has one line per request: name the request, not the line.
    let message = match error["line"].as_u64() {
        Some(n) if n > 0 => match message.strip_prefix(&format!("line {n}: ")) {
            Some(rest) => format!("requests.{}: {rest}", n - 1),
            None => message.to_string(),
        },
        _ => message.to_string(),
    };
    errored(kind, &message)
}

/// Why results cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// It has not ended.
    #[error(
        "message batch {0} is still processing; its results are ready once processing_status is \"ended\""
    )]
    NotEnded(String),
    /// A file of it is gone or cannot be read.
    #[error("the results of message batch {id} cannot be read: {why}")]
    Unreadable {
        /// The batch.
        id: String,
        /// What failed.
        why: String,
    },
}

/// A Message Batch's results JSONL, one `{"custom_id", "result"}` line per request in request
/// order: `succeeded` with the message, `errored` with Anthropic's error response, `canceled`
/// (not started when it was cancelled), `expired` (not started within its 24 h). Reads files:
/// call off the runtime's workers.
pub fn results(state: &AppState, batch: &Batch) -> Result<Vec<u8>, ResultsError> {
    let r = batch.record();
    if !r.status.is_final() {
        return Err(ResultsError::NotEnded(batch.id.clone()));
    }
    let unreadable = |why: String| ResultsError::Unreadable {
        id: batch.id.clone(),
        why,
    };
    let read = |id: &str| -> Result<String, ResultsError> {
        let file = state
            .files()
            .get(id)
            .ok_or_else(|| unreadable(format!("its file {id} is gone")))?;
        let bytes = file
            .content
            .read()
            .map_err(|e| unreadable(format!("its file {id}: {e}")))?;
        String::from_utf8(bytes.to_vec()).map_err(|e| unreadable(format!("its file {id}: {e}")))
    };
    let input = read(&batch.asked.input_file_id)?;
    let items = batch::parse(&input, &batch.asked.model, Some(MESSAGES_ENDPOINT))
        .map_err(|e| unreadable(e.to_string()))?;
    let mut answered: HashMap<String, Value> = HashMap::new();
    for id in [&r.output_file_id, &r.error_file_id].into_iter().flatten() {
        for raw in read(id)?.lines().filter(|l| !l.trim().is_empty()) {
            let line: Value = serde_json::from_str(raw)
                .map_err(|e| unreadable(format!("a line of its file {id}: {e}")))?;
            if let Some(custom_id) = line["custom_id"].as_str() {
                answered.insert(custom_id.to_string(), result_of(&line));
            }
        }
    }
    let failure = r.errors.first().and_then(|e| e["message"].as_str());
    let mut out = Vec::new();
    for custom_id in items.into_iter().filter_map(|i| i.custom_id) {
        let result = answered
            .remove(&custom_id)
            .unwrap_or_else(|| match failure {
                Some(why) => errored("api_error", why),
                None => json!({"type": "canceled"}),
            });
        let line = json!({"custom_id": custom_id, "result": result});
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Summary;

    #[test]
    fn output_lines_become_anthropic_results() {
        let ok = json!({"custom_id": "a", "response": {"status_code": 200,
            "body": {"type": "message", "id": "msg_1"}}, "error": null});
        assert_eq!(
            result_of(&ok),
            json!({"type": "succeeded", "message": {"type": "message", "id": "msg_1"}})
        );
        let refused = json!({"custom_id": "b", "response": {"status_code": 404, "body":
            {"type": "error", "error": {"type": "not_found_error", "message": "no model"}}}});
        assert_eq!(
            result_of(&refused)["error"]["error"]["type"],
            "not_found_error"
        );
        assert_eq!(result_of(&refused)["type"], "errored");
        // An OpenAI-shaped body (a middleware's) still reads as Anthropic's error.
        let openai = json!({"response": {"status_code": 503,
            "body": {"error": {"message": "loading"}}}});
        assert_eq!(
            result_of(&openai),
            errored("overloaded_error", "loading"),
            "{openai}"
        );
        let unsent = json!({"response": null, "error": {"code": "invalid_request",
            "message": "line 2: `stream: true` is not supported in a batch", "line": 2}});
        assert_eq!(
            result_of(&unsent),
            errored(
                "invalid_request_error",
                "requests.1: `stream: true` is not supported in a batch"
            )
        );
        let late = json!({"response": null, "error": {"code": "batch_expired", "message": "x"}});
        assert_eq!(result_of(&late), json!({"type": "expired"}));
    }

    #[test]
    fn requests_stay_processing_until_the_batch_ends() {
        let mut r = Record::new();
        r.status = Status::InProgress;
        r.counts = Summary {
            total: 5,
            done: 3,
            succeeded: 2,
            failed: 1,
            ..Summary::default()
        };
        assert_eq!(request_counts(&r)["processing"], 5);
        assert_eq!(request_counts(&r)["succeeded"], 0);
        r.status = Status::Cancelled;
        assert_eq!(
            request_counts(&r),
            json!({"processing": 0, "succeeded": 2, "errored": 1, "canceled": 2, "expired": 0})
        );
        r.status = Status::Expired;
        r.counts.done = 5;
        r.counts.failed = 3;
        r.expired_lines = 2;
        assert_eq!(
            request_counts(&r),
            json!({"processing": 0, "succeeded": 2, "errored": 1, "canceled": 0, "expired": 2})
        );
        r.status = Status::Failed;
        assert_eq!(
            request_counts(&r),
            json!({"processing": 0, "succeeded": 0, "errored": 5, "canceled": 0, "expired": 0})
        );
        assert_eq!(processing_status(Status::Cancelling), "canceling");
        assert_eq!(processing_status(Status::Finalizing), "in_progress");
        assert_eq!(processing_status(Status::Expired), "ended");
    }
}

//! OpenAI's Batch API files run through the server's own routes, in process (`dsv4 run-batch`,
//! as vLLM's `run-batch`).
//!
//! The input is JSONL, one request per line: `{"custom_id", "method": "POST", "url", "body"}`
//! with `url` one of [`ENDPOINTS`]. Each body goes through [`crate::router`] exactly as an HTTP
//! request would (same parsing, constrained decoding, stop strings, errors), as many at once as
//! [`Options::share`] allows, so the engine batches them. The output is one line per input
//! line, in input order: `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
//! "error": null}`. A line that cannot be sent at all (not JSON, a field missing, another URL or
//! method, `stream` or `background` set) gets `"response": null` and `"error": {"code",
//! "message", "line"}` instead; a request the route refuses keeps its status and error body in
//! `response`, as OpenAI writes it.
//!
//! Each line's request runs at [`LINE_PRIORITY`] unless its body sets a `priority` the server
//! takes ([`BatchLine`]), so interactive requests beside a batch are admitted first.
//!
//! What would spoil the whole run is refused before anything runs ([`BatchFileError`], read by
//! [`parse`] in `file.rs`): an empty file, a repeated `custom_id`, a `model` this run does not
//! serve, a line to another endpoint than a `/v1/batches` batch's.

mod file;
mod share;

pub use file::{BatchFileError, Call, ENDPOINTS, Item, MESSAGES_ENDPOINT, parse};
pub use share::{Activity, Interactive, Share};

use crate::routes::router;
use crate::state::AppState;
use axum::body::Body;
use axum::http::{Request, header};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tower::ServiceExt;

/// The `priority` a batch line's request gets unless its body sets one: below interactive
/// requests (0 by default), so they are admitted ahead of the batch's waiting lines.
pub const LINE_PRIORITY: i32 = -1;

/// Marks the request of a batch line, sent through the routes in process: a request
/// extension, so no client can claim it. Such a request runs at [`LINE_PRIORITY`] unless it
/// asks for another priority and the server takes it (`server.request_priority`).
#[derive(Debug, Clone, Copy)]
pub struct BatchLine;

/// How a batch runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// One permit per request in flight (the engine batches them); batches that share it
    /// share its limit.
    pub share: Arc<Share>,
    /// Prefix of the output lines' `id`s (`{prefix}_{line}`), unique per run.
    pub id_prefix: String,
    /// Once it turns true no further line starts; the lines in flight finish and are written.
    pub cancel: Option<watch::Receiver<bool>>,
}

impl Options {
    /// Up to `concurrency` requests at once (at least 1), not cancellable.
    pub fn new(concurrency: usize, id_prefix: impl Into<String>) -> Self {
        Self {
            share: Arc::new(Share::fixed(concurrency)),
            id_prefix: id_prefix.into(),
            cancel: None,
        }
    }
}

/// Resolves once `cancel` turns true; never when there is none or its sender is gone.
async fn cancelled(cancel: Option<watch::Receiver<bool>>) {
    if let Some(mut c) = cancel
        && c.wait_for(|v| *v).await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Counts of a run so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Lines in the file.
    pub total: usize,
    /// Lines answered so far (written or waiting for an earlier line).
    pub done: usize,
    /// Of those, lines whose request answered 200.
    pub succeeded: usize,
    /// Of those, lines that could not be sent or whose request the route refused.
    pub failed: usize,
    /// Tokens of the lines that succeeded.
    pub tokens: Tokens,
}

impl std::ops::Add for Summary {
    type Output = Summary;

    /// The counts of two runs of one file's lines, one after the other.
    fn add(mut self, s: Summary) -> Summary {
        self.total += s.total;
        self.done += s.done;
        self.succeeded += s.succeeded;
        self.failed += s.failed;
        self.tokens += s.tokens;
        self
    }
}

/// Tokens the answered lines report in their `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt tokens (`prompt_tokens`, or `input_tokens` of a response).
    pub input: u64,
    /// Of those, tokens the prefix cache had (`cached_tokens`).
    pub cached: u64,
    /// Generated tokens (`completion_tokens`, or `output_tokens`).
    pub output: u64,
    /// Of those, reasoning tokens (`reasoning_tokens`).
    pub reasoning: u64,
}

impl std::ops::AddAssign for Tokens {
    fn add_assign(&mut self, t: Tokens) {
        self.input += t.input;
        self.cached += t.cached;
        self.output += t.output;
        self.reasoning += t.reasoning;
    }
}

impl Tokens {
    /// The usage of an answer body: chat and completions (`prompt_tokens`, `completion_tokens`,
    /// `prompt_tokens_details.cached_tokens`) or the Responses API (`input_tokens`,
    /// `output_tokens`, `input_tokens_details.cached_tokens`); zeros where it has none.
    pub fn of(body: &Value) -> Self {
        let usage = &body["usage"];
        let n = |a: &str, b: &str| usage[a].as_u64().or_else(|| usage[b].as_u64()).unwrap_or(0);
        let detail = |a: &str, b: &str, field: &str| {
            usage[a][field]
                .as_u64()
                .or_else(|| usage[b][field].as_u64())
                .unwrap_or(0)
        };
        Self {
            input: n("prompt_tokens", "input_tokens"),
            cached: detail(
                "prompt_tokens_details",
                "input_tokens_details",
                "cached_tokens",
            ),
            output: n("completion_tokens", "output_tokens"),
            reasoning: detail(
                "completion_tokens_details",
                "output_tokens_details",
                "reasoning_tokens",
            ),
        }
    }

    /// OpenAI's batch `usage` object.
    pub fn usage(&self) -> Value {
        json!({
            "input_tokens": self.input,
            "input_tokens_details": {"cached_tokens": self.cached},
            "output_tokens": self.output,
            "output_tokens_details": {"reasoning_tokens": self.reasoning},
            "total_tokens": self.input + self.output,
        })
    }
}

/// Where output lines go: every line to `output`, or failed ones to `errors` when given (as
/// OpenAI splits a batch's output and error files).
pub struct Sinks<'a> {
    /// Successful lines (and failed ones when `errors` is `None`).
    pub output: &'a mut (dyn Write + Send),
    /// Failed lines, when they go to a file of their own.
    pub errors: Option<&'a mut (dyn Write + Send)>,
}

/// Run `items` through the routes of `state` (which must be ready), writing one output line per
/// item in input order, and call `progress` after each answer. With [`Options::cancel`], the
/// lines started before it are written and the rest are not. An I/O error writing the output
/// stops the run.
pub async fn run(
    state: &AppState,
    items: Vec<Item>,
    opts: &Options,
    sinks: Sinks<'_>,
    mut progress: impl FnMut(&Summary),
) -> std::io::Result<Summary> {
    let Sinks { output, mut errors } = sinks;
    let app = router(state.clone());
    let key = state.cfg().api_key.clone();
    let share = opts.share.clone();
    let cancel = opts.cancel.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, bool, Value)>();
    let mut summary = Summary {
        total: items.len(),
        ..Summary::default()
    };
    let _feeder = AbortOnDrop({
        let prefix = opts.id_prefix.clone();
        tokio::spawn(async move {
            for (index, item) in items.into_iter().enumerate() {
                if cancel.as_ref().is_some_and(|c| *c.borrow()) {
                    return;
                }
                let permit = tokio::select! {
                    biased;
                    () = cancelled(cancel.clone()) => return,
                    p = share.acquire() => p,
                };
                let (app, key, tx, prefix) = (app.clone(), key.clone(), tx.clone(), prefix.clone());
                tokio::spawn(async move {
                    let (ok, out) = answer(app, key.as_deref(), &prefix, item).await;
                    drop(permit);
                    // The receiver is gone only when writing failed; the run is over then.
                    let _ = tx.send((index, ok, out));
                });
            }
        })
    });
    let mut pending: BTreeMap<usize, (bool, Value)> = BTreeMap::new();
    let mut next = 0;
    while let Some((index, ok, out)) = rx.recv().await {
        summary.done += 1;
        if ok {
            summary.succeeded += 1;
            summary.tokens += Tokens::of(&out["response"]["body"]);
        } else {
            summary.failed += 1;
        }
        pending.insert(index, (ok, out));
        let written = next;
        while let Some((ok, out)) = pending.remove(&next) {
            let sink: &mut (dyn Write + Send) = match (&mut errors, ok) {
                (Some(e), false) => &mut **e,
                _ => &mut *output,
            };
            serde_json::to_writer(&mut *sink, &out)?;
            sink.write_all(b"\n")?;
            next += 1;
        }
        if next > written {
            // The finished prefix is on disk even if the run is killed.
            output.flush()?;
            if let Some(e) = errors.as_mut() {
                e.flush()?;
            }
        }
        progress(&summary);
    }
    output.flush()?;
    if let Some(e) = errors {
        e.flush()?;
    }
    Ok(summary)
}

/// Aborts its task when dropped (the task that starts requests, when the run ends however it
/// ends; a batch's expiry timer).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The output line of one item, and whether its request answered 200.
async fn answer(app: axum::Router, key: Option<&str>, prefix: &str, item: Item) -> (bool, Value) {
    let id = format!("{prefix}_{}", item.line);
    let call = match item.call {
        Ok(call) => call,
        Err((code, message)) => {
            let error = json!({"code": code, "message": message, "line": item.line});
            return (false, line_json(&id, &item.custom_id, Value::Null, error));
        }
    };
    let mut req = Request::post(call.url.as_str())
        .header(header::CONTENT_TYPE, "application/json")
        .extension(BatchLine);
    if let Some(key) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let sent = req
        .body(Body::from(call.body.to_string()))
        .expect("a POST to a fixed route with a JSON body is a valid request");
    let response = match app.oneshot(sent).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let status = response.status().as_u16();
    let body = match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(bytes) => serde_json::from_slice::<Value>(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) => {
            let error = json!({
                "code": "internal_error",
                "message": format!("line {}: the answer could not be read: {e}", item.line),
                "line": item.line,
            });
            return (false, line_json(&id, &item.custom_id, Value::Null, error));
        }
    };
    let request_id = body
        .get("id")
        .and_then(Value::as_str)
        .map_or_else(|| id.clone(), str::to_string);
    let response = json!({"status_code": status, "request_id": request_id, "body": body});
    (
        status == 200,
        line_json(&id, &item.custom_id, response, Value::Null),
    )
}

/// An output line in OpenAI's batch output format.
pub(crate) fn line_json(
    id: &str,
    custom_id: &Option<String>,
    response: Value,
    error: Value,
) -> Value {
    json!({"id": id, "custom_id": custom_id, "response": response, "error": error})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_read_both_usage_shapes() {
        let chat = json!({"usage": {"prompt_tokens": 9, "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 3}}});
        let response = json!({"usage": {"input_tokens": 7, "output_tokens": 5,
            "input_tokens_details": {}, "output_tokens_details": {"reasoning_tokens": 2}}});
        let t = |v: &Value| Tokens::of(v);
        assert_eq!(
            t(&chat),
            Tokens {
                input: 9,
                cached: 3,
                output: 4,
                reasoning: 0
            }
        );
        assert_eq!(
            t(&response),
            Tokens {
                input: 7,
                cached: 0,
                output: 5,
                reasoning: 2
            }
        );
        assert_eq!(t(&json!({"error": {}})), Tokens::default());
        assert_eq!(t(&response).usage()["total_tokens"], 12);
    }
}

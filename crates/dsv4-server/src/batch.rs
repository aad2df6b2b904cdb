//! OpenAI's Batch API files run through the server's own routes, in process (`dsv4 run-batch`,
//! as vLLM's `run-batch`).
//!
//! The input is JSONL, one request per line: `{"custom_id", "method": "POST", "url", "body"}`
//! with `url` one of [`ENDPOINTS`]. Each body goes through [`crate::router`] exactly as an HTTP
//! request would (same parsing, constrained decoding, stop strings, errors), up to
//! [`Options::concurrency`] at once, so the engine batches them. The output is one line per input
//! line, in input order: `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
//! "error": null}`. A line that cannot be sent at all (not JSON, a field missing, another URL or
//! method, `stream` or `background` set) gets `"response": null` and `"error": {"code",
//! "message", "line"}` instead; a request the route refuses keeps its status and error body in
//! `response`, as OpenAI writes it.
//!
//! What would spoil the whole run is refused before anything runs ([`BatchFileError`]): an
//! empty file, a repeated `custom_id`, a `model` this run does not serve.

use crate::routes::router;
use crate::state::AppState;
use axum::body::Body;
use axum::http::{Request, header};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc, watch};
use tower::ServiceExt;

/// The routes a batch line may name (OpenAI's Batch API names these three for text models).
pub const ENDPOINTS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/responses"];

/// One input line as OpenAI's Batch API defines it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    custom_id: String,
    method: String,
    url: String,
    body: Value,
}

/// A request ready to send: where to and what.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The route, one of [`ENDPOINTS`].
    pub url: String,
    /// The JSON body, as the line gave it.
    pub body: Value,
}

/// One line of the input file.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// 1-based line number in the file.
    pub line: usize,
    /// The line's `custom_id` (`None` when the line is not a JSON object that has one).
    pub custom_id: Option<String>,
    /// The request, or why the line cannot be sent (`code`, `message`).
    pub call: Result<Call, (&'static str, String)>,
}

/// Why a batch file is refused before any request runs.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BatchFileError {
    /// No line has a request.
    #[error("the batch file has no requests (every line is empty)")]
    Empty,
    /// Two lines share a `custom_id`; outputs could not be told apart.
    #[error("custom_id `{id}` is on line {first} and line {again}; each request needs its own")]
    DuplicateId {
        /// The repeated id.
        id: String,
        /// Where it first appears.
        first: usize,
        /// Where it appears again.
        again: usize,
    },
    /// A line's URL is not the batch's endpoint (a `/v1/batches` batch names one).
    #[error(
        "line {line} goes to `{url}`, but the batch's endpoint is `{endpoint}`; every line of a batch goes to its endpoint"
    )]
    WrongEndpoint {
        /// The line.
        line: usize,
        /// Its URL.
        url: String,
        /// The batch's endpoint.
        endpoint: String,
    },
    /// A line asks for a model this run does not serve.
    #[error(
        "line {line} asks for model `{asked}`, but this run serves `{served}`; pass \
         --served-model-name {asked} to answer to that name"
    )]
    WrongModel {
        /// The first line that asks for it.
        line: usize,
        /// The model the line names.
        asked: String,
        /// The served model id.
        served: String,
    },
}

/// Read a batch file: one [`Item`] per non-empty line. Lines that cannot be sent become items
/// with an error; a file that cannot run at all is a [`BatchFileError`]. `served` is the model
/// id each body's `model` (when it has one) must name; `endpoint`, when given, the URL every
/// line must go to.
pub fn parse(
    text: &str,
    served: &str,
    endpoint: Option<&str>,
) -> Result<Vec<Item>, BatchFileError> {
    let mut items = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let item = parse_line(raw, line);
        if let Some(id) = &item.custom_id {
            if let Some(&first) = seen.get(id) {
                return Err(BatchFileError::DuplicateId {
                    id: id.clone(),
                    first,
                    again: line,
                });
            }
            seen.insert(id.clone(), line);
        }
        if let (Ok(call), Some(endpoint)) = (&item.call, endpoint)
            && call.url != endpoint
        {
            return Err(BatchFileError::WrongEndpoint {
                line,
                url: call.url.clone(),
                endpoint: endpoint.to_string(),
            });
        }
        if let Ok(call) = &item.call
            && let Some(asked) = call.body.get("model").and_then(Value::as_str)
            && asked != served
        {
            return Err(BatchFileError::WrongModel {
                line,
                asked: asked.to_string(),
                served: served.to_string(),
            });
        }
        items.push(item);
    }
    if items.is_empty() {
        return Err(BatchFileError::Empty);
    }
    Ok(items)
}

/// One line: its `custom_id` as far as it can be read, and the request or why it cannot run.
fn parse_line(raw: &str, line: usize) -> Item {
    let value: Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        Err(e) => {
            return Item {
                line,
                custom_id: None,
                call: Err(("invalid_json", format!("line {line} is not JSON: {e}"))),
            };
        }
    };
    let loose_id = value
        .get("custom_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    match serde_json::from_value::<Line>(value) {
        Ok(l) => Item {
            line,
            custom_id: Some(l.custom_id.clone()),
            call: check(l, line),
        },
        Err(e) => Item {
            line,
            custom_id: loose_id,
            call: Err((
                "invalid_request",
                format!(
                    "line {line} is not a batch request ({e}); a line is {{\"custom_id\": ID, \
                     \"method\": \"POST\", \"url\": URL, \"body\": {{…}}}}"
                ),
            )),
        },
    }
}

/// What a line may ask: POST to one of [`ENDPOINTS`] with an object body that neither streams
/// nor runs in the background (a batch writes each answer whole, then exits).
fn check(l: Line, line: usize) -> Result<Call, (&'static str, String)> {
    if l.method != "POST" {
        return Err((
            "invalid_method",
            format!(
                "line {line}: method `{}` is not supported; batch requests are POST",
                l.method
            ),
        ));
    }
    if !ENDPOINTS.contains(&l.url.as_str()) {
        return Err((
            "invalid_url",
            format!(
                "line {line}: url `{}` is not supported; a batch request goes to {}",
                l.url,
                ENDPOINTS.join(", ")
            ),
        ));
    }
    let Some(body) = l.body.as_object() else {
        return Err((
            "invalid_request",
            format!("line {line}: `body` must be a JSON object (the request's body)"),
        ));
    };
    for (field, why) in [
        ("stream", "a batch writes each answer whole"),
        ("background", "the batch runner exits when the file is done"),
    ] {
        if body.get(field) == Some(&Value::Bool(true)) {
            return Err((
                "invalid_request",
                format!("line {line}: `{field}: true` is not supported in a batch ({why})"),
            ));
        }
    }
    Ok(Call {
        url: l.url,
        body: l.body,
    })
}

/// How a batch runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// One permit per request in flight (the engine batches them); batches that share the
    /// semaphore share its limit.
    pub permits: Arc<Semaphore>,
    /// Prefix of the output lines' `id`s (`{prefix}_{line}`), unique per run.
    pub id_prefix: String,
    /// Once it turns true no further line starts; the lines in flight finish and are written.
    pub cancel: Option<watch::Receiver<bool>>,
}

impl Options {
    /// Up to `concurrency` requests at once (at least 1), not cancellable.
    pub fn new(concurrency: usize, id_prefix: impl Into<String>) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
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
    let permits = opts.permits.clone();
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
                    p = permits.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
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

/// Stops the task that starts requests when the run ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

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
    let mut req = Request::post(call.url.as_str()).header(header::CONTENT_TYPE, "application/json");
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
fn line_json(id: &str, custom_id: &Option<String>, response: Value, error: Value) -> Value {
    json!({"id": id, "custom_id": custom_id, "response": response, "error": error})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(custom_id: &str, url: &str, body: Value) -> String {
        json!({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).to_string()
    }

    #[test]
    fn lines_become_calls_and_blank_lines_are_skipped() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let text = format!(
            "{}\n\n   \n{}\n",
            line("a", "/v1/chat/completions", body.clone()),
            line("b", "/v1/completions", json!({"prompt": "x"}))
        );
        let items = parse(&text, "m", None).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].line, 1);
        assert_eq!(items[0].custom_id.as_deref(), Some("a"));
        assert_eq!(
            items[0].call,
            Ok(Call {
                url: "/v1/chat/completions".into(),
                body
            })
        );
        assert_eq!(items[1].line, 4);
    }

    #[test]
    fn lines_that_cannot_be_sent_say_why_and_keep_their_place() {
        let text = [
            "{not json".to_string(),
            json!({"custom_id": "m", "method": "GET", "url": "/v1/completions", "body": {}})
                .to_string(),
            line("u", "/v1/embeddings", json!({})),
            line("s", "/v1/completions", json!({"stream": true})),
            line("g", "/v1/responses", json!({"background": true})),
            line("o", "/v1/completions", json!("text")),
            json!({"custom_id": "x", "url": "/v1/completions", "body": {}}).to_string(),
            json!({"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": {}, "extra": 1})
                .to_string(),
            line("ok", "/v1/completions", json!({"stream": false})),
        ]
        .join("\n");
        let items = parse(&text, "m", None).unwrap();
        let codes: Vec<_> = items
            .iter()
            .map(|i| i.call.as_ref().err().map(|e| e.0))
            .collect();
        assert_eq!(
            codes,
            [
                Some("invalid_json"),
                Some("invalid_method"),
                Some("invalid_url"),
                Some("invalid_request"),
                Some("invalid_request"),
                Some("invalid_request"),
                Some("invalid_request"),
                Some("invalid_request"),
                None
            ]
        );
        let message = |k: usize| items[k].call.as_ref().unwrap_err().1.clone();
        assert!(
            message(2).contains("/v1/chat/completions"),
            "{}",
            message(2)
        );
        assert!(message(3).contains("`stream: true`"), "{}", message(3));
        assert!(message(6).contains("method"), "{}", message(6));
        assert!(message(7).contains("extra"), "{}", message(7));
        assert_eq!(items[0].custom_id, None);
        assert_eq!(items[6].custom_id.as_deref(), Some("x"));
    }

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

    #[test]
    fn files_that_cannot_run_are_refused_whole() {
        assert_eq!(parse("\n  \n", "m", None), Err(BatchFileError::Empty));
        let text = [
            line("a", "/v1/completions", json!({})),
            line("b", "/v1/completions", json!({})),
            line("a", "/v1/completions", json!({})),
        ]
        .join("\n");
        assert_eq!(
            parse(&text, "m", None),
            Err(BatchFileError::DuplicateId {
                id: "a".into(),
                first: 1,
                again: 3
            })
        );
        let text = [
            line("a", "/v1/completions", json!({"model": "m"})),
            line("b", "/v1/completions", json!({"model": "gpt-4o"})),
        ]
        .join("\n");
        let e = parse(&text, "m", None).unwrap_err();
        let other = parse(
            &text.replace("gpt-4o", "m"),
            "m",
            Some("/v1/chat/completions"),
        );
        assert_eq!(
            other,
            Err(BatchFileError::WrongEndpoint {
                line: 1,
                url: "/v1/completions".into(),
                endpoint: "/v1/chat/completions".into()
            })
        );
        assert!(e.to_string().contains("--served-model-name gpt-4o"), "{e}");
    }
}

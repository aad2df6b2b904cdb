//! A scripted OpenAI-compatible server (axum) for the end-to-end tests: `GET /health`,
//! `GET /v1/models`, `POST /v1/chat/completions` and the Responses API ([`responses`]: foreground and background),
//! streaming (SSE) or not, answering every request by one [`Script`] — clean answers, or one
//! kind of corruption.

mod responses;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How the mock answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// Valid tool calls when forced (the named or first tool, schema-valid arguments), text
    /// otherwise.
    Clean,
    /// DSML tool markup in the content, split across chunks when streamed, finish "stop".
    MarkupInContent,
    /// A lone `</think>` in the content.
    Unbalanced,
    /// Tool-call arguments that are not JSON.
    InvalidJson,
    /// Tool-call arguments missing required properties.
    SchemaViolation,
    /// A call of an undeclared tool.
    UnknownTool,
    /// Text even when a call is forced.
    IgnoreToolChoice,
    /// An end-of-sentence token inside the text.
    SpecialToken,
    /// One character 100 times.
    Repeat,
    /// No content, finish "length".
    EmptyLength,
    /// Streamed answers differ from plain ones.
    StreamDiffers,
    /// The second time a request body is seen, the answer differs.
    SecondTimeDiffers,
    /// 500 `model_output_error` (an error event when streamed).
    ModelOutputError,
    /// 503 `service_unavailable` (a stream cut before `[DONE]` when streamed).
    Unavailable,
    /// Background responses: a resumed stream starts at event `N`, not `N + 1`, so the last
    /// event read comes twice (otherwise clean).
    ResumeRepeats,
    /// Background responses never finish: polls say `in_progress`, streams end without their
    /// last event (otherwise clean).
    NeverFinishes,
    /// Background requests are answered finished, not `queued` (otherwise clean).
    NotQueued,
}

#[derive(Clone)]
struct Mock {
    script: Script,
    max_model_len: u64,
    seen: Arc<Mutex<HashMap<String, usize>>>,
    /// Background responses by id.
    background: Arc<Mutex<HashMap<String, responses::Background>>>,
    /// `GET /health` answers 503 "loading" this many more times, and chat requests 503 until
    /// then, as a server loading its model does.
    loading: Arc<AtomicUsize>,
}

/// Start the mock on a free loopback port; its base URL.
pub async fn start(script: Script) -> String {
    start_with_context(script, 1_000_000).await
}

/// Start the mock with this `max_model_len` in `GET /v1/models`; its base URL.
pub async fn start_with_context(script: Script, max_model_len: u64) -> String {
    start_full(script, max_model_len, 0).await
}

/// Start a clean mock that is loading until `GET /health` was asked `probes` times.
pub async fn start_loading(probes: usize) -> String {
    start_full(Script::Clean, 1_000_000, probes).await
}

async fn start_full(script: Script, max_model_len: u64, loading: usize) -> String {
    let mock = Mock {
        script,
        max_model_len,
        seen: Arc::default(),
        background: Arc::default(),
        loading: Arc::new(AtomicUsize::new(loading)),
    };
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/mock/held", get(responses::held))
        .with_state(mock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn health(State(mock): State<Mock>) -> Response {
    let was = mock
        .loading
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    match was {
        Ok(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "loading"})),
        )
            .into_response(),
        Err(_) => axum::Json(json!({"status": "ok"})).into_response(),
    }
}

async fn models(State(mock): State<Mock>) -> Response {
    axum::Json(json!({"object": "list", "data": [
        {"id": "mock-model", "object": "model", "max_model_len": mock.max_model_len}]}))
    .into_response()
}

/// Schema-valid arguments: every required property with a value of its type.
fn valid_args(schema: &Value) -> Value {
    let mut args = serde_json::Map::new();
    for name in schema["required"].as_array().into_iter().flatten() {
        let name = name.as_str().unwrap();
        let p = &schema["properties"][name];
        let v = if let Some(first) = p["enum"].get(0) {
            first.clone()
        } else {
            match p["type"].as_str() {
                Some("integer") | Some("number") => p["minimum"].clone().max_or(json!(1)),
                Some("boolean") => json!(true),
                _ => json!("42"),
            }
        };
        args.insert(name.to_owned(), v);
    }
    Value::Object(args)
}

trait OrDefault {
    fn max_or(self, d: Value) -> Value;
}
impl OrDefault for Value {
    fn max_or(self, d: Value) -> Value {
        if self.is_null() { d } else { self }
    }
}

/// The parts of one answer before it is serialised.
struct Reply {
    content: Vec<String>,
    calls: Vec<(String, String)>,
    finish: &'static str,
}

fn reply(mock: &Mock, req: &Value, stream: bool) -> Result<Reply, (StatusCode, &'static str)> {
    let tools: Vec<&Value> = req["tools"].as_array().into_iter().flatten().collect();
    let forced = match &req["tool_choice"] {
        Value::String(s) if s == "required" => tools.first().map(|t| t["function"].clone()),
        Value::Object(o) => {
            let name = o["function"]["name"].clone();
            tools
                .iter()
                .map(|t| t["function"].clone())
                .find(|f| f["name"] == name)
        }
        _ => None,
    };
    let text = |parts: &[&str], finish| Reply {
        content: parts.iter().map(|s| s.to_string()).collect(),
        calls: vec![],
        finish,
    };
    let call = |name: &str, args: String| Reply {
        content: vec![],
        calls: vec![(name.to_owned(), args)],
        finish: "tool_calls",
    };
    let clean = || match &forced {
        Some(f) => call(
            f["name"].as_str().unwrap(),
            valid_args(&f["parameters"]).to_string(),
        ),
        None => text(&["All ", "good."], "stop"),
    };
    let first_tool = forced
        .clone()
        .or_else(|| tools.first().map(|t| t["function"].clone()))
        .unwrap_or(json!({"name": "none"}));
    Ok(match mock.script {
        Script::Clean | Script::ResumeRepeats | Script::NeverFinishes | Script::NotQueued => {
            clean()
        }
        Script::MarkupInContent => text(&["ok <｜DS", "ML｜invoke name=\"read_file\">"], "stop"),
        Script::Unbalanced => text(&["done", "</think>"], "stop"),
        Script::InvalidJson => call(first_tool["name"].as_str().unwrap(), "{\"path\": ".into()),
        Script::SchemaViolation => call(first_tool["name"].as_str().unwrap(), "{}".into()),
        Script::UnknownTool => call("rm_rf", "{\"path\": \"/\"}".into()),
        Script::IgnoreToolChoice => text(&["I will not call tools."], "stop"),
        Script::SpecialToken => text(&["hello<｜end▁of", "▁sentence｜>world"], "stop"),
        Script::Repeat => text(
            &["!!!!!!!!!!".repeat(5).as_str(), &"!".repeat(50)],
            "length",
        ),
        Script::EmptyLength => text(&[], "length"),
        Script::StreamDiffers if stream => text(&["streamed"], "stop"),
        Script::StreamDiffers => text(&["not streamed"], "stop"),
        Script::SecondTimeDiffers => {
            let mut seen = mock.seen.lock().unwrap();
            let n = seen.entry(req.to_string()).or_default();
            *n += 1;
            if *n == 1 {
                clean()
            } else {
                text(&["a different answer"], "stop")
            }
        }
        Script::ModelOutputError => {
            return Err((StatusCode::INTERNAL_SERVER_ERROR, "model_output_error"));
        }
        Script::Unavailable => {
            return Err((StatusCode::SERVICE_UNAVAILABLE, "service_unavailable"));
        }
    })
}

fn error_body(ty: &str) -> Value {
    json!({"error": {"message": format!("scripted {ty}"), "type": ty, "param": null, "code": "malformed"}})
}

async fn chat(State(mock): State<Mock>, body: String) -> Response {
    if mock.loading.load(Ordering::SeqCst) > 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(error_body("service_unavailable")),
        )
            .into_response();
    }
    let req: Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(_) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(error_body("invalid_request_error")),
            )
                .into_response();
        }
    };
    let stream = req["stream"].as_bool().unwrap_or(false);
    // One token per byte of the request, as the tiny model's byte-level tokenizer would count.
    let usage = json!({"prompt_tokens": body.len(), "completion_tokens": 5, "total_tokens": body.len() + 5});
    let r = reply(&mock, &req, stream);
    if !stream {
        return match r {
            Err((status, ty)) => (status, axum::Json(error_body(ty))).into_response(),
            Ok(r) => {
                let calls: Vec<Value> = r.calls.iter().enumerate().map(|(i, (n, a))| {
                    json!({"id": format!("call_{i}"), "type": "function", "function": {"name": n, "arguments": a}})
                }).collect();
                let content = r.content.concat();
                let mut msg = json!({"role": "assistant", "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { json!(content) }});
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                axum::Json(json!({"id": "x", "object": "chat.completion", "model": "mock-model",
                    "choices": [{"index": 0, "message": msg, "finish_reason": r.finish}], "usage": usage}))
                .into_response()
            }
        };
    }
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "x", "object": "chat.completion.chunk", "model": "mock-model",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = vec![chunk(json!({"role": "assistant"}), Value::Null).to_string()];
    let mut done = true;
    match r {
        Err((_, "model_output_error")) => events.push(error_body("model_output_error").to_string()),
        Err(_) => done = false,
        Ok(r) => {
            for c in &r.content {
                events.push(chunk(json!({"content": c}), Value::Null).to_string());
            }
            for (i, (n, a)) in r.calls.iter().enumerate() {
                let (head, tail) = a.split_at(a.len() / 2);
                events.push(chunk(json!({"tool_calls": [{"index": i, "id": format!("call_{i}"), "type": "function", "function": {"name": n, "arguments": head}}]}), Value::Null).to_string());
                events.push(
                    chunk(
                        json!({"tool_calls": [{"index": i, "function": {"arguments": tail}}]}),
                        Value::Null,
                    )
                    .to_string(),
                );
            }
            events.push(chunk(json!({}), json!(r.finish)).to_string());
            events.push(json!({"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}).to_string());
        }
    }
    let mut text: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    if done {
        text.push_str("data: [DONE]\n\n");
    }
    sse(text)
}

/// An SSE answer of `text`, sent in small pieces so events (and multi-byte characters) are
/// split across reads.
fn sse(text: String) -> Response {
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = text
        .into_bytes()
        .chunks(7)
        .map(|c| Ok(c.to_vec()))
        .collect();
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(futures_util::stream::iter(pieces)))
        .unwrap()
}

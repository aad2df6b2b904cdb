//! The mock's Responses API: `POST /v1/responses` answers the same scripted [`super::Reply`]
//! as chat, as a `response` object or typed events; with `background` it is kept by id, polled
//! (`in_progress` once, then finished), replayed from `starting_after`, and deleted. The
//! background scripts break exactly one of those.

use super::{Mock, Reply, Script, error_body, reply, sse};
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// A background response the mock holds.
pub struct Background {
    /// Its events, `data` text by sequence number.
    events: Vec<String>,
    /// Its final response object.
    last: Value,
    /// Polls answered so far.
    polls: usize,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// The request in chat's shape for [`reply`]: tools and `tool_choice` rewritten.
fn as_chat(req: &Value) -> Value {
    let mut chat = req.clone();
    let tools: Vec<Value> = req["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| json!({"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}))
        .collect();
    chat["tools"] = json!(tools);
    if let Value::Object(o) = &req["tool_choice"] {
        chat["tool_choice"] = json!({"type": "function", "function": {"name": o["name"]}});
    }
    chat
}

/// The final response and the events of `r` (`created`: the first event's status); without
/// the last event when `finish` is false.
fn build(id: &str, r: &Reply, created: &str, prompt: usize, finish: bool) -> (Value, Vec<String>) {
    let text = r.content.concat();
    let mut output = Vec::new();
    let mut events = Vec::new();
    let base = json!({"id": id, "object": "response", "output": []});
    let with_status = |status: &str| {
        let mut b = base.clone();
        b["status"] = json!(status);
        b
    };
    events.push(json!({"type": "response.created", "response": with_status(created)}));
    events.push(json!({"type": "response.in_progress", "response": with_status("in_progress")}));
    if !r.content.is_empty() || r.calls.is_empty() {
        let item = json!({"type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
                          "content": [{"type": "output_text", "text": text, "annotations": []}]});
        events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": "msg_0"}}));
        for piece in &r.content {
            events.push(json!({"type": "response.output_text.delta", "item_id": "msg_0", "delta": piece, "logprobs": []}));
        }
        events.push(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
        output.push(item);
    }
    for (i, (name, args)) in r.calls.iter().enumerate() {
        let item = json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": format!("call_{i}"),
                          "name": name, "arguments": args, "status": "completed"});
        events.push(json!({"type": "response.function_call_arguments.delta", "delta": args}));
        events.push(json!({"type": "response.output_item.done", "item": item}));
        output.push(item);
    }
    let (status, kind) = match r.finish {
        "length" => ("incomplete", "response.incomplete"),
        _ => ("completed", "response.completed"),
    };
    let mut last = with_status(status);
    last["output"] = json!(output);
    last["usage"] = json!({"input_tokens": prompt, "output_tokens": 5, "total_tokens": prompt + 5});
    if finish {
        events.push(json!({"type": kind, "response": last}));
    }
    let events = events
        .into_iter()
        .enumerate()
        .map(|(n, mut e)| {
            e["sequence_number"] = json!(n);
            e.to_string()
        })
        .collect();
    (last, events)
}

fn stream_of(events: &[String]) -> Response {
    sse(events.iter().map(|e| format!("data: {e}\n\n")).collect())
}

/// `POST /v1/responses`.
pub async fn create(State(mock): State<Mock>, body: String) -> Response {
    let Ok(req) = serde_json::from_str::<Value>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(error_body("invalid_request_error")),
        )
            .into_response();
    };
    let stream = req["stream"].as_bool().unwrap_or(false);
    let background = req["background"] == true;
    let id = format!("resp_{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let r = match reply(&mock, &as_chat(&req), stream) {
        Ok(r) => r,
        Err((status, ty)) if !stream => {
            return (status, axum::Json(error_body(ty))).into_response();
        }
        Err((_, ty)) => {
            // A streamed error: a failed response, or (unavailable) a stream cut short.
            let mut events = vec![
                json!({"type": "response.created", "sequence_number": 0,
                                         "response": {"id": id, "status": "in_progress"}})
                .to_string(),
            ];
            if ty == "model_output_error" {
                let e = error_body(ty)["error"].clone();
                events.push(
                    json!({"type": "response.failed", "sequence_number": 1,
                                   "response": {"id": id, "status": "failed", "error": e}})
                    .to_string(),
                );
            }
            return stream_of(&events);
        }
    };
    let finishes = !(background && mock.script == Script::NeverFinishes);
    let created = if background { "queued" } else { "in_progress" };
    let (last, events) = build(&id, &r, created, body.len(), finishes);
    if !background {
        return if stream {
            stream_of(&events)
        } else {
            axum::Json(last).into_response()
        };
    }
    let queued = if mock.script == Script::NotQueued {
        last.clone()
    } else {
        json!({"id": id, "object": "response", "status": "queued", "background": true, "output": []})
    };
    let answer = if stream {
        stream_of(&events)
    } else {
        axum::Json(queued).into_response()
    };
    let held = Background {
        events,
        last,
        polls: 0,
    };
    mock.background.lock().unwrap().insert(id, held);
    answer
}

/// `GET /v1/responses/{id}`: a poll, or with `stream=true` the events after `starting_after`.
pub async fn retrieve(State(mock): State<Mock>, Path(id): Path<String>, uri: Uri) -> Response {
    let q: HashMap<&str, &str> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|p| p.split_once('='))
        .collect();
    let mut all = mock.background.lock().unwrap();
    let Some(b) = all.get_mut(&id) else {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(error_body("invalid_request_error")),
        )
            .into_response();
    };
    if q.get("stream") == Some(&"true") {
        let after: Option<usize> = q.get("starting_after").and_then(|n| n.parse().ok());
        let from = match (after, mock.script) {
            (Some(n), Script::ResumeRepeats) => n,
            (Some(n), _) => n + 1,
            (None, _) => 0,
        };
        return stream_of(b.events.get(from..).unwrap_or_default());
    }
    b.polls += 1;
    if b.polls == 1 || mock.script == Script::NeverFinishes {
        return axum::Json(
            json!({"id": id, "object": "response", "status": "in_progress",
                                 "background": true, "output": []}),
        )
        .into_response();
    }
    axum::Json(b.last.clone()).into_response()
}

/// `GET /mock/held`: how many background responses the mock still holds (the harness deletes
/// each, finished or abandoned).
pub async fn held(State(mock): State<Mock>) -> Response {
    axum::Json(json!({"held": mock.background.lock().unwrap().len()})).into_response()
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(State(mock): State<Mock>, Path(id): Path<String>) -> Response {
    match mock.background.lock().unwrap().remove(&id) {
        Some(_) => {
            axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(error_body("invalid_request_error")),
        )
            .into_response(),
    }
}

//! The Responses API side of the harness (`--api responses`): a turn's chat request rewritten
//! as a `/v1/responses` request (the whole conversation as input items, `store: false`), and
//! the answer read back from a `response` object or assembled from its typed stream events.
//! A stream's deltas must add up to the items of its final response; a stream that disagrees
//! with itself fails the turn.

use crate::answer::{Answer, ToolCall};
use crate::chat_answer::Fed;
use serde_json::{Value, json};

/// The `/v1/responses` request of a chat request `chat` (as the runner builds it): messages as
/// input items, tools and `tool_choice` in the Responses shape, `max_tokens` as
/// `max_output_tokens`, `logprobs` as the `message.output_text.logprobs` include; the sampling
/// fields, `stream` and `stop` (an extension dsv4 accepts) as they are. With `background`, it
/// runs in the background and is stored (background responses must be); else `store: false`.
pub fn responses_body(chat: &Value, background: bool) -> Value {
    let mut input = Vec::new();
    for m in chat["messages"].as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or("user");
        match role {
            "tool" => input.push(json!({"type": "function_call_output",
                                        "call_id": m["tool_call_id"],
                                        "output": m["content"]})),
            _ => {
                let text = m["content"].as_str().unwrap_or("");
                let calls = m["tool_calls"].as_array();
                if !text.is_empty() || calls.is_none() {
                    input.push(json!({"type": "message", "role": role, "content": text}));
                }
                for c in calls.into_iter().flatten() {
                    input.push(json!({"type": "function_call", "call_id": c["id"],
                                      "name": c["function"]["name"],
                                      "arguments": c["function"]["arguments"]}));
                }
            }
        }
    }
    let tools: Vec<Value> = chat["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let f = &t["function"];
            let mut tool =
                json!({"type": "function", "name": f["name"], "parameters": f["parameters"]});
            if let Some(strict) = f.get("strict") {
                tool["strict"] = strict.clone();
            }
            tool
        })
        .collect();
    let tool_choice = match &chat["tool_choice"] {
        Value::Object(o) => json!({"type": "function", "name": o["function"]["name"]}),
        other => other.clone(),
    };
    let mut body = json!({
        "model": chat["model"],
        "input": input,
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": chat["parallel_tool_calls"],
        "max_output_tokens": chat["max_tokens"],
        "temperature": chat["temperature"],
        "seed": chat["seed"],
        "stream": chat["stream"],
        "store": background,
    });
    if background {
        body["background"] = json!(true);
    }
    if chat["logprobs"] == true {
        body["include"] = json!(["message.output_text.logprobs"]);
    }
    if let Some(stop) = chat.get("stop") {
        body["stop"] = stop.clone();
    }
    body
}

/// The answer of a `response` object: the message text, the reasoning, the function calls
/// (their `call_id` as id), a chat finish reason (`stop`, `tool_calls`, `length` for
/// `incomplete`, `abort` for `cancelled`), usage and the text's log-probabilities.
pub fn parse_response(v: &Value) -> Result<Answer, String> {
    let output = v["output"]
        .as_array()
        .ok_or_else(|| format!("the response has no output: {}", clip(v)))?;
    let mut a = Answer::default();
    for item in output {
        match item["type"].as_str() {
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    a.content.push_str(part["text"].as_str().unwrap_or(""));
                    a.logprobs.extend(logprobs(&part["logprobs"]));
                }
            }
            Some("reasoning") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    let text = part["text"].as_str().unwrap_or("");
                    a.reasoning.get_or_insert_default().push_str(text);
                }
            }
            Some("function_call") => a.tool_calls.push(call(item)),
            other => return Err(format!("unknown output item type {other:?}")),
        }
    }
    a.finish_reason = Some(
        match v["status"].as_str() {
            Some("completed") if a.tool_calls.is_empty() => "stop",
            Some("completed") => "tool_calls",
            Some("incomplete") => "length",
            Some("cancelled") => "abort",
            other => return Err(format!("the response's status is {other:?}")),
        }
        .to_string(),
    );
    a.prompt_tokens = v["usage"]["input_tokens"].as_u64();
    a.completion_tokens = v["usage"]["output_tokens"].as_u64();
    Ok(a)
}

fn call(item: &Value) -> ToolCall {
    ToolCall {
        id: item["call_id"].as_str().unwrap_or("").to_owned(),
        name: item["name"].as_str().unwrap_or("").to_owned(),
        arguments: item["arguments"].as_str().unwrap_or("").to_owned(),
    }
}

fn logprobs(list: &Value) -> Vec<f64> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|e| e["logprob"].as_f64().unwrap_or(f64::NAN))
        .collect()
}

/// The (type, message) of a stream's error object: its `type` (dsv4 sends chat's, e.g.
/// `model_output_error`) and its message with the `code`.
fn failure(e: &Value, what: &str) -> (Option<String>, String) {
    let code = e["code"]
        .as_str()
        .map(|c| format!(" [{c}]"))
        .unwrap_or_default();
    let msg = e["message"].as_str().unwrap_or("no message");
    (
        e["type"].as_str().map(str::to_owned),
        format!("{what}: {msg}{code}"),
    )
}

fn clip(v: &Value) -> String {
    let s = v.to_string();
    let t: String = s.chars().take(300).collect();
    if t.len() < s.len() { t + "…" } else { t }
}

/// Assembles a response's stream events into an [`Answer`]: text, reasoning and arguments from
/// the deltas, calls from their `output_item.done`, the rest from the final response, which the
/// deltas must agree with.
#[derive(Debug, Default)]
pub struct ResponsesAccumulator {
    /// The answer so far.
    pub answer: Answer,
    /// The final `response` object, once it came.
    last: Option<Value>,
    /// The response's id, from the first event that carries the response.
    pub id: Option<String>,
    /// The `sequence_number` of the last event taken.
    pub last_seq: Option<u64>,
}

impl ResponsesAccumulator {
    /// Take one event's data. `response.failed` and `error` events are an
    /// `Err((type, message))`; `response.completed` and `response.incomplete` end the stream.
    pub fn feed(&mut self, data: &str) -> Result<Fed, (Option<String>, String)> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(Fed::Other);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            (
                None,
                format!("a stream event is not JSON ({e}): {data:.300}"),
            )
        })?;
        if let Some(n) = v["sequence_number"].as_u64() {
            self.last_seq = Some(n);
        }
        if self.id.is_none() {
            self.id = v["response"]["id"].as_str().map(str::to_owned);
        }
        let a = &mut self.answer;
        match v["type"].as_str().unwrap_or("") {
            "response.output_text.delta" => {
                a.content.push_str(v["delta"].as_str().unwrap_or(""));
                a.logprobs.extend(logprobs(&v["logprobs"]));
            }
            "response.reasoning_text.delta" => a
                .reasoning
                .get_or_insert_default()
                .push_str(v["delta"].as_str().unwrap_or("")),
            "response.output_item.done" if v["item"]["type"] == "function_call" => {
                a.tool_calls.push(call(&v["item"]));
            }
            "response.completed" | "response.incomplete" => {
                self.last = Some(v["response"].clone());
                return Ok(Fed::Done);
            }
            "response.failed" => {
                let e = &v["response"]["error"];
                return Err(failure(e, "the response failed in the stream"));
            }
            "error" => return Err(failure(&v, "error event in the stream")),
            _ => return Ok(Fed::Other),
        }
        a.chunks += 1;
        Ok(Fed::Token)
    }

    /// The assembled answer (after the final event): usage and finish reason from the final
    /// response, which must show the streamed text, reasoning and calls.
    pub fn finish(self) -> Result<Answer, String> {
        let last = self
            .last
            .ok_or("the stream ended without response.completed or response.incomplete")?;
        let whole = parse_response(&last)?;
        let mut a = self.answer;
        if (&a.content, &a.reasoning, &a.tool_calls)
            != (&whole.content, &whole.reasoning, &whole.tool_calls)
        {
            return Err(format!(
                "the streamed deltas do not add up to the final response: streamed {:?} / {:?}, \
                 final {:?} / {:?}",
                a.content, a.tool_calls, whole.content, whole.tool_calls
            ));
        }
        a.stream = true;
        a.finish_reason = whole.finish_reason;
        a.prompt_tokens = whole.prompt_tokens;
        a.completion_tokens = whole.completion_tokens;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_request_becomes_the_same_conversation_as_items() {
        let chat = json!({
            "model": "m", "temperature": 0.0, "seed": 7, "stream": true, "max_tokens": 32,
            "parallel_tool_calls": false, "logprobs": true, "stop": ["<｜"],
            "stream_options": {"include_usage": true},
            "tool_choice": {"type": "function", "function": {"name": "search"}},
            "tools": [{"type": "function", "function": {"name": "search",
                       "parameters": {"type": "object"}}}],
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "found"},
                {"role": "assistant", "content": "done"},
            ],
        });
        let r = responses_body(&chat, false);
        assert_eq!(
            r["input"],
            json!([
                {"type": "message", "role": "system", "content": "sys"},
                {"type": "message", "role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "found"},
                {"type": "message", "role": "assistant", "content": "done"},
            ])
        );
        assert_eq!(
            r["tools"],
            json!([{"type": "function", "name": "search", "parameters": {"type": "object"}}])
        );
        assert_eq!(
            r["tool_choice"],
            json!({"type": "function", "name": "search"})
        );
        assert_eq!(r["max_output_tokens"], 32);
        assert_eq!(r["store"], false);
        assert_eq!(r["include"], json!(["message.output_text.logprobs"]));
        assert_eq!(r["stop"], json!(["<｜"]));
        assert!(r.get("stream_options").is_none() && r.get("messages").is_none());
        assert!(r.get("background").is_none());
        let strict = json!({"messages": [], "tools": [{"type": "function", "function": {
            "name": "s", "parameters": {}, "strict": true}}]});
        assert_eq!(
            responses_body(&strict, false)["tools"][0]["strict"],
            true,
            "strict travels to the Responses tool"
        );
        let auto = responses_body(&json!({"tool_choice": "auto", "messages": []}), false);
        assert_eq!(auto["tool_choice"], "auto");
        assert!(auto.get("include").is_none() && auto.get("stop").is_none());
        let bg = responses_body(&chat, true);
        assert_eq!(
            (&bg["background"], &bg["store"]),
            (&json!(true), &json!(true))
        );
        assert_eq!(bg["input"], r["input"]);
    }

    fn final_response(status: &str) -> Value {
        json!({"status": status, "usage": {"input_tokens": 9, "output_tokens": 4}, "output": [
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]},
            {"type": "message", "content": [{"type": "output_text", "text": "ab",
              "logprobs": [{"logprob": -0.5}, {"logprob": -1.0}]}]},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        ]})
    }

    #[test]
    fn responses_parse_into_answers() {
        let a = parse_response(&final_response("completed")).unwrap();
        assert_eq!(a.content, "ab");
        assert_eq!(a.reasoning.as_deref(), Some("hm"));
        assert_eq!(a.tool_calls[0].id, "call_1");
        assert_eq!(a.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!((a.prompt_tokens, a.completion_tokens), (Some(9), Some(4)));
        assert_eq!(a.logprobs, [-0.5, -1.0]);
        let cut = parse_response(&final_response("incomplete")).unwrap();
        assert_eq!(cut.finish_reason.as_deref(), Some("length"));
        assert!(parse_response(&final_response("failed")).is_err());
        assert!(parse_response(&json!({"status": "completed"})).is_err());
    }

    fn stream(events: &[Value]) -> Result<Answer, String> {
        let mut acc = ResponsesAccumulator::default();
        for e in events {
            if acc.feed(&e.to_string()).map_err(|e| e.1)? == Fed::Done {
                return acc.finish();
            }
        }
        Err("no final event".into())
    }

    #[test]
    fn stream_events_assemble_and_must_agree_with_the_final_response() {
        let call = json!({"type": "function_call", "call_id": "call_1", "name": "f",
                          "arguments": "{}"});
        let events = [
            json!({"type": "response.created", "response": {}}),
            json!({"type": "response.reasoning_text.delta", "delta": "hm"}),
            json!({"type": "response.output_text.delta", "delta": "a", "logprobs": [{"logprob": -0.5}]}),
            json!({"type": "response.output_text.delta", "delta": "b", "logprobs": [{"logprob": -1.0}]}),
            json!({"type": "response.output_item.done", "item": call}),
            json!({"type": "response.completed", "response": final_response("completed")}),
        ];
        let mut acc = ResponsesAccumulator::default();
        let created = json!({"type": "response.created", "sequence_number": 0,
                             "response": {"id": "resp_1"}});
        acc.feed(&created.to_string()).unwrap();
        acc.feed(
            &json!({"type": "response.in_progress", "sequence_number": 1,
                         "response": {"id": "resp_1"}})
            .to_string(),
        )
        .unwrap();
        assert_eq!((acc.id.as_deref(), acc.last_seq), (Some("resp_1"), Some(1)));
        let a = stream(&events).unwrap();
        assert!(a.stream);
        assert_eq!(a.chunks, 4);
        let mut want = parse_response(&final_response("completed")).unwrap();
        (want.stream, want.chunks) = (true, 4);
        assert_eq!(a, want);
        // A lost delta is caught against the final response.
        let mut lossy = events.to_vec();
        lossy.remove(3);
        let e = stream(&lossy).unwrap_err();
        assert!(e.contains("do not add up"), "{e}");
        // A failed response is the turn's error.
        let failed = json!({"type": "response.failed", "response": {"error": {
            "code": "malformed", "message": "bad", "type": "model_output_error"}}});
        let mut acc = ResponsesAccumulator::default();
        let (kind, msg) = acc.feed(&failed.to_string()).unwrap_err();
        assert_eq!(kind.as_deref(), Some("model_output_error"));
        assert!(msg.contains("bad [malformed]"), "{msg}");
        assert!(acc.feed("not json").is_err());
        assert!(ResponsesAccumulator::default().finish().is_err());
    }
}

//! OpenAI's Responses API over HTTP: each answer equals the chat completion of the same
//! conversation (plain, instructions and items, thinking with reasoning tokens, tools, JSON
//! formats, log-probabilities); streams carry the same response as ordered typed events. Bad
//! input names its field: [`bad_requests`]. Stored responses and aborts: [`lifecycle`];
//! background responses: [`background`]; `truncation: "auto"`: [`truncation`]; the input token
//! count: [`input_tokens`]; stored responses on disk: [`on_disk`].

use super::common::*;
use serde_json::{Value, json};

mod background;
mod bad_requests;
mod input_tokens;
mod lifecycle;
mod on_disk;
mod truncation;

/// The tiny tokenizer's id of `</think>`.
const THINK_END: u64 = 6;

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "enum": ["Oslo", "Paris"]},
               "days": {"type": "integer", "minimum": 1, "maximum": 3}},
             "required": ["city"]}})
}

/// The same tool in chat's shape.
fn chat_weather_tool() -> Value {
    let f: serde_json::Map<String, Value> = weather_tool()
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "type")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    json!({"type": "function", "function": f})
}

fn with(mut body: Value, extra: Value) -> Value {
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// A greedy Responses body, cut at [`CLEAN_STOPS`] (the tiny model's noise would otherwise
/// break the strict DSV4 parser; grammars need none).
fn responses(input: Value, extra: Value) -> Value {
    with(
        json!({"model": MODEL, "input": input, "temperature": 0, "stop": CLEAN_STOPS}),
        extra,
    )
}

/// A greedy chat body of `messages`, cut at [`CLEAN_STOPS`].
fn chat_of(messages: Value, extra: Value) -> Value {
    with(
        json!({"model": MODEL, "messages": messages, "temperature": 0, "stop": CLEAN_STOPS}),
        extra,
    )
}

/// A greedy chat body of one user message, cut at [`CLEAN_STOPS`].
fn chat(content: &str, extra: Value) -> Value {
    chat_of(json!([{"role": "user", "content": content}]), extra)
}

/// What an answer says, in a shape both APIs map to: (reasoning, text, calls as (name,
/// arguments), ended by the token limit, input tokens, output tokens).
type Said = (
    Option<String>,
    String,
    Vec<(String, String)>,
    bool,
    u64,
    u64,
);

fn said_by_response(v: &Value) -> Said {
    let (mut reasoning, mut text, mut calls) = (None, String::new(), Vec::new());
    for item in v["output"].as_array().unwrap() {
        match item["type"].as_str().unwrap() {
            "reasoning" => reasoning = item["content"][0]["text"].as_str().map(String::from),
            "message" => text.push_str(item["content"][0]["text"].as_str().unwrap()),
            "function_call" => calls.push((
                item["name"].as_str().unwrap().to_string(),
                item["arguments"].as_str().unwrap().to_string(),
            )),
            other => panic!("unexpected item {other}: {v}"),
        }
    }
    let u = &v["usage"];
    (
        reasoning,
        text,
        calls,
        v["status"] == "incomplete",
        u["input_tokens"].as_u64().unwrap(),
        u["output_tokens"].as_u64().unwrap(),
    )
}

fn said_by_chat(v: &Value) -> Said {
    let m = &v["choices"][0]["message"];
    let calls = m["tool_calls"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| {
                    (
                        c["function"]["name"].as_str().unwrap().to_string(),
                        c["function"]["arguments"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (
        m["reasoning_content"].as_str().map(String::from),
        m["content"].as_str().unwrap_or_default().to_string(),
        calls,
        v["choices"][0]["finish_reason"] == "length",
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

/// Send both and check they say the same (or fail the same way); the response.
async fn same_as_chat(s: &TestServer, resp: &Value, chat: &Value) -> Value {
    let c = s.send("POST", "/v1/chat/completions", chat).await;
    let r = s.send("POST", "/v1/responses", resp).await;
    assert_eq!(r.status, c.status, "{resp}\n{}\n{}", r.body, c.body);
    if c.status != 200 {
        assert_eq!(r.json()["error"]["code"], c.json()["error"]["code"]);
        return r.json();
    }
    let (rv, cv) = (r.json(), c.json());
    assert_eq!(
        said_by_response(&rv),
        said_by_chat(&cv),
        "{resp}\n{rv}\n{cv}"
    );
    assert_eq!(rv["object"], "response");
    assert!(rv["id"].as_str().unwrap().starts_with("resp_"));
    rv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_equal_the_chat_completion_of_the_same_conversation() {
    let s = start(config()).await;
    // A string input is one user message.
    let r = same_as_chat(
        &s,
        &responses(json!("Hello"), json!({"max_output_tokens": 12})),
        &chat("Hello", json!({"max_tokens": 12})),
    )
    .await;
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
    if r["status"] == "incomplete" {
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    }
    // Settings that do nothing here are accepted, echoed, and change nothing.
    let inert = same_as_chat(
        &s,
        &responses(
            json!("Hello"),
            json!({"max_output_tokens": 12, "max_tool_calls": 3, "prompt_cache_retention": "24h",
                   "text": {"verbosity": "low"}, "service_tier": "auto"}),
        ),
        &chat("Hello", json!({"max_tokens": 12})),
    )
    .await;
    assert_eq!(inert["max_tool_calls"], 3);
    assert_eq!(inert["text"]["verbosity"], "low");
    assert_eq!(r["max_tool_calls"], Value::Null);
    assert_eq!(r["text"]["verbosity"], "medium");

    // Instructions go first as the system prompt; items keep their roles and text parts.
    let items = json!([
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "today?"}]},
    ]);
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": "Weather today?"},
    ]);
    same_as_chat(
        &s,
        &responses(
            items.clone(),
            json!({"instructions": "You are terse.", "max_output_tokens": 10}),
        ),
        &chat_of(messages, json!({"max_tokens": 10})),
    )
    .await;

    // Thinking with a required tool: a reasoning item, then the call; the reasoning tokens
    // are those up to and including `</think>`.
    let r = same_as_chat(
        &s,
        &responses(
            json!("Hi"),
            json!({"reasoning": {"effort": "medium"}, "tools": [weather_tool()],
                   "tool_choice": "required", "parallel_tool_calls": false,
                   "max_output_tokens": 3000, "stop": []}),
        ),
        &chat(
            "Hi",
            json!({"chat_template_kwargs": {"thinking": true}, "tools": [chat_weather_tool()],
                   "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 3000,
                   "stop": []}),
        ),
    )
    .await;
    let kinds: Vec<_> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["reasoning", "function_call"], "{r}");
    let c = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat(
                "Hi",
                json!({"chat_template_kwargs": {"thinking": true}, "tools": [chat_weather_tool()],
                       "tool_choice": "required", "parallel_tool_calls": false,
                       "max_tokens": 3000, "return_token_ids": true, "stop": []}),
            ),
        )
        .await
        .json();
    let ids = c["choices"][0]["token_ids"].clone();
    let end = ids
        .as_array()
        .unwrap()
        .iter()
        .position(|t| t == THINK_END)
        .expect("the reasoning ended");
    assert_eq!(
        r["usage"]["output_tokens_details"]["reasoning_tokens"],
        end as u64 + 1
    );
    // Chat counts them the same (OpenAI's `completion_tokens_details`).
    assert_eq!(
        c["usage"]["completion_tokens_details"]["reasoning_tokens"],
        end as u64 + 1,
        "{c}"
    );
    let call = &r["output"][1];
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["status"], "completed");

    // xhigh is DSV4's max effort; a named tool.
    same_as_chat(
        &s,
        &responses(
            json!("Hi"),
            json!({"reasoning": {"effort": "xhigh"}, "tools": [weather_tool()],
                   "tool_choice": {"type": "function", "name": "get_weather"},
                   "parallel_tool_calls": false, "max_output_tokens": 3000, "stop": []}),
        ),
        &chat(
            "Hi",
            json!({"chat_template_kwargs": {"thinking": true}, "reasoning_effort": "max",
                   "tools": [chat_weather_tool()],
                   "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                   "parallel_tool_calls": false, "max_tokens": 3000, "stop": []}),
        ),
    )
    .await;

    // A JSON schema as text.format.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
                        "required": ["n"]});
    let r = same_as_chat(
        &s,
        &responses(
            json!("Hi"),
            json!({"text": {"format": {"type": "json_schema", "name": "n", "schema": schema}},
                   "max_output_tokens": 600, "stop": []}),
        ),
        &chat(
            "Hi",
            json!({"response_format": {"type": "json_schema",
                                       "json_schema": {"name": "n", "schema": schema}},
                   "max_tokens": 600, "stop": []}),
        ),
    )
    .await;
    let text = r["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(
        serde_json::from_str::<Value>(text).unwrap()["n"].is_i64(),
        "{text}"
    );
    assert_eq!(r["text"]["format"]["type"], "json_schema");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_message_text_carries_the_chat_log_probabilities() {
    let s = start(config()).await;
    let r = s
        .send(
            "POST",
            "/v1/responses",
            &responses(
                json!("Hello"),
                json!({"include": ["message.output_text.logprobs"], "top_logprobs": 2,
                       "max_output_tokens": 6}),
            ),
        )
        .await
        .json();
    let c = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat(
                "Hello",
                json!({"logprobs": true, "top_logprobs": 2, "max_tokens": 6}),
            ),
        )
        .await
        .json();
    let want = &c["choices"][0]["logprobs"]["content"];
    assert_eq!(want.as_array().unwrap().len(), 6, "{c}");
    assert_eq!(&r["output"][0]["content"][0]["logprobs"], want, "{r}");
    // Without them, the part has none.
    let plain = s
        .send(
            "POST",
            "/v1/responses",
            &responses(json!("Hi"), json!({"max_output_tokens": 2})),
        )
        .await
        .json();
    assert!(plain["output"][0]["content"][0].get("logprobs").is_none());
    // Streamed, the deltas carry them in order.
    let streamed = s
        .send(
            "POST",
            "/v1/responses",
            &responses(
                json!("Hello"),
                json!({"include": ["message.output_text.logprobs"], "top_logprobs": 2,
                       "max_output_tokens": 6, "stream": true}),
            ),
        )
        .await;
    let deltas: Vec<Value> = typed_events(&streamed)
        .into_iter()
        .filter(|(t, _)| t == "response.output_text.delta")
        .flat_map(|(_, e)| e["logprobs"].as_array().unwrap().clone())
        .collect();
    assert_eq!(&Value::Array(deltas), want);
    s.shutdown().await.unwrap();
}

/// The `(event:, data:)` pairs of a stream; each data's `type` is its event name.
fn typed_events(r: &Reply) -> Vec<(String, Value)> {
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
        .split("\n\n")
        .filter(|e| e.contains("data: "))
        .map(|e| {
            let kind = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_else(|| panic!("no event name: {e}"))
                .to_string();
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], kind.as_str(), "{e}");
            (kind, v)
        })
        .collect()
}

/// Check a stream's events against the non-streamed response of the same request.
fn check_stream(events: &[(String, Value)], want: &Value) {
    for (k, (_, e)) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], k as u64, "{e}");
    }
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
    let created = if want["background"] == true {
        "queued"
    } else {
        "in_progress"
    };
    assert_eq!(events[0].1["response"]["status"], created);
    assert_eq!(events[1].1["response"]["status"], "in_progress");
    assert_eq!(events[0].1["response"]["output"], json!([]));
    let id = &events[0].1["response"]["id"];
    let (last_kind, last) = events.last().unwrap();
    let expected = match want["status"].as_str().unwrap() {
        "completed" => "response.completed",
        _ => "response.incomplete",
    };
    assert_eq!(last_kind, expected);
    assert_eq!(
        last["response"]["completed_at"].is_u64(),
        expected == "response.completed",
        "completed_at only once completed: {last}"
    );
    assert!(events[0].1["response"]["completed_at"].is_null());
    assert_eq!(&last["response"]["id"], id);
    assert_eq!(normalized(&last["response"]), normalized(want));
    // Each item: added, its deltas adding up to its done text, done equal to the final item.
    let output = last["response"]["output"].as_array().unwrap();
    for (index, item) in output.iter().enumerate() {
        let of_item: Vec<&(String, Value)> = events
            .iter()
            .filter(|(_, e)| e["output_index"] == index as u64)
            .collect();
        assert_eq!(of_item[0].0, "response.output_item.added");
        assert_eq!(of_item[0].1["item"]["id"], item["id"]);
        assert_eq!(of_item[0].1["item"]["status"], "in_progress");
        let done = of_item.last().unwrap();
        assert_eq!(done.0, "response.output_item.done");
        assert_eq!(&done.1["item"], item);
        let deltas: String = of_item
            .iter()
            .filter(|(k, _)| k.ends_with(".delta"))
            .map(|(_, e)| e["delta"].as_str().unwrap())
            .collect();
        let whole = match item["type"].as_str().unwrap() {
            "function_call" => item["arguments"].as_str().unwrap(),
            _ => item["content"][0]["text"].as_str().unwrap(),
        };
        assert_eq!(deltas, whole, "{item}");
    }
    // Items do not interleave: each one's events are contiguous.
    let order: Vec<u64> = events
        .iter()
        .filter_map(|(_, e)| e["output_index"].as_u64())
        .collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_carry_the_same_response_as_ordered_typed_events() {
    let s = start(config()).await;
    for extra in [
        json!({"max_output_tokens": 12}),
        json!({"reasoning": {"effort": "low"}, "tools": [weather_tool()],
               "tool_choice": "required", "parallel_tool_calls": false,
               "max_output_tokens": 3000, "stop": []}),
        json!({"instructions": "Be brief.", "max_output_tokens": 5, "metadata": {"k": "v"}}),
    ] {
        let tools = extra.get("tools").is_some();
        let body = responses(json!("Hello"), extra);
        let want = s.send("POST", "/v1/responses", &body).await;
        assert_eq!(want.status, 200, "{}", want.body);
        let streamed = s
            .send(
                "POST",
                "/v1/responses",
                &with(body.clone(), json!({"stream": true})),
            )
            .await;
        assert!(!streamed.body.contains("[DONE]"));
        let events = typed_events(&streamed);
        check_stream(&events, &want.json());
        if tools {
            // The call's arguments stream in pieces as the model writes them.
            let pieces = events
                .iter()
                .filter(|(k, _)| k == "response.function_call_arguments.delta")
                .count();
            assert!(pieces > 2, "{}", streamed.body);
        }
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_breaks_the_parser_fails_the_response() {
    let s = start(config()).await;
    // Without stop strings the tiny model's greedy answer to "Hi" starts with DSML markup
    // outside a tool-call block, which the strict parser refuses (as chat does).
    let body = with(
        responses(json!("Hi"), json!({"max_output_tokens": 8})),
        json!({"stop": []}),
    );
    let e = s.send("POST", "/v1/responses", &body).await.error(500);
    assert_eq!(e["type"], "model_output_error", "{e}");
    let streamed = s
        .send(
            "POST",
            "/v1/responses",
            &with(body, json!({"stream": true})),
        )
        .await;
    let events = typed_events(&streamed);
    let (kind, last) = events.last().unwrap();
    assert_eq!(kind, "response.failed", "{}", streamed.body);
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(last["response"]["error"]["code"], e["code"]);
    assert_eq!(last["response"]["error"]["type"], "model_output_error");
    assert!(
        last["response"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a valid DSV4")
    );
    assert_eq!(events[0].0, "response.created");
    assert!(
        s.state.responses().is_empty(),
        "a failed response is not stored"
    );
    s.shutdown().await.unwrap();
}

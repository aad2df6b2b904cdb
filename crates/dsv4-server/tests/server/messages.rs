//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`): each answer is the
//! chat answer to the same conversation (greedy: text, thinking and tool calls alike), its
//! stream assembles to it, count_tokens counts what `/tokenize` counts for the chat messages,
//! and bad requests get Anthropic's error objects naming the field.

use super::common::*;
use dsv4_server::ServerConfig;
use serde_json::{Value, json};

/// A greedy Messages body cut at [`CLEAN_STOPS`] (the tiny model's noise would otherwise break
/// the strict DSV4 parser; grammars need none), with `extra` fields.
pub(super) fn message(messages: Value, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_tokens": 24, "messages": messages,
                          "temperature": 0, "stop_sequences": CLEAN_STOPS});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The greedy chat body of the same conversation, with `extra` fields.
fn chat_body(messages: Value, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_tokens": 24, "messages": messages,
                          "temperature": 0, "stop": CLEAN_STOPS});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

pub(super) fn weather() -> Value {
    json!({"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object",
                            "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
                            "required": ["city"]}})
}

fn chat_weather() -> Value {
    let w = weather();
    json!({"type": "function", "function": {"name": w["name"], "description": w["description"],
                                            "parameters": w["input_schema"]}})
}

/// The text of a message's blocks of `kind` (`text` or `thinking`), concatenated.
fn joined(m: &Value, kind: &str) -> String {
    m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == kind)
        .map(|b| b[kind].as_str().unwrap())
        .collect()
}

/// POST both; assert the Messages answer is the chat answer; the message.
async fn same_as_chat(s: &TestServer, m: &Value, c: &Value) -> Value {
    let got = s.send("POST", "/v1/messages", m).await;
    assert_eq!(got.status, 200, "{}", got.body);
    let got = got.json();
    let want = s.send("POST", "/v1/chat/completions", c).await;
    assert_eq!(want.status, 200, "{}", want.body);
    let want = want.json();
    let msg = &want["choices"][0]["message"];
    assert_eq!(
        joined(&got, "text"),
        msg["content"].as_str().unwrap_or(""),
        "{got}"
    );
    assert_eq!(
        joined(&got, "thinking"),
        msg["reasoning_content"].as_str().unwrap_or(""),
        "{got}"
    );
    let calls: Vec<(Value, Value)> = got["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| (b["name"].clone(), b["input"].clone()))
        .collect();
    let chat_calls: Vec<(Value, Value)> = msg["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    let f = &c["function"];
                    let args = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
                    (f["name"].clone(), args)
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(calls, chat_calls, "{got}");
    let stop = match want["choices"][0]["finish_reason"].as_str().unwrap() {
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ if got["stop_sequence"].is_string() => "stop_sequence",
        _ => "end_turn",
    };
    assert_eq!(got["stop_reason"], stop, "{got}");
    let (u, cu) = (&got["usage"], &want["usage"]);
    assert_eq!(u["output_tokens"], cu["completion_tokens"], "{got}");
    let input =
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input, cu["prompt_tokens"].as_u64().unwrap(), "{got}");
    assert_eq!(got["type"], "message");
    assert_eq!(got["role"], "assistant");
    assert_eq!(got["model"], MODEL);
    assert!(got["id"].as_str().unwrap().starts_with("msg_"), "{got}");
    got
}

/// The message a stream of Messages events assembles to (checking each event's name is its
/// data's type, and the order of block events).
pub(super) fn assembled(r: &Reply) -> Value {
    assert_eq!(r.status, 200, "{}", r.body);
    let mut message = Value::Null;
    let mut open: Option<usize> = None;
    for ev in r.body.split("\n\n").filter(|e| e.contains("data: ")) {
        let name = ev.lines().find_map(|l| l.strip_prefix("event: ")).unwrap();
        let data: Value =
            serde_json::from_str(ev.lines().find_map(|l| l.strip_prefix("data: ")).unwrap())
                .unwrap();
        assert_eq!(data["type"], name, "{ev}");
        match name {
            "message_start" => message = data["message"].clone(),
            "content_block_start" => {
                assert_eq!(open, None, "a block started inside another: {}", r.body);
                let i = data["index"].as_u64().unwrap() as usize;
                assert_eq!(i, message["content"].as_array().unwrap().len());
                message["content"]
                    .as_array_mut()
                    .unwrap()
                    .push(data["content_block"].clone());
                open = Some(i);
            }
            "content_block_delta" => {
                let i = data["index"].as_u64().unwrap() as usize;
                assert_eq!(open, Some(i), "{ev}");
                let block = &mut message["content"][i];
                let d = &data["delta"];
                let (field, add) = match d["type"].as_str().unwrap() {
                    "text_delta" => ("text", d["text"].as_str().unwrap().to_string()),
                    "thinking_delta" => ("thinking", d["thinking"].as_str().unwrap().to_string()),
                    "signature_delta" => {
                        ("signature", d["signature"].as_str().unwrap().to_string())
                    }
                    "input_json_delta" => {
                        ("partial", d["partial_json"].as_str().unwrap().to_string())
                    }
                    other => panic!("unknown delta {other}"),
                };
                let now = block[field].as_str().unwrap_or("").to_string() + &add;
                block[field] = json!(now);
            }
            "content_block_stop" => {
                let i = data["index"].as_u64().unwrap() as usize;
                assert_eq!(open.take(), Some(i), "{ev}");
                let block = &mut message["content"][i];
                if let Some(p) = block.as_object_mut().unwrap().remove("partial") {
                    block["input"] = serde_json::from_str(p.as_str().unwrap()).unwrap();
                }
            }
            "message_delta" => {
                message["stop_reason"] = data["delta"]["stop_reason"].clone();
                message["stop_sequence"] = data["delta"]["stop_sequence"].clone();
                message["usage"] = data["usage"].clone();
            }
            "message_stop" => assert_eq!(open, None),
            other => panic!("unexpected event {other}: {}", r.body),
        }
    }
    assert!(r.body.contains("event: message_stop"), "{}", r.body);
    message
}

/// The stream of `body`, assembled, and the same request unstreamed: equal but for the id.
pub(super) async fn streams_the_same(s: &TestServer, body: &Value) -> Value {
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = s.send("POST", "/v1/messages", &streamed).await;
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let mut got = assembled(&r);
    let mut want = s.send("POST", "/v1/messages", body).await.json();
    got["id"] = Value::Null;
    want["id"] = Value::Null;
    for b in got["content"].as_array_mut().into_iter().flatten() {
        b.as_object_mut().unwrap().remove("id");
    }
    for b in want["content"].as_array_mut().into_iter().flatten() {
        b.as_object_mut().unwrap().remove("id");
    }
    assert_eq!(got, want);
    got
}

#[tokio::test]
async fn a_conversation_answers_as_chat_and_streams_the_same() {
    let s = start(config()).await;
    let system = json!([{"type": "text", "text": "Be brief."},
                        {"type": "text", "text": "Answer in English.", "cache_control": {"type": "ephemeral"}}]);
    let m = message(
        json!([{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                            {"type": "text", "text": "there"}]}]),
        json!({"system": system, "metadata": {"user_id": "u1"}}),
    );
    let c = chat_body(
        json!([{"role": "system", "content": "Be brief.\nAnswer in English."},
               {"role": "user", "content": "Hello\nthere"}]),
        json!({}),
    );
    let got = same_as_chat(&s, &m, &c).await;
    streams_the_same(&s, &m).await;
    if got["stop_reason"] == "stop_sequence" {
        assert!(CLEAN_STOPS.contains(&got["stop_sequence"].as_str().unwrap()));
    }

    // A last assistant message is a prefill the answer continues (chat's `prefix`).
    same_as_chat(
        &s,
        &message(
            json!([{"role": "user", "content": "Count"},
                   {"role": "assistant", "content": "1, 2,"}]),
            json!({}),
        ),
        &chat_body(
            json!([{"role": "user", "content": "Count"},
                   {"role": "assistant", "content": "1, 2,", "prefix": true}]),
            json!({}),
        ),
    )
    .await;
    // In thinking mode too: the prefill closes the reasoning, and the answer goes on as text.
    let got = same_as_chat(
        &s,
        &message(
            json!([{"role": "user", "content": "Count"},
                   {"role": "assistant", "content": [
                       {"type": "thinking", "thinking": "Easy.", "signature": ""},
                       {"type": "text", "text": "1, 2,"}]}]),
            json!({"thinking": {"type": "enabled", "budget_tokens": 4}}),
        ),
        &chat_body(
            json!([{"role": "user", "content": "Count"},
                   {"role": "assistant", "reasoning_content": "Easy.", "content": "1, 2,",
                    "prefix": true}]),
            json!({"chat_template_kwargs": {"thinking": true}}),
        ),
    )
    .await;
    assert_eq!(joined(&got, "thinking"), "", "{got}");
}

#[tokio::test]
async fn tools_thinking_and_json_answer_as_chat() {
    let s = start(config()).await;
    let ask = json!([{"role": "user", "content": "Weather in Oslo?"}]);
    // Any tool: a tool_use block, stop_reason tool_use; its input streamed in input_json_delta
    // pieces as the model writes it. (No
    // stop strings: the grammar keeps the answer clean, and `｜DSML｜` would cut the call.)
    let m = message(
        ask.clone(),
        json!({"tools": [weather()], "stop_sequences": [], "max_tokens": 200,
               "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}),
    );
    let c = chat_body(
        ask.clone(),
        json!({"tools": [chat_weather()], "tool_choice": "required", "parallel_tool_calls": false,
               "stop": [], "max_tokens": 200}),
    );
    let got = same_as_chat(&s, &m, &c).await;
    assert_eq!(got["stop_reason"], "tool_use");
    let call = got["content"].as_array().unwrap().last().unwrap().clone();
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"), "{call}");
    streams_the_same(&s, &m).await;
    let mut streamed = m.clone();
    streamed["stream"] = json!(true);
    let events = s.send("POST", "/v1/messages", &streamed).await.body;
    let pieces = events.matches("\"input_json_delta\"").count();
    assert!(pieces > 1, "the input streams in pieces: {events}");

    // The call and its result continue the conversation, as chat's tool messages.
    let turn = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [call.clone()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                      "content": [{"type": "text", "text": "-3 C"}]}]}]);
    let chat_turn = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call["id"], "type": "function",
            "function": {"name": "get_weather", "arguments": call["input"].to_string()}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "-3 C"}]);
    same_as_chat(
        &s,
        &message(
            turn,
            json!({"tools": [weather()], "tool_choice": {"type": "none"}}),
        ),
        &chat_body(
            chat_turn,
            json!({"tools": [chat_weather()], "tool_choice": "none"}),
        ),
    )
    .await;

    // Thinking with a named tool: a thinking block (an empty signature), then the call.
    let m = message(
        ask.clone(),
        json!({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 3000,
               "tools": [weather()], "tool_choice": {"type": "tool", "name": "get_weather",
                               "disable_parallel_tool_use": true},
               "stop_sequences": []}),
    );
    let c = chat_body(
        ask.clone(),
        json!({"chat_template_kwargs": {"thinking": true}, "max_tokens": 3000,
               "thinking_token_budget": 1024, "tools": [chat_weather()],
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
               "parallel_tool_calls": false, "stop": []}),
    );
    let got = same_as_chat(&s, &m, &c).await;
    let kinds: Vec<_> = got["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "tool_use"], "{got}");
    assert_eq!(got["content"][0]["signature"], "");
    streams_the_same(&s, &m).await;

    // A JSON answer under output_config.format, as chat's response_format.
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"], "additionalProperties": false});
    same_as_chat(
        &s,
        &message(
            ask.clone(),
            json!({"output_config": {"format": {"type": "json_schema", "schema": schema}},
                   "max_tokens": 200, "stop_sequences": []}),
        ),
        &chat_body(
            ask,
            json!({"response_format": {"type": "json_schema",
                                       "json_schema": {"name": "x", "schema": schema}},
                   "max_tokens": 200, "stop": []}),
        ),
    )
    .await;
}

#[tokio::test]
async fn count_tokens_counts_what_tokenize_counts_for_the_chat_messages() {
    let s = start(config()).await;
    let messages = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "-3 C"},
            {"type": "text", "text": "Thanks"}]}]);
    let chat_messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "-3 C"},
        {"role": "user", "content": "Thanks"}]);
    for thinking in [false, true] {
        let mut body = json!({"model": MODEL, "messages": messages, "system": "Be brief.",
                              "tools": [weather()]});
        let mut tok = json!({"model": MODEL, "messages": chat_messages, "tools": [chat_weather()]});
        if thinking {
            body["thinking"] = json!({"type": "adaptive"});
            tok["chat_template_kwargs"] = json!({"thinking": true});
        }
        let r = s.send("POST", "/v1/messages/count_tokens", &body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let want = tokenized(&s.send("POST", "/tokenize", &tok).await.json()).len();
        assert_eq!(
            r.json(),
            json!({"input_tokens": want}),
            "thinking {thinking}"
        );
    }
}

#[tokio::test]
async fn max_tokens_0_runs_the_prompt_only_and_warms_the_prefix_cache() {
    let s = start(config()).await;
    let long = "The weather in Oslo is cold and the weather in Paris is mild. ".repeat(40);
    let body = json!({"model": MODEL, "max_tokens": 0, "system": long,
                      "messages": [{"role": "user", "content": "Weather?"}]});
    let mut counted = body.clone();
    counted.as_object_mut().unwrap().remove("max_tokens");
    let count = s
        .send("POST", "/v1/messages/count_tokens", &counted)
        .await
        .json()["input_tokens"]
        .as_u64()
        .unwrap();
    let first = s.send("POST", "/v1/messages", &body).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let first = first.json();
    assert_eq!(first["content"], json!([]), "{first}");
    assert_eq!(first["stop_reason"], "max_tokens");
    let u = &first["usage"];
    assert_eq!(u["output_tokens"], 0);
    let input = |u: &Value| {
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap()
    };
    assert_eq!(input(u), count);
    // The same prompt again reads most of it from the cache the first request warmed.
    let mut again = body.clone();
    again["max_tokens"] = json!(4);
    again["stop_sequences"] = json!(CLEAN_STOPS);
    let second = s.send("POST", "/v1/messages", &again).await.json();
    let read = second["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(read > count / 2, "{second}");
    assert_eq!(input(&second["usage"]), count);
}

/// Assert Anthropic's error object with `status` and error `type`; its message.
pub(super) fn anthropic_error(r: &Reply, status: u16, kind: &str) -> String {
    assert_eq!(r.status, status, "{}", r.body);
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    v["error"]["message"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn bad_requests_get_anthropic_errors_naming_the_field() {
    let s = start(config()).await;
    let hi = json!([{"role": "user", "content": "Hi"}]);
    let mut no_max = message(hi.clone(), json!({}));
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let cases = [
        (no_max, "max_tokens"),
        (
            message(hi.clone(), json!({"top_logprobs": 2})),
            "top_logprobs",
        ),
        (
            message(
                json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                json!({}),
            ),
            "messages[0].content[0].type",
        ),
        (
            message(hi.clone(), json!({"tool_choice": {"type": "any"}})),
            "tool_choice",
        ),
        (
            message(
                hi.clone(),
                json!({"tools": [{"type": "bash_20250124", "name": "bash"}]}),
            ),
            "tools[0].type",
        ),
        (
            message(hi.clone(), json!({"thinking": {"type": "enabled"}})),
            "thinking.budget_tokens",
        ),
        (
            message(hi.clone(), json!({"output_config": {"effort": "extreme"}})),
            "output_config.effort",
        ),
        (
            message(hi.clone(), json!({"mcp_servers": []})),
            "mcp_servers",
        ),
        (
            message(hi.clone(), json!({"max_tokens": 1_000_000})),
            "max_tokens",
        ),
        (message(json!([]), json!({})), "messages"),
    ];
    for (body, field) in cases {
        let r = s.send("POST", "/v1/messages", &body).await;
        let said = anthropic_error(&r, 400, "invalid_request_error");
        assert!(said.contains(field), "{field}: {said}");
    }
    let r = s
        .send(
            "POST",
            "/v1/messages",
            &message(hi.clone(), json!({"model": "claude-x"})),
        )
        .await;
    anthropic_error(&r, 404, "not_found_error");
    let r = request(s.addr, "POST", "/v1/messages", &[], b"{\"model\": ").await;
    anthropic_error(&r, 400, "invalid_request_error");
    let r = s
        .send(
            "POST",
            "/v1/messages/count_tokens",
            &json!({"model": MODEL, "messages": "x"}),
        )
        .await;
    anthropic_error(&r, 400, "invalid_request_error");
}

#[tokio::test]
async fn the_api_key_may_come_as_x_api_key() {
    let s = start(ServerConfig {
        api_key: Some("sk-test".into()),
        ..config()
    })
    .await;
    let body = message(
        json!([{"role": "user", "content": "Hi"}]),
        json!({"max_tokens": 2}),
    )
    .to_string();
    let r = request(s.addr, "POST", "/v1/messages", &[], body.as_bytes()).await;
    let said = anthropic_error(&r, 401, "authentication_error");
    assert!(said.contains("x-api-key"), "{said}");
    let r = request(
        s.addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", "wrong")],
        body.as_bytes(),
    )
    .await;
    anthropic_error(&r, 401, "authentication_error");
    let r = request(
        s.addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", "sk-test")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Any keyed route takes it; the OpenAI routes keep their error shape.
    let r = request(
        s.addr,
        "GET",
        "/v1/models",
        &[("x-api-key", "sk-test")],
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.get("/v1/models").await.error(401);
}

#[tokio::test]
async fn the_model_list_reads_as_anthropics_too() {
    let before = dsv4_core::time::now_unix();
    let s = start(config()).await;
    let after = dsv4_core::time::now_unix();
    let v = s.get("/v1/models").await.json();
    assert_eq!(
        (&v["has_more"], &v["first_id"], &v["last_id"]),
        (&json!(false), &json!(MODEL), &json!(MODEL)),
        "{v}"
    );
    let m = &v["data"][0];
    assert_eq!(
        (&m["type"], &m["display_name"]),
        (&json!("model"), &json!(MODEL))
    );
    // Created when the server started, the same instant in both fields.
    let created = m["created"].as_i64().unwrap();
    assert!((before..=after).contains(&created), "{m}");
    assert_eq!(
        m["created_at"],
        dsv4_core::time::rfc3339(created),
        "the time `created` says"
    );
    assert_eq!(&s.get(&format!("/v1/models/{MODEL}")).await.json(), m);
}

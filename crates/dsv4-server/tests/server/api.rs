//! The API surface on the tiny model: chat (plain, streamed, thinking), tool calls under
//! `tool_choice` required/named with a round trip, JSON answers, completions, models, usage,
//! stop strings and metrics.

use super::common::*;
use dsv4_chat::{Conversation, EncodeOptions, Tokenizer, encode_prompt_ids};
use serde_json::{Value, json};

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "enum": ["Oslo", "Paris"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 3}},
              "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    ])
}

/// The content of a stream's chunks, and its finish reason.
fn streamed(events: &[Value]) -> (String, String, Vec<Value>) {
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for e in events.iter().filter(|e| e.is_object()) {
        for c in e["choices"].as_array().unwrap() {
            let d = &c["delta"];
            content.push_str(d["content"].as_str().unwrap_or(""));
            reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            calls.extend(d["tool_calls"].as_array().cloned().unwrap_or_default());
        }
    }
    (content, reasoning, joined_calls(&calls))
}

fn finish(events: &[Value]) -> Value {
    events
        .iter()
        .filter(|e| e.is_object())
        .flat_map(|e| e["choices"].as_array().unwrap().clone())
        .find(|c| !c["finish_reason"].is_null())
        .map(|c| c["finish_reason"].clone())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_answers_equal_their_streams_and_count_usage() {
    let s = start(config()).await;
    let req = chat("Hello there", json!({"max_tokens": 8, "stop": CLEAN_STOPS}));
    let r = s.send("POST", "/v1/chat/completions", &req).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(
        choice["message"].get("reasoning_content").is_none(),
        "chat mode: {v}"
    );
    assert!(choice["message"].get("tool_calls").is_none(), "{v}");
    let content = choice["message"]["content"].as_str().unwrap().to_string();
    let reason = choice["finish_reason"].as_str().unwrap();
    assert!(["stop", "length"].contains(&reason), "{v}");
    let conv = Conversation::from_json_str(&req.to_string()).unwrap();
    let (_, ids) = encode_prompt_ids(
        &conv,
        &EncodeOptions::default(),
        &Tokenizer::tiny().unwrap(),
    )
    .unwrap();
    let usage = &v["usage"];
    assert_eq!(usage["prompt_tokens"], ids.len());
    let n = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&n), "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        ids.len() as u64 + n
    );

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let r = s.send("POST", "/v1/chat/completions", &sreq).await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = r.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    let (text, _, _) = streamed(&events);
    assert_eq!(text, content, "the stream carries the same answer");
    assert_eq!(finish(&events), reason);
    let usage_chunk = &events[events.len() - 2];
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], *usage);
    for e in &events[..events.len() - 2] {
        assert!(e["usage"].is_null() && e.get("usage").is_some(), "{e}");
        assert_eq!(e["id"], events[0]["id"]);
    }
    // Without include_usage no chunk carries usage.
    sreq["stream_options"] = json!(null);
    let events = s.send("POST", "/v1/chat/completions", &sreq).await.events();
    assert!(
        events.iter().all(|e| e.get("usage").is_none()),
        "{events:?}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tool_calls_round_trip_with_a_tool_result() {
    let s = start(config()).await;
    let req = chat(
        "Weather in Oslo?",
        json!({"tools": weather_tools(), "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 400}),
    );
    let r = s.send("POST", "/v1/chat/completions", &req).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let msg = &choice["message"];
    assert!(msg["content"].is_null(), "{msg}");
    let calls = msg["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{msg}");
    let call = &calls[0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    let name = call["function"]["name"].as_str().unwrap();
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    match name {
        "get_weather" => assert!(
            ["Oslo", "Paris"].contains(&args["city"].as_str().unwrap()),
            "{args}"
        ),
        "get_time" => assert_eq!(args, json!({})),
        other => panic!("unknown tool {other}"),
    }

    // Streamed, the same call arrives in pieces as the model writes it: its id and name, then
    // its arguments in several deltas.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = s.send("POST", "/v1/chat/completions", &sreq).await.events();
    let pieces = events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["tool_calls"].is_array())
        .count();
    assert!(pieces > 2, "{events:?}");
    let (_, _, scalls) = streamed(&events);
    assert_eq!(scalls.len(), 1, "{events:?}");
    assert_eq!(scalls[0]["index"], 0);
    assert_eq!(scalls[0]["function"], call["function"]);
    assert_eq!(finish(&events), "tool_calls");

    // The tool's result goes back; the conversation continues.
    let first_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut follow = req.clone();
    follow["messages"].as_array_mut().unwrap().extend([
        msg.clone(),
        json!({"role": "tool", "tool_call_id": call["id"], "content": "{\"temp_c\": 4}"}),
    ]);
    follow["tool_choice"] = json!("auto");
    follow["max_tokens"] = json!(6);
    follow["stop"] = json!(CLEAN_STOPS);
    let r = s.send("POST", "/v1/chat/completions", &follow).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v2 = r.json();
    assert!(
        v2["usage"]["prompt_tokens"].as_u64().unwrap() > first_prompt + 10,
        "{v2}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_tools_thinking_json_answers_and_tool_choice_none() {
    let s = start(config()).await;
    let named = chat(
        "Time?",
        json!({"tools": weather_tools(), "max_tokens": 400,
               "tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
    );
    let v = s.send("POST", "/v1/chat/completions", &named).await.json();
    for c in v["choices"][0]["message"]["tool_calls"].as_array().unwrap() {
        assert_eq!(c["function"]["name"], "get_time", "{v}");
    }
    let thinking = chat(
        "Weather?",
        json!({"tools": weather_tools(), "tool_choice": "required", "max_tokens": 3000,
               "parallel_tool_calls": false, "chat_template_kwargs": {"thinking": true}}),
    );
    let r = s.send("POST", "/v1/chat/completions", &thinking).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let msg = &r.json()["choices"][0]["message"];
    assert!(msg["reasoning_content"].is_string(), "{msg}");
    assert_eq!(msg["tool_calls"].as_array().unwrap().len(), 1, "{msg}");

    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": false});
    let rf = chat(
        "JSON please",
        json!({"max_tokens": 200, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}),
    );
    for stream in [false, true] {
        let mut req = rf.clone();
        req["stream"] = json!(stream);
        let r = s.send("POST", "/v1/chat/completions", &req).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let content = if stream {
            streamed(&r.events()).0
        } else {
            r.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let v: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{e}: {content}"));
        assert!(v["ok"].is_boolean() && v["n"].as_u64().unwrap() <= 9, "{v}");
    }

    // tool_choice none leaves the tools out of the prompt.
    let base = json!({"tools": weather_tools(), "max_tokens": 2, "stop": CLEAN_STOPS});
    let auto = s
        .send("POST", "/v1/chat/completions", &chat("Hi", base.clone()))
        .await
        .json();
    let mut none = chat("Hi", base);
    none["tool_choice"] = json!("none");
    let none = s.send("POST", "/v1/chat/completions", &none).await.json();
    assert!(
        none["usage"]["prompt_tokens"].as_u64() < auto["usage"]["prompt_tokens"].as_u64(),
        "{none} vs {auto}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_models_stops_and_metrics() {
    let s = start(config()).await;
    let v = s.get("/v1/models").await.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["max_model_len"], 65536);
    assert_eq!(
        s.get(&format!("/v1/models/{MODEL}")).await.json()["id"],
        MODEL
    );

    let req =
        json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0});
    let v = s.send("POST", "/v1/completions", &req).await.json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    let usage = v["usage"].clone();
    let tok = Tokenizer::tiny().unwrap();
    assert_eq!(
        usage["prompt_tokens"],
        1 + tok.encode("Once upon a time").unwrap().len()
    );
    // The same prompt as token ids (BOS included) gives the same text.
    let mut ids = vec![0u32];
    ids.extend(tok.encode("Once upon a time").unwrap());
    let by_ids = json!({"model": MODEL, "prompt": ids, "max_tokens": 12, "temperature": 0});
    let v2 = s.send("POST", "/v1/completions", &by_ids).await.json();
    assert_eq!(v2["choices"][0]["text"], text.as_str());
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let events = s.send("POST", "/v1/completions", &sreq).await.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let streamed: String = events
        .iter()
        .filter(|e| e.is_object())
        .flat_map(|e| e["choices"].as_array().unwrap().clone())
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(events[events.len() - 2]["usage"], usage);

    // A stop string taken from the answer ends it there, cut before the stop.
    let stop: String = text.chars().skip(2).take(1).collect();
    let mut stopped = req.clone();
    stopped["stop"] = json!(stop);
    let v = s.send("POST", "/v1/completions", &stopped).await.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let cut = v["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with(cut) && !cut.contains(&stop),
        "{cut:?} from {text:?}"
    );
    // include_stop_str_in_output keeps the stop string, streamed or not.
    stopped["include_stop_str_in_output"] = json!(true);
    let kept = s.send("POST", "/v1/completions", &stopped).await.json();
    assert_eq!(kept["choices"][0]["finish_reason"], "stop");
    assert_eq!(kept["choices"][0]["text"], format!("{cut}{stop}"));
    stopped["stream"] = json!(true);
    let streamed: String = s
        .send("POST", "/v1/completions", &stopped)
        .await
        .events()
        .iter()
        .filter(|e| e.is_object())
        .flat_map(|e| e["choices"].as_array().unwrap().clone())
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, format!("{cut}{stop}"));

    let m = s.get("/metrics").await;
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    for needle in [
        "dsv4:http_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 6",
        "dsv4:request_success_total{finished_reason=\"stop\"}",
        "dsv4:time_to_first_token_seconds_count 6",
        "dsv4:request_queue_time_seconds_count 6",
        "dsv4:time_per_output_token_seconds_bucket{le=\"+Inf\"}",
        "dsv4:num_requests_running 0",
        "dsv4:num_requests_waiting 0",
        "dsv4:prefix_cache_hit_rate",
        "dsv4:cache_pool_total_pages{pool=\"swa_kv\"}",
        "dsv4:generation_tokens_total",
        "dsv4:engine_logit_rows_total",
        "dsv4:engine_prefill_waits_total 0",
        "dsv4:grammar_compile_seconds_count 0",
        "dsv4:grammar_cache_entries 0",
        "dsv4:thinking_budget_cuts_total 0",
    ] {
        assert!(m.body.contains(needle), "{needle} missing:\n{}", m.body);
    }
    s.shutdown().await.unwrap();
}

//! SGLang's request fields, so a dsv4 server answers behind SGLang's router: the router
//! (sglang-router 0.3.2) forwards every body with SGLang's switches at their defaults, and each
//! route answers those bodies exactly as the plain requests. `no_stop_trim` is
//! `include_stop_str_in_output`, `separate_reasoning: false` leaves the reasoning in the
//! content, `stream_reasoning: false` streams it in one chunk with all its tokens,
//! `skip_special_tokens` hides special tokens in raw chat answers, and the switches dsv4 lacks
//! are refused when on.

use super::common::*;
use dsv4_server::{OutputParsing, ServerConfig};
use serde_json::{Value, json};

/// `base` with `extra`'s keys added.
fn with(base: &Value, extra: Value) -> Value {
    let mut v = base.clone();
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

/// The chat fields sglang-router 0.3.2 adds to every chat body it forwards.
fn router_chat() -> Value {
    json!({"logprobs": false, "stream": false, "no_stop_trim": false, "ignore_eos": false,
           "continue_final_message": false, "skip_special_tokens": true,
           "separate_reasoning": true, "stream_reasoning": true, "return_hidden_states": false})
}

/// The chat message of a JSON answer.
async fn message(s: &TestServer, body: &Value) -> Value {
    let r = s.send("POST", "/v1/chat/completions", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["message"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_bodies_answer_as_the_plain_requests() {
    let s = start(config()).await;
    let plain = chat("Hello there", json!({"max_tokens": 12, "temperature": 0}));
    let routed = with(
        &with(&plain, router_chat()),
        json!({"max_completion_tokens": 12}),
    );
    assert_eq!(message(&s, &routed).await, message(&s, &plain).await);

    // The router asks for SGLang's default, special tokens left out, which dsv4's completions
    // honour (their own default shows them).
    let plain = json!({"model": MODEL, "prompt": "Once upon", "max_tokens": 12, "temperature": 0,
                       "skip_special_tokens": true});
    let routed = with(
        &plain,
        json!({"stream": false, "echo": false, "no_stop_trim": false, "ignore_eos": false,
               "skip_special_tokens": true, "return_hidden_states": false}),
    );
    let text = |v: Value| v["choices"][0]["text"].clone();
    let a = s.send("POST", "/v1/completions", &plain).await.json();
    let b = s.send("POST", "/v1/completions", &routed).await.json();
    assert_eq!(text(b), text(a));

    let plain = json!({"text": "Once upon", "sampling_params":
                       {"max_new_tokens": 12, "temperature": 0}});
    let routed = with(
        &plain,
        json!({"model": null, "return_text_in_logprobs": false, "stream": false,
               "log_metrics": true, "return_hidden_states": false, "background": false,
               "no_logs": false, "return_bytes": false, "return_entropy": false}),
    );
    let out = |v: Value| (v["text"].clone(), v["output_ids"].clone());
    let a = s.send("POST", "/generate", &plain).await.json();
    let b = s.send("POST", "/generate", &routed).await.json();
    assert_eq!(out(b), out(a));
    let named = with(&plain, json!({"model": MODEL}));
    assert_eq!(s.send("POST", "/generate", &named).await.status, 200);
    let other = with(&plain, json!({"model": "other"}));
    let e = s.send("POST", "/generate", &other).await.error(404);
    assert_eq!(e["code"], "model_not_found", "{e}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stop_trim_is_include_stop_str_in_output() {
    let s = start(config()).await;
    let base = json!({"model": MODEL, "prompt": "Once upon", "max_tokens": 16, "temperature": 0});
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let full = text(&s.send("POST", "/v1/completions", &base).await.json());
    // A stop string from the middle of the greedy answer.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 6, "{full:?}");
    let stop: String = chars[3..5].iter().collect();
    let stopped = with(&base, json!({"stop": [stop]}));
    let vllm = with(&stopped, json!({"include_stop_str_in_output": true}));
    let sglang = with(&stopped, json!({"no_stop_trim": true}));
    let kept = text(&s.send("POST", "/v1/completions", &vllm).await.json());
    assert!(kept.ends_with(&stop), "{kept:?} ends with {stop:?}");
    assert_eq!(
        text(&s.send("POST", "/v1/completions", &sglang).await.json()),
        kept
    );
    let chat_base = chat("Hello", json!({"max_tokens": 16, "temperature": 0}));
    let answer = message(&s, &chat_base).await["content"]
        .as_str()
        .unwrap()
        .to_string();
    let chars: Vec<char> = answer.chars().collect();
    let stop: String = chars[2..4].iter().collect();
    let kept = message(
        &s,
        &with(&chat_base, json!({"stop": [stop], "no_stop_trim": true})),
    )
    .await;
    assert!(kept["content"].as_str().unwrap().ends_with(&stop), "{kept}");

    let both = with(
        &base,
        json!({"include_stop_str_in_output": true, "no_stop_trim": false}),
    );
    let e = s.send("POST", "/v1/completions", &both).await.error(400);
    assert_eq!(e["param"], "no_stop_trim", "{e}");
    s.shutdown().await.unwrap();
}

/// A thinking-mode chat whose grammar forces reasoning, `</think>` and one tool call.
fn thinking_call() -> Value {
    chat(
        "Weather?",
        json!({"tools": [{"type": "function", "function": {"name": "get_time",
                 "parameters": {"type": "object", "properties": {}}}}],
               "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 3000,
               "temperature": 0, "chat_template_kwargs": {"thinking": true}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_reasoning_false_leaves_the_reasoning_in_the_content() {
    let s = start(config()).await;
    let separate = message(&s, &thinking_call()).await;
    let reasoning = separate["reasoning_content"].as_str().unwrap();
    let joined = message(
        &s,
        &with(&thinking_call(), json!({"separate_reasoning": false})),
    )
    .await;
    assert!(
        joined["reasoning_content"]
            .as_str()
            .is_none_or(str::is_empty),
        "{joined}"
    );
    assert_eq!(
        joined["content"].as_str().unwrap(),
        format!("{reasoning}</think>"),
        "{joined}"
    );
    let name = |m: &Value| m["tool_calls"][0]["function"].clone();
    assert_eq!(name(&joined), name(&separate));
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_reasoning_false_sends_the_reasoning_in_one_chunk_with_its_tokens() {
    let s = start(config()).await;
    let streamed = with(
        &thinking_call(),
        json!({"stream": true, "logprobs": true, "return_token_ids": true}),
    );
    let events = |body: Value| {
        let s = &s;
        async move {
            let r = s.send("POST", "/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200, "{}", r.body);
            r.events()
        }
    };
    let live = events(streamed.clone()).await;
    let held = events(with(&streamed, json!({"stream_reasoning": false}))).await;
    // (reasoning chunks, reasoning, logprob entries, token ids, tool calls)
    let sum = |evs: &[Value]| {
        let (mut chunks, mut text, mut entries, mut ids, mut calls) =
            (0, String::new(), 0, Vec::new(), Vec::new());
        for e in evs.iter().filter(|e| e.is_object()) {
            for c in e["choices"].as_array().unwrap() {
                if let Some(r) = c["delta"]["reasoning_content"].as_str() {
                    chunks += 1;
                    text.push_str(r);
                }
                entries += c["logprobs"]["content"].as_array().map_or(0, Vec::len);
                ids.extend(c["token_ids"].as_array().cloned().unwrap_or_default());
                for t in c["delta"]["tool_calls"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                {
                    calls.push(t["function"]["name"].clone());
                }
            }
        }
        (chunks, text, entries, ids, calls)
    };
    let (live_chunks, live_text, live_entries, live_ids, live_calls) = sum(&live);
    let (held_chunks, held_text, held_entries, held_ids, held_calls) = sum(&held);
    assert!(
        live_chunks > 1,
        "the reasoning streams as it comes: {live_chunks}"
    );
    assert_eq!(held_chunks, 1, "held back, then sent whole");
    assert_eq!(held_text, live_text);
    assert!(!held_text.is_empty());
    assert_eq!(held_entries, live_entries, "every token's entry is sent");
    assert_eq!(held_ids, live_ids, "every token's id is sent, in order");
    assert_eq!(held_calls, live_calls);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_special_tokens_hides_special_tokens_in_raw_chat_answers() {
    let s = start(ServerConfig {
        output: OutputParsing::Raw,
        ..config()
    })
    .await;
    let special = 100u32;
    let body = chat(
        "Hi",
        json!({"logit_bias": {special.to_string(): 100}, "max_tokens": 2}),
    );
    let one = dsv4_chat::markers::reserved(special);
    let shown = message(&s, &body).await;
    assert_eq!(shown["content"], format!("{one}{one}"), "{shown}");
    let hidden = message(&s, &with(&body, json!({"skip_special_tokens": true}))).await;
    assert_eq!(hidden["content"], "", "{hidden}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switches_dsv4_lacks_are_refused_when_on() {
    let s = start(config()).await;
    let cases = [
        (
            "/v1/chat/completions",
            chat("x", json!({"max_tokens": 1})),
            "return_hidden_states",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "x", "max_tokens": 1}),
            "return_hidden_states",
        ),
        ("/generate", json!({"text": "x"}), "return_hidden_states"),
        ("/generate", json!({"text": "x"}), "background"),
        ("/generate", json!({"text": "x"}), "return_bytes"),
        ("/generate", json!({"text": "x"}), "return_entropy"),
    ];
    for (path, body, field) in cases {
        let on = with(&body, json!({field: true}));
        let e = s.send("POST", path, &on).await.error(400);
        assert_eq!(e["param"], field, "{path}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains("not supported"),
            "{e}"
        );
        let off = with(&body, json!({field: false}));
        assert_eq!(
            s.send("POST", path, &off).await.status,
            200,
            "{path} {field}"
        );
    }
    s.shutdown().await.unwrap();
}

//! Thinking budgets (`thinking_token_budget` on chat, `thinking.budget_tokens` on
//! `/v1/messages`): a greedy answer with a budget is the answer without one, cut at the budget
//! by `</think>`, then goes on; a grammar still holds after it; chat mode and a budget the
//! reasoning stays within change nothing; and bad budgets are 400s naming the field.

use super::common::*;
use dsv4_chat::{Tokenizer, markers};
use dsv4_server::{OutputParsing, ServerConfig};
use serde_json::{Value, json};

fn think_end() -> u64 {
    u64::from(
        Tokenizer::tiny()
            .unwrap()
            .token_id(markers::THINK_END)
            .unwrap(),
    )
}

/// A greedy thinking-mode chat body returning its token ids, with `extra` fields.
fn thinking(extra: Value) -> Value {
    let mut body = chat(
        "Why is the sky blue?",
        json!({"chat_template_kwargs": {"thinking": true}, "max_tokens": 24, "stop": [],
               "return_token_ids": true}),
    );
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// Where a budget of `budget` tokens ends reasoning that would have gone on as `free`: at the
/// first token boundary from `budget` on that is also a character boundary (tiny ids from
/// 128 are the bytes; the lower ones are special tokens, whole text).
fn cut_at(free: &[u64], budget: usize) -> usize {
    let complete = |ids: &[u64]| {
        let mut owed = 0u8;
        for &id in ids {
            owed = match id.checked_sub(128).map(|b| b as u8) {
                Some(0x80..=0xBF) => owed.saturating_sub(1),
                Some(0xC0..=0xDF) => 1,
                Some(0xE0..=0xEF) => 2,
                Some(0xF0..=0xF7) => 3,
                _ => 0,
            };
        }
        owed == 0
    };
    (budget..=free.len())
        .find(|&i| complete(&free[..i]))
        .unwrap()
}

/// The generated token ids of an answer's first choice (chat or completion).
fn first_ids(v: &Value) -> Vec<u64> {
    v["choices"][0]["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no token ids: {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// The generated token ids of a chat answer.
async fn token_ids(s: &TestServer, body: &Value) -> Vec<u64> {
    let r = s.send("POST", "/v1/chat/completions", body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    first_ids(&r.json())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_cuts_the_reasoning_with_think_end_where_it_is_spent() {
    // Raw output: the answer's tokens whatever the tiny model writes.
    let s = start(ServerConfig {
        output: OutputParsing::Raw,
        ..config()
    })
    .await;
    let end = think_end();
    let free = token_ids(&s, &thinking(json!({}))).await;
    let natural = free.iter().position(|&t| t == end).unwrap_or(free.len());
    assert!(
        natural > 6,
        "the free reasoning must outlast the budgets: {free:?}"
    );
    let mut waited = false;
    for budget in [0usize, 1, 4, 6] {
        let got = token_ids(&s, &thinking(json!({"thinking_token_budget": budget}))).await;
        let at = cut_at(&free, budget);
        waited |= at > budget;
        assert_eq!(got[..at], free[..at], "budget {budget}");
        assert_eq!(got[at], end, "budget {budget}: {got:?}");
        // The answer goes on after it (the random tiny model may write `</think>` again).
        assert!(got.len() > at + 1, "{got:?}");
    }
    assert!(waited, "one budget ends inside a character: {free:?}");
    assert_eq!(metric(&s, "dsv4:thinking_budget_cuts_total").await, 4);

    // The usage counts the reasoning up to and including `</think>`, over every choice, plain
    // and streamed; chat mode has no count.
    let budgeted = thinking(json!({"thinking_token_budget": 1, "n": 2, "seed": 3}));
    let r = s.send("POST", "/v1/chat/completions", &budgeted).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let reasoning: u64 = (0..2)
        .map(|i| {
            let ids = &v["choices"][i]["token_ids"];
            let at = ids
                .as_array()
                .unwrap()
                .iter()
                .position(|t| t == end)
                .unwrap();
            at as u64 + 1
        })
        .sum();
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], reasoning,
        "{v}"
    );
    let mut streamed = budgeted.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = s.send("POST", "/v1/chat/completions", &streamed).await;
    let events = r.events();
    let last = events
        .iter()
        .rev()
        .find(|e| e["usage"].is_object())
        .unwrap();
    assert_eq!(
        last["usage"]["completion_tokens_details"], v["usage"]["completion_tokens_details"],
        "{last}"
    );
    let mut chat_mode = thinking(json!({}));
    chat_mode["chat_template_kwargs"] = json!({"thinking": false});
    let r = s.send("POST", "/v1/chat/completions", &chat_mode).await;
    assert!(
        r.json()["usage"].get("completion_tokens_details").is_none(),
        "{}",
        r.body
    );
    // A budget the reasoning stays within, and chat mode, change nothing.
    let roomy = json!({"thinking_token_budget": natural + 5});
    assert_eq!(token_ids(&s, &thinking(roomy)).await, free);
    let chat_mode = |extra: Value| {
        let mut b = thinking(extra);
        b["chat_template_kwargs"] = json!({"thinking": false});
        b
    };
    assert_eq!(
        token_ids(&s, &chat_mode(json!({"thinking_token_budget": 0}))).await,
        token_ids(&s, &chat_mode(json!({}))).await
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_holds_under_a_grammar_and_streams_the_same() {
    let s = start(config()).await;
    let ask = |extra: Value| {
        let mut b = chat(
            "Is it raining?",
            json!({"structured_outputs": {"choice": ["yes", "no"]},
                   "chat_template_kwargs": {"thinking": true}, "max_tokens": 3000}),
        );
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let r = s
        .send("POST", "/v1/chat/completions", &ask(json!({})))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let free = r.json()["choices"][0]["message"].clone();
    let free_reasoning = free["reasoning_content"].as_str().unwrap().to_string();
    // Tiny tokens are bytes; the grammar keeps the reasoning whole characters (at most 4
    // bytes each).
    assert!(free_reasoning.len() > 5 + 3, "{free}");

    let budgeted = ask(json!({"thinking_token_budget": 5}));
    let r = s.send("POST", "/v1/chat/completions", &budgeted).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let msg = &v["choices"][0]["message"];
    let reasoning = msg["reasoning_content"].as_str().unwrap();
    assert!(
        (5..=5 + 3).contains(&reasoning.len()) && free_reasoning.starts_with(reasoning),
        "the first 5 tokens, to a character's end: {reasoning:?} of {free_reasoning:?}"
    );
    assert!(
        ["yes", "no"].contains(&msg["content"].as_str().unwrap()),
        "{msg}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Streamed: the same reasoning and answer.
    let mut streamed = budgeted.clone();
    streamed["stream"] = json!(true);
    let r = s.send("POST", "/v1/chat/completions", &streamed).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (mut reasoning_s, mut content_s) = (String::new(), String::new());
    for chunk in r.events().iter().filter(|e| e.is_object()) {
        let delta = &chunk["choices"][0]["delta"];
        reasoning_s += delta["reasoning_content"].as_str().unwrap_or("");
        content_s += delta["content"].as_str().unwrap_or("");
    }
    assert_eq!(
        (reasoning_s.as_str(), &content_s),
        (reasoning, &msg["content"].as_str().unwrap().to_string())
    );
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn messages_enforce_budget_tokens_as_chat_enforces_its_budget() {
    let s = start(config()).await;
    let ask = json!([{"role": "user", "content": "Weather in Oslo?"}]);
    let weather = json!({"name": "get_weather",
        "input_schema": {"type": "object",
                         "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
                         "required": ["city"]}});
    let m = json!({"model": MODEL, "max_tokens": 3000, "messages": ask, "temperature": 0,
                   "thinking": {"type": "enabled", "budget_tokens": 4},
                   "tools": [weather.clone()],
                   "tool_choice": {"type": "tool", "name": "get_weather"}});
    let c = json!({"model": MODEL, "max_tokens": 3000, "messages": ask, "temperature": 0,
                   "chat_template_kwargs": {"thinking": true}, "thinking_token_budget": 4,
                   "tools": [{"type": "function", "function": {"name": "get_weather",
                                                                "parameters": weather["input_schema"]}}],
                   "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let got = s.send("POST", "/v1/messages", &m).await;
    assert_eq!(got.status, 200, "{}", got.body);
    let got = got.json();
    let want = s.send("POST", "/v1/chat/completions", &c).await;
    assert_eq!(want.status, 200, "{}", want.body);
    let want = want.json()["choices"][0]["message"].clone();
    assert_eq!(got["content"][0]["type"], "thinking", "{got}");
    let thought = got["content"][0]["thinking"].as_str().unwrap();
    assert_eq!(thought, want["reasoning_content"].as_str().unwrap());
    assert!(
        (4..8).contains(&thought.len()),
        "4 tokens, to a character's end: {thought:?}"
    );
    assert_eq!(got["content"][1]["type"], "tool_use", "{got}");
    assert_eq!(
        got["content"][1]["input"].to_string(),
        want["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .map(|a| serde_json::from_str::<Value>(a).unwrap().to_string())
            .unwrap()
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_budget_applies_to_requests_that_give_none() {
    // `server.thinking_token_budget = 2`, raw output.
    let s = start(ServerConfig {
        output: OutputParsing::Raw,
        thinking_token_budget: Some(2),
        ..config()
    })
    .await;
    let end = think_end();
    let free = token_ids(&s, &thinking(json!({"thinking_token_budget": 1000}))).await;
    let got = token_ids(&s, &thinking(json!({}))).await;
    assert_eq!(got[cut_at(&free, 2)], end, "{got:?}");
    // A request's own budget wins.
    let got = token_ids(&s, &thinking(json!({"thinking_token_budget": 6}))).await;
    assert_eq!(got[cut_at(&free, 6)], end, "{got:?}");
    // The Responses API (no field for a budget) takes the server's.
    let r = s
        .send(
            "POST",
            "/v1/responses",
            &json!({"model": MODEL, "input": "Why is the sky blue?", "temperature": 0,
                    "reasoning": {"effort": "medium"}, "max_output_tokens": 24}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["usage"]["output_tokens_details"]["reasoning_tokens"],
        cut_at(&free, 2) as u64 + 1,
        "{}",
        r.body
    );
    // So does a raw prompt that ends with `<think>`.
    let got = completion_ids(&s, RAW_THINKING, json!({})).await;
    assert_eq!(got[cut_at(&free, 2)], end, "{got:?}");
    // Beam search cannot follow a budget: the server's does not apply to it.
    let beams = thinking(json!({"use_beam_search": true, "n": 2, "max_tokens": 4}));
    let r = s.send("POST", "/v1/chat/completions", &beams).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // An adaptive Messages request takes it too.
    let m = json!({"model": MODEL, "max_tokens": 24, "temperature": 0,
                   "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                   "thinking": {"type": "adaptive"}});
    let r = s.send("POST", "/v1/messages", &m).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.json()["content"][0]["text"].as_str().unwrap().to_string();
    let first = thinking(json!({}));
    let r = s.send("POST", "/v1/chat/completions", &first).await;
    assert_eq!(
        text,
        r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
    );
    s.shutdown().await.unwrap();
}

/// The chat prompt of [`thinking`], as raw text.
const RAW_THINKING: &str =
    "<｜begin▁of▁sentence｜><｜User｜>Why is the sky blue?<｜Assistant｜><think>";

/// The generated ids of a text completion of `prompt`, with `extra` fields.
async fn completion_ids(s: &TestServer, prompt: &str, extra: Value) -> Vec<u64> {
    let mut body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 24,
                          "temperature": 0, "return_token_ids": true});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let r = s.send("POST", "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    first_ids(&r.json())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_prompts_that_end_with_think_take_budgets_too() {
    let s = start(ServerConfig {
        output: OutputParsing::Raw,
        ..config()
    })
    .await;
    let end = think_end();
    // The raw prompt is the chat prompt: the same free answer.
    let free = completion_ids(&s, RAW_THINKING, json!({})).await;
    assert_eq!(free, token_ids(&s, &thinking(json!({}))).await);
    let got = completion_ids(&s, RAW_THINKING, json!({"thinking_token_budget": 4})).await;
    let at = cut_at(&free, 4);
    assert_eq!((&got[..at], got[at]), (&free[..at], end), "{got:?}");
    // SGLang's /generate spells it sampling_params.thinking_budget.
    let r = s
        .send(
            "POST",
            "/generate",
            &json!({"text": RAW_THINKING,
                    "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                        "thinking_budget": 4}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["output_ids"], json!(got));
    // A prompt that does not end with `<think>` is not in reasoning: no cut.
    let plain = "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>";
    assert_eq!(
        completion_ids(&s, plain, json!({"thinking_token_budget": 0})).await,
        completion_ids(&s, plain, json!({})).await
    );
    // With beam search, a budget is refused.
    let mut beams = json!({"model": MODEL, "prompt": RAW_THINKING, "max_tokens": 4,
                           "use_beam_search": true, "n": 2, "thinking_token_budget": 2});
    let r = s.send("POST", "/v1/completions", &beams).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("thinking_token_budget"), "{}", r.body);
    beams
        .as_object_mut()
        .unwrap()
        .remove("thinking_token_budget");
    let r = s.send("POST", "/v1/completions", &beams).await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_budgets_are_400s_naming_the_field() {
    let s = start(config()).await;
    let chat_cases = [
        json!({"thinking_token_budget": -1}),
        json!({"thinking_token_budget": "many"}),
        json!({"thinking_token_budget": 4, "use_beam_search": true, "n": 2}),
    ];
    for extra in chat_cases {
        let r = s
            .send("POST", "/v1/chat/completions", &thinking(extra.clone()))
            .await;
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        assert!(
            r.body.contains("thinking_token_budget"),
            "{extra}: {}",
            r.body
        );
    }
    let hi = json!([{"role": "user", "content": "Hi"}]);
    for (thinking, max_tokens) in [
        (json!({"type": "enabled", "budget_tokens": 64}), 64),
        (json!({"type": "enabled", "budget_tokens": 0}), 64),
        (json!({"type": "enabled", "budget_tokens": -3}), 64),
    ] {
        let body = json!({"model": MODEL, "max_tokens": max_tokens, "messages": hi,
                          "thinking": thinking});
        let r = s.send("POST", "/v1/messages", &body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("thinking.budget_tokens"),
            "{v}"
        );
    }
    // max_tokens 0 only runs the prompt: any budget is taken.
    let warm = json!({"model": MODEL, "max_tokens": 0, "messages": hi,
                      "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let r = s.send("POST", "/v1/messages", &warm).await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.shutdown().await.unwrap();
}

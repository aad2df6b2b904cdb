//! `n` > 1: each choice is its own engine request with seed `seed + index`, so choice i of a
//! seeded request equals the same request with `n` = 1 and seed `seed + i`; usage counts the
//! prompt once and sums the generated tokens; streamed, the choices' chunks interleave (one
//! role chunk and one finish chunk per choice, one usage chunk, one `[DONE]` at the end) and
//! assemble to the non-streamed answer; several completion prompts get n choices each, in
//! prompt order, with usage summed over the prompts; grammar-constrained tool calls are
//! numbered per choice; a client that disconnects cancels every choice.

use super::common::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

/// `body` with these fields set.
fn with(body: &Value, extra: Value) -> Value {
    let mut v = body.clone();
    if let (Value::Object(o), Value::Object(x)) = (&mut v, extra) {
        o.extend(x);
    }
    v
}

/// A 200 answer's JSON.
async fn ok(s: &TestServer, path: &str, body: &Value) -> Value {
    let r = s.send("POST", path, body).await;
    assert_eq!(r.status, 200, "{body} → {}", r.body);
    r.json()
}

/// A choice's text: the chat message's content or the completion's text.
fn text(choice: &Value) -> String {
    let t = choice["message"]["content"]
        .as_str()
        .or(choice["text"].as_str());
    t.unwrap_or_else(|| panic!("no text in {choice}"))
        .to_string()
}

/// The `choices` of an answer, checking their indexes are 0..n in order.
fn choices(v: &Value, n: usize) -> Vec<Value> {
    let cs = v["choices"].as_array().unwrap().clone();
    assert_eq!(cs.len(), n, "{v}");
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
    }
    cs
}

/// One choice of a stream, assembled from its chunks.
#[derive(Debug, Default)]
struct Assembled {
    text: String,
    role_chunks: usize,
    finish_chunks: usize,
    finish_reason: Value,
    tool_calls: Vec<Value>,
    /// Completions with logprobs: the tokens and offsets of every chunk, concatenated.
    tokens: Vec<Value>,
    offsets: Vec<Value>,
    /// Position (in the stream) of the choice's first chunk after its role chunk, and of its
    /// finish chunk.
    first_at: Option<usize>,
    finish_at: usize,
}

/// Assemble a stream's chunks per choice index; checks that every chunk carries at most one
/// choice, that no chunk of a choice follows its finish chunk, and that `[DONE]` comes once, at
/// the very end. Returns the choices and the usage chunk's usage (if any).
fn assemble(events: &[Value]) -> (BTreeMap<u64, Assembled>, Option<Value>) {
    assert_eq!(events.last(), Some(&json!("[DONE]")), "{events:?}");
    let done = events.iter().filter(|e| **e == json!("[DONE]")).count();
    assert_eq!(done, 1, "{events:?}");
    let mut out: BTreeMap<u64, Assembled> = BTreeMap::new();
    let mut usage = None;
    for (at, e) in events[..events.len() - 1].iter().enumerate() {
        assert!(e.get("error").is_none(), "{e}");
        let cs = e["choices"].as_array().unwrap();
        assert!(cs.len() <= 1, "{e}");
        if cs.is_empty() {
            assert!(usage.is_none(), "one usage chunk: {events:?}");
            usage = Some(e["usage"].clone());
            continue;
        }
        assert!(usage.is_none(), "the usage chunk comes last: {events:?}");
        let c = &cs[0];
        let a = out.entry(c["index"].as_u64().unwrap()).or_default();
        assert_eq!(a.finish_chunks, 0, "a chunk after the finish chunk: {e}");
        let d = &c["delta"];
        if d["role"] == "assistant" {
            assert_eq!(a.role_chunks, 0, "one role chunk per choice: {e}");
            a.role_chunks += 1;
        } else {
            a.first_at.get_or_insert(at);
        }
        if let Some(t) = d["content"].as_str().or(c["text"].as_str()) {
            a.text.push_str(t);
        }
        a.tool_calls
            .extend(d["tool_calls"].as_array().cloned().unwrap_or_default());
        if let Some(lp) = c["logprobs"].as_object() {
            a.tokens.extend(lp["tokens"].as_array().unwrap().clone());
            a.offsets
                .extend(lp["text_offset"].as_array().unwrap().clone());
        }
        if !c["finish_reason"].is_null() {
            a.finish_chunks += 1;
            a.finish_reason = c["finish_reason"].clone();
            a.finish_at = at;
        }
    }
    for (i, a) in out.iter_mut() {
        assert_eq!(a.finish_chunks, 1, "choice {i}: {events:?}");
        a.tool_calls = joined_calls(&a.tool_calls);
    }
    (out, usage)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_choices_equal_single_requests_seeded_base_plus_index() {
    let s = start(config()).await;
    let seed = 1234u64;
    let base = chat(
        "Tell me a story",
        json!({"temperature": 1, "seed": seed, "max_tokens": 8, "stop": CLEAN_STOPS}),
    );
    let v = ok(&s, CHAT, &with(&base, json!({"n": 3}))).await;
    assert_eq!(v["object"], "chat.completion");
    let cs = choices(&v, 3);
    let mut completion_tokens = 0;
    let mut single_texts = Vec::new();
    for (i, c) in cs.iter().enumerate() {
        let one = ok(&s, CHAT, &with(&base, json!({"seed": seed + i as u64}))).await;
        let c1 = &choices(&one, 1)[0];
        assert_eq!(c["message"], c1["message"], "choice {i}");
        assert_eq!(c["finish_reason"], c1["finish_reason"], "choice {i}");
        assert_eq!(v["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
        completion_tokens += one["usage"]["completion_tokens"].as_u64().unwrap();
        single_texts.push(text(c1));
    }
    assert!(
        single_texts.iter().any(|t| *t != single_texts[0]),
        "the seeds give different answers: {single_texts:?}"
    );
    let usage = &v["usage"];
    assert_eq!(usage["completion_tokens"], completion_tokens, "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + completion_tokens
    );
    // Reproducible: the same request again gives the same choices.
    let again = ok(&s, CHAT, &with(&base, json!({"n": 3}))).await;
    assert_eq!(again["choices"], v["choices"]);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chat_choices_assemble_to_the_answer() {
    let s = start(config()).await;
    let base = chat(
        "Tell me a story",
        json!({"temperature": 1, "seed": 99, "max_tokens": 8, "stop": CLEAN_STOPS, "n": 3}),
    );
    let v = ok(&s, CHAT, &base).await;
    let cs = choices(&v, 3);
    let sreq = with(
        &base,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let r = s.send("POST", CHAT, &sreq).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    let (streamed, usage) = assemble(&events);
    assert_eq!(streamed.len(), 3, "{events:?}");
    for (i, c) in cs.iter().enumerate() {
        let a = &streamed[&(i as u64)];
        assert_eq!(a.role_chunks, 1, "choice {i}: {events:?}");
        assert_eq!(a.text, text(c), "choice {i}");
        assert_eq!(a.finish_reason, c["finish_reason"], "choice {i}");
    }
    // The role chunks come first, one per choice in index order.
    for (i, e) in events[..3].iter().enumerate() {
        assert_eq!(e["choices"][0]["index"], i, "{e}");
        assert_eq!(e["choices"][0]["delta"]["role"], "assistant", "{e}");
    }
    let usage = usage.expect("a usage chunk");
    for key in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage[key], v["usage"][key], "{key}: {usage}");
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_choices_equal_single_requests_and_their_stream() {
    let s = start(config()).await;
    let seed = 42u64;
    let base = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 16,
                      "temperature": 1, "seed": seed, "logprobs": 1});
    let v = ok(&s, COMPLETIONS, &with(&base, json!({"n": 2}))).await;
    assert_eq!(v["object"], "text_completion");
    let cs = choices(&v, 2);
    let mut completion_tokens = 0;
    for (i, c) in cs.iter().enumerate() {
        let one = ok(
            &s,
            COMPLETIONS,
            &with(&base, json!({"seed": seed + i as u64})),
        )
        .await;
        let c1 = &choices(&one, 1)[0];
        assert_eq!(c["text"], c1["text"], "choice {i}");
        assert_eq!(c["finish_reason"], c1["finish_reason"], "choice {i}");
        assert_eq!(c["logprobs"], c1["logprobs"], "choice {i}");
        completion_tokens += one["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert_ne!(cs[0]["text"], cs[1]["text"], "{v}");
    assert_eq!(v["usage"]["completion_tokens"], completion_tokens, "{v}");

    let sreq = with(
        &base,
        json!({"n": 2, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let events = s.send("POST", COMPLETIONS, &sreq).await.events();
    let (streamed, usage) = assemble(&events);
    assert_eq!(streamed.len(), 2, "{events:?}");
    for (i, c) in cs.iter().enumerate() {
        let a = &streamed[&(i as u64)];
        assert_eq!(a.role_chunks, 0, "no role chunks in completions");
        assert_eq!(a.text, text(c), "choice {i}");
        assert_eq!(a.finish_reason, c["finish_reason"], "choice {i}");
        // Each choice's offsets count from the start of its own text.
        assert_eq!(json!(a.tokens), c["logprobs"]["tokens"], "choice {i}");
        assert_eq!(json!(a.offsets), c["logprobs"]["text_offset"], "choice {i}");
    }
    // Not in turn: choice 1's text starts streaming before choice 0 has finished.
    let zero_done = streamed[&0].finish_at;
    assert!(
        streamed[&1].first_at.is_some_and(|at| at < zero_done),
        "{events:?}"
    );
    let usage = usage.expect("a usage chunk");
    assert_eq!(usage["completion_tokens"], completion_tokens, "{usage}");
    assert_eq!(usage["prompt_tokens"], v["usage"]["prompt_tokens"]);
    // The most choices a request may ask for.
    let most = with(&base, json!({"n": 16, "max_tokens": 1, "logprobs": null}));
    choices(&ok(&s, COMPLETIONS, &most).await, 16);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_prompts_each_get_their_n_choices_in_prompt_order() {
    let s = start(config()).await;
    let prompts = ["Once upon a time", "The cat sat"];
    let base = json!({"model": MODEL, "max_tokens": 6, "temperature": 0});
    let mut singles = Vec::new();
    for p in prompts {
        singles.push(ok(&s, COMPLETIONS, &with(&base, json!({"prompt": p}))).await);
    }
    let req = with(&base, json!({"prompt": prompts, "n": 2}));
    let v = ok(&s, COMPLETIONS, &req).await;
    let cs = choices(&v, 4);
    for (i, c) in cs.iter().enumerate() {
        // Greedy: choice i is prompt i / 2's answer.
        assert_eq!(
            c["text"],
            singles[i / 2]["choices"][0]["text"],
            "choice {i}"
        );
    }
    let sum = |k: &str| -> u64 {
        singles
            .iter()
            .map(|x| x["usage"][k].as_u64().unwrap())
            .sum()
    };
    assert_eq!(v["usage"]["prompt_tokens"], sum("prompt_tokens"), "{v}");
    assert_eq!(
        v["usage"]["completion_tokens"],
        2 * sum("completion_tokens"),
        "{v}"
    );
    let sreq = with(
        &req,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let events = s.send("POST", COMPLETIONS, &sreq).await.events();
    let (streamed, usage) = assemble(&events);
    assert_eq!(streamed.len(), 4, "{events:?}");
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(streamed[&(i as u64)].text, text(c), "choice {i}");
    }
    assert_eq!(usage, Some(v["usage"].clone()));
    // Token-id prompts with echo: each choice starts with its own prompt.
    let ids = |t: &str| -> Vec<u32> { t.bytes().map(|b| 128 + u32::from(b)).collect() };
    let echoed = ok(
        &s,
        COMPLETIONS,
        &with(
            &base,
            json!({"prompt": [ids("ab"), ids("xyz")], "echo": true, "max_tokens": 2}),
        ),
    )
    .await;
    let cs = choices(&echoed, 2);
    assert!(
        text(&cs[0]).starts_with("ab") && text(&cs[1]).starts_with("xyz"),
        "{echoed}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_tool_calls_are_numbered_per_choice() {
    let s = start(config()).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Oslo", "Paris"]}}, "required": ["city"]}}}]);
    let req = chat(
        "Weather?",
        json!({"tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
               "max_tokens": 400, "temperature": 1, "seed": 5, "n": 2}),
    );
    let v = ok(&s, CHAT, &req).await;
    let cs = choices(&v, 2);
    let events = s
        .send("POST", CHAT, &with(&req, json!({"stream": true})))
        .await
        .events();
    let (streamed, _) = assemble(&events);
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        let a = &streamed[&(i as u64)];
        assert_eq!(a.finish_reason, "tool_calls");
        assert_eq!(a.tool_calls.len(), 1, "{events:?}");
        assert_eq!(a.tool_calls[0]["index"], 0, "choice {i}: {events:?}");
        assert_eq!(a.tool_calls[0]["function"], calls[0]["function"]);
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_cancels_every_choice() {
    let s = start(config()).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    for (stream, cancelled) in [(true, 3), (false, 6)] {
        // Answers long whatever the model wants: JSON strings of at least 5000 characters.
        let body = chat(
            "x",
            json!({"max_tokens": 20000, "stream": stream, "n": 3,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "s",
                       "schema": {"type": "string", "minLength": 5000}}}}),
        )
        .to_string();
        let conn = open_post(s.addr, CHAT, &body, stream).await;
        eventually("every choice runs", async || {
            engine.metrics().running_requests == 3
        })
        .await;
        drop(conn);
        eventually("the engine cancels every choice", async || {
            engine.metrics().requests_cancelled == cancelled && s.state.in_flight() == 0
        })
        .await;
    }
    s.shutdown().await.unwrap();
}

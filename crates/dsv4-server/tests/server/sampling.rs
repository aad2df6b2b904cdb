//! Sampling options over HTTP on greedy requests: `logit_bias` forces or favours a token, the
//! penalties break its repeats, `min_tokens` holds the end token and stop strings back,
//! `ignore_eos` keeps going past it (its text left out), `stop_token_ids` end the answer as
//! the end token does, `allowed_token_ids` are all that is generated, `bad_words` never are,
//! `skip_special_tokens`
//! leaves their text out, and `min_p` 1 samples like greedy.

use super::common::*;
use serde_json::{Value, json};

/// The byte token for `b` in the tiny vocabulary.
fn byte_token(b: u8) -> u32 {
    128 + u32::from(b)
}

/// The tiny model's end-of-sequence id.
fn eos() -> u32 {
    dsv4_chat::Tokenizer::tiny().unwrap().eos_id()
}

/// A greedy completion of `prompt` with `extra` fields.
async fn complete(s: &TestServer, prompt: &str, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let r = s.send("POST", "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{extra}: {}", r.body);
    r.json()
}

/// The answer to a greedy chat "Hi" with `extra` fields.
async fn chat_hi(s: &TestServer, extra: Value) -> Value {
    s.send("POST", "/v1/chat/completions", &chat("Hi", extra))
        .await
        .json()
}

/// Each of `bads` as `field` of a completion is a 400 naming the field.
async fn refused_values(s: &TestServer, field: &str, bads: &[Value]) {
    for bad in bads {
        let mut body = json!({"model": MODEL, "prompt": "a"});
        body[field] = bad.clone();
        let e = s.send("POST", "/v1/completions", &body).await.error(400);
        assert_eq!(e["param"], field, "{bad} → {e}");
    }
}

fn text(v: &Value) -> &str {
    v["choices"][0]["text"].as_str().unwrap()
}

fn count_a(v: &Value) -> usize {
    text(v).matches('a').count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_and_penalties_steer_greedy_tokens() {
    let s = start(config()).await;
    let a = byte_token(b'a').to_string();
    let v = complete(&s, "Once upon a time", json!({"logit_bias": {&a: 100}})).await;
    assert_eq!(text(&v), "a".repeat(16), "{v}");
    // Pushed away: the greedy first token (a byte token here) is never chosen.
    let plain = complete(&s, "Hello there", json!({"max_tokens": 1, "logprobs": 0})).await;
    let first = plain["choices"][0]["logprobs"]["tokens"][0].clone();
    let &[b] = first.as_str().unwrap().as_bytes() else {
        panic!("the greedy first token is one ASCII byte: {plain}");
    };
    let away = json!({"logit_bias": {byte_token(b).to_string(): -100}, "logprobs": 0});
    let v = complete(&s, "Hello there", away).await;
    let tokens = v["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
    assert!(!tokens.contains(&first), "{first} in {v}");

    // A favoured token repeats; penalties on generated tokens make it repeat less.
    let favoured = json!({"logit_bias": {&a: 5}});
    let base = complete(&s, "Hello there", favoured.clone()).await;
    assert!(count_a(&base) >= 12, "{base}");
    for penalty in ["frequency_penalty", "presence_penalty"] {
        let mut extra = favoured.clone();
        extra[penalty] = json!(2);
        let v = complete(&s, "Hello there", extra).await;
        assert!(count_a(&v) < count_a(&base) / 2, "{penalty}: {v} vs {base}");
    }
    // The repetition penalty also reads the prompt: "a" is in it, so it loses its lead.
    let base = complete(&s, "aaaa aaaa aaaa", favoured.clone()).await;
    assert!(count_a(&base) >= 12, "{base}");
    let mut extra = favoured.clone();
    extra["repetition_penalty"] = json!(3);
    let v = complete(&s, "aaaa aaaa aaaa", extra).await;
    assert!(count_a(&v) < count_a(&base) / 2, "{v} vs {base}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_tokens_and_ignore_eos_hold_the_end_token_back() {
    let s = start(config()).await;
    let to_eos = json!({eos().to_string(): 100});
    let usage = |v: &Value| v["usage"]["completion_tokens"].as_u64().unwrap();
    let finish = |v: &Value| {
        v["choices"][0]["finish_reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let v = complete(&s, "Hi", json!({"logit_bias": to_eos, "max_tokens": 5})).await;
    assert_eq!((usage(&v), finish(&v)), (0, "stop".into()), "{v}");
    let v = complete(
        &s,
        "Hi",
        json!({"logit_bias": to_eos, "max_tokens": 5, "min_tokens": 5}),
    )
    .await;
    assert_eq!((usage(&v), finish(&v)), (5, "length".into()), "{v}");
    let v = complete(
        &s,
        "Hi",
        json!({"logit_bias": to_eos, "max_tokens": 6, "min_tokens": 3}),
    )
    .await;
    assert_eq!((usage(&v), finish(&v)), (3, "stop".into()), "{v}");
    // Stop strings are not looked for before min_tokens either (vLLM): forced to "a", a stop
    // of "a" ends the answer at the third token, cut before that token's "a", streamed or not.
    let to_a = json!({byte_token(b'a').to_string(): 100});
    for stream in [false, true] {
        let body = json!({"logit_bias": to_a, "stop": "a", "min_tokens": 3, "stream": stream,
                          "stream_options": {"include_usage": stream}});
        if stream {
            let mut req = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 16,
                                 "temperature": 0});
            req.as_object_mut()
                .unwrap()
                .extend(body.as_object().unwrap().clone());
            let events = s.send("POST", "/v1/completions", &req).await.events();
            let mut chunks = events.iter().filter(|e| e.is_object());
            let streamed: String = chunks
                .clone()
                .flat_map(|e| e["choices"].as_array().unwrap().clone())
                .map(|c| c["text"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(streamed, "aa", "{events:?}");
            let last = chunks.next_back().unwrap();
            assert_eq!(last["usage"]["completion_tokens"], 3, "{last}");
        } else {
            let v = complete(&s, "Hi", body).await;
            assert_eq!((usage(&v), finish(&v)), (3, "stop".into()), "{v}");
            assert_eq!(text(&v), "aa");
        }
    }
    let v = complete(&s, "Hi", json!({"logit_bias": to_a, "stop": "a"})).await;
    assert_eq!((usage(&v), text(&v)), (1, ""), "without min_tokens: {v}");

    // With ignore_eos the end token is generated like any other; its text is left out, and
    // its offset does not advance.
    let v = complete(
        &s,
        "Hi",
        json!({"logit_bias": to_eos, "max_tokens": 4, "ignore_eos": true, "logprobs": 1}),
    )
    .await;
    assert_eq!((usage(&v), finish(&v)), (4, "length".into()), "{v}");
    assert_eq!(text(&v), "");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(vec!["<｜end▁of▁sentence｜>"; 4]));
    assert_eq!(lp["text_offset"], json!([0, 0, 0, 0]));
    // Chat too: the strict parser never sees the end token's text.
    let r = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat(
                "Hi",
                json!({"logit_bias": to_eos, "max_tokens": 4, "ignore_eos": true}),
            ),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!((usage(&v), finish(&v)), (4, "length".into()), "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_token_ids_end_the_answer_as_the_end_token_does() {
    // Token "z" biased to win and named a stop token: the answer ends on it, empty, unless
    // min_tokens holds it back (then "z" never shows: it is an end token, left out).
    let s = start(config()).await;
    let z = byte_token(b'z');
    let body = json!({"logit_bias": {z.to_string(): 100}, "stop_token_ids": [z],
                      "max_tokens": 6, "ignore_eos": true});
    let v = complete(&s, "Hi", body.clone()).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(
        (v["usage"]["completion_tokens"].as_u64(), text(&v)),
        (Some(0), "")
    );
    let mut held = body.clone();
    held["min_tokens"] = json!(3);
    let v = complete(&s, "Hi", held).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    assert!(!text(&v).contains('z'), "{v}");
    // Without stop_token_ids "z" is an ordinary token.
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("stop_token_ids");
    let v = complete(&s, "Hi", plain).await;
    assert_eq!(text(&v), "zzzzzz");
    // Chat takes them too.
    let c = chat_hi(
        &s,
        json!({"logit_bias": {z.to_string(): 100}, "stop_token_ids": [z]}),
    )
    .await;
    assert_eq!(c["choices"][0]["finish_reason"], "stop", "{c}");
    assert_eq!(c["usage"]["completion_tokens"], 0, "{c}");
    let bads = [json!("z"), json!([-1]), json!([99999]), json!(vec![z; 65])];
    refused_values(&s, "stop_token_ids", &bads).await;
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_token_ids_are_all_that_is_generated() {
    let s = start(config()).await;
    let (x, y) = (byte_token(b'x'), byte_token(b'y'));
    // Sampled freely from two letters (and repeats dropped): nothing else, and without the
    // end token the answer runs its length.
    let v = complete(
        &s,
        "Hi",
        json!({"allowed_token_ids": [y, x, y], "temperature": 1.0, "seed": 3, "n": 4,
               "max_tokens": 12}),
    )
    .await;
    let mut letters = String::new();
    for c in v["choices"].as_array().unwrap() {
        let t = c["text"].as_str().unwrap();
        assert_eq!(t.len(), 12, "{v}");
        assert!(t.chars().all(|ch| ch == 'x' || ch == 'y'), "{v}");
        assert_eq!(c["finish_reason"], "length", "{v}");
        letters.push_str(t);
    }
    assert!(letters.contains('x') && letters.contains('y'), "{v}");
    // With the end token allowed and biased, the answer ends at once; chat takes them too.
    let c = chat_hi(
        &s,
        json!({"allowed_token_ids": [x, eos()], "logit_bias": {eos().to_string(): 100}}),
    )
    .await;
    assert_eq!(c["choices"][0]["finish_reason"], "stop", "{c}");
    assert_eq!(c["usage"]["completion_tokens"], 0, "{c}");
    // A grammar that allows none of them fails the request as the request's fault.
    for temperature in [0.0, 1.0] {
        let e = s
            .send(
                "POST",
                "/v1/completions",
                &json!({"model": MODEL, "prompt": "a", "allowed_token_ids": [x],
                        "regex": "[0-9]+", "temperature": temperature, "max_tokens": 4}),
            )
            .await
            .error(400);
        assert_eq!(e["code"], "grammar_failed", "{e}");
    }
    let bads = [json!([]), json!("x"), json!([-1]), json!([99999])];
    refused_values(&s, "allowed_token_ids", &bads).await;
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_words_are_never_generated() {
    let s = start(config()).await;
    let (a, b) = (byte_token(b'a'), byte_token(b'b'));
    // Sampled from "a" and "b": "ab" appears unless it is a bad word; then once an "a" is
    // written only "a" can follow.
    let body = |bad: Value| {
        json!({"allowed_token_ids": [a, b], "temperature": 1.0, "seed": 5, "n": 4,
               "max_tokens": 16, "bad_words": bad})
    };
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect()
    };
    let free = texts(&complete(&s, "Hi", body(Value::Null)).await);
    assert!(free.iter().any(|t| t.contains("ab")), "{free:?}");
    let banned = texts(&complete(&s, "Hi", body(json!(["  ab"]))).await);
    for t in &banned {
        assert_eq!(t.len(), 16, "{banned:?}");
        assert!(!t.contains("ab"), "{banned:?}");
    }
    // A one-token word is never generated; chat takes them too.
    let c = chat_hi(
        &s,
        json!({"allowed_token_ids": [a, b], "logit_bias": {a.to_string(): 100},
               "bad_words": ["a"], "max_tokens": 5}),
    )
    .await;
    assert_eq!(c["choices"][0]["message"]["content"], "bbbbb", "{c}");
    let long = "x".repeat(65);
    let bads = [
        json!("ab"),
        json!([""]),
        json!(["  "]),
        json!([1]),
        json!([long]),
        json!(vec!["w"; 65]),
    ];
    refused_values(&s, "bad_words", &bads).await;
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_special_tokens_leaves_their_text_out() {
    let s = start(config()).await;
    let special = 100u32;
    let body = json!({"logit_bias": {special.to_string(): 100}, "max_tokens": 2, "logprobs": 0});
    let v = complete(&s, "Hi", body.clone()).await;
    let one = dsv4_chat::markers::reserved(special);
    assert_eq!(text(&v), format!("{one}{one}"), "shown by default: {v}");
    let mut skipped = body.clone();
    skipped["skip_special_tokens"] = json!(true);
    skipped["spaces_between_special_tokens"] = json!(false);
    let v = complete(&s, "Hi", skipped).await;
    assert_eq!(
        (text(&v), &v["usage"]["completion_tokens"]),
        ("", &json!(2)),
        "{v}"
    );
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(
        lp["tokens"],
        json!([one, one]),
        "the lists still name them: {v}"
    );
    assert_eq!(lp["text_offset"], json!([0, 0]), "they add no text: {v}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_p_of_one_samples_like_greedy() {
    let s = start(config()).await;
    let greedy = complete(&s, "Once upon a time", json!({})).await;
    let sampled = json!({"temperature": 1, "seed": 3});
    let v = complete(&s, "Once upon a time", sampled.clone()).await;
    assert_ne!(text(&v), text(&greedy), "seed 3 departs from greedy");
    let mut extra = sampled.clone();
    extra["min_p"] = json!(1);
    let v = complete(&s, "Once upon a time", extra).await;
    assert_eq!(text(&v), text(&greedy));
    s.shutdown().await.unwrap();
}

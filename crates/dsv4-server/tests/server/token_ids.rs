//! vLLM's token-level outputs over HTTP: `return_token_ids` (the prompt's ids and each
//! choice's, ending with the token that ended it), `return_tokens_as_token_ids`, `stop_reason`,
//! and `stream_options.continuous_usage_stats`, on both endpoints, streamed or not; and
//! `truncate_prompt_tokens`, checked through the ids.

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

/// A greedy completion body of "Hi" with `extra` fields.
fn completion(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 8, "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The ids of a list of values.
fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {v}"))
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

/// The choice chunks of a stream (the usage chunk and `[DONE]` left out).
fn choice_chunks(r: &Reply) -> Vec<Value> {
    r.events()
        .into_iter()
        .filter(|e| e["choices"].as_array().is_some_and(|c| !c.is_empty()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_return_the_prompt_and_answer_ids_and_what_stopped_them() {
    let s = start(config()).await;
    let tokenized = s
        .send("POST", "/tokenize", &json!({"prompt": "Hi"}))
        .await
        .json();
    let asked = json!({"return_token_ids": true, "return_tokens_as_token_ids": true,
                       "logprobs": 2});
    let v = s
        .send("POST", "/v1/completions", &completion(asked.clone()))
        .await;
    assert_eq!(v.status, 200, "{}", v.body);
    let v = v.json();
    let c = &v["choices"][0];
    assert_eq!(
        c["prompt_token_ids"], tokenized["tokens"],
        "BOS included: {v}"
    );
    let answer = ids(&c["token_ids"]);
    assert_eq!(
        answer.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    // The logprobs name the same tokens by id, alternatives too.
    let named: Vec<String> = answer.iter().map(|t| format!("token_id:{t}")).collect();
    assert_eq!(c["logprobs"]["tokens"], json!(named), "{v}");
    for top in c["logprobs"]["top_logprobs"].as_array().unwrap() {
        assert!(
            top.as_object()
                .unwrap()
                .keys()
                .all(|k| k.starts_with("token_id:")),
            "{top}"
        );
    }
    let text = s
        .send("POST", "/detokenize", &json!({"tokens": answer}))
        .await
        .json();
    if c["finish_reason"] == "length" {
        assert_eq!(text["prompt"], c["text"], "{v}");
    }
    assert!(c.get("stop_reason").is_some_and(Value::is_null), "{v}");

    // Streamed: the prompt's ids on the first chunk only, the answer's spread over the
    // chunks, the stop reason with the finish reason.
    let mut streamed = asked.clone();
    streamed["stream"] = json!(true);
    let r = s
        .send("POST", "/v1/completions", &completion(streamed))
        .await;
    let chunks = choice_chunks(&r);
    assert_eq!(
        chunks[0]["choices"][0]["prompt_token_ids"],
        tokenized["tokens"]
    );
    assert!(
        chunks[1..]
            .iter()
            .all(|e| e["choices"][0].get("prompt_token_ids").is_none())
    );
    let all: Vec<u32> = chunks
        .iter()
        .flat_map(|e| ids(&e["choices"][0]["token_ids"]))
        .collect();
    assert_eq!(all, answer);
    let last = &chunks.last().unwrap()["choices"][0];
    assert!(
        last["stop_reason"].is_null() && last["finish_reason"].is_string(),
        "{last}"
    );
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|e| e["choices"][0].get("stop_reason").is_none())
    );

    // Not asked for: absent; text names.
    let v = s
        .send(
            "POST",
            "/v1/completions",
            &completion(json!({"logprobs": 0})),
        )
        .await
        .json();
    let c = &v["choices"][0];
    assert!(
        c.get("token_ids").is_none() && c.get("prompt_token_ids").is_none(),
        "{v}"
    );
    assert!(
        !c["logprobs"]["tokens"][0]
            .as_str()
            .unwrap()
            .starts_with("token_id:")
    );

    // Each choice carries its prompt's ids.
    let v = s
        .send(
            "POST",
            "/v1/completions",
            &completion(
                json!({"prompt": ["Hi", "Yo"], "n": 2, "return_token_ids": true,
                               "max_tokens": 2}),
            ),
        )
        .await
        .json();
    let yo = s
        .send("POST", "/tokenize", &json!({"prompt": "Yo"}))
        .await
        .json();
    for (i, want) in [&tokenized, &tokenized, &yo, &yo].into_iter().enumerate() {
        assert_eq!(
            v["choices"][i]["prompt_token_ids"], want["tokens"],
            "choice {i}"
        );
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_that_ends_an_answer_closes_its_ids_and_names_its_stop_reason() {
    let s = start(config()).await;
    let (a, z) = (byte_token(b'a'), byte_token(b'z'));
    // Before min_tokens, "a" (biased less than the end token) wins: plain text for chat.
    let cases = [
        // The end-of-sequence token after min_tokens: the ids end with it; no stop reason.
        (
            json!({"logit_bias": {eos().to_string(): 100, a.to_string(): 50}, "min_tokens": 2}),
            2,
            Some(eos()),
            json!(null),
        ),
        // A stop token: it ends the ids and is the stop reason.
        (
            json!({"logit_bias": {z.to_string(): 100, a.to_string(): 50}, "stop_token_ids": [z],
                   "min_tokens": 2, "ignore_eos": true}),
            2,
            Some(z),
            json!(z),
        ),
        // The end-of-sequence token named a stop token under ignore_eos: a stop reason.
        (
            json!({"logit_bias": {eos().to_string(): 100}, "stop_token_ids": [eos()],
                   "ignore_eos": true}),
            0,
            Some(eos()),
            json!(eos()),
        ),
        // A stop string: its token is among the ids, the text is cut before it.
        (
            json!({"logit_bias": {a.to_string(): 100}, "stop": ["q", "a"]}),
            1,
            None,
            json!("a"),
        ),
    ];
    for (extra, counted, last, reason) in cases {
        let mut body = completion(extra.clone());
        body["return_token_ids"] = json!(true);
        let v = s.send("POST", "/v1/completions", &body).await;
        assert_eq!(v.status, 200, "{extra}: {}", v.body);
        let v = v.json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "stop", "{extra}: {v}");
        assert_eq!(c["stop_reason"], reason, "{extra}: {v}");
        assert_eq!(v["usage"]["completion_tokens"], counted, "{extra}: {v}");
        let got = ids(&c["token_ids"]);
        assert_eq!(
            got.len(),
            counted + usize::from(last.is_some()),
            "{extra}: {v}"
        );
        if let Some(t) = last {
            assert_eq!(got.last(), Some(&t), "{extra}: {v}");
        }
        // Streamed, the same ids and the same reason.
        body["stream"] = json!(true);
        let r = s.send("POST", "/v1/completions", &body).await;
        let chunks = choice_chunks(&r);
        let all: Vec<u32> = chunks
            .iter()
            .flat_map(|e| ids(&e["choices"][0]["token_ids"]))
            .collect();
        assert_eq!(all, got, "{extra}");
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["stop_reason"],
            reason,
            "{extra}"
        );
        // Chat says the same.
        let mut chat_body = chat("Hi", extra.clone());
        chat_body["return_token_ids"] = json!(true);
        chat_body["max_tokens"] = json!(8);
        let v = s.send("POST", "/v1/chat/completions", &chat_body).await;
        assert_eq!(v.status, 200, "{extra}: {}", v.body);
        let v = v.json();
        assert_eq!(v["choices"][0]["stop_reason"], reason, "chat {extra}: {v}");
        assert_eq!(ids(&v["choices"][0]["token_ids"]), got, "chat {extra}: {v}");
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_returns_the_encoded_prompt_ids_and_streams_the_answer_ids() {
    let s = start(config()).await;
    let a = byte_token(b'a');
    let extra = json!({"logit_bias": {a.to_string(): 100}, "max_tokens": 5,
                       "return_token_ids": true, "logprobs": true, "top_logprobs": 1,
                       "return_tokens_as_token_ids": true});
    let tokenized = s
        .send(
            "POST",
            "/tokenize",
            &json!({"messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await
        .json();
    let v = s
        .send("POST", "/v1/chat/completions", &chat("Hi", extra.clone()))
        .await;
    assert_eq!(v.status, 200, "{}", v.body);
    let v = v.json();
    assert_eq!(v["prompt_token_ids"], tokenized["tokens"], "{v}");
    assert_eq!(ids(&v["choices"][0]["token_ids"]), vec![a; 5], "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "aaaaa");
    let entry = &v["choices"][0]["logprobs"]["content"][0];
    assert_eq!(entry["token"], format!("token_id:{a}"), "{v}");
    assert_eq!(entry["bytes"], json!([b'a']), "{v}");
    let top = entry["top_logprobs"][0]["token"].as_str().unwrap();
    assert!(top.starts_with("token_id:"), "{v}");

    let mut streamed = chat("Hi", extra);
    streamed["stream"] = json!(true);
    streamed["n"] = json!(2);
    let r = s.send("POST", "/v1/chat/completions", &streamed).await;
    let events: Vec<Value> = r.events().into_iter().filter(Value::is_object).collect();
    assert_eq!(events[0]["prompt_token_ids"], tokenized["tokens"]);
    assert!(
        events[1..]
            .iter()
            .all(|e| e.get("prompt_token_ids").is_none())
    );
    for index in 0..2 {
        let all: Vec<u32> = events
            .iter()
            .flat_map(|e| e["choices"].as_array().unwrap().clone())
            .filter(|c| c["index"] == index)
            .flat_map(|c| c.get("token_ids").map(ids).unwrap_or_default())
            .collect();
        assert_eq!(all, vec![a; 5], "choice {index}");
    }
    // Not asked for: absent.
    let plain = json!({"logit_bias": {a.to_string(): 100}, "max_tokens": 2});
    let v = s
        .send("POST", "/v1/chat/completions", &chat("Hi", plain))
        .await;
    let v = v.json();
    assert!(v.get("prompt_token_ids").is_none() && v["choices"][0].get("token_ids").is_none());
    assert!(
        v["choices"][0].get("stop_reason").is_some(),
        "always said: {v}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_usage_stats_count_each_choice_as_it_goes() {
    let s = start(config()).await;
    let a = byte_token(b'a');
    let opts = json!({"include_usage": true, "continuous_usage_stats": true});
    let body = completion(json!({"logit_bias": {a.to_string(): 100}, "stream": true,
                                 "stream_options": opts, "return_token_ids": true}));
    let r = s.send("POST", "/v1/completions", &body).await;
    let chunks = choice_chunks(&r);
    let mut seen = 0;
    for e in &chunks {
        seen += ids(&e["choices"][0]["token_ids"]).len();
        assert_eq!(e["usage"]["completion_tokens"], seen, "{e}");
        assert_eq!(e["usage"]["prompt_tokens"], 3, "BOS, \"H\" and \"i\": {e}");
        assert_eq!(e["usage"]["total_tokens"], 3 + seen, "{e}");
    }
    assert_eq!(seen, 8);
    let last = chunks.last().unwrap();
    assert!(last["usage"]["prompt_tokens_details"].is_object(), "{last}");
    assert!(chunks[0]["usage"].get("prompt_tokens_details").is_none());
    let end = r.events();
    let totals = &end[end.len() - 2];
    assert_eq!(totals["usage"]["completion_tokens"], 8, "{totals}");

    // Chat: the role chunk counts nothing yet; each later chunk its choice's tokens.
    let mut c = chat(
        "Hi",
        json!({"logit_bias": {a.to_string(): 100}, "max_tokens": 4,
                                  "stream": true, "stream_options": opts, "n": 2}),
    );
    c["return_token_ids"] = json!(true);
    let r = s.send("POST", "/v1/chat/completions", &c).await;
    let mut per_choice = [0usize; 2];
    for e in r
        .events()
        .iter()
        .filter(|e| e["choices"].as_array().is_some_and(|c| !c.is_empty()))
    {
        let ch = &e["choices"][0];
        let i = ch["index"].as_u64().unwrap() as usize;
        per_choice[i] += ch.get("token_ids").map(ids).unwrap_or_default().len();
        assert_eq!(e["usage"]["completion_tokens"], per_choice[i], "{e}");
    }
    assert_eq!(per_choice, [4, 4]);

    // Without include_usage it is refused, as is an unknown option.
    for (opts, param) in [
        (
            json!({"continuous_usage_stats": true}),
            "stream_options.continuous_usage_stats",
        ),
        (
            json!({"include_usage": true, "usage_every": 2}),
            "stream_options",
        ),
    ] {
        let body = completion(json!({"stream": true, "stream_options": opts}));
        let e = s.send("POST", "/v1/completions", &body).await.error(400);
        assert!(
            e["param"].as_str().unwrap().starts_with(param),
            "{opts} → {e}"
        );
        if param == "stream_options" {
            assert!(
                e["message"].as_str().unwrap().contains("usage_every"),
                "{e}"
            );
        }
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_prompt_tokens_keeps_the_prompts_end() {
    let s = start(config()).await;
    let context = s.get("/v1/models").await.json()["data"][0]["max_model_len"]
        .as_u64()
        .unwrap() as usize;
    let full = ids(&s
        .send("POST", "/tokenize", &json!({"prompt": "Hello world"}))
        .await
        .json()["tokens"]);
    let tail = full[full.len() - 4..].to_vec();
    // Completions: the run, the echo and the answer are those of the last 4 tokens given as
    // ids (no BOS was added to them, so the first has no log-probability).
    let v = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "Hello world", "truncate_prompt_tokens": 4,
                    "return_token_ids": true, "echo": true, "logprobs": 0, "max_tokens": 4,
                    "temperature": 0}),
        )
        .await;
    assert_eq!(v.status, 200, "{}", v.body);
    let v = v.json();
    let c = &v["choices"][0];
    assert_eq!(ids(&c["prompt_token_ids"]), tail, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert!(c["text"].as_str().unwrap().starts_with("orld"), "{v}");
    assert!(c["logprobs"]["token_logprobs"][0].is_null(), "{v}");
    let by_ids = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": tail, "echo": true, "max_tokens": 4,
                    "temperature": 0}),
        )
        .await
        .json();
    assert_eq!(c["text"], by_ids["choices"][0]["text"], "{v} vs {by_ids}");

    // A prompt over the context fits once truncated; −1 keeps up to the context.
    let long: Vec<u32> = (0..context + 5)
        .map(|i| byte_token(b'a' + (i % 26) as u8))
        .collect();
    let body = |keep: i64| {
        json!({"model": MODEL, "prompt": long, "truncate_prompt_tokens": keep,
               "max_tokens": 8})
    };
    let v = s.send("POST", "/v1/completions", &body(1000)).await;
    assert_eq!(v.status, 200, "{}", v.body);
    assert_eq!(v.json()["usage"]["prompt_tokens"], 1000);
    let e = s
        .send("POST", "/v1/completions", &body(-1))
        .await
        .error(400);
    assert_eq!(
        e["code"], "context_length_exceeded",
        "the whole context leaves no room: {e}"
    );
    for bad in [0, -2, context as i64 + 1] {
        let e = s
            .send("POST", "/v1/completions", &body(bad))
            .await
            .error(400);
        assert_eq!(e["param"], "truncate_prompt_tokens", "{bad}: {e}");
    }

    // Chat keeps the encoded prompt's end; /tokenize shows the same ids.
    let messages = json!([{"role": "user", "content": "Hi there"}]);
    let all = ids(&s
        .send("POST", "/tokenize", &json!({"messages": messages}))
        .await
        .json()["tokens"]);
    let cut = s
        .send(
            "POST",
            "/tokenize",
            &json!({"messages": messages, "truncate_prompt_tokens": 5}),
        )
        .await
        .json();
    assert_eq!(ids(&cut["tokens"]), all[all.len() - 5..].to_vec());
    let mut req = chat(
        "Hi there",
        json!({"truncate_prompt_tokens": 5, "max_tokens": 2,
                                         "return_token_ids": true,
                                         "logit_bias": {byte_token(b'a').to_string(): 100}}),
    );
    req["messages"] = messages;
    let v = s.send("POST", "/v1/chat/completions", &req).await;
    assert_eq!(v.status, 200, "{}", v.body);
    let v = v.json();
    assert_eq!(v["prompt_token_ids"], cut["tokens"], "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    s.shutdown().await.unwrap();
}

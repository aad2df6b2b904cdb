//! SGLang's `POST /abort_request`: a generation named by its id (a `/generate` rid, a
//! completion's or chat's id) or every one (`abort_all`) ends at once with what it had, finish
//! reason `abort`, streamed or not, its engine request cancelled; bad bodies are refused.

use super::common::*;
use serde_json::{Value, json};

/// A long greedy generation nothing ends before its 8000 tokens but an abort.
const LONG: u64 = 8000;

async fn abort(s: &TestServer, body: Value) -> usize {
    let r = s.send("POST", "/abort_request", &body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    let v = r.json();
    assert_eq!(v["status"], "ok");
    v["aborted"].as_u64().unwrap() as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_generation_ends_with_what_it_had() {
    let s = start(config()).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    let cancelled = engine.metrics().requests_cancelled;
    let body = json!({"text": "Hi", "rid": "long", "stream": true,
                      "sampling_params": {"max_new_tokens": LONG, "ignore_eos": true}});
    let (conn, seen) = open_stream(s.addr, "/generate", &body).await;
    assert_eq!(abort(&s, json!({"rid": "long"})).await, 1);
    let r = finish_stream(conn, seen).await;
    let events = r.events();
    assert_eq!(events.last(), Some(&json!("[DONE]")), "{}", r.body);
    let last = &events[events.len() - 2];
    assert_eq!(
        last["meta_info"]["finish_reason"]["type"], "abort",
        "{last}"
    );
    let made = last["meta_info"]["completion_tokens"].as_u64().unwrap();
    assert!(made < LONG, "{last}");
    assert_eq!(last["output_ids"].as_array().unwrap().len() as u64, made);
    eventually("the engine cancels it", async || {
        engine.metrics().requests_cancelled == cancelled + 1
            && s.state.in_flight() == 0
            && s.state.aborts().is_empty()
    })
    .await;
    assert_eq!(abort(&s, json!({"rid": "long"})).await, 0, "it is gone");

    // A streamed completion's id aborts all its choices.
    let body = json!({"model": MODEL, "prompt": "Hi", "max_tokens": LONG, "ignore_eos": true,
                      "n": 2, "stream": true});
    let (conn, seen) = open_stream(s.addr, "/v1/completions", &body).await;
    let first = parse_reply(&seen);
    let id = first.events()[0]["id"].as_str().unwrap().to_string();
    assert_eq!(abort(&s, json!({"rid": id})).await, 2);
    let r = finish_stream(conn, seen).await;
    let reasons: Vec<Value> = r
        .events()
        .iter()
        .filter(|e| e["choices"][0]["finish_reason"].is_string())
        .map(|e| e["choices"][0]["finish_reason"].clone())
        .collect();
    assert_eq!(reasons, [json!("abort"), json!("abort")], "{}", r.body);

    // abort_all ends requests that are not streamed: each answers with what it had.
    let a = byte_token(b'a');
    let completion = json!({"model": MODEL, "prompt": "Hi", "max_tokens": LONG, "n": 2,
                            "ignore_eos": true});
    let chat_body = chat(
        "Hi",
        json!({"max_tokens": LONG, "ignore_eos": true, "logit_bias": {a.to_string(): 100}}),
    );
    let running = engine.metrics().running_requests;
    let (c, h) = tokio::join!(s.send("POST", "/v1/completions", &completion), async {
        eventually("both choices run", async || {
            engine.metrics().running_requests == running + 2
        })
        .await;
        let chat_reply = s.send("POST", "/v1/chat/completions", &chat_body);
        let (reply, n) = tokio::join!(chat_reply, async {
            eventually("the chat runs", async || {
                engine.metrics().running_requests == running + 3
            })
            .await;
            abort(&s, json!({"abort_all": true})).await
        });
        (reply, n)
    });
    let (chat_reply, n) = h;
    assert_eq!(n, 3);
    assert_eq!(c.status, 200, "{}", c.body);
    let c = c.json();
    for choice in c["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "abort", "{c}");
    }
    assert!(c["usage"]["completion_tokens"].as_u64().unwrap() < 2 * LONG);
    assert_eq!(chat_reply.status, 200, "{}", chat_reply.body);
    let v = chat_reply.json();
    assert_eq!(v["choices"][0]["finish_reason"], "abort", "{v}");
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with('a')
    );
    s.shutdown().await.unwrap();
}

/// The byte token for `b` in the tiny vocabulary.
fn byte_token(b: u8) -> u32 {
    128 + u32::from(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_abort_requests_are_refused() {
    let s = start(config()).await;
    for (body, param) in [
        (json!({}), Some("rid")),
        (json!({"abort_all": false}), Some("rid")),
        (json!({"rid": ""}), Some("rid")),
        (json!({"rid": "x", "abort_all": true}), None),
        (json!({"rid": "x", "all": true}), Some("all")),
        (json!({"rid": 7}), Some("rid")),
    ] {
        let e = s.send("POST", "/abort_request", &body).await.error(400);
        assert_eq!(e["param"].as_str(), param, "{body} → {e}");
    }
    assert_eq!(abort(&s, json!({"rid": "nobody"})).await, 0);
    assert_eq!(abort(&s, json!({"abort_all": true})).await, 0);
    s.shutdown().await.unwrap();

    let s = start(dsv4_server::ServerConfig {
        api_key: Some("sekret".into()),
        ..config()
    })
    .await;
    let body = json!({"abort_all": true}).to_string();
    let e = request(s.addr, "POST", "/abort_request", &[], body.as_bytes())
        .await
        .error(401);
    assert_eq!(e["code"], "invalid_api_key");
    s.shutdown().await.unwrap();
}

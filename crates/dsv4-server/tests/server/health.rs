//! Health: 503 while loading, 503 "stalled" while a stalled step loop (injected) holds pending
//! requests and 200 again once it moves, "draining" during shutdown; `/health_generate`'s
//! one-token probe through the engine, and `/version`; a client that disconnects cancels its
//! request; shutdown finishes the streams in flight.

use super::common::*;
use serde_json::json;
use std::time::Duration;

/// A chat request whose answer is long whatever the model wants (a JSON string of at least
/// `len` characters).
fn long_answer(len: usize, stream: bool) -> serde_json::Value {
    chat(
        "x",
        json!({"max_tokens": 20000, "stream": stream,
               "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "minLength": len}}}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_servers_answer_503() {
    let s = start_loading(config()).await;
    let r = s.get("/health").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["status"], "loading");
    let e = s
        .send("POST", "/v1/chat/completions", &chat("hi", json!({})))
        .await
        .error(503);
    assert_eq!(e["type"], "service_unavailable");
    let e = s
        .send("POST", "/tokenize", &json!({"prompt": "hi"}))
        .await
        .error(503);
    assert_eq!(e["type"], "service_unavailable");
    s.send("POST", "/reset_prefix_cache", &json!({}))
        .await
        .error(503);
    assert_eq!(r.header("x-should-retry"), None);
    assert_eq!(s.get("/v1/models").await.json()["data"][0]["id"], MODEL);
    assert_eq!(s.get("/metrics").await.status, 200);
    let r = s.get("/health_generate").await;
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (503, Some("loading"))
    );
    s.state.set_ready(loaded());
    assert_eq!(s.get("/health").await.status, 200);
    // Ready: the probe generates one token through the engine.
    let finished = s.state.loaded().unwrap().engine.metrics().requests_finished;
    let r = s.get("/health_generate").await;
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (200, Some("ok")),
        "{}",
        r.body
    );
    assert!(r.json()["generate_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(
        s.state.loaded().unwrap().engine.metrics().requests_finished,
        finished + 1,
        "it went through the engine"
    );
    let v = s.get("/version").await.json();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_step_loop_turns_health_503_until_it_moves_again() {
    let s = start(dsv4_server::ServerConfig {
        health_stall: Duration::from_millis(200),
        ..config()
    })
    .await;
    assert_eq!(s.get("/health").await.status, 200);
    let guard = s.state.loaded().unwrap().engine.stall();
    // The generating probe gets no token while the loop is stalled.
    let r = s.get("/health_generate").await;
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (503, Some("stalled")),
        "{}",
        r.body
    );
    let addr = s.addr;
    let body = chat(
        "hi",
        json!({"max_tokens": 3, "stream": true, "stop": CLEAN_STOPS}),
    );
    let pending = tokio::spawn(async move {
        request(
            addr,
            "POST",
            "/v1/chat/completions",
            &[],
            body.to_string().as_bytes(),
        )
        .await
    });
    eventually("health 503 while stalled", async || {
        s.get("/health").await.status == 503
    })
    .await;
    let r = s.get("/health").await;
    assert_eq!(r.json()["status"], "stalled", "{}", r.body);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("1 requests are pending"),
        "{}",
        r.body
    );
    drop(guard);
    eventually("health 200 once the loop moves", async || {
        s.get("/health").await.status == 200
    })
    .await;
    assert_eq!(s.get("/health_generate").await.status, 200);
    let r = pending.await.unwrap();
    assert_eq!(r.events().last().unwrap(), "[DONE]", "{}", r.body);
    assert!(
        r.events().iter().all(|e| e.get("error").is_none()),
        "{}",
        r.body
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_cancels_its_request() {
    let s = start(config()).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    for (stream, cancelled) in [(true, 1), (false, 2)] {
        let body = long_answer(5000, stream).to_string();
        // Streamed: wait for the first event, then hang up.
        let conn = open_post(s.addr, "/v1/chat/completions", &body, stream).await;
        if !stream {
            eventually("the request runs", async || {
                engine.metrics().running_requests == 1
            })
            .await;
        }
        drop(conn);
        eventually("the engine cancels the request", async || {
            engine.metrics().requests_cancelled == cancelled && s.state.in_flight() == 0
        })
        .await;
    }
    let m = engine.metrics();
    assert_eq!((m.running_requests, m.queued_requests), (0, 0));
    // Once the prefix snapshots are dropped too, no page is held: the cancelled requests'
    // caches were freed.
    engine.clear_prefix_cache();
    eventually("every page free", async || {
        engine.metrics().pools.iter().all(|p| p.used_pages == 0)
    })
    .await;
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_the_streams_in_flight() {
    let mut s = start(config()).await;
    let addr = s.addr;
    let body = long_answer(400, true).to_string();
    let stream = tokio::spawn(async move {
        request(addr, "POST", "/v1/chat/completions", &[], body.as_bytes()).await
    });
    eventually("the stream is in flight", async || s.state.in_flight() == 1).await;
    s.begin_shutdown();
    eventually("draining", async || {
        s.state.health() == dsv4_server::Health::Draining
    })
    .await;
    let r = stream.await.unwrap();
    let events = r.events();
    assert_eq!(events.last().unwrap(), "[DONE]", "{}", r.body);
    let content: String = events
        .iter()
        .filter(|e| e.is_object())
        .map(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    let answer: String = serde_json::from_str(&content).unwrap();
    assert!(answer.chars().count() >= 400);
    s.shutdown().await.unwrap();
}

//! Request priority over HTTP: with one running slot held, waiting requests are admitted by
//! `priority`, larger first, on every generation route; a batch's lines (priority -1 unless
//! they set one) wait behind interactive requests; a bad `priority` names the field.

use super::common::*;
use dsv4_engine::{CacheBudget, EngineConfig};
use serde_json::{Value, json};
use std::time::Instant;
use tokio::net::TcpStream;

/// A server whose engine runs one request at a time.
async fn one_slot() -> TestServer {
    start_engine(EngineConfig {
        cache: CacheBudget::Tokens(16384),
        max_running_requests: 1,
        ..Default::default()
    })
    .await
}

/// Take the one slot with a long streamed request; dropping the connection frees it.
async fn hold(s: &TestServer) -> TcpStream {
    let body = json!({"model": MODEL, "prompt": "hold", "max_tokens": 1500, "ignore_eos": true,
                      "stream": true});
    open_stream(s.addr, "/v1/completions", &body).await.0
}

/// Wait until `n` requests queue behind the held one.
async fn queued(s: &TestServer, n: u64) {
    let engine = s.state.loaded().unwrap().engine.clone();
    eventually(&format!("{n} requests queued"), async || {
        engine.metrics().queued_requests as u64 == n
    })
    .await;
}

/// Send `body` to `path` in the background; its reply and when it arrived.
fn send_later(
    s: &TestServer,
    path: &'static str,
    body: Value,
) -> tokio::task::JoinHandle<(Reply, Instant)> {
    let addr = s.addr;
    tokio::spawn(async move {
        let r = request(addr, "POST", path, &[], body.to_string().as_bytes()).await;
        (r, Instant::now())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_are_admitted_by_priority_on_every_route() {
    let s = one_slot().await;
    let conn = hold(&s).await;
    let gen_ = |p: &str, priority: Option<i32>| {
        let mut b = json!({"text": p, "sampling_params": {"max_new_tokens": 12,
                           "ignore_eos": true, "temperature": 0}});
        if let Some(p) = priority {
            b["priority"] = json!(p);
        }
        b
    };
    // Sent in this order; admitted by priority: chat (7), generate (3), completion (0),
    // responses (-2).
    let plain = send_later(
        &s,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "zero", "max_tokens": 12, "ignore_eos": true,
               "temperature": 0}),
    );
    queued(&s, 1).await;
    let low = send_later(
        &s,
        "/v1/responses",
        json!({"model": MODEL, "input": "low", "max_output_tokens": 12, "temperature": 0,
               "priority": -2, "store": false}),
    );
    queued(&s, 2).await;
    let mid = send_later(&s, "/generate", gen_("three", Some(3)));
    queued(&s, 3).await;
    let top = send_later(
        &s,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "seven"}],
               "max_tokens": 12, "temperature": 0, "priority": 7}),
    );
    queued(&s, 4).await;
    drop(conn);
    let mut arrived = Vec::new();
    for (name, task) in [("plain", plain), ("low", low), ("mid", mid), ("top", top)] {
        let (r, at) = task.await.unwrap();
        assert_eq!(r.status, 200, "{name}: {}", r.body);
        arrived.push((at, name));
    }
    arrived.sort();
    let order: Vec<&str> = arrived.iter().map(|(_, n)| *n).collect();
    assert_eq!(order, ["top", "mid", "plain", "low"]);
    // A priority changes when a request runs, never what it generates.
    let alone = s
        .send("POST", "/generate", &gen_("three", None))
        .await
        .json();
    let again = s
        .send("POST", "/generate", &gen_("three", Some(-9)))
        .await
        .json();
    assert_eq!(alone["output_ids"], again["output_ids"]);
    // Bad priorities name the field.
    for bad in [json!("high"), json!(1u64 << 40), json!(1.5)] {
        let r = s
            .send(
                "POST",
                "/v1/completions",
                &json!({"model": MODEL, "prompt": "x", "max_tokens": 1, "priority": bad}),
            )
            .await;
        let e = r.error(400);
        assert!(e["message"].as_str().unwrap().contains("priority"), "{e}");
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_line_waits_behind_an_interactive_request() {
    let s = one_slot().await;
    let conn = hold(&s).await;
    let line = batch_line(
        "only",
        "/v1/completions",
        json!({"model": MODEL, "prompt": "batch", "max_tokens": 48, "ignore_eos": true,
               "temperature": 0}),
    );
    let r = post_form(
        &s,
        &[
            ("purpose", None, b"batch"),
            ("file", Some("b.jsonl"), line.as_bytes()),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let file = r.json()["id"].as_str().unwrap().to_string();
    let batch = s
        .send(
            "POST",
            "/v1/batches",
            &json!({"input_file_id": file, "endpoint": "/v1/completions",
                    "completion_window": "24h"}),
        )
        .await
        .json();
    let id = batch["id"].as_str().unwrap().to_string();
    queued(&s, 1).await;
    // Sent after the batch line queued, admitted before it.
    let interactive = send_later(
        &s,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "now", "max_tokens": 48, "ignore_eos": true,
               "temperature": 0}),
    );
    queued(&s, 2).await;
    drop(conn);
    let (r, _) = interactive.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let b = s.get(&format!("/v1/batches/{id}")).await.json();
    assert_eq!(
        b["request_counts"]["completed"], 0,
        "the batch line ran first: {b}"
    );
    let done = poll(&s, &format!("/v1/batches/{id}"), "the batch ends", |v| {
        v["status"] == "completed"
    })
    .await;
    assert_eq!(done["request_counts"]["completed"], 1, "{done}");
    s.shutdown().await.unwrap();
}

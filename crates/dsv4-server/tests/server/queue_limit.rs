//! `scheduler.max_queued_requests`: with that many requests waiting for a running slot, a new
//! generation request on any route is a 503 `queue_full` with `Retry-After`, counted on
//! `/metrics`; a batch's line still queues; once the queue drains, requests are taken again.

use super::batches::{create, ended, upload};
use super::common::*;
use dsv4_server::ServerConfig;
use serde_json::{Value, json};

/// A server whose engine runs one request at a time and refuses past `limit` waiting.
async fn server(limit: usize) -> TestServer {
    let cfg = ServerConfig {
        max_queued_requests: limit,
        ..config()
    };
    start_with(cfg, slots(1)).await
}

/// A greedy completion body of `n` tokens.
fn completion(prompt: &str, n: u32) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": n, "ignore_eos": true,
           "temperature": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_new_requests_with_503_but_not_batch_lines() {
    let s = server(2).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    // One running (a long stream), two waiting: the queue is full.
    let body = json!({"model": MODEL, "prompt": "hold", "max_tokens": 1500, "ignore_eos": true,
                      "stream": true});
    let (conn, _) = open_stream(s.addr, "/v1/completions", &body).await;
    // With the step loop held, the count cannot depend on when a step runs.
    let stall = engine.stall();
    let waiting: Vec<_> = ["one", "two"]
        .into_iter()
        .map(|p| {
            let (addr, body) = (s.addr, completion(p, 4).to_string());
            tokio::spawn(async move {
                request(addr, "POST", "/v1/completions", &[], body.as_bytes()).await
            })
        })
        .collect();
    eventually("two requests queued", async || engine.queued() == 2).await;

    let refused = [
        ("/v1/completions", completion("three", 4)),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "max_tokens": 2}),
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "x", "max_output_tokens": 2, "store": false}),
        ),
        (
            "/generate",
            json!({"text": "x", "sampling_params": {"max_new_tokens": 2}}),
        ),
    ];
    for (path, body) in &refused {
        let r = s.send("POST", path, body).await;
        assert_eq!(r.header("retry-after"), Some("1"), "{path}");
        let e = r.error(503);
        assert_eq!(e["code"], "queue_full", "{path}: {e}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains("scheduler.max_queued_requests = 2"),
            "{path}: {e}"
        );
    }
    let metrics = s.get("/metrics").await.body;
    assert!(
        metrics.contains("\ndsv4:requests_refused_queue_full_total 4\n"),
        "{metrics}"
    );
    drop(stall);

    // A batch's line still queues behind the full queue, and answers.
    let line = batch_line("only", "/v1/completions", completion("batch", 4));
    let file = upload(&s, &line).await;
    let id = create(&s, &file, "/v1/completions").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually("the batch line queued", async || engine.queued() == 3).await;

    // Free the slot: everything queued answers, and the queue takes requests again.
    drop(conn);
    for w in waiting {
        let r = w.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let done = ended(&s, &id).await;
    assert_eq!(done["request_counts"]["completed"], 1, "{done}");
    assert_eq!(done["request_counts"]["failed"], 0, "{done}");
    eventually("the queue drained", async || engine.queued() == 0).await;
    let r = s
        .send("POST", "/v1/completions", &completion("again", 2))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.shutdown().await.unwrap();
}

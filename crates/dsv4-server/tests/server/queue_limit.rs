//! `scheduler.max_queued_requests`: with that many requests waiting for a running slot, a new
//! generation request on any route is a 503 `queue_full` with `Retry-After`, also streamed and
//! background ones, before anything starts; one of higher priority takes the place of the last
//! waiting request of lowest priority, which gets the 503; both are counted on `/metrics`; a
//! batch's line still queues; once the queue drains, requests are taken again.

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
async fn a_full_queue_refuses_new_requests_with_503_or_makes_room_by_priority() {
    let s = server(2).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    let queued = |n: usize| {
        let engine = engine.clone();
        async move {
            eventually(&format!("{n} requests queued"), async || {
                engine.metrics().queued_requests == n
            })
            .await
        }
    };
    // One running (a long stream), two waiting: the queue is full.
    let body = json!({"model": MODEL, "prompt": "hold", "max_tokens": 1500, "ignore_eos": true,
                      "stream": true});
    let (conn, _) = open_stream(s.addr, "/v1/completions", &body).await;
    let one = send_later(&s, "/v1/completions", completion("one", 4));
    queued(1).await;
    let two = send_later(&s, "/v1/completions", completion("two", 4));
    queued(2).await;

    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                      "max_tokens": 2});
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let refused = [
        ("/v1/completions", completion("three", 4)),
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", streamed),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "x", "max_output_tokens": 2, "store": false}),
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "x", "max_output_tokens": 2, "background": true}),
        ),
        (
            "/generate",
            json!({"text": "x", "sampling_params": {"max_new_tokens": 2}}),
        ),
    ];
    for (path, body) in &refused {
        let r = s.send("POST", path, body).await;
        assert_eq!(r.header("retry-after"), Some("1"), "{path} {body}");
        let e = r.error(503);
        assert_eq!(e["code"], "queue_full", "{path}: {e}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains("2 requests wait for a running slot; the limit is 2")
                && message.contains("scheduler.max_queued_requests"),
            "{path}: {e}"
        );
    }
    assert_eq!(
        metric(&s, "dsv4:requests_refused_queue_full_total").await,
        6
    );

    // A batch's line still queues behind the full queue.
    let line = batch_line("only", "/v1/completions", completion("batch", 4));
    let file = upload(&s, &line).await;
    let id = create(&s, &file, "/v1/completions").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    queued(3).await;

    // A request of higher priority takes the place of the last waiting one of priority 0.
    let mut urgent = completion("urgent", 4);
    urgent["priority"] = json!(5);
    let urgent = send_later(&s, "/v1/completions", urgent);
    let (two, _) = two.await.unwrap();
    let e = two.error(503);
    assert_eq!(e["code"], "queue_full", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("a request of higher priority (5, this one 0) took its place"),
        "{e}"
    );
    assert_eq!(
        metric(&s, "dsv4:requests_displaced_queue_full_total").await,
        1
    );
    assert_eq!(
        metric(&s, "dsv4:requests_refused_queue_full_total").await,
        7
    );

    // Free the slot: everything queued answers, and the queue takes requests again.
    drop(conn);
    for w in [one, urgent] {
        let (r, _) = w.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let done = ended(&s, &id).await;
    assert_eq!(done["request_counts"]["completed"], 1, "{done}");
    assert_eq!(done["request_counts"]["failed"], 0, "{done}");
    queued(0).await;
    let r = s
        .send("POST", "/v1/completions", &completion("again", 2))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.shutdown().await.unwrap();
}

//! Request priority over HTTP: with one running slot held, waiting requests are admitted by
//! `priority`, larger first, on every generation route; a batch's lines (priority -1 unless
//! they set one) wait behind interactive requests; a bad `priority` names the field.

use super::common::*;
use dsv4_engine::EngineConfig;
use dsv4_server::{RequestPriority, ServerConfig};
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// A server whose engine runs one request at a time.
async fn one_slot() -> TestServer {
    one_slot_with(RequestPriority::Use).await
}

/// A server whose engine runs one request at a time, under `server.request_priority = mode`.
async fn one_slot_with(mode: RequestPriority) -> TestServer {
    let cfg = ServerConfig {
        request_priority: mode,
        ..config()
    };
    start_with(cfg, slots(1)).await
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

/// Under `mode`, with the one slot held, queue a batch line (its body's `priority` is
/// `line`) and then an interactive completion (`interactive`); whether the batch line ran first.
async fn batch_line_runs_first(
    mode: RequestPriority,
    line: Option<i32>,
    interactive: Option<i32>,
) -> bool {
    let s = one_slot_with(mode).await;
    let conn = hold(&s).await;
    let with = |mut body: Value, priority: Option<i32>| {
        if let Some(p) = priority {
            body["priority"] = json!(p);
        }
        body
    };
    let line = batch_line(
        "only",
        "/v1/completions",
        with(
            json!({"model": MODEL, "prompt": "batch", "max_tokens": 48, "ignore_eos": true,
                   "temperature": 0}),
            line,
        ),
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
    let interactive = send_later(
        &s,
        "/v1/completions",
        with(
            json!({"model": MODEL, "prompt": "now", "max_tokens": 48, "ignore_eos": true,
                   "temperature": 0}),
            interactive,
        ),
    );
    queued(&s, 2).await;
    drop(conn);
    let (r, _) = interactive.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let b = s.get(&format!("/v1/batches/{id}")).await.json();
    let first = b["request_counts"]["completed"] == 1;
    let done = poll(&s, &format!("/v1/batches/{id}"), "the batch ends", |v| {
        v["status"] == "completed"
    })
    .await;
    assert_eq!(done["request_counts"]["completed"], 1, "{done}");
    s.shutdown().await.unwrap();
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_line_waits_behind_an_interactive_request() {
    // Sent after the batch line queued, admitted before it: lines run at -1.
    assert!(!batch_line_runs_first(RequestPriority::Use, None, None).await);
    // A line that asks for more runs first where priorities are used...
    assert!(batch_line_runs_first(RequestPriority::Use, Some(5), Some(-7)).await);
    // ... and not where they are ignored: the line stays at -1, the request at 0.
    assert!(!batch_line_runs_first(RequestPriority::Ignore, Some(5), Some(-7)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_priorities_leave_arrival_order_and_refused_ones_are_a_400() {
    let s = one_slot_with(RequestPriority::Ignore).await;
    let conn = hold(&s).await;
    let body = |prompt: &str, priority: i32| {
        json!({"model": MODEL, "prompt": prompt, "max_tokens": 12, "ignore_eos": true,
               "temperature": 0, "priority": priority})
    };
    let low = send_later(&s, "/v1/completions", body("low", -5));
    queued(&s, 1).await;
    let high = send_later(&s, "/v1/completions", body("high", 9));
    queued(&s, 2).await;
    drop(conn);
    let ((l, low_at), (h, high_at)) = (low.await.unwrap(), high.await.unwrap());
    assert_eq!((l.status, h.status), (200, 200), "{} {}", l.body, h.body);
    assert!(
        low_at < high_at,
        "admitted in arrival order, not by priority"
    );
    s.shutdown().await.unwrap();

    let s = one_slot_with(RequestPriority::Refuse).await;
    let asks = [
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "x", "max_tokens": 2}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "max_tokens": 2, "stop": CLEAN_STOPS}),
        ),
        (
            "/v1/responses",
            // Greedy: a sampled answer of the random tiny model may hold DSML markup (a 500).
            json!({"model": MODEL, "input": "x", "max_output_tokens": 2, "store": false,
                   "temperature": 0}),
        ),
        (
            "/generate",
            json!({"text": "x", "sampling_params": {"max_new_tokens": 2}}),
        ),
    ];
    for (path, body) in asks {
        let r = s.send("POST", path, &body).await;
        assert_eq!(r.status, 200, "{path} without a priority: {}", r.body);
        let mut with = body.clone();
        with["priority"] = json!(0);
        let e = s.send("POST", path, &with).await.error(400);
        assert_eq!(e["param"], "priority", "{path}: {e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("server.request_priority"),
            "{path}: {e}"
        );
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_beam_search_runs_every_step_at_its_priority() {
    // One slot, and a request above the running one by any gap takes its slot.
    let engine = EngineConfig {
        priority_preemption: Some(0),
        ..slots(1)
    };
    let s = start_with(config(), engine).await;
    let conn = hold(&s).await;
    let plain = send_later(
        &s,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "plain", "max_tokens": 48, "ignore_eos": true,
               "temperature": 0}),
    );
    queued(&s, 1).await;
    // Each step of the search is a request of its own: each preempts the plain one at 5, and
    // none would at the default 0.
    let beam = send_later(
        &s,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "beam", "max_tokens": 4, "n": 2,
               "use_beam_search": true, "priority": 5}),
    );
    queued(&s, 2).await;
    drop(conn);
    let (b, beam_at) = beam.await.unwrap();
    assert_eq!(b.status, 200, "{}", b.body);
    let (p, plain_at) = plain.await.unwrap();
    assert_eq!(p.status, 200, "{}", p.body);
    assert!(
        beam_at < plain_at,
        "the search waited for the plain request"
    );
    s.shutdown().await.unwrap();
}

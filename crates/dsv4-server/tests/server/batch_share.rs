//! `server.batch_max_running`: batches keep at most that many lines in flight while interactive
//! requests still run beside them, `/metrics` reports the lines and the limit, and 0 or more
//! than the engine's running slots means as many as those. With `server.batch_fill_idle_ms`
//! lines fill every slot while no interactive request is in flight, and those past the share
//! pause at once when one comes; a background response counts as interactive until it ends.

use super::batches::{create, ended, upload};
use super::common::*;
use dsv4_server::ServerConfig;
use serde_json::json;
use std::time::Duration;

/// The engine's running slots in these tests.
const SLOTS: usize = 8;

/// A server whose batches keep at most `batch_max_running` lines in flight, on an engine with
/// [`SLOTS`] running slots.
async fn server(batch_max_running: usize) -> TestServer {
    let cfg = ServerConfig {
        batch_max_running,
        ..config()
    };
    start_with(cfg, slots(SLOTS)).await
}

/// A batch of `n` lines of `tokens` tokens each on `s`; its id.
async fn batch(s: &TestServer, n: usize, tokens: u32) -> String {
    batch_of(s, n, |_| tokens).await
}

/// A batch of `n` lines, line `i` of `tokens(i)` tokens, on `s`; its id.
async fn batch_of(s: &TestServer, n: usize, tokens: impl Fn(usize) -> u32) -> String {
    let file = upload(s, &lines(n, tokens)).await;
    create(s, &file, "/v1/completions").await["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A batch input of `n` greedy completions, line `i` of `tokens(i)` tokens.
fn lines(n: usize, tokens: impl Fn(usize) -> u32) -> String {
    (0..n)
        .map(|i| {
            let body = json!({"model": MODEL, "prompt": format!("line {i}"),
                              "max_tokens": tokens(i), "ignore_eos": true, "temperature": 0});
            batch_line(&format!("c{i}"), "/v1/completions", body) + "\n"
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_keep_at_most_batch_max_running_lines_in_flight() {
    let s = server(2).await;
    assert_eq!(metric(&s, "dsv4:batch_lines_limit").await, 2);
    assert_eq!(metric(&s, "dsv4:batch_lines_running").await, 0);
    let id = batch(&s, 12, 48).await;
    let state = s.state.clone();
    eventually("two lines in flight", async || {
        state.batches().lines_in_flight() == 2
    })
    .await;
    assert_eq!(metric(&s, "dsv4:batch_lines_running").await, 2);

    // Watch the batch to its end while an interactive request runs beside it.
    let engine = s.state.loaded().unwrap().engine.clone();
    let watcher = tokio::spawn(async move {
        let (mut lines, mut running) = (0, 0);
        loop {
            lines = state.batches().lines_in_flight().max(lines);
            running = engine.metrics().running_requests.max(running);
            if lines > 2 || running > 3 || state.batches().running() == 0 {
                return (lines, running);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    let r = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "interactive", "max_tokens": 8,
                    "ignore_eos": true, "temperature": 0}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 8);
    // The interactive request did not wait for the batch's lines: it ran past the limit.
    let now = s.get(&format!("/v1/batches/{id}")).await.json();
    assert_eq!(now["status"], "in_progress", "{now}");
    assert!(
        now["request_counts"]["completed"].as_u64().unwrap() < 12,
        "{now}"
    );

    let done = ended(&s, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["request_counts"]["completed"], 12, "{done}");
    let (lines, running) = watcher.await.unwrap();
    assert_eq!(lines, 2, "batch lines in flight at most");
    assert!(
        running <= 3,
        "{running} requests ran: 2 batch lines and 1 interactive at most"
    );
    assert_eq!(metric(&s, "dsv4:batch_lines_running").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_or_more_than_the_running_slots_means_as_many_as_the_slots() {
    for asked in [0, SLOTS + 1, 65_536] {
        let s = server(asked).await;
        assert_eq!(
            metric(&s, "dsv4:batch_lines_limit").await,
            SLOTS as u64,
            "server.batch_max_running = {asked}"
        );
        if asked == 0 {
            // Every running slot fills with batch lines.
            let id = batch(&s, 24, 48).await;
            eventually("every slot running a batch line", async || {
                s.state.batches().lines_in_flight() == SLOTS
            })
            .await;
            assert_eq!(ended(&s, &id).await["request_counts"]["completed"], 24);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_slots_fill_with_batch_lines_until_an_interactive_request_comes() {
    let cfg = ServerConfig {
        batch_max_running: 2,
        batch_fill_idle: Some(Duration::from_millis(50)),
        ..config()
    };
    let s = start_with(cfg, slots(SLOTS)).await;
    // Lines of different lengths, so they never end together, and a long first wave: the
    // stream comes while it runs, so the lines past the share are still running and must be
    // paused (equal lines could all end in the same step, and short ones could end on their
    // own as the stream arrives, leaving nothing to pause).
    let id = batch_of(&s, 96, |i| {
        let spread = 9 * (i % SLOTS) as u32;
        if i < SLOTS { 400 + spread } else { 64 + spread }
    })
    .await;
    let (state, activity) = (s.state.clone(), s.state.interactive().clone());
    let engine = s.state.loaded().unwrap().engine.clone();
    // In the engine, not only in flight in the batch layer: a line holds its share before the
    // engine admits it, and lines still waiting there when the stream comes are held back by
    // the cap without being paused.
    eventually("every slot running a batch line", async || {
        state.batches().lines_in_flight() == SLOTS && engine.metrics().running_requests == SLOTS
    })
    .await;
    assert_eq!(metric(&s, "dsv4:batch_lines_limit").await, SLOTS as u64);
    assert_eq!(activity.in_flight(), 0, "batch lines are not interactive");

    // An interactive stream: the lines past the share pause in the engine at once, and no
    // line starts past it.
    let body = json!({"model": MODEL, "prompt": "interactive", "max_tokens": 1500,
                      "ignore_eos": true, "stream": true});
    let (conn, _) = open_stream(s.addr, "/v1/completions", &body).await;
    assert_eq!(activity.in_flight(), 1, "the stream counts while it runs");
    assert_eq!(metric(&s, "dsv4:interactive_requests_in_flight").await, 1);
    assert_eq!(metric(&s, "dsv4:batch_lines_limit").await, 2);
    eventually("two lines running beside the stream", async || {
        engine.metrics().running_requests == 3
    })
    .await;
    assert!(metric(&s, "dsv4:num_yield_preemptions_total").await > 0);
    let path = format!("/v1/batches/{id}");
    let done = async || {
        s.get(&path).await.json()["request_counts"]["completed"]
            .as_u64()
            .unwrap()
    };
    let (before, mut most) = (done().await, 0);
    while done().await < before + 4 {
        most = most.max(engine.metrics().running_requests);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        most <= 3,
        "{most} requests ran: two lines beside the interactive stream at most"
    );

    // Its client goes: once idle, the lines fill every slot again.
    drop(conn);
    eventually("the stream's end seen", async || activity.in_flight() == 0).await;
    eventually("every slot running a batch line again", async || {
        state.batches().lines_in_flight() == SLOTS && engine.metrics().running_requests == SLOTS
    })
    .await;
    let r = s
        .send("POST", &format!("/v1/batches/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(ended(&s, &id).await["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_counts_as_interactive_until_it_ends() {
    let cfg = ServerConfig {
        batch_max_running: 2,
        batch_fill_idle: Some(Duration::from_millis(50)),
        ..config()
    };
    let s = start_with(cfg, slots(SLOTS)).await;
    let activity = s.state.interactive().clone();
    // A long constrained answer (a string of 2000 characters at least), run in the background.
    let body = json!({"model": MODEL, "input": "x", "max_output_tokens": 8000, "background": true,
                      "text": {"format": {"type": "json_schema", "name": "s",
                                          "schema": {"type": "string", "minLength": 2000}}}});
    let r = s.send("POST", "/v1/responses", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    // The POST is answered; the response still runs, and still counts.
    let status = s.get(&format!("/v1/responses/{id}")).await.json()["status"].clone();
    assert!(
        status == "queued" || status == "in_progress",
        "still running: {status}"
    );
    assert_eq!(activity.in_flight(), 1, "counted while it runs");
    assert_eq!(
        metric(&s, "dsv4:batch_lines_limit").await,
        2,
        "no fill beside it"
    );
    let r = s
        .send("POST", &format!("/v1/responses/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    eventually("its end seen", async || activity.in_flight() == 0).await;
    eventually("the fill opens again", async || {
        s.state.batches().lines_limit() == SLOTS
    })
    .await;
}

//! OpenAI Batch API files run through the routes in process (`dsv4 run-batch`): each line's
//! answer equals the same request sent alone over HTTP, lines come back in input order with
//! their `custom_id`, failed lines keep their place (or go to the error sink), progress counts
//! every line, every line written is flushed before progress is reported (a killed run keeps
//! its finished prefix), and a server with an API key runs its batch.

use super::common::*;
use dsv4_server::batch::{self, Options, Sinks, Summary};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Run `text` through the routes of `s`, `concurrency` requests at once: the output lines, the
/// error lines (when `split`) and the summaries `progress` saw.
async fn run(
    s: &TestServer,
    text: &str,
    concurrency: usize,
    split: bool,
) -> (Vec<Value>, Vec<Value>, Vec<Summary>) {
    let items = batch::parse(text, MODEL, None).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut seen = Vec::new();
    let opts = Options::new(concurrency, "batch_req_test");
    let sinks = Sinks {
        output: &mut out,
        errors: if split { Some(&mut err) } else { None },
    };
    batch::run(&s.state, items, &opts, sinks, |p| seen.push(*p))
        .await
        .unwrap();
    let lines = |b: &[u8]| -> Vec<Value> {
        std::str::from_utf8(b)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    (lines(&out), lines(&err), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_answer_equals_the_request_sent_alone_in_input_order() {
    let s = start(config()).await;
    let chat = |text: &str| {
        json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8,
               "temperature": 0, "stop": CLEAN_STOPS})
    };
    let lines = [
        ("chat-a", "/v1/chat/completions", chat("Hello")),
        (
            "cmpl-a",
            "/v1/completions",
            json!({"model": MODEL, "prompt": "The quick brown fox",
            "max_tokens": 8, "temperature": 0, "logprobs": 2}),
        ),
        (
            "resp-a",
            "/v1/responses",
            json!({"model": MODEL, "input": "Hi there",
            "max_output_tokens": 6, "temperature": 0}),
        ),
        (
            "chat-b",
            "/v1/chat/completions",
            chat("What is the weather?"),
        ),
        (
            "cmpl-b",
            "/v1/completions",
            json!({"model": MODEL, "prompt": "Once upon a time",
            "max_tokens": 12, "temperature": 1, "seed": 7, "n": 2}),
        ),
        (
            "cmpl-c",
            "/v1/completions",
            json!({"model": MODEL, "prompt": [1, 200, 201, 202],
            "max_tokens": 5, "temperature": 0, "ignore_eos": true}),
        ),
        (
            "resp-b",
            "/v1/responses",
            json!({"model": MODEL, "input": [{"role": "user",
            "content": "Tell me"}], "max_output_tokens": 4, "temperature": 0}),
        ),
        ("chat-c", "/v1/chat/completions", chat("Hello")),
    ];
    let text: Vec<String> = lines
        .iter()
        .map(|(id, url, b)| batch_line(id, url, b.clone()))
        .collect();
    let (out, err, _) = run(&s, &text.join("\n"), 8, false).await;
    assert!(err.is_empty());
    assert_eq!(out.len(), lines.len());
    let answered = out
        .iter()
        .filter(|o| o["response"]["status_code"] == 200)
        .count();
    assert!(answered >= 6, "only {answered} lines answered 200");
    for (o, (custom_id, url, body)) in out.iter().zip(&lines) {
        assert_eq!(o["custom_id"], *custom_id, "{o}");
        assert_eq!(o["error"], Value::Null, "{o}");
        let alone = s.send("POST", url, body).await;
        let response = &o["response"];
        assert_eq!(response["status_code"], alone.status, "{custom_id}: {o}");
        assert_eq!(
            normalized(&response["body"]),
            normalized(&alone.json()),
            "{custom_id}: the batch answered otherwise than the request alone"
        );
        if alone.status == 200 {
            assert_eq!(response["request_id"], response["body"]["id"], "{o}");
        }
    }
    let ids: Vec<&str> = out.iter().map(|o| o["id"].as_str().unwrap()).collect();
    assert_eq!(ids[0], "batch_req_test_1");
    assert_eq!(ids[7], "batch_req_test_8");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_lines_keep_their_place_or_go_to_the_error_sink() {
    let s = start(config()).await;
    let ok = |p: &str| json!({"model": MODEL, "prompt": p, "max_tokens": 3, "temperature": 0});
    let text = [
        batch_line("ok-1", "/v1/completions", ok("a")),
        batch_line(
            "hot",
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "temperature": 9}),
        ),
        batch_line(
            "where",
            "/v1/embeddings",
            json!({"model": MODEL, "input": "a"}),
        ),
        "{\"custom_id\": \"cut".to_string(),
        batch_line("ok-2", "/v1/completions", ok("b")),
        batch_line("nomodel", "/v1/chat/completions", json!({"messages": []})),
        batch_line("ok-3", "/v1/completions", ok("c")),
    ]
    .join("\n");

    // One file: every line in input order.
    let (all, none, seen) = run(&s, &text, 3, false).await;
    assert!(none.is_empty());
    let ids: Vec<&Value> = all.iter().map(|o| &o["custom_id"]).collect();
    assert_eq!(
        ids,
        [
            &json!("ok-1"),
            &json!("hot"),
            &json!("where"),
            &Value::Null,
            &json!("ok-2"),
            &json!("nomodel"),
            &json!("ok-3")
        ]
    );
    assert_eq!(all[1]["response"]["status_code"], 400);
    assert_eq!(all[1]["response"]["body"]["error"]["param"], "temperature");
    assert_eq!(all[1]["error"], Value::Null);
    assert_eq!(all[2]["response"], Value::Null);
    assert_eq!(all[2]["error"]["code"], "invalid_url");
    assert_eq!(all[3]["error"]["code"], "invalid_json");
    assert_eq!(all[3]["error"]["line"], 4);
    assert_eq!(all[5]["response"]["status_code"], 400, "{}", all[5]);
    assert_eq!(seen.len(), 7);
    assert!(seen.windows(2).all(|w| w[1].done == w[0].done + 1));
    let last = seen[6];
    assert_eq!(
        (last.total, last.done, last.succeeded, last.failed),
        (7, 7, 3, 4)
    );

    // Split: the answers to `output`, the failures to `errors`, each in input order.
    let (good, bad, _) = run(&s, &text, 3, true).await;
    let ids = |v: &[Value]| -> Vec<Value> { v.iter().map(|o| o["custom_id"].clone()).collect() };
    assert_eq!(ids(&good), [json!("ok-1"), json!("ok-2"), json!("ok-3")]);
    assert_eq!(
        ids(&bad),
        [json!("hot"), json!("where"), Value::Null, json!("nomodel")]
    );
    assert!(good.iter().all(|o| o["response"]["status_code"] == 200));
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_an_api_key_runs_its_batch() {
    let s = start(dsv4_server::ServerConfig {
        api_key: Some("sekret".into()),
        ..config()
    })
    .await;
    let text = batch_line(
        "k",
        "/v1/completions",
        json!({"model": MODEL, "prompt": "a", "max_tokens": 2}),
    );
    let (out, _, _) = run(&s, &text, 1, false).await;
    assert_eq!(out[0]["response"]["status_code"], 200, "{}", out[0]);
    s.shutdown().await.unwrap();
}

/// A sink that counts the bytes written and the bytes flushed.
struct Counted {
    written: Arc<AtomicUsize>,
    flushed: Arc<AtomicUsize>,
}

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written.fetch_add(buf.len(), Ordering::SeqCst);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.flushed
            .store(self.written.load(Ordering::SeqCst), Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_written_line_is_flushed_before_progress_is_reported() {
    let s = start(config()).await;
    let text: Vec<String> = (0..12)
        .map(|i| {
            batch_line(
                &format!("r{i}"),
                "/v1/completions",
                json!({"model": MODEL, "prompt": format!("p{i}"), "max_tokens": 1 + i % 5}),
            )
        })
        .collect();
    let items = batch::parse(&text.join("\n"), MODEL, None).unwrap();
    let (written, flushed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut sink = Counted {
        written: written.clone(),
        flushed: flushed.clone(),
    };
    let sinks = Sinks {
        output: &mut sink,
        errors: None,
    };
    let mut checked = 0;
    batch::run(&s.state, items, &Options::new(4, "t"), sinks, |_| {
        // What a killed run leaves on disk is every line written so far.
        assert_eq!(
            flushed.load(Ordering::SeqCst),
            written.load(Ordering::SeqCst)
        );
        checked += 1;
    })
    .await
    .unwrap();
    assert_eq!(checked, 12);
    assert!(written.load(Ordering::SeqCst) > 0);
    s.shutdown().await.unwrap();
}

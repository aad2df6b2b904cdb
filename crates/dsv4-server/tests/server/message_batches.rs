//! Anthropic's Message Batches API (`/v1/messages/batches`): a batch answers each request as
//! `/v1/messages` answers it alone, its counts stay `processing` until it ends, its results are
//! JSONL in request order (`succeeded`, `errored` with Anthropic's error, `canceled`); a cancel
//! cancels the requests not started; an ended batch can be deleted with its files; lists page
//! newest first; with `server.files_dir` a batch goes on after a restart, and past its 24 h
//! window its requests not started expire; bad requests get Anthropic's errors naming the
//! field. A Message Batch is not an OpenAI batch, and its files are not the Files API's.

use super::common::*;
use super::messages::{anthropic_error, message};
use serde_json::{Value, json};

/// One request of a batch: `custom_id` and a greedy Messages body saying `text`.
fn item(custom_id: &str, text: &str, extra: Value) -> Value {
    let params = message(json!([{"role": "user", "content": text}]), extra);
    json!({"custom_id": custom_id, "params": params})
}

/// Create a Message Batch of `requests`; its object.
async fn create(s: &TestServer, requests: Vec<Value>) -> Value {
    let r = s
        .send(
            "POST",
            "/v1/messages/batches",
            &json!({"requests": requests}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// Poll a Message Batch until it has ended; its object.
async fn ended(s: &TestServer, id: &str) -> Value {
    poll(
        s,
        &format!("/v1/messages/batches/{id}"),
        "the message batch ends",
        |v| v["processing_status"] == "ended",
    )
    .await
}

/// The results of an ended batch, one JSON value per line.
async fn results(s: &TestServer, id: &str) -> Vec<Value> {
    let r = s.get(&format!("/v1/messages/batches/{id}/results")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/x-jsonl"));
    r.body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Cancel batch `id`; the answer.
async fn cancel(s: &TestServer, id: &str) -> Reply {
    let path = format!("/v1/messages/batches/{id}/cancel");
    s.send("POST", &path, &json!({})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_batch_answers_each_request_as_messages_alone() {
    let s = start(config()).await;
    let requests = vec![
        item("a", "The quick brown fox", json!({})),
        item("b", "Once upon a time", json!({"max_tokens": 9})),
        item("other-model", "Hi", json!({"model": "claude-sonnet-4-5"})),
        item("streams", "Hi", json!({"stream": true})),
        item("no_max", "Hi", json!({"max_tokens": null})),
        item("c", "The quick brown fox", json!({})),
    ];
    let batch = create(&s, requests.clone()).await;
    let id = batch["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("msgbatch_"), "{batch}");
    assert_eq!(batch["type"], "message_batch");
    assert_eq!(batch["processing_status"], "in_progress");
    assert_eq!(
        batch["request_counts"],
        json!({"processing": 6, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0})
    );
    assert!(batch["results_url"].is_null() && batch["ended_at"].is_null());
    let created = batch["created_at"].as_str().unwrap();
    assert!(created.ends_with('Z') && created.contains('T'), "{batch}");
    let done = ended(&s, &id).await;
    assert_eq!(
        done["request_counts"],
        json!({"processing": 0, "succeeded": 3, "errored": 3, "canceled": 0, "expired": 0}),
        "{done}"
    );
    assert_eq!(
        done["results_url"],
        format!("http://test/v1/messages/batches/{id}/results")
    );
    assert!(done["ended_at"].as_str().unwrap().ends_with('Z'));
    let lines = results(&s, &id).await;
    let order: Vec<&Value> = lines.iter().map(|l| &l["custom_id"]).collect();
    assert_eq!(order, ["a", "b", "other-model", "streams", "no_max", "c"]);
    for line in &lines {
        let sent = requests
            .iter()
            .find(|r| r["custom_id"] == line["custom_id"])
            .unwrap();
        let result = &line["result"];
        if line["custom_id"] == "streams" {
            // The route would stream it; a batch answers whole, so it is refused.
            let e = &result["error"]["error"];
            assert_eq!(e["type"], "invalid_request_error", "{line}");
            assert!(
                e["message"].as_str().unwrap().starts_with("requests.3: "),
                "{line}"
            );
            continue;
        }
        let alone = s.send("POST", "/v1/messages", &sent["params"]).await;
        if alone.status == 200 {
            assert_eq!(result["type"], "succeeded", "{line}");
            let (got, want) = (&result["message"], alone.json());
            assert_eq!(got["type"], "message");
            assert_eq!(got["content"], want["content"], "{line}");
            assert_eq!(
                got["usage"]["output_tokens"],
                want["usage"]["output_tokens"]
            );
        } else {
            assert_eq!(result["type"], "errored", "{line}");
            assert_eq!(result["error"]["type"], "error");
            assert_eq!(result["error"], alone.json(), "{line}");
        }
    }
    // A Message Batch is not an OpenAI batch, and its files are not the Files API's.
    let openai = s.get("/v1/batches").await.json();
    assert_eq!(openai["data"], json!([]), "{openai}");
    s.get(&format!("/v1/batches/{id}")).await.error(404);
    assert_eq!(s.get("/v1/files").await.json()["data"], json!([]));
    let r = s.get(&format!("/v1/messages/batches/{id}")).await;
    assert_eq!(r.json()["id"], id.as_str());
    // A proxy's forwarded host and scheme make the results URL.
    let r = request(
        s.addr,
        "GET",
        &format!("/v1/messages/batches/{id}"),
        &[
            ("X-Forwarded-Host", "llm.example.com"),
            ("X-Forwarded-Proto", "https"),
        ],
        b"",
    )
    .await;
    assert_eq!(
        r.json()["results_url"],
        format!("https://llm.example.com/v1/messages/batches/{id}/results")
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_batch_ends_with_its_unstarted_requests_canceled_and_can_be_deleted() {
    let s = start(config()).await;
    let requests: Vec<Value> = (0..200)
        .map(|i| {
            let extra = json!({"max_tokens": 24});
            item(&format!("r{i}"), &format!("line {i}"), extra)
        })
        .collect();
    let batch = create(&s, requests).await;
    let id = batch["id"].as_str().unwrap().to_string();
    // Still processing: no results yet, and it cannot be deleted.
    let r = s.get(&format!("/v1/messages/batches/{id}/results")).await;
    let e = anthropic_error(&r, 400, "invalid_request_error");
    assert!(e.contains("still processing"), "{e}");
    let r = s
        .send("DELETE", &format!("/v1/messages/batches/{id}"), &json!({}))
        .await;
    let e = anthropic_error(&r, 400, "invalid_request_error");
    assert!(e.contains("cancel"), "{e}");
    // Canceled once some requests have answered (its own object shows progress).
    let running = s.state.batches().get(&id).unwrap();
    eventually("requests answered", async || {
        running.object()["request_counts"]["completed"].as_u64() > Some(0)
    })
    .await;
    let r = cancel(&s, &id).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let canceling = r.json();
    assert_eq!(canceling["processing_status"], "canceling", "{canceling}");
    assert!(canceling["cancel_initiated_at"].is_string());
    let done = ended(&s, &id).await;
    let counts = &done["request_counts"];
    let (ok, canceled) = (
        counts["succeeded"].as_u64().unwrap(),
        counts["canceled"].as_u64().unwrap(),
    );
    assert!(ok > 0 && canceled > 0, "{done}");
    assert_eq!(ok + canceled + counts["errored"].as_u64().unwrap(), 200);
    let lines = results(&s, &id).await;
    assert_eq!(lines.len(), 200);
    let kinds: Vec<&str> = lines
        .iter()
        .map(|l| l["result"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "canceled").count() as u64,
        canceled
    );
    // The requests that ran are the first ones, in order.
    assert!(
        kinds[..ok as usize].iter().all(|k| *k == "succeeded"),
        "{kinds:?}"
    );
    // Canceling a canceled batch answers it again.
    let r = cancel(&s, &id).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["request_counts"], done["request_counts"]);
    let held = s.state.files().bytes();
    assert!(held > 0);
    let r = s
        .send("DELETE", &format!("/v1/messages/batches/{id}"), &json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), json!({"id": id, "type": "message_batch_deleted"}));
    assert_eq!(s.state.files().bytes(), 0, "its files are deleted with it");
    let r = s.get(&format!("/v1/messages/batches/{id}")).await;
    anthropic_error(&r, 404, "not_found_error");
    let r = s.get(&format!("/v1/messages/batches/{id}/results")).await;
    anthropic_error(&r, 404, "not_found_error");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_batches_list_newest_first_in_pages() {
    let s = start(config()).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let b = create(
            &s,
            vec![item(&format!("x{i}"), "Hi", json!({"max_tokens": 1}))],
        )
        .await;
        ids.push(b["id"].as_str().unwrap().to_string());
    }
    ids.reverse();
    let page = |q: &str| {
        let q = q.to_string();
        let s = &s;
        async move { s.get(&format!("/v1/messages/batches{q}")).await.json() }
    };
    let listed = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap().to_string())
            .collect()
    };
    let all = page("").await;
    assert_eq!(listed(&all), ids);
    assert_eq!(all["has_more"], false);
    let first = page("?limit=2").await;
    assert_eq!(listed(&first), ids[..2]);
    assert_eq!(first["has_more"], true);
    assert_eq!(first["first_id"], ids[0].as_str());
    assert_eq!(first["last_id"], ids[1].as_str());
    let next = page(&format!("?limit=2&after_id={}", ids[1])).await;
    assert_eq!(listed(&next), ids[2..]);
    assert_eq!(next["has_more"], false);
    let back = page(&format!("?limit=1&before_id={}", ids[2])).await;
    assert_eq!(listed(&back), ids[1..2]);
    assert_eq!(back["has_more"], true);
    for (q, param) in [
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?order=asc", "order"),
        ("?after_id=msgbatch_nope", "after_id"),
    ] {
        let r = s.get(&format!("/v1/messages/batches{q}")).await;
        let e = anthropic_error(&r, 400, "invalid_request_error");
        assert!(e.contains(param), "{q}: {e}");
    }
    let both = format!("?after_id={}&before_id={}", ids[0], ids[1]);
    let r = s.get(&format!("/v1/messages/batches{both}")).await;
    anthropic_error(&r, 400, "invalid_request_error");
    // /metrics counts the routes under their templates, not each batch's id.
    let requests = r#"dsv4:http_requests_total{endpoint="/v1/messages/batches",status="200"}"#;
    // Three creates and four pages.
    assert_eq!(metric(&s, requests).await, 3 + 4);
    let one = r#"dsv4:http_requests_total{endpoint="/v1/messages/batches/{id}",status="404"}"#;
    s.get("/v1/messages/batches/msgbatch_nope").await;
    assert_eq!(metric(&s, one).await, 1);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_message_batch_requests_are_refused_in_anthropics_shape() {
    let s = start(config()).await;
    let ok = item("ok", "Hi", json!({}));
    let cases = [
        (json!({"requests": []}), "requests"),
        (json!({}), "requests"),
        (json!({"requests": [ok.clone()], "extra": 1}), "extra"),
        (
            json!({"requests": [{"custom_id": "a b", "params": ok["params"]}]}),
            "requests.0.custom_id",
        ),
        (
            json!({"requests": [{"custom_id": "x".repeat(65), "params": ok["params"]}]}),
            "requests.0.custom_id",
        ),
        (
            json!({"requests": [ok.clone(), ok.clone()]}),
            "requests.1.custom_id",
        ),
        (
            json!({"requests": [{"custom_id": "p", "params": "hello"}]}),
            "requests.0.params",
        ),
        (
            json!({"requests": [{"custom_id": "p", "params": {}, "more": 1}]}),
            "more",
        ),
    ];
    for (body, field) in cases {
        let r = s.send("POST", "/v1/messages/batches", &body).await;
        let e = anthropic_error(&r, 400, "invalid_request_error");
        assert!(e.contains(field), "{body}: {e}");
    }
    let r = request(
        s.addr,
        "POST",
        "/v1/messages/batches",
        &[],
        b"{\"requests\": [",
    )
    .await;
    anthropic_error(&r, 400, "invalid_request_error");
    let r = s.get("/v1/messages/batches/msgbatch_nope").await;
    anthropic_error(&r, 404, "not_found_error");
    // Nothing was started by any of them.
    assert_eq!(
        s.get("/v1/messages/batches").await.json()["data"],
        json!([])
    );
    s.shutdown().await.unwrap();
    // A batch larger than the files budget (not bounded by server.max_request_bytes).
    let small = start(dsv4_server::ServerConfig {
        files_bytes: 2000,
        max_request_bytes: 100,
        ..config()
    })
    .await;
    let fits = json!({"requests": [item("a", "Hi", json!({"max_tokens": 1}))]});
    let r = small.send("POST", "/v1/messages/batches", &fits).await;
    assert_eq!(
        r.status, 200,
        "past max_request_bytes, within the budget: {}",
        r.body
    );
    let requests: Vec<Value> = (0..40)
        .map(|i| item(&format!("r{i}"), "Hi", json!({})))
        .collect();
    let r = small
        .send(
            "POST",
            "/v1/messages/batches",
            &json!({"requests": requests}),
        )
        .await;
    let e = anthropic_error(&r, 413, "request_too_large");
    assert!(e.contains("server.files_mib"), "{e}");
    // One that fits the limit but not the room the first batch left.
    let requests: Vec<Value> = (0..7)
        .map(|i| item(&format!("f{i}"), "Hi", json!({})))
        .collect();
    let body = json!({"requests": requests});
    assert!(body.to_string().len() < 2000);
    let r = small.send("POST", "/v1/messages/batches", &body).await;
    let e = anthropic_error(&r, 400, "invalid_request_error");
    assert!(e.contains("DELETE /v1/messages/batches/{id}"), "{e}");
    small.shutdown().await.unwrap();
    // With the Files and Batch APIs off, so are Message Batches.
    let off = start(dsv4_server::ServerConfig {
        files_bytes: 0,
        ..config()
    })
    .await;
    let r = off
        .send("POST", "/v1/messages/batches", &json!({"requests": [ok]}))
        .await;
    let e = anthropic_error(&r, 404, "not_found_error");
    assert!(e.contains("server.files_mib"), "{e}");
    off.shutdown().await.unwrap();
}

/// A server keeping its files in `dir`.
fn on_disk(dir: &std::path::Path) -> dsv4_server::ServerConfig {
    dsv4_server::ServerConfig {
        files_dir: Some(dir.to_owned()),
        ..config()
    }
}

/// Start a server on `dir`, create a batch of 200 requests named `prefix{i}`, and stop the
/// server once some have answered: the batch's id and requests.
async fn stopped_part_way(dir: &std::path::Path, prefix: &str) -> (String, Vec<Value>) {
    let a = start(on_disk(dir)).await;
    let requests: Vec<Value> = (0..200)
        .map(|i| {
            let extra = json!({"max_tokens": 32});
            item(&format!("{prefix}{i}"), &format!("{prefix} {i}"), extra)
        })
        .collect();
    let id = create(&a, requests.clone()).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Its counts stay `processing` until it ends; the batch's own object shows progress.
    let running = a.state.batches().get(&id).unwrap();
    eventually("requests answered", async || {
        running.object()["request_counts"]["completed"].as_u64() > Some(0)
    })
    .await;
    a.shutdown().await.unwrap();
    (id, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_batch_goes_on_after_a_restart_with_files_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (id, requests) = stopped_part_way(dir.path(), "k").await;
    let record = dir.path().join("batches").join(format!("{id}.json"));
    let record: Value = serde_json::from_slice(&std::fs::read(record).unwrap()).unwrap();
    assert_eq!(
        record["status"], "in_progress",
        "stopped part-way: {record}"
    );
    let b = start(on_disk(dir.path())).await;
    let done = ended(&b, &id).await;
    assert_eq!(done["request_counts"]["succeeded"], 200, "{done}");
    let lines = results(&b, &id).await;
    let order: Vec<String> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap().to_string())
        .collect();
    let want: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    assert_eq!(order, want);
    // Each answer is the request's alone, whichever server ran it.
    for i in [0, 199] {
        let alone = b.send("POST", "/v1/messages", &requests[i]["params"]).await;
        assert_eq!(
            lines[i]["result"]["message"]["content"],
            alone.json()["content"]
        );
    }
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_not_started_within_the_window_expire() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = stopped_part_way(dir.path(), "w").await;
    // Stopped part-way; its creation moved a day and an hour back, so its 24 h window has
    // ended when the next server goes on with it.
    let path = dir.path().join("batches").join(format!("{id}.json"));
    let mut record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let answered = record["request_counts"]["completed"].as_u64().unwrap();
    assert!((1..200).contains(&answered), "{record}");
    record["created_at"] = json!(record["created_at"].as_u64().unwrap() - 25 * 3600);
    std::fs::write(&path, record.to_string()).unwrap();
    let b = start(on_disk(dir.path())).await;
    let done = ended(&b, &id).await;
    assert_eq!(
        done["request_counts"],
        json!({"processing": 0, "succeeded": answered, "errored": 0, "canceled": 0,
               "expired": 200 - answered}),
        "{done}"
    );
    let kinds: Vec<String> = results(&b, &id)
        .await
        .iter()
        .map(|l| l["result"]["type"].as_str().unwrap().to_string())
        .collect();
    let n = answered as usize;
    assert!(kinds[..n].iter().all(|k| k == "succeeded"), "{kinds:?}");
    assert!(kinds[n..].iter().all(|k| k == "expired"), "{kinds:?}");
    b.shutdown().await.unwrap();
}

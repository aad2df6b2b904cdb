//! OpenAI's Files and Batch APIs over HTTP: an uploaded file's batch answers each line as the
//! request sent alone, in input order, with output and error files; a file that cannot run
//! ends the batch failed with the reason; a cancel keeps the lines that finished; two batches
//! beside interactive requests answer as each line alone; bad uploads, bad create requests, a
//! full files budget and `server.files_mib = 0` are refused clearly. Files on disk, restarts and
//! expiry are in `batches_disk.rs`.

use super::common::*;
use serde_json::{Value, json};

/// Upload `text` as a batch input file; its id.
pub(super) async fn upload(s: &TestServer, text: &str) -> String {
    let r = post_form(
        s,
        &[
            ("purpose", None, b"batch"),
            ("file", Some("in.jsonl"), text.as_bytes()),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let f = r.json();
    assert_eq!(f["object"], "file");
    assert_eq!(f["purpose"], "batch");
    assert_eq!(f["bytes"], text.len());
    assert_eq!(f["filename"], "in.jsonl");
    f["id"].as_str().unwrap().to_string()
}

/// Create a batch over `file` to `endpoint`; its object.
pub(super) async fn create(s: &TestServer, file: &str, endpoint: &str) -> Value {
    let r = s
        .send(
            "POST",
            "/v1/batches",
            &json!({"input_file_id": file, "endpoint": endpoint, "completion_window": "24h",
                    "metadata": {"job": "nightly"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// Poll a batch until it has ended; its object.
pub(super) async fn ended(s: &TestServer, id: &str) -> Value {
    poll(s, &format!("/v1/batches/{id}"), "the batch ends", |v| {
        matches!(
            v["status"].as_str(),
            Some("completed" | "failed" | "cancelled" | "expired")
        )
    })
    .await
}

/// The JSON lines of a stored file.
pub(super) async fn lines_of(s: &TestServer, file: &Value) -> Vec<Value> {
    let r = s
        .get(&format!("/v1/files/{}/content", file.as_str().unwrap()))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_each_line_as_the_request_alone_with_output_and_error_files() {
    let s = start(config()).await;
    let body = |p: &str, n: usize| json!({"model": MODEL, "prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": true});
    let bodies = [
        ("a", body("The quick brown fox", 6)),
        ("b", body("Once upon a time", 9)),
        ("bad", json!({"model": MODEL, "prompt": "x", "top_p": 7})),
        ("c", body("Hello", 3)),
        ("d", body("The quick brown fox", 6)),
    ];
    let text: Vec<String> = bodies
        .iter()
        .map(|(id, b)| batch_line(id, "/v1/completions", b.clone()))
        .collect();
    let file = upload(&s, &text.join("\n")).await;
    let batch = create(&s, &file, "/v1/completions").await;
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["status"], "validating");
    assert_eq!(batch["metadata"], json!({"job": "nightly"}));
    let id = batch["id"].as_str().unwrap().to_string();
    let done = ended(&s, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["request_counts"],
        json!({"total": 5, "completed": 4, "failed": 1})
    );
    // 6 + 9 + 3 + 6 tokens generated (ignore_eos) by the four lines that ran.
    assert_eq!(done["usage"]["output_tokens"], 24, "{done}");
    assert_eq!(done["model"], MODEL);
    for k in ["in_progress_at", "finalizing_at", "completed_at"] {
        assert!(done[k].is_u64(), "{k}: {done}");
    }
    let out = lines_of(&s, &done["output_file_id"]).await;
    let ids: Vec<&Value> = out.iter().map(|o| &o["custom_id"]).collect();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    for o in &out {
        let (_, sent) = bodies.iter().find(|(id, _)| o["custom_id"] == *id).unwrap();
        let alone = s.send("POST", "/v1/completions", sent).await.json();
        let got = &o["response"]["body"];
        assert_eq!(o["response"]["status_code"], 200);
        assert_eq!(
            got["choices"][0]["text"], alone["choices"][0]["text"],
            "{o}"
        );
        assert_eq!(
            got["usage"]["completion_tokens"],
            alone["usage"]["completion_tokens"]
        );
    }
    let errors = lines_of(&s, &done["error_file_id"]).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["custom_id"], "bad");
    assert_eq!(errors[0]["response"]["status_code"], 400);
    assert_eq!(errors[0]["response"]["body"]["error"]["param"], "top_p");

    // The files: the upload and the two outputs, newest first; purpose filters.
    let all = s.get("/v1/files").await.json();
    assert_eq!(all["data"].as_array().unwrap().len(), 3, "{all}");
    assert_eq!(all["data"][2]["id"], file.as_str());
    let outputs = s
        .get("/v1/files?purpose=batch_output&order=asc")
        .await
        .json();
    let purposes: Vec<&Value> = outputs["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| &f["purpose"])
        .collect();
    assert_eq!(purposes, ["batch_output", "batch_output"]);
    assert_eq!(
        s.get(&format!("/v1/files/{file}")).await.json()["id"],
        file.as_str()
    );
    // Batches list newest first; the finished batch is listed.
    let second = create(&s, &file, "/v1/completions").await;
    let listed = s.get("/v1/batches?limit=1").await.json();
    assert_eq!(listed["data"][0]["id"], second["id"]);
    assert_eq!(listed["has_more"], true);
    let after = s
        .get(&format!(
            "/v1/batches?after={}",
            second["id"].as_str().unwrap()
        ))
        .await
        .json();
    assert_eq!(after["data"][0]["id"], id.as_str());
    ended(&s, second["id"].as_str().unwrap()).await;
    // Deleting the input leaves the batches' outputs; the file is then gone.
    let r = request(s.addr, "DELETE", &format!("/v1/files/{file}"), &[], b"").await;
    assert_eq!(
        r.json(),
        json!({"id": file, "object": "file", "deleted": true})
    );
    s.get(&format!("/v1/files/{file}")).await.error(404);
    assert_eq!(lines_of(&s, &done["output_file_id"]).await.len(), 4);
    // The two batches' outputs and errors; the input is gone.
    let metrics = s.get("/metrics").await.body;
    assert!(metrics.contains("\ndsv4:batches_running 0\n"), "{metrics}");
    assert!(metrics.contains("\ndsv4:files_stored 4\n"), "{metrics}");
    // A finished batch cannot be cancelled.
    let r = s
        .send("POST", &format!("/v1/batches/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(r.error(400)["code"], "batch_not_cancellable");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_cannot_run_ends_the_batch_failed_saying_why() {
    let s = start(config()).await;
    let ok = json!({"model": MODEL, "prompt": "x", "max_tokens": 1});
    let cases = [
        (
            [
                batch_line("x", "/v1/completions", ok.clone()),
                batch_line("x", "/v1/completions", ok.clone()),
            ]
            .join("\n"),
            "duplicate_custom_id",
        ),
        (
            batch_line("x", "/v1/chat/completions", ok.clone()),
            "mismatched_endpoint",
        ),
        (
            batch_line(
                "x",
                "/v1/completions",
                json!({"model": "gpt-4o", "prompt": "x"}),
            ),
            "model_not_found",
        ),
        ("\n\n".to_string(), "empty_file"),
    ];
    for (text, code) in cases {
        let file = upload(&s, &text).await;
        let batch = create(&s, &file, "/v1/completions").await;
        let done = ended(&s, batch["id"].as_str().unwrap()).await;
        assert_eq!(done["status"], "failed", "{done}");
        assert_eq!(done["errors"]["data"][0]["code"], code, "{done}");
        assert!(done["failed_at"].is_u64());
        assert_eq!(done["output_file_id"], Value::Null);
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_batch_keeps_the_lines_that_finished() {
    let s = start(config()).await;
    let text: Vec<String> = (0..300)
        .map(|i| {
            batch_line(
                &format!("r{i}"),
                "/v1/completions",
                json!({"model": MODEL, "prompt": format!("line {i}"), "max_tokens": 24,
                       "temperature": 0, "ignore_eos": true}),
            )
        })
        .collect();
    let file = upload(&s, &text.join("\n")).await;
    let batch = create(&s, &file, "/v1/completions").await;
    let id = batch["id"].as_str().unwrap();
    let r = s
        .send("POST", &format!("/v1/batches/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["status"], "cancelling");
    let done = ended(&s, id).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(done["cancelled_at"].is_u64() && done["cancelling_at"].is_u64());
    let counts = &done["request_counts"];
    let finished = counts["completed"].as_u64().unwrap() + counts["failed"].as_u64().unwrap();
    assert_eq!(counts["total"], 300);
    assert!(
        finished < 300,
        "a cancel right after create stopped nothing: {done}"
    );
    let kept = match done["output_file_id"].as_str() {
        Some(_) => lines_of(&s, &done["output_file_id"]).await,
        None => Vec::new(),
    };
    assert_eq!(kept.len() as u64, counts["completed"].as_u64().unwrap());
    // The finished lines are the file's first lines, in order.
    for (i, o) in kept.iter().enumerate() {
        assert_eq!(o["custom_id"], format!("r{i}"));
    }
    let r = s
        .send("POST", &format!("/v1/batches/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(
        r.status, 200,
        "cancelling a cancelled batch is a no-op: {}",
        r.body
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_and_batch_requests_are_refused_naming_the_field() {
    let s = start(dsv4_server::ServerConfig {
        files_bytes: 1000,
        ..config()
    })
    .await;
    // Uploads.
    let r = s.send("POST", "/v1/files", &json!({"file": "x"})).await;
    assert!(
        r.error(400)["message"]
            .as_str()
            .unwrap()
            .contains("multipart/form-data")
    );
    let file: &[u8] = b"{}";
    let up: [Field<'_>; 2] = [("purpose", None, b"batch"), ("file", Some("a.jsonl"), file)];
    let expiring = |anchor: &'static [u8], seconds: &'static [u8]| {
        let mut f = up.to_vec();
        f.push(("expires_after[anchor]", None, anchor));
        f.push(("expires_after[seconds]", None, seconds));
        f
    };
    let mut only_seconds = up.to_vec();
    only_seconds.push(("expires_after[seconds]", None, b"3600"));
    let mut twice = expiring(b"created_at", b"3600");
    twice.push(("expires_after[anchor]", None, b"created_at"));
    for (fields, param) in [
        (expiring(b"last_active_at", b"3600"), "expires_after.anchor"),
        (expiring(b"created_at", b"10"), "expires_after.seconds"),
        (expiring(b"created_at", b"2592001"), "expires_after.seconds"),
        (expiring(b"created_at", b"soon"), "expires_after.seconds"),
        (only_seconds, "expires_after.anchor"),
        (twice, "expires_after[anchor]"),
    ] {
        let r = post_form(&s, &fields).await;
        assert_eq!(r.error(400)["param"], param, "{}", r.body);
    }
    let cases: [(&[Field<'_>], &str); 6] = [
        (&[("file", Some("a.jsonl"), file)], "purpose"),
        (
            &[
                ("purpose", None, b"fine-tune"),
                ("file", Some("a.jsonl"), file),
            ],
            "purpose",
        ),
        (&[("purpose", None, b"batch")], "file"),
        (
            &[("purpose", None, b"batch"), ("file", Some("a.jsonl"), b"")],
            "file",
        ),
        (
            &[("purpose", None, b"batch"), ("colour", None, b"red")],
            "colour",
        ),
        (
            &[
                ("purpose", None, b"batch"),
                ("file", Some("a"), file),
                ("file", Some("b"), file),
            ],
            "file",
        ),
    ];
    for (fields, param) in cases {
        let r = post_form(&s, fields).await;
        assert_eq!(r.error(400)["param"], param, "{}", r.body);
    }
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    let cut = &form(&[("purpose", None, b"batch")])[..20];
    let r = request(s.addr, "POST", "/v1/files", &[("Content-Type", &ct)], cut).await;
    r.error(400);
    // The budget: 1000 bytes.
    let big = vec![b'x'; 800];
    let first = upload(&s, std::str::from_utf8(&big).unwrap()).await;
    let r = post_form(
        &s,
        &[
            ("purpose", None, b"batch"),
            ("file", Some("b"), &big[..300]),
        ],
    )
    .await;
    assert_eq!(r.error(400)["code"], "files_full");
    let r = post_form(
        &s,
        &[
            ("purpose", None, b"batch"),
            ("file", Some("c"), &[b'x'; 2000]),
        ],
    )
    .await;
    assert_eq!(r.error(413)["code"], "request_too_large");
    // Create.
    let create_with = async |body: Value| s.send("POST", "/v1/batches", &body).await;
    let good =
        json!({"input_file_id": first, "endpoint": "/v1/completions", "completion_window": "24h"});
    let with = |k: &str, v: Value| {
        let mut b = good.clone();
        b[k] = v;
        b
    };
    for (body, param, status) in [
        (with("endpoint", json!("/v1/embeddings")), "endpoint", 400),
        (
            with("completion_window", json!("1h")),
            "completion_window",
            400,
        ),
        (
            with("input_file_id", json!("file-nope")),
            "input_file_id",
            404,
        ),
        (with("colour", json!("red")), ".", 400),
        (with("metadata", json!({"a": 1})), "metadata", 400),
        (
            with(
                "output_expires_after",
                json!({"anchor": "created_at", "seconds": 100}),
            ),
            "output_expires_after.seconds",
            400,
        ),
        (
            with(
                "output_expires_after",
                json!({"anchor": "completed_at", "seconds": 3600}),
            ),
            "output_expires_after.anchor",
            400,
        ),
        (
            with("output_expires_after", json!({"anchor": "created_at"})),
            "output_expires_after.seconds",
            400,
        ),
        (
            with("output_expires_after", json!({"seconds": -5})),
            ".",
            400,
        ),
    ] {
        let r = create_with(body).await;
        let e = r.error(status);
        if param != "." {
            assert_eq!(e["param"], param, "{}", r.body);
        }
    }
    // Lists and lookups.
    assert_eq!(
        s.get("/v1/files?purpose=assistants").await.error(400)["param"],
        "purpose"
    );
    assert_eq!(
        s.get("/v1/batches?limit=0").await.error(400)["param"],
        "limit"
    );
    assert_eq!(
        s.get("/v1/batches?after=batch_nope").await.error(400)["param"],
        "after"
    );
    s.get("/v1/batches/batch_nope").await.error(404);
    s.get("/v1/files/file-nope/content").await.error(404);
    s.shutdown().await.unwrap();

    // server.files_mib = 0: both APIs are off.
    let off = start(dsv4_server::ServerConfig {
        files_bytes: 0,
        ..config()
    })
    .await;
    let e = off.get("/v1/files").await.error(404);
    assert!(e["message"].as_str().unwrap().contains("server.files_mib"));
    off.get("/v1/batches").await.error(404);
    let r = post_form(
        &off,
        &[("purpose", None, b"batch"), ("file", Some("a"), file)],
    )
    .await;
    r.error(404);
    off.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batches_beside_interactive_requests_answer_as_each_line_alone() {
    let s = start(config()).await;
    let body = |i: usize| {
        json!({"model": MODEL, "prompt": format!("Request {i} of many"), "max_tokens": 4 + i % 7,
               "temperature": 1, "seed": i, "ignore_eos": true, "logprobs": 1})
    };
    let file = |from: usize| -> String {
        (from..from + 24)
            .map(|i| batch_line(&format!("r{i}"), "/v1/completions", body(i)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (a, b) = (upload(&s, &file(0)).await, upload(&s, &file(100)).await);
    let (ba, bb) = (
        create(&s, &a, "/v1/completions").await,
        create(&s, &b, "/v1/completions").await,
    );
    // Interactive requests while both batches run.
    let mut beside = Vec::new();
    for i in 200..208 {
        let (addr, sent) = (s.addr, body(i));
        beside.push(tokio::spawn(async move {
            request(
                addr,
                "POST",
                "/v1/completions",
                &[],
                sent.to_string().as_bytes(),
            )
            .await
        }));
    }
    for h in beside {
        assert_eq!(h.await.unwrap().status, 200);
    }
    for batch in [&ba, &bb] {
        let done = ended(&s, batch["id"].as_str().unwrap()).await;
        assert_eq!(done["request_counts"]["completed"], 24, "{done}");
        for o in lines_of(&s, &done["output_file_id"]).await {
            let i: usize = o["custom_id"].as_str().unwrap()[1..].parse().unwrap();
            let alone = s.send("POST", "/v1/completions", &body(i)).await.json();
            let got = &o["response"]["body"]["choices"][0];
            assert_eq!(got["text"], alone["choices"][0]["text"], "line r{i}");
            assert_eq!(
                got["logprobs"], alone["choices"][0]["logprobs"],
                "line r{i}"
            );
        }
    }
    s.shutdown().await.unwrap();
}

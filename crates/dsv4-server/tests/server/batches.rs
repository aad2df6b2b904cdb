//! OpenAI's Files and Batch APIs over HTTP: an uploaded file's batch answers each line as the
//! request sent alone, in input order, with output and error files; a file that cannot run
//! ends the batch failed with the reason; a cancel keeps the lines that finished; two batches
//! beside interactive requests answer as each line alone; with `server.files_dir` files and
//! batches survive a restart (a batch cut by it goes on from its last whole line, one stopped
//! while keeping its files finishes keeping them); files expire, and a batch past its completion
//! window ends expired with its unstarted lines as `batch_expired`; bad uploads, bad create
//! requests, a full files budget and `server.files_mib = 0` are refused clearly.

use super::common::*;
use serde_json::{Value, json};

/// A test server's options with its files and batches in `dir`.
fn on_disk(dir: &std::path::Path) -> dsv4_server::ServerConfig {
    dsv4_server::ServerConfig {
        files_dir: Some(dir.to_owned()),
        ..config()
    }
}

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
async fn lines_of(s: &TestServer, file: &Value) -> Vec<Value> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_batches_survive_a_restart_with_files_dir() {
    let dir = tempfile::tempdir().unwrap();
    let on_disk = || on_disk(dir.path());
    let a = start(on_disk()).await;
    let body = |i: usize, n: usize| {
        json!({"model": MODEL, "prompt": format!("p{i}"), "max_tokens": n, "temperature": 0,
               "ignore_eos": true})
    };
    let small: Vec<String> = (0..3)
        .map(|i| batch_line(&format!("s{i}"), "/v1/completions", body(i, 3)))
        .collect();
    let input = upload(&a, &small.join("\n")).await;
    let done = ended(
        &a,
        create(&a, &input, "/v1/completions").await["id"]
            .as_str()
            .unwrap(),
    )
    .await;
    let output = lines_of(&a, &done["output_file_id"]).await;
    assert_eq!(output.len(), 3);
    // A long batch still running when the server stops.
    let long: Vec<String> = (0..400)
        .map(|i| batch_line(&format!("l{i}"), "/v1/completions", body(i, 48)))
        .collect();
    let long_input = upload(&a, &long.join("\n")).await;
    let running = create(&a, &long_input, "/v1/completions").await;
    let running_id = running["id"].as_str().unwrap().to_string();
    poll(
        &a,
        &format!("/v1/batches/{running_id}"),
        "lines answered",
        |v| v["request_counts"]["completed"].as_u64() > Some(0),
    )
    .await;
    // A shutdown lets the lines in flight finish, writes them, and leaves the rest.
    a.shutdown().await.unwrap();
    let batches = dir.path().join("batches");
    let record: Value =
        serde_json::from_slice(&std::fs::read(batches.join(format!("{running_id}.json"))).unwrap())
            .unwrap();
    assert_eq!(record["status"], "in_progress", "{record}");
    let part = batches.join(format!("{running_id}.output.jsonl.part"));
    let before = std::fs::read_to_string(&part).unwrap();
    let written = before.lines().count();
    assert!(
        written > 0 && written < 400,
        "{written} lines written before the stop"
    );
    // What a kill leaves: a line cut short.
    let mut cut = std::fs::OpenOptions::new()
        .append(true)
        .open(&part)
        .unwrap();
    std::io::Write::write_all(&mut cut, br#"{"id": "batch_req_"#).unwrap();
    drop(cut);
    // A batch stopped while keeping its files (one moved into place, its record not yet
    // written), and one whose input file went while the server was down.
    let crafted = |id: &str, status: &str, input: &str| {
        let mut v = done.clone();
        v["id"] = json!(id);
        v["status"] = json!(status);
        v["input_file_id"] = json!(input);
        v["output_file_id"] = Value::Null;
        v
    };
    let mut keeping = crafted("batch_keeping", "finalizing", &input);
    keeping["dsv4_outputs"] = json!(["file-kept-out", "file-kept-err"]);
    let output_file = format!("{}.data", done["output_file_id"].as_str().unwrap());
    let output_text = std::fs::read(dir.path().join(output_file)).unwrap();
    std::fs::write(
        batches.join("batch_keeping.output.jsonl.part"),
        &output_text,
    )
    .unwrap();
    std::fs::write(dir.path().join("file-kept-err.data"), b"{}\n").unwrap();
    let orphan = crafted("batch_orphan", "in_progress", "file-gone");
    for v in [&keeping, &orphan] {
        let path = batches.join(format!("{}.json", v["id"].as_str().unwrap()));
        std::fs::write(path, v.to_string()).unwrap();
    }

    let b = start_loading(on_disk()).await;
    let waiting = b.get(&format!("/v1/batches/{running_id}")).await.json();
    assert_eq!(
        waiting["status"], "in_progress",
        "read back as it was: {waiting}"
    );
    b.state.set_ready(loaded());
    let resumed = ended(&b, &running_id).await;
    assert_eq!(resumed["status"], "completed", "{resumed}");
    assert_eq!(resumed["request_counts"]["completed"], 400, "{resumed}");
    assert_eq!(resumed["request_counts"]["failed"], 0);
    assert_eq!(resumed["usage"]["output_tokens"], 400 * 48);
    assert_eq!(resumed["in_progress_at"], record["in_progress_at"]);
    let lines = lines_of(&b, &resumed["output_file_id"]).await;
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..400).map(|i| format!("l{i}")).collect();
    assert_eq!(ids, want, "every line once, in input order");
    let text = b
        .get(&format!(
            "/v1/files/{}/content",
            resumed["output_file_id"].as_str().unwrap()
        ))
        .await
        .body;
    assert!(
        text.starts_with(&before),
        "the lines answered before the stop are kept as they were, not run again"
    );
    // Lines from before and after the stop answer as the request alone.
    for i in [0, written - 1, written, 399] {
        let alone = b.send("POST", "/v1/completions", &body(i, 48)).await.json();
        assert_eq!(
            lines[i]["response"]["body"]["choices"][0]["text"], alone["choices"][0]["text"],
            "line {i}"
        );
    }
    assert!(!part.exists(), "the part files are moved into place");
    let kept = ended(&b, "batch_keeping").await;
    assert_eq!(kept["status"], "completed", "{kept}");
    assert_eq!(kept["output_file_id"], "file-kept-out");
    assert_eq!(kept["error_file_id"], "file-kept-err");
    assert_eq!(lines_of(&b, &kept["output_file_id"]).await, output);
    let gone = ended(&b, "batch_orphan").await;
    assert_eq!(gone["status"], "failed", "{gone}");
    assert_eq!(gone["errors"]["data"][0]["code"], "server_restarted");
    assert!(
        gone["errors"]["data"][0]["message"]
            .as_str()
            .unwrap()
            .contains("file-gone"),
        "{gone}"
    );
    // Deleting a file removes it from the directory.
    let r = request(b.addr, "DELETE", &format!("/v1/files/{input}"), &[], b"").await;
    assert_eq!(r.status, 200);
    assert!(!dir.path().join(format!("{input}.data")).exists());
    assert!(!dir.path().join(format!("{input}.json")).exists());
    b.shutdown().await.unwrap();

    // A directory without a budget is a contradiction.
    let e = dsv4_server::AppState::new(dsv4_server::ServerConfig {
        files_bytes: 0,
        ..on_disk()
    })
    .unwrap_err();
    assert!(e.to_string().contains("server.files_mib"), "{e}");
    // One server per directory: a second is refused while the first holds it.
    let held = dsv4_server::AppState::new(on_disk()).unwrap();
    let e = dsv4_server::AppState::new(on_disk())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("server.files_dir") && e.contains("another server uses it"),
        "{e}"
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_expire_and_a_batch_past_its_window_expires_with_its_unstarted_lines() {
    let dir = tempfile::tempdir().unwrap();
    let on_disk = || on_disk(dir.path());
    // A file that expired while no server ran is not served, and is deleted at start.
    let meta = json!({"format": "dsv4-file/1", "id": "file-old", "filename": "old.jsonl",
                      "purpose": "batch", "created_at": 1, "expires_at": 3601, "bytes": 2});
    std::fs::write(dir.path().join("file-old.data"), b"{}").unwrap();
    std::fs::write(dir.path().join("file-old.json"), meta.to_string()).unwrap();
    let a = start(on_disk()).await;
    a.get("/v1/files/file-old").await.error(404);
    eventually("the expired file is deleted", async || {
        !dir.path().join("file-old.data").exists()
    })
    .await;
    assert!(!dir.path().join("file-old.json").exists());
    // An upload and a batch's outputs with expiries.
    let body = |i: usize| {
        json!({"model": MODEL, "prompt": format!("e{i}"), "max_tokens": 48, "temperature": 0,
               "ignore_eos": true})
    };
    let text: Vec<String> = (0..200)
        .map(|i| batch_line(&format!("e{i}"), "/v1/completions", body(i)))
        .collect();
    let text = text.join("\n");
    let r = post_form(
        &a,
        &[
            ("purpose", None, b"batch"),
            ("file", Some("in.jsonl"), text.as_bytes()),
            ("expires_after[anchor]", None, b"created_at"),
            ("expires_after[seconds]", None, b"7200"),
        ],
    )
    .await;
    let f = r.json();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(f["expires_at"], f["created_at"].as_u64().unwrap() + 7200);
    let input = f["id"].as_str().unwrap();
    let r = a
        .send(
            "POST",
            "/v1/batches",
            &json!({"input_file_id": input, "endpoint": "/v1/completions",
                    "completion_window": "24h",
                    "output_expires_after": {"anchor": "created_at", "seconds": 3600}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    poll(&a, &format!("/v1/batches/{id}"), "lines answered", |v| {
        v["request_counts"]["completed"].as_u64() > Some(0)
    })
    .await;
    a.shutdown().await.unwrap();
    // The batch was stopped part-way; move its creation a day and an hour back, so its
    // completion window has ended when the next server goes on with it.
    let batches = dir.path().join("batches");
    let written = std::fs::read_to_string(batches.join(format!("{id}.output.jsonl.part")))
        .unwrap()
        .lines()
        .count();
    let path = batches.join(format!("{id}.json"));
    let mut record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["created_at"] = json!(record["created_at"].as_u64().unwrap() - 25 * 3600);
    std::fs::write(&path, record.to_string()).unwrap();

    let b = start(on_disk()).await;
    let done = ended(&b, &id).await;
    assert_eq!(done["status"], "expired", "{done}");
    assert!(done["expired_at"].is_u64(), "{done}");
    assert!(done["completed_at"].is_null());
    let counts = &done["request_counts"];
    assert_eq!(counts["completed"], written, "{done}");
    assert_eq!(counts["failed"], 200 - written);
    let output = lines_of(&b, &done["output_file_id"]).await;
    let errors = lines_of(&b, &done["error_file_id"]).await;
    let ids: Vec<&str> = output
        .iter()
        .chain(&errors)
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..200).map(|i| format!("e{i}")).collect();
    assert_eq!(ids, want, "answered lines, then the expired ones, in order");
    for e in &errors {
        assert_eq!(e["response"], Value::Null);
        assert_eq!(e["error"]["code"], "batch_expired", "{e}");
    }
    for kind in ["output_file_id", "error_file_id"] {
        let file = b
            .get(&format!("/v1/files/{}", done[kind].as_str().unwrap()))
            .await
            .json();
        assert_eq!(
            file["expires_at"],
            file["created_at"].as_u64().unwrap() + 3600,
            "{file}"
        );
    }
    let r = b
        .send("POST", &format!("/v1/batches/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(r.error(400)["code"], "batch_not_cancellable");
    b.shutdown().await.unwrap();
}

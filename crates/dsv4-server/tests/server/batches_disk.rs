//! OpenAI's Files and Batch APIs across time: with `server.files_dir` files and batches survive
//! a restart (a batch cut by it goes on from its last whole line, one stopped while keeping its
//! files finishes keeping them); files expire, and a batch past its completion window ends
//! expired with its unstarted lines as `batch_expired`.

use super::batches::{create, ended, lines_of, upload};
use super::common::*;
use serde_json::{Value, json};

/// A test server's options with its files and batches in `dir`.
fn on_disk(dir: &std::path::Path) -> dsv4_server::ServerConfig {
    dsv4_server::ServerConfig {
        files_dir: Some(dir.to_owned()),
        ..config()
    }
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

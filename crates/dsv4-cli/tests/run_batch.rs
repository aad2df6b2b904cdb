//! End-to-end tests of `dsv4 run-batch` on OpenAI Batch API files: answers and failures in input
//! order, request priority, http(s) inputs and outputs, and a file that cannot run refused before
//! anything loads.

mod common;

use common::{dsv4, fails, json};
use serde_json::Value;
use std::path::Path;

/// A batch input line for `run-batch`.
fn batch_line(custom_id: &str, url: &str, body: Value) -> String {
    serde_json::json!({"custom_id": custom_id, "method": "POST", "url": url, "body": body})
        .to_string()
}

/// The JSON lines of a file.
fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn run_batch_writes_answers_and_failures_in_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let body = |p: &str| {
        let mut b = serde_json::json!({"model": "dsv4-tiny", "max_tokens": 3, "temperature": 0});
        b["prompt"] = p.into();
        b
    };
    let input = [
        batch_line("a", "/v1/completions", body("one")),
        batch_line(
            "b",
            "/v1/completions",
            serde_json::json!({"model": "dsv4-tiny", "prompt": "x", "n": 0}),
        ),
        String::new(),
        batch_line(
            "c",
            "/v1/chat/completions",
            serde_json::json!({"model": "dsv4-tiny",
            "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "temperature": 0, "stop": ["<｜"]}),
        ),
    ]
    .join("\n");
    std::fs::write(dir.path().join("in.jsonl"), &input).unwrap();
    let args = [
        "run-batch",
        "-i",
        "in.jsonl",
        "-o",
        "out.jsonl",
        "--error-file",
        "err.jsonl",
        "--json",
    ];
    let summary = json(dsv4(dir.path(), &args));
    assert_eq!(summary["total"], 3, "{summary}");
    assert_eq!(summary["succeeded"], 2, "{summary}");
    assert_eq!(summary["failed"], 1, "{summary}");
    // Line a: 3 tokens; line c: at most 3 (a stop string may end it sooner).
    let generated = summary["usage"]["output_tokens"].as_u64().unwrap();
    assert!((4..=6).contains(&generated), "{summary}");
    assert!(
        summary["usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{summary}"
    );
    let out = jsonl(&dir.path().join("out.jsonl"));
    let ids: Vec<&Value> = out.iter().map(|o| &o["custom_id"]).collect();
    assert_eq!(ids, ["a", "c"]);
    assert_eq!(out[1]["response"]["body"]["object"], "chat.completion");
    let err = jsonl(&dir.path().join("err.jsonl"));
    assert_eq!(err.len(), 1);
    assert_eq!(err[0]["custom_id"], "b");
    assert_eq!(err[0]["response"]["status_code"], 400);

    // stdin to stdout: one file of every line, the progress on stderr.
    let mut cmd = dsv4(dir.path(), &["run-batch", "-i", "-", "-o", "-"]);
    cmd.stdin(std::fs::File::open(dir.path().join("in.jsonl")).unwrap());
    let run = common::run(cmd);
    assert!(run.status.success());
    let lines: Vec<Value> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<&Value> = lines.iter().map(|o| &o["custom_id"]).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("run-batch: done: 2 succeeded, 1 failed"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{generated} generated")),
        "{stderr}"
    );
}

#[test]
fn run_batch_lines_follow_server_request_priority() {
    let dir = tempfile::tempdir().unwrap();
    let body = |priority: Option<i32>| {
        let mut b = serde_json::json!({"model": "dsv4-tiny", "prompt": "x", "max_tokens": 2});
        if let Some(p) = priority {
            b["priority"] = p.into();
        }
        b
    };
    let input = [
        batch_line("plain", "/v1/completions", body(None)),
        batch_line("asks", "/v1/completions", body(Some(3))),
    ]
    .join("\n");
    std::fs::write(dir.path().join("in.jsonl"), &input).unwrap();
    let run = |mode: &str| {
        let set = format!("server.request_priority={mode}");
        let args = [
            "--set",
            &set,
            "run-batch",
            "-i",
            "in.jsonl",
            "-o",
            "out.jsonl",
        ];
        common::ok(dsv4(dir.path(), &args));
        jsonl(&dir.path().join("out.jsonl"))
    };
    for mode in ["use", "ignore"] {
        let out = run(mode);
        let codes: Vec<&Value> = out.iter().map(|o| &o["response"]["status_code"]).collect();
        assert_eq!(codes, [200, 200], "{mode}: {out:?}");
    }
    let out = run("refuse");
    assert_eq!(out[0]["response"]["status_code"], 200, "{out:?}");
    assert_eq!(out[1]["response"]["status_code"], 400, "{out:?}");
    assert_eq!(
        out[1]["response"]["body"]["error"]["param"], "priority",
        "{out:?}"
    );
}

/// A one-thread HTTP/1.1 server for `run-batch`'s URLs: GET `/in.jsonl` answers `input`, PUT
/// `/ok/...` keeps the body (sent on the channel with its path), PUT `/flaky/...` answers 503
/// the first time and then as `/ok/`, PUT `/broken` answers 500, PUT `/forbidden` 403,
/// anything else 404. One request per connection.
fn web(input: String) -> (String, std::sync::mpsc::Receiver<(String, String)>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut flaky_seen = std::collections::HashSet::new();
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut first = String::new();
            if reader.read_line(&mut first).is_err() {
                continue;
            }
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    length = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let mut parts = first.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let (status, answer) = match (method, path) {
                ("GET", "/in.jsonl") => ("200 OK", input.clone()),
                ("PUT", p) if p.starts_with("/ok/") => {
                    let _ = tx.send((p.to_string(), String::from_utf8(body).unwrap()));
                    ("200 OK", String::new())
                }
                ("PUT", p) if p.starts_with("/flaky/") && flaky_seen.insert(p.to_string()) => {
                    ("503 Service Unavailable", "busy".to_string())
                }
                ("PUT", p) if p.starts_with("/flaky/") => {
                    let _ = tx.send((p.to_string(), String::from_utf8(body).unwrap()));
                    ("200 OK", String::new())
                }
                ("PUT", "/broken") => ("500 Internal Server Error", "down".to_string()),
                ("PUT", "/forbidden") => ("403 Forbidden", "expired".to_string()),
                _ => ("404 Not Found", "no such object".to_string()),
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (base, rx)
}

#[test]
fn run_batch_reads_and_writes_http_urls_and_keeps_an_output_it_cannot_upload() {
    let dir = tempfile::tempdir().unwrap();
    let input = [
        batch_line(
            "a",
            "/v1/completions",
            serde_json::json!({"model": "dsv4-tiny", "prompt": "x", "max_tokens": 2}),
        ),
        batch_line(
            "b",
            "/v1/completions",
            serde_json::json!({"model": "dsv4-tiny", "prompt": "x", "n": 0}),
        ),
    ]
    .join("\n");
    let (base, uploads) = web(input);
    let (input_url, out_url, err_url) = (
        format!("{base}/in.jsonl"),
        format!("{base}/ok/out.jsonl"),
        format!("{base}/ok/err.jsonl"),
    );
    let args = [
        "run-batch",
        "-i",
        &input_url,
        "-o",
        &out_url,
        "--error-file",
        &err_url,
    ];
    common::ok(dsv4(dir.path(), &args));
    let mut got: Vec<(String, String)> = uploads.try_iter().collect();
    got.sort();
    let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["/ok/err.jsonl", "/ok/out.jsonl"]);
    let line = |text: &str| -> Value { serde_json::from_str(text.trim()).unwrap() };
    assert_eq!(line(&got[1].1)["custom_id"], "a");
    assert_eq!(line(&got[0].1)["custom_id"], "b");
    assert_eq!(line(&got[0].1)["response"]["status_code"], 400);

    // A URL that does not answer 200 stops the run before the model loads.
    let missing = format!("{base}/missing.jsonl");
    let e = common::fails(dsv4(dir.path(), &["run-batch", "-i", &missing, "-o", "o"]));
    assert!(e.contains("404") && e.contains(&missing), "{e}");
    assert!(!e.contains("loading model"), "{e}");
    assert!(!dir.path().join("o").exists(), "nothing was written");

    // A failure that may pass is tried again.
    let flaky = format!("{base}/flaky/out.jsonl");
    let out = common::run(dsv4(
        dir.path(),
        &["run-batch", "-i", &input_url, "-o", &flaky],
    ));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("503") && said.contains("trying again in 1 s (1 of 4 retries)"),
        "{said}"
    );
    let (path, text) = uploads.try_recv().unwrap();
    assert_eq!(path, "/flaky/out.jsonl");
    assert_eq!(line(text.lines().next().unwrap())["custom_id"], "a");

    // One that cannot pass is not: a 403 fails at once.
    let forbidden = format!("{base}/forbidden");
    let e = common::fails(dsv4(
        dir.path(),
        &["run-batch", "-i", &input_url, "-o", &forbidden],
    ));
    assert!(e.contains("403") && !e.contains("trying again"), "{e}");
    let kept = e
        .split("kept in ")
        .nth(1)
        .and_then(|rest| rest.split(" (").next())
        .unwrap_or_else(|| panic!("no kept file named: {e}"));
    std::fs::remove_file(kept).unwrap();

    // An upload that still fails keeps the output on disk and says where.
    let broken = format!("{base}/broken");
    let e = common::fails(dsv4(
        dir.path(),
        &[
            "run-batch",
            "-i",
            &input_url,
            "-o",
            &broken,
            "--upload-retries",
            "1",
        ],
    ));
    assert!(e.contains("500") && e.contains("after 2 attempts"), "{e}");
    let kept = e
        .split("kept in ")
        .nth(1)
        .and_then(|rest| rest.split(" (").next())
        .unwrap_or_else(|| panic!("no kept file named: {e}"));
    let lines = jsonl(Path::new(kept));
    let ids: Vec<&Value> = lines.iter().map(|l| &l["custom_id"]).collect();
    assert_eq!(ids, ["a", "b"]);
    std::fs::remove_file(kept).unwrap();
}

#[test]
fn run_batch_refuses_a_file_that_cannot_run_before_loading_anything() {
    let dir = tempfile::tempdir().unwrap();
    let body = serde_json::json!({"model": "dsv4-tiny", "prompt": "p"});
    let write = |text: &str| std::fs::write(dir.path().join("in.jsonl"), text).unwrap();
    let refuse = |extra: &[&str]| {
        let mut args = vec!["run-batch", "-i", "in.jsonl", "-o", "out.jsonl"];
        args.extend_from_slice(extra);
        fails(dsv4(dir.path(), &args))
    };
    write(
        &[
            batch_line("x", "/v1/completions", body.clone()),
            batch_line("x", "/v1/completions", body.clone()),
        ]
        .join("\n"),
    );
    let e = refuse(&[]);
    assert!(e.contains("custom_id `x` is on line 1 and line 2"), "{e}");
    assert!(
        !dir.path().join("out.jsonl").exists(),
        "a refused batch wrote its output"
    );
    write(&batch_line(
        "x",
        "/v1/completions",
        serde_json::json!({"model": "gpt-4o"}),
    ));
    let e = refuse(&[]);
    assert!(e.contains("--served-model-name gpt-4o"), "{e}");
    write("\n\n");
    assert!(refuse(&[]).contains("no requests"));
    write(&batch_line("x", "/v1/completions", body));
    let e = fails(dsv4(
        dir.path(),
        &["run-batch", "-i", "in.jsonl", "-o", "-", "--json"],
    ));
    assert!(e.contains("pick one"), "{e}");
    assert!(refuse(&["--max-concurrency", "0"]).contains("--max-concurrency"));
    let e = refuse(&["--error-file", "nodir/err.jsonl"]);
    assert!(e.contains("does not exist"), "{e}");
    let e = fails(dsv4(
        dir.path(),
        &["run-batch", "-i", "missing.jsonl", "-o", "o"],
    ));
    assert!(
        e.contains("cannot read the batch file missing.jsonl"),
        "{e}"
    );
}

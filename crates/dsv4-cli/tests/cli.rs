//! End-to-end tests of the `dsv4` binary: profiles, `--set`, errors, `model init-tiny`, `model inspect`,
//! `bench` option checks, `run-batch` on OpenAI Batch API files.

mod common;

use common::{dsv4, fails, json, ok};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The `source` of one key in `profile show --json`.
fn source_of(doc: &Value, key: &str) -> String {
    doc["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .unwrap_or_else(|| panic!("no {key} in {doc}"))["source"]
        .as_str()
        .unwrap()
        .to_string()
}

fn flash_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dsv4-model/tests/data/flash-config.json")
}

#[test]
fn profile_show_layers_env_and_set_over_the_embedded_default() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = dsv4(
        dir.path(),
        &[
            "-vv",
            "profile",
            "show",
            "--json",
            "--set",
            "exec.threads=3",
        ],
    );
    cmd.env("DSV4_NUMERICS__KV_CACHE_DTYPE", "fp8")
        .env("DSV4_LOG", "debug");
    let doc = json(cmd);
    assert_eq!(doc["profile"], "dev-cpu");
    assert_eq!(doc["files"][0], "embedded:dev-cpu.toml");
    assert_eq!(doc["resolved"]["numerics"]["kv_cache_dtype"], "fp8");
    assert_eq!(
        source_of(&doc, "numerics.kv_cache_dtype"),
        "env DSV4_NUMERICS__KV_CACHE_DTYPE"
    );
    assert_eq!(doc["resolved"]["exec"]["threads"], 3);
    assert_eq!(source_of(&doc, "exec.threads"), "--set exec.threads=3");
    assert!(source_of(&doc, "model.path").starts_with("embedded:dev-cpu.toml:"));
    assert_eq!(source_of(&doc, "backend.device"), "default");
}

#[test]
fn profiles_come_from_profile_dir_then_local_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("profiles")).unwrap();
    std::fs::write(
        dir.path().join("profiles/local.toml"),
        "extends = \"reference\"\n[exec]\nthreads = 4\n",
    )
    .unwrap();
    let extra = dir.path().join("extra");
    std::fs::create_dir(&extra).unwrap();
    std::fs::write(extra.join("local.toml"), "[exec]\nthreads = 9\n").unwrap();

    let text = ok(dsv4(dir.path(), &["profile", "show", "local"]));
    assert!(text.contains("profiles/local.toml:3"), "{text}");
    assert!(text.contains("embedded:reference.toml"), "{text}");

    let mut cmd = dsv4(dir.path(), &["profile", "show", "--json", "local"]);
    cmd.env("DSV4_PROFILE_DIR", &extra);
    assert_eq!(json(cmd)["resolved"]["exec"]["threads"], 9);
}

#[test]
fn bad_set_values_and_keys_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let e = fails(dsv4(
        dir.path(),
        &["profile", "show", "--set", "numerics.kv_cache_dtype=fp16"],
    ));
    assert!(
        e.contains("`fp16`") && e.contains("numerics.kv_cache_dtype"),
        "{e}"
    );
    assert!(e.contains("one of: bf16, fp8"), "{e}");

    let e = fails(dsv4(
        dir.path(),
        &["profile", "show", "--set", "numerics.kv_cache=fp8"],
    ));
    assert!(e.contains("did you mean `numerics.kv_cache_dtype`"), "{e}");

    let mut cmd = dsv4(dir.path(), &["profile", "show"]);
    cmd.env("DSV4_EXEC__THREADS", "many");
    let e = fails(cmd);
    assert!(
        e.contains("DSV4_EXEC__THREADS") && e.contains("an integer from 0 to 1024"),
        "{e}"
    );
}

#[test]
fn bench_refuses_bad_options_before_measuring_anything() {
    let dir = tempfile::tempdir().unwrap();
    for (args, want) in [
        (
            &["--configs", "tiny,huge"][..],
            "unknown bench config `huge`",
        ),
        (&["--prefill-tokens", "0"][..], "at least 1 token"),
        (
            &["--contexts", "1024,70000"][..],
            "context 70000 is outside",
        ),
        (&["--serving-concurrency", "1,0"][..], "every concurrency"),
        (
            &[
                "--serving-prompt-tokens",
                "64",
                "--serving-shared-prefix",
                "65",
            ][..],
            "longer than the prompt",
        ),
        (
            &["--serving", "--serving-concurrency", "0"][..],
            "every concurrency",
        ),
        (&["--out", "gone/bench.json"][..], "does not exist"),
        (&["--backend", "nope"][..], "unknown backend `nope`"),
    ] {
        let e = fails(dsv4(dir.path(), &[&["bench"][..], args].concat()));
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!e.contains("measuring the machine"), "{args:?}: {e}");
    }
}

#[test]
fn unknown_profile_lists_the_available_ones() {
    let dir = tempfile::tempdir().unwrap();
    let e = fails(dsv4(
        dir.path(),
        &["--profile", "prod-fp9", "profile", "show"],
    ));
    assert!(e.contains("unknown profile `prod-fp9`"), "{e}");
    assert!(
        e.contains("available profiles: dev-cpu, prod-bf16, prod-fp8, reference"),
        "{e}"
    );
}

#[test]
fn init_tiny_writes_the_three_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let text = ok(dsv4(
        dir.path(),
        &[
            "model",
            "init-tiny",
            "--out",
            out.to_str().unwrap(),
            "--seed",
            "3",
        ],
    ));
    assert!(text.contains("seed 3"), "{text}");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["vocab_size"], 384);
    let weights = std::fs::metadata(out.join("model.safetensors")).unwrap();
    assert!(weights.len() > 1_000_000, "{} bytes", weights.len());
    let tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer.json")).unwrap())
            .unwrap();
    assert!(tokenizer["model"].is_object(), "{tokenizer}");

    // The written checkpoint is inspectable like any other.
    let doc = json(dsv4(
        dir.path(),
        &[
            "model",
            "inspect",
            "--model",
            out.to_str().unwrap(),
            "--json",
        ],
    ));
    assert_eq!(doc["layers"], 4);

    // Without its tokenizer.json the checkpoint is refused before any weight is loaded and, for
    // serve, before the port opens (nothing printed on stdout).
    std::fs::remove_file(out.join("tokenizer.json")).unwrap();
    let model = out.to_str().unwrap();
    for args in [
        &["serve", "--port", "0", "--model", model][..],
        &["generate", "--prompt", "hi", "--model", model][..],
    ] {
        let o = common::run(dsv4(dir.path(), args));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr.contains("tokenizer.json"), "{args:?}: {stderr}");
        assert!(
            o.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

#[test]
fn inspect_flash_gives_published_counts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = flash_config();
    let doc = json(dsv4(
        dir.path(),
        &[
            "model",
            "inspect",
            "--config",
            cfg.to_str().unwrap(),
            "--json",
        ],
    ));
    let total = doc["params"]["total"].as_f64().unwrap();
    let active = doc["params"]["active"].as_f64().unwrap();
    assert!((total / 284e9 - 1.0).abs() <= 0.01, "total {total}");
    assert!((active / 13e9 - 1.0).abs() <= 0.03, "active {active}");
    assert_eq!(doc["params"]["embedding"], 129_280u64 * 4096);
    assert!(doc["params"]["mtp"].as_u64().unwrap() > 0);
    assert_eq!(doc["cache"]["kv_cache_dtype"], "bf16");

    let text = ok(dsv4(
        dir.path(),
        &["model", "inspect", "--config", cfg.to_str().unwrap()],
    ));
    assert!(
        text.contains("284.") || text.contains("283.") || text.contains("285."),
        "{text}"
    );
}

#[test]
fn inspect_cache_bytes_follow_the_profile_numerics() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = flash_config();
    let cfg = cfg.to_str().unwrap();
    let entry = |doc: &Value, name: &str| {
        doc["cache"]["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap()["entry_bytes"]
            .as_u64()
            .unwrap()
    };
    let bf16 = json(dsv4(
        dir.path(),
        &["model", "inspect", "--config", cfg, "--json"],
    ));
    assert_eq!(entry(&bf16, "swa_kv"), 1024);
    assert_eq!(entry(&bf16, "c4_index_k"), 256);
    let fp8 = json(dsv4(
        dir.path(),
        &[
            "model",
            "inspect",
            "--config",
            cfg,
            "--json",
            "--set",
            "numerics.kv_cache_dtype=fp8",
            "--set",
            "numerics.index_k_dtype=fp4",
        ],
    ));
    assert_eq!(entry(&fp8, "swa_kv"), 584);
    assert_eq!(entry(&fp8, "c4_index_k"), 68);
    assert_eq!(fp8["cache"]["index_k_dtype"], "fp4");
}

#[test]
fn inspect_reports_a_missing_config() {
    let dir = tempfile::tempdir().unwrap();
    let e = fails(dsv4(
        dir.path(),
        &["model", "inspect", "--model", "no-such-dir"],
    ));
    assert!(e.contains("no-such-dir"), "{e}");
}

#[test]
fn generate_runs_the_embedded_tiny_model_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "generate",
        "--prompt",
        "hello",
        "--max-tokens",
        "4",
        "--json",
    ];
    let a = json(dsv4(dir.path(), &args));
    let b = json(dsv4(dir.path(), &args));
    assert_eq!(a, b);
    assert_eq!(a["prompt_ids"][0], 0, "BOS first: {a}");
    let n = a["completion_ids"].as_array().unwrap().len();
    assert!(n == 4 || (n < 4 && a["finish_reason"] == "eos"), "{a}");
    // A run that would outgrow the context is refused before the prefill, with the room left.
    let e = fails(dsv4(
        dir.path(),
        &["generate", "--prompt", "hello", "--max-tokens", "70000"],
    ));
    assert!(
        e.contains("--max-tokens (70000)") && e.contains("at most 65530"),
        "{e}"
    );
}

#[test]
fn a_backend_that_cannot_run_here_is_reported_with_the_reason() {
    // cuda-sm120 is linked into the binary but needs an NVIDIA driver and GPU.
    if let Ok(()) = dsv4_backend_cuda::cuda::probe() {
        eprintln!(
            "SKIP a_backend_that_cannot_run_here_is_reported_with_the_reason: a CUDA device is present"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let e = fails(dsv4(
        dir.path(),
        &[
            "generate",
            "--prompt",
            "hi",
            "--set",
            "backend.kind=cuda-sm120",
        ],
    ));
    let reason = dsv4_backend_cuda::cuda::probe().unwrap_err();
    assert!(
        e.contains("backend `cuda-sm120` is not available here") && e.contains(&reason),
        "{e}"
    );
}

#[test]
fn kernels_compile_checks_every_architecture_before_compiling() {
    let dir = tempfile::tempdir().unwrap();
    // Checked before NVRTC is even looked for: these fail the same on any machine.
    for arch in ["7.5", "sm_75", "nine", "90"] {
        let e = fails(dsv4(
            dir.path(),
            &["kernels", "compile", "--arch", "9.0", "--arch", arch],
        ));
        assert!(
            e.contains(&format!("--arch: `{arch}` is not a compute capability"))
                && e.contains("sm_80 or newer, e.g. 9.0"),
            "{arch}: {e}"
        );
    }
    let e = fails(dsv4(dir.path(), &["kernels", "compile"]));
    assert!(e.contains("--arch <CC>"), "{e}");
    let e = fails(dsv4(
        dir.path(),
        &["kernels", "compile", "--arch", "9.0", "--sums", "f16"],
    ));
    assert!(e.contains("possible values: auto, f64, f32, both"), "{e}");
    assert!(!dir.path().join("cuda-kernels").exists(), "nothing written");
}

#[test]
fn kernels_list_tells_current_from_stale_and_prunes_the_stale() {
    use dsv4_backend_cuda::kernel_cache::path_in;
    let dir = tempfile::tempdir().unwrap();
    let listing = |extra: &[&str]| {
        let mut args = vec!["kernels", "list", "--cache-dir", "cache", "--json"];
        args.extend_from_slice(extra);
        json(dsv4(dir.path(), &args))
    };
    assert_eq!(
        listing(&[])["cubins"],
        serde_json::json!([]),
        "no cache yet"
    );
    let cache = dir.path().join("cache");
    let current = path_in(&cache, (9, 0), true);
    let stale = current.with_file_name("sm_90-f64-00000000deadbeef.cubin");
    std::fs::create_dir_all(current.parent().unwrap()).unwrap();
    std::fs::write(&current, b"\x7fELF this build").unwrap();
    std::fs::write(&stale, b"\x7fELF an older build").unwrap();
    let doc = listing(&[]);
    let states: Vec<(&str, &str)> = doc["cubins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["arch"].as_str().unwrap(), c["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("sm_90", "current"), ("sm_90", "stale")]);
    let doc = listing(&["--prune"]);
    assert_eq!(doc["pruned_bytes"], 19, "the stale file's bytes");
    assert!(
        current.is_file() && !stale.exists(),
        "only the stale CUBIN goes"
    );
    let text = ok(dsv4(
        dir.path(),
        &["kernels", "list", "--cache-dir", "cache"],
    ));
    assert!(text.starts_with("sm_90   f64  current"), "{text}");
}

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

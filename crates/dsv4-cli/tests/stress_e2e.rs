//! `dsv4 stress` end to end against the real `dsv4 serve --port 0` (embedded tiny model): a clean
//! profile gives no failed session with the solo oracle (exit 0) and the report names the
//! served profile and its hash (through chat, the Responses API and background responses; and
//! without stop strings only when the tools are strict, which constrains every answer); the injected arena fault (`debug.inject=arena-ignores-streams`
//! with CUDA-graph-style capture and multi-stream overlap) gives failed sessions (exit 1); an
//! unreachable server exits 2.

mod common;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A `dsv4 serve --port 0` process, killed when dropped.
struct Serve {
    child: Child,
    url: String,
}

impl Serve {
    fn start(sets: &[&str]) -> Self {
        let mut args = vec!["serve", "--port", "0"];
        for s in sets {
            args.extend(["--set", s]);
        }
        let mut cmd = common::dsv4(&std::env::temp_dir(), &args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().expect("dsv4 serve starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("a first line").unwrap();
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {first:?}"))
            .to_string();
        std::thread::spawn(move || for _ in lines {});
        let s = Serve { child, url };
        let addr = s.url.trim_start_matches("http://").to_string();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !healthy(&addr) {
            assert!(Instant::now() < deadline, "dsv4 serve never became healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn healthy(addr: &str) -> bool {
    get(addr, "/health").starts_with("HTTP/1.1 200")
}

/// The whole answer to `GET path` (empty when the server is not there).
fn get(addr: &str, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The workload of both runs: small answers, every turn replayed alone, every token's
/// log-probability compared.
const WORKLOAD: [&str; 16] = [
    "--sessions",
    "8",
    "--concurrency",
    "4",
    "--turns",
    "2",
    "--max-tokens",
    "200",
    "--growth-chars",
    "60",
    "--oracle",
    "solo",
    "--seed",
    "3",
    "--logprobs",
    "--quiet",
];

/// Run `dsv4 stress` with [`WORKLOAD`] against `url`, its "auto" answers stopped before any
/// markup the random tiny model would emit; exit code, stdout, stderr and the JSON report.
fn stress(url: &str, extra: &[&str]) -> (i32, String, String, Value) {
    stress_with(url, &[&["--stop-before-markup"], extra].concat())
}

/// Run `dsv4 stress` with [`WORKLOAD`] and `extra` against `url`.
fn stress_with(url: &str, extra: &[&str]) -> (i32, String, String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let mut args = vec!["stress", "--url", url, "--json", report.to_str().unwrap()];
    args.extend(WORKLOAD);
    args.extend(extra);
    let out = common::run(common::dsv4(dir.path(), &args));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("no report ({e}):\n{stdout}\n{stderr}"));
    (
        out.status.code().unwrap_or(-1),
        stdout,
        stderr,
        serde_json::from_str(&text).unwrap(),
    )
}

#[test]
fn a_clean_profile_has_no_failed_sessions_with_the_solo_oracle() {
    let serve = Serve::start(&[]);
    let (code, stdout, stderr, r) = stress(&serve.url, &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(r["failed_sessions"], 0, "{stdout}");
    assert_eq!(
        (r["sessions"].as_u64(), r["completed"].as_u64()),
        (Some(8), Some(16)),
        "{stdout}"
    );
    assert!(r["oracle_requests"].as_u64().unwrap() >= 16);
    assert_eq!(r["options"]["logprobs"], true, "{stdout}");
    let tool_calls: usize = r["records"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["turns"].as_array().unwrap())
        .map(|t| t["tool_calls"].as_array().unwrap().len())
        .sum();
    assert!(tool_calls > 0, "forced turns made tool calls: {stdout}");
    // The oracle compared real numbers: one log-probability per generated token.
    for t in r["records"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["turns"].as_array().unwrap())
    {
        assert_eq!(t["logprobs"], t["completion_tokens"], "{t}");
        assert!(t["logprobs"].as_u64().unwrap() > 0, "{t}");
    }
    assert_eq!(r["server"]["model"], "dsv4-tiny");
    assert_eq!(r["server"]["dsv4_profile"], "dev-cpu");
    let hash = r["server"]["dsv4_profile_sha256"].as_str().unwrap();
    assert!(
        hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{hash}"
    );
    assert!(stdout.contains("signatures:        none"), "{stdout}");

    // The same workload through the Responses API: clean too, and every turn went there.
    let (code, stdout, stderr, r) = stress(&serve.url, &["--api", "responses"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(r["failed_sessions"], 0, "{stdout}");
    assert_eq!(r["completed"], 16, "{stdout}");
    assert_eq!(r["options"]["api"], "responses");
    let turns: Vec<&Value> = r["records"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["turns"].as_array().unwrap())
        .collect();
    assert!(
        turns
            .iter()
            .any(|t| !t["tool_calls"].as_array().unwrap().is_empty())
    );
    let addr = serve.url.trim_start_matches("http://");
    let metrics = get(addr, "/metrics");
    let answered = metrics
        .lines()
        .find(|l| {
            l.starts_with("dsv4:http_requests_total{endpoint=\"/v1/responses\",status=\"200\"}")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no /v1/responses count: {metrics}"));
    let oracle = r["oracle_requests"].as_u64().unwrap() as usize;
    assert_eq!(
        answered,
        16 + oracle,
        "each turn and each replay went to /v1/responses"
    );

    // Again in background mode: plain turns polled, streams dropped after a few tokens and
    // resumed by sequence number, each response deleted once read; still clean.
    let (code, stdout, stderr, r) = stress(&serve.url, &["--api", "responses-background"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(r["failed_sessions"], 0, "{stdout}");
    assert_eq!(r["completed"], 16, "{stdout}");
    assert_eq!(r["options"]["api"], "responses-background");
    let resumed: u64 = r["records"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["turns"].as_array().unwrap())
        .map(|t| t["resumed"].as_u64().unwrap())
        .sum();
    assert!(resumed > 0, "some stream was resumed: {stdout}");
    let metrics = get(addr, "/metrics");
    for gauge in [
        "\ndsv4:responses_stored 0\n",
        "\ndsv4:responses_background_running 0\n",
    ] {
        assert!(
            metrics.contains(gauge),
            "every background response was deleted: {gauge}: {metrics}"
        );
    }

    // Without stop strings the random tiny model's "auto" answers break the DSV4 parser; with
    // strict tools every answer is grammar-constrained and the run is clean, oracle included.
    let (code, stdout, _, r) = stress_with(&serve.url, &[]);
    assert_eq!(code, 1, "{stdout}");
    assert!(r["failed_sessions"].as_u64().unwrap() > 0, "{stdout}");
    let (code, stdout, stderr, r) = stress_with(&serve.url, &["--strict-tools"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(r["failed_sessions"], 0, "{stdout}");
    assert_eq!(r["completed"], 16, "{stdout}");
    assert_eq!(r["options"]["strict_tools"], true);
    assert_eq!(r["options"]["stop"], json!([]), "no stop strings were sent");
    assert!(stdout.contains("signatures:        none"), "{stdout}");
}

#[test]
fn the_injected_arena_fault_fails_sessions() {
    let serve = Serve::start(&[
        "exec.cuda_graph=true",
        "exec.multi_stream_overlap=true",
        "debug.inject=arena-ignores-streams",
    ]);
    let (code, stdout, stderr, r) = stress(&serve.url, &[]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(stderr.contains("sessions failed"), "{stderr}");
    assert!(r["failed_sessions"].as_u64().unwrap() > 0, "{stdout}");
    assert!(
        r["signatures"]["solo_divergence"].as_u64().unwrap() > 0,
        "{stdout}"
    );
    // A different configuration: a different hash than the clean profile's would have.
    assert!(r["server"]["dsv4_profile_sha256"].is_string());
}

#[test]
fn an_unreachable_server_exits_2_with_a_clear_message() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let out = common::run(common::dsv4(
        dir.path(),
        &["stress", "--url", &url, "--quiet", "--ready-timeout", "0"],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot reach") && stderr.contains(&url),
        "{stderr}"
    );
    // Waited for first (the default), it is "not ready" once the wait is over.
    let out = common::run(common::dsv4(
        dir.path(),
        &["stress", "--url", &url, "--ready-timeout", "1s"],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("waiting for") && stderr.contains("not ready within 1 s"),
        "{stderr}"
    );
    let out = common::run(common::dsv4(
        dir.path(),
        &["stress", "--url", "nope", "--quiet"],
    ));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--url"));
    // A report path in a missing directory is refused before the server is even asked.
    let out = common::run(common::dsv4(
        dir.path(),
        &[
            "stress",
            "--url",
            &url,
            "--quiet",
            "--jsonl",
            "gone/r.jsonl",
        ],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--jsonl gone/r.jsonl") && !stderr.contains("cannot reach"),
        "{stderr}"
    );
}

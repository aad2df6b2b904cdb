//! `dsv4 serve` end to end: the binary with no model arguments serves the embedded tiny model
//! (`--port 0` picks a free port; the bound URL is read from stdout), the official `openai`
//! Python client runs tests/e2e/test_openai.py against it, SIGTERM drains a stream in flight
//! before the process exits 0, and the start-up lines say how requests are scheduled (a
//! `server.batch_max_running` past the engine's running slots said so).
//!
//! The Python test needs `python3` with the `openai` package. Without them it is skipped with
//! the reason printed, except under CI=true, where it fails (.ci/run installs the package).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A `dsv4 serve --port 0` process; killed if the test ends early.
struct Serve {
    child: Child,
    url: String,
    addr: String,
    /// The lines it prints on stdout after the first two.
    printed: mpsc::Receiver<String>,
}

impl Serve {
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// Start with `args` after `serve --port 0`.
    fn start_with(args: &[&str]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsv4"));
        cmd.args(["serve", "--port", "0"])
            .args(args)
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, _) in std::env::vars() {
            if k.starts_with("DSV4_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd.spawn().expect("dsv4 serve starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().expect("a first line").unwrap();
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {first:?}"))
            .to_string();
        let second = lines.next().expect("a curl example").unwrap();
        assert!(
            second.contains("curl ") && second.contains(&url),
            "{second}"
        );
        // Keep reading stdout so the server never blocks on a full pipe.
        let (tx, printed) = mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let addr = url.trim_start_matches("http://").to_string();
        let s = Serve {
            child,
            url,
            addr,
            printed,
        };
        s.wait_healthy();
        s
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(r) = http(&self.addr, "GET", "/health", "")
                && r.starts_with("HTTP/1.1 200")
            {
                return;
            }
            assert!(Instant::now() < deadline, "dsv4 serve never became healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Send SIGTERM.
    fn sigterm(&self) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(ok.success(), "kill -TERM {pid}");
    }

    /// Wait for the exit status (after a SIGTERM).
    fn wait_exit(mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "dsv4 serve did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One blocking HTTP/1.1 request; the whole raw answer.
fn http(addr: &str, method: &str, path: &str, body: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Why the Python client cannot run here, if it cannot.
fn python_missing() -> Option<String> {
    match Command::new("python3")
        .args(["-c", "import openai"])
        .output()
    {
        Err(e) => Some(format!("python3 cannot run ({e})")),
        Ok(o) if !o.status.success() => Some(format!(
            "the `openai` package is missing (python3 -m pip install openai): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

#[test]
fn the_openai_python_client_works_against_dsv4_serve() {
    if let Some(reason) = python_missing() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("CI=true and the end-to-end test cannot run: {reason}");
        }
        eprintln!("SKIP the_openai_python_client_works_against_dsv4_serve: {reason}");
        return;
    }
    let serve = Serve::start();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e/test_openai.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([
            "--base-url",
            &format!("{}/v1", serve.url),
            "--model",
            "dsv4-tiny",
        ])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Every test of the script ran and passed (the count is the script's own).
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    for t in [
        "test_chat",
        "test_completions",
        "test_vllm_token_ids",
        "test_errors",
    ] {
        assert!(
            stdout.contains(&format!("PASS {t}\n")),
            "{t} did not pass: {stdout}"
        );
    }
    serve.sigterm();
    assert!(serve.wait_exit().success());
}

#[test]
fn sigterm_drains_a_stream_in_flight_then_exits_0() {
    let serve = Serve::start();
    let body = r#"{"model": "dsv4-tiny", "messages": [{"role": "user", "content": "x"}], "stream": true, "max_tokens": 4000,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "minLength": 600}}}}"#;
    let mut conn = TcpStream::connect(&serve.addr).unwrap();
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Wait for the stream to start, then ask the server to stop.
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    serve.sigterm();
    conn.read_to_end(&mut seen).unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.contains("data: [DONE]"),
        "the stream was not finished: {text}"
    );
    assert!(text.contains("\"finish_reason\":\"stop\""), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    assert!(serve.wait_exit().success());
}

#[test]
fn the_scheduling_limits_are_reported_at_start() {
    // dev-cpu's automatic cache budget gives 64 running slots.
    let serve = Serve::start_with(&["--set", "server.batch_max_running=65536"]);
    let line = serve
        .printed
        .recv_timeout(Duration::from_secs(30))
        .expect("a third line");
    assert_eq!(
        line,
        "dsv4 serve: scheduling: 64 running slots; batches up to 64 lines \
         (server.batch_max_running = 65536 is more than the slots); queue unlimited; request \
         priorities used; priority preemption off"
    );
    let metrics = http(&serve.addr, "GET", "/metrics", "").unwrap();
    assert!(
        metrics.contains("\ndsv4:batch_lines_limit 64\n"),
        "{metrics}"
    );
    serve.sigterm();
    assert!(serve.wait_exit().success());
}

//! `dsv4 serve` end to end: the binary with no model arguments serves the embedded tiny model
//! (`--port 0` picks a free port; the bound URL is read from stdout), the official `openai`
//! Python client runs tests/e2e/test_openai.py against it (and the official `anthropic` client
//! tests/e2e/test_anthropic.py against its Messages API), SIGTERM drains a stream in flight
//! before the process exits 0, and the start-up lines say how requests are scheduled (a
//! `server.batch_max_running` past the engine's running slots said so).
//!
//! With `server.ssl_certfile` and `server.ssl_keyfile` it serves HTTPS: the first line says
//! `https://`, and a client that trusts the test CA gets answers.
//!
//! Two servers behind SGLang's router (the `sglang-router` package, `--policy power_of_two`)
//! answer every route through it, and the router balances on their `/get_load`
//! (tests/e2e/test_sglang_router.py).
//!
//! The Python tests need `python3` with the `openai` and `anthropic` (and, behind the router,
//! `sglang-router`) packages. Without them they are skipped with the reason printed, except under CI=true, where
//! they fail (.ci/run installs the packages).

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
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))
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
        let plain = url.starts_with("http://");
        let addr = url.split_once("://").unwrap().1.to_string();
        let s = Serve {
            child,
            url,
            addr,
            printed,
        };
        // An HTTPS server's health is for its caller to poll, with a TLS client.
        if plain {
            s.wait_healthy();
        }
        s
    }

    fn wait_healthy(&self) {
        poll_until("dsv4 serve healthy", Duration::from_millis(50), || {
            http(&self.addr, "GET", "/health", "")
                .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
                .then_some(())
        });
    }

    /// Send SIGTERM.
    fn sigterm(&self) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(ok.success(), "kill -TERM {pid}");
    }

    /// Wait for the exit status (after a SIGTERM).
    fn wait_exit(mut self) -> std::process::ExitStatus {
        poll_until(
            "dsv4 serve exited after SIGTERM",
            Duration::from_millis(20),
            || self.child.try_wait().unwrap(),
        )
    }
}

/// Call `f` every `every` until it gives a value; panics naming `what` after two minutes.
fn poll_until<T>(what: &str, every: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(every);
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

/// Run `tests/e2e/{script}` with `args` and require every test of it to pass (the count is
/// the script's own); its stdout.
fn run_e2e_script(script: &str, args: &[&str]) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/e2e")
        .join(script);
    let out = Command::new("python3")
        .arg(&path)
        .args(args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script}: {stdout}\n{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "{script}: {stdout}");
    stdout
}

/// Why python3 cannot import `module` here, if it cannot (`package` is its pip name).
fn python_missing(module: &str, package: &str) -> Option<String> {
    match Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
    {
        Err(e) => Some(format!("python3 cannot run ({e})")),
        Ok(o) if !o.status.success() => Some(format!(
            "the `{package}` package is missing (python3 -m pip install {package}): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// Whether `test` must skip for want of the Python `modules` (`(module, pip name)`): it says
/// why and skips, except under CI=true, where it fails.
fn skip_without(test: &str, modules: &[(&str, &str)]) -> bool {
    let Some(reason) = modules.iter().find_map(|(m, p)| python_missing(m, p)) else {
        return false;
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and {test} cannot run: {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
    true
}

#[test]
fn the_openai_python_client_works_against_dsv4_serve() {
    if skip_without(
        "the_openai_python_client_works_against_dsv4_serve",
        &[("openai", "openai")],
    ) {
        return;
    }
    let serve = Serve::start();
    let base = format!("{}/v1", serve.url);
    let stdout = run_e2e_script(
        "test_openai.py",
        &["--base-url", &base, "--model", "dsv4-tiny"],
    );
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
fn the_anthropic_python_client_works_against_dsv4_serve() {
    if skip_without(
        "the_anthropic_python_client_works_against_dsv4_serve",
        &[("anthropic", "anthropic")],
    ) {
        return;
    }
    let serve = Serve::start();
    // The SDK adds `/v1/messages` to the base URL itself.
    let stdout = run_e2e_script(
        "test_anthropic.py",
        &["--base-url", &serve.url, "--model", "dsv4-tiny"],
    );
    for t in [
        "test_stream_helper",
        "test_tool_use_round_trip",
        "test_streamed_thinking_and_tool_use",
        "test_count_tokens",
    ] {
        assert!(
            stdout.contains(&format!("PASS {t}\n")),
            "{t} did not pass: {stdout}"
        );
    }
    serve.sigterm();
    assert!(serve.wait_exit().success());
}

/// SGLang's router (`sglang_router.launch_router`) over `workers`; killed when dropped.
struct Router {
    child: Child,
    url: String,
}

impl Router {
    fn start(workers: &[&str]) -> Self {
        // A free port: bound, read, released for the router.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("python3")
            .args(["-m", "sglang_router.launch_router", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--policy", "power_of_two"])
            .args(["--log-level", "warn", "--worker-urls"])
            .args(workers)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the router starts");
        let mut router = Router {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        // Ready once it lists every worker; a router that exits fails at once.
        let addr = format!("127.0.0.1:{port}");
        poll_until(
            "the router to list the workers",
            Duration::from_millis(100),
            || {
                if let Some(status) = router.child.try_wait().unwrap() {
                    panic!("the router exited ({status}) before it listed the workers");
                }
                http(&addr, "GET", "/get_loads", "")
                    .is_ok_and(|r| {
                        r.starts_with("HTTP/1.1 200") && workers.iter().all(|w| r.contains(w))
                    })
                    .then_some(())
            },
        );
        router
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn dsv4_servers_work_behind_the_sglang_router() {
    let test = "dsv4_servers_work_behind_the_sglang_router";
    if skip_without(
        test,
        &[("openai", "openai"), ("sglang_router", "sglang-router")],
    ) {
        return;
    }
    let (a, b) = (Serve::start(), Serve::start());
    let router = Router::start(&[&a.url, &b.url]);
    let stdout = run_e2e_script(
        "test_sglang_router.py",
        &["--router", &router.url, "--workers", &a.url, &b.url],
    );
    assert!(
        stdout.contains("PASS test_load_reaches_the_router\n"),
        "{stdout}"
    );
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

#[test]
fn https_serves_clients_that_trust_the_certificate() {
    let tls = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dsv4-server/tests/fixtures/tls"
    );
    let cert = format!("server.ssl_certfile={tls}/server.pem");
    let key = format!("server.ssl_keyfile={tls}/server.key");
    let serve = Serve::start_with(&["--set", &cert, "--set", &key]);
    assert!(serve.url.starts_with("https://127.0.0.1:"), "{}", serve.url);
    let ca = std::fs::read(format!("{tls}/ca.pem")).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let health = format!("{}/health", serve.url);
    poll_until(
        "dsv4 serve healthy over TLS",
        Duration::from_millis(50),
        || {
            runtime
                .block_on(client.get(&health).send())
                .is_ok_and(|r| r.status() == 200)
                .then_some(())
        },
    );
    let body = serde_json::json!({"model": "dsv4-tiny", "prompt": "Hello", "max_tokens": 4,
                                  "temperature": 0});
    let answer: serde_json::Value = runtime.block_on(async {
        let r = client
            .post(format!("{}/v1/completions", serve.url))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        serde_json::from_str(&r.text().await.unwrap()).unwrap()
    });
    assert_eq!(answer["usage"]["completion_tokens"], 4, "{answer}");
    // dsv4 stress trusts the test CA with --ca-cert; without it the certificate is refused.
    let ca_path = format!("{tls}/ca.pem");
    let stress = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dsv4"))
            .args([
                "stress",
                "--url",
                &serve.url,
                "--sessions",
                "2",
                "--turns",
                "1",
            ])
            .args(["--max-tokens", "200", "--quiet", "--ready-timeout", "0"])
            // Stop "auto" answers before the markup the random tiny model emits.
            .arg("--stop-before-markup")
            .args(extra)
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap()
    };
    let trusted = stress(&["--ca-cert", &ca_path]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&trusted.stdout),
        String::from_utf8_lossy(&trusted.stderr),
    );
    assert!(trusted.status.success(), "{stdout}\n{stderr}");
    let untrusted = stress(&[]);
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert_eq!(untrusted.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("certificate"), "{stderr}");
    // Plain HTTP on the same port gets no answer.
    let plain = http(&serve.addr, "GET", "/health", "");
    assert!(
        !plain.as_ref().is_ok_and(|r| r.starts_with("HTTP/")),
        "{plain:?}"
    );
    serve.sigterm();
    assert!(serve.wait_exit().success());
}

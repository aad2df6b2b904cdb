//! Request ids: every answer carries `x-request-id` and `request-id` (the client's id when it
//! sent a usable one, else a fresh one), and the server's log lines of the request (its access
//! line, a refusal) name that id.

use super::common::*;
use serde_json::json;
use std::sync::{Arc, Mutex, OnceLock};

/// The log lines of this test binary (dsv4-server's at debug, the rest at info), captured once.
fn captured() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buf);
        let writer = move || Writer(Arc::clone(&sink));
        tracing_subscriber::fmt()
            .with_writer(writer)
            .with_env_filter(tracing_subscriber::EnvFilter::new("info,dsv4_server=debug"))
            .with_ansi(false)
            .try_init()
            .expect("no other global subscriber in this test binary");
        buf
    })
    .clone()
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The captured lines that name `needle`.
fn lines_with(log: &Mutex<Vec<u8>>, needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&log.lock().unwrap())
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_carry_the_request_id_and_its_log_lines_name_it() {
    let log = captured();
    let s = start(config()).await;
    let body = chat("Hi", json!({"max_tokens": 4, "stop": CLEAN_STOPS}));
    let bytes = body.to_string();

    // The client's id is echoed under both names.
    let mine = "client-7f3a-e2e";
    let r = request(
        s.addr,
        "POST",
        "/v1/chat/completions",
        &[("X-Request-Id", mine)],
        bytes.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-request-id"), Some(mine));
    assert_eq!(r.header("request-id"), Some(mine));

    // Without one, each answer gets a fresh id; an unusable one is replaced.
    let a = s.send("POST", "/v1/chat/completions", &body).await;
    let b = s.send("POST", "/v1/chat/completions", &body).await;
    let (ida, idb) = (
        a.header("x-request-id").unwrap(),
        b.header("x-request-id").unwrap(),
    );
    assert!(!ida.is_empty() && ida != idb, "{ida} {idb}");
    assert_eq!(a.header("request-id"), Some(ida));
    let long = "x".repeat(300);
    let r = request(
        s.addr,
        "POST",
        "/v1/chat/completions",
        &[("x-request-id", &long)],
        bytes.as_bytes(),
    )
    .await;
    let id = r.header("x-request-id").unwrap();
    assert!(!id.is_empty() && id != long, "{id}");

    // Streams, errors, other routes and unknown paths carry it too.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = request(
        s.addr,
        "POST",
        "/v1/chat/completions",
        &[("x-request-id", "client-stream")],
        streamed.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-request-id"), Some("client-stream"));
    let r = request(
        s.addr,
        "GET",
        "/v1/nowhere",
        &[("x-request-id", "client-404")],
        b"",
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.header("x-request-id"), Some("client-404"));
    let r = request(
        s.addr,
        "POST",
        "/v1/messages",
        &[("x-request-id", "client-msg")],
        json!({"model": MODEL, "messages": []})
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.header("request-id"), Some("client-msg"));

    // A client that leaves a stream before its end.
    let long = chat(
        "Hi",
        json!({"max_tokens": 2000, "ignore_eos": true, "stream": true}),
    );
    let (conn, _) = open_stream_with(
        s.addr,
        "/v1/chat/completions",
        &[("x-request-id", "client-gone")],
        &long,
    )
    .await;
    drop(conn);

    // The access line of each, written once its answer is done, and the refusal's own line,
    // name the id.
    eventually("the access lines are logged", async || {
        [
            "client-7f3a-e2e",
            "client-stream",
            "client-404",
            "client-gone",
        ]
        .iter()
        .all(|id| lines_with(&log, id).iter().any(|l| l.contains("answered")))
    })
    .await;
    let access = lines_with(&log, mine);
    let line = access.iter().find(|l| l.contains("answered")).unwrap();
    for part in [
        "dsv4::access",
        "method=POST",
        "path=/v1/chat/completions",
        "status=200",
        "head_ms=",
        " ms=",
        "bytes=",
        "outcome=complete",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
    let streamed = lines_with(&log, "client-stream");
    let line = streamed.iter().find(|l| l.contains("answered")).unwrap();
    assert!(line.contains("outcome=complete"), "{line}");
    let gone = lines_with(&log, "client-gone");
    let line = gone.iter().find(|l| l.contains("answered")).unwrap();
    assert!(line.contains("outcome=client_gone"), "{line}");
    let refused = lines_with(&log, "client-404");
    assert!(
        refused
            .iter()
            .any(|l| l.contains("request refused") && l.contains("status=404")),
        "{refused:?}"
    );
    s.shutdown().await.unwrap();
}

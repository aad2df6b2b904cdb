//! Test plumbing: a server on a free port over the tiny model, and a raw HTTP/1.1 client
//! (one connection per request, `Connection: close`, chunked bodies decoded).

use dsv4_core::Numerics;
use dsv4_engine::{CacheBudget, EngineConfig};
use dsv4_kernels::{BackendOptions, registry};
use dsv4_model::{Model, ModelSource, load_model};
use dsv4_server::{AppState, Loaded, Server, ServerConfig, ServerError};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The served model id.
pub const MODEL: &str = "dsv4-tiny";

/// Stop strings that end a tiny-model answer before any special token the strict DSV4 parser
/// refuses in plain text (the tiny model's weights are random; it emits such tokens often).
pub const CLEAN_STOPS: [&str; 7] = [
    "<｜begin▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜latest_reminder｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
];

/// The tiny model on the fastest registered CPU backend (loaded once per test binary).
pub fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| {
        dsv4_backend_reference::link();
        dsv4_backend_cpu::link();
        let names = registry::names();
        let name = if names.contains(&"cpu") {
            "cpu"
        } else {
            "reference"
        };
        let backend = registry::create(
            name,
            &BackendOptions {
                threads: 2,
                ..Default::default()
            },
        )
        .unwrap();
        Arc::new(load_model(&ModelSource::Tiny { seed: 0 }, backend, Numerics::default()).unwrap())
    })
    .clone()
}

/// An engine on the tiny model with room for 64 concurrent requests.
pub fn loaded() -> Loaded {
    loaded_with(slots(64))
}

/// An engine on the tiny model under `cfg`.
pub fn loaded_with(cfg: EngineConfig) -> Loaded {
    Loaded::new(
        model(),
        dsv4_chat::Tokenizer::tiny().unwrap(),
        cfg,
        Default::default(),
        dsv4_server::config::DEFAULT_GRAMMAR_CACHE,
    )
    .unwrap()
}

/// Server options for tests: a free port on 127.0.0.1.
pub fn config() -> ServerConfig {
    ServerConfig {
        port: 0,
        ..Default::default()
    }
}

/// A running server.
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state.
    pub state: AppState,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServerError>>,
}

/// Start a server with `cfg` and the tiny model.
pub async fn start(cfg: ServerConfig) -> TestServer {
    let s = start_loading(cfg).await;
    s.state.set_ready(loaded());
    s
}

/// Start a test server whose engine runs under `engine` (a smaller cache, fewer slots).
pub async fn start_engine(engine: EngineConfig) -> TestServer {
    start_with(config(), engine).await
}

/// Start a test server with `cfg` whose engine runs under `engine`.
pub async fn start_with(cfg: ServerConfig, engine: EngineConfig) -> TestServer {
    let s = start_loading(cfg).await;
    s.state.set_ready(loaded_with(engine));
    s
}

/// An engine with a 16384-token cache running `slots` requests at once.
pub fn slots(slots: usize) -> EngineConfig {
    EngineConfig {
        cache: CacheBudget::Tokens(16384),
        max_running_requests: slots,
        ..Default::default()
    }
}

/// Start a server with `cfg` whose model never finishes loading.
pub async fn start_loading(cfg: ServerConfig) -> TestServer {
    let state = AppState::new(cfg).unwrap();
    let server = Server::bind(state.clone()).await.unwrap();
    let addr = server.local_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    TestServer {
        addr,
        state,
        stop: Some(tx),
        task,
    }
}

impl TestServer {
    /// Begin a graceful shutdown (the server drains what is in flight).
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    /// Shut down and wait until the server has drained.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        self.begin_shutdown();
        self.task.await.unwrap()
    }

    /// A request to this server.
    pub async fn send(&self, method: &str, path: &str, body: &Value) -> Reply {
        request(self.addr, method, path, &[], body.to_string().as_bytes()).await
    }

    /// A GET request.
    pub async fn get(&self, path: &str) -> Reply {
        request(self.addr, "GET", path, &[], b"").await
    }
}

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (chunked encoding removed).
    pub body: String,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent event stream (`[DONE]` as a JSON string).
    pub fn events(&self) -> Vec<Value> {
        self.body
            .split("\n\n")
            .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_string())))
            .collect()
    }

    /// Assert an OpenAI error object with `status`; returns it.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        e
    }
}

/// Write one raw request (bytes as given) and read the whole answer.
pub async fn raw(addr: SocketAddr, bytes: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    parse_reply(&buf)
}

/// POST `body` to `path` on a connection of its own and, for a streamed request, wait for the
/// first server-sent event; the connection stays open (drop it to hang up).
pub async fn open_post(addr: SocketAddr, path: &str, body: &str, stream: bool) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let bytes = request_bytes("POST", path, &[], body.as_bytes());
    conn.write_all(&bytes).await.unwrap();
    if stream {
        let mut buf = vec![0u8; 4096];
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("data: ") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "the server closed early");
            seen.extend_from_slice(&buf[..n]);
        }
    }
    conn
}

/// One request with a body, `Connection: close`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    raw(addr, &request_bytes(method, path, headers, body)).await
}

/// The bytes of one HTTP/1.1 request (`Content-Type: application/json` unless `headers` name
/// another).
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// A whole HTTP/1.1 answer (status line, headers, body; a chunked body decoded).
pub fn parse_reply(buf: &[u8]) -> Reply {
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(buf)));
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = buf[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

/// A chat request body.
pub fn chat(content: &str, extra: Value) -> Value {
    let mut v = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
    });
    if let (Value::Object(o), Value::Object(x)) = (&mut v, extra) {
        o.extend(x);
    }
    v
}

/// The `tokens` of a `/tokenize` answer.
pub fn tokenized(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// Poll `f` until it is true (panics after a generous deadline; no test asserts a duration).
pub async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// POST `body` to `path` and read until the first event; the connection and what was read.
pub async fn open_stream(addr: SocketAddr, path: &str, body: &Value) -> (TcpStream, Vec<u8>) {
    open_stream_with(addr, path, &[], body).await
}

/// [`open_stream`] with request `headers`.
pub async fn open_stream_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (TcpStream, Vec<u8>) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let bytes = request_bytes("POST", path, headers, body.to_string().as_bytes());
    conn.write_all(&bytes).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\n\n") {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "the server closed early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    (conn, seen)
}

/// Read the rest of a stream opened by [`open_stream`].
pub async fn finish_stream(mut conn: TcpStream, mut seen: Vec<u8>) -> Reply {
    conn.read_to_end(&mut seen).await.unwrap();
    parse_reply(&seen)
}

/// `v` without what differs between two runs of one request: ids, creation and completion
/// times, and how many prompt tokens the prefix cache had.
pub fn normalized(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "id" | "call_id"
                            | "item_id"
                            | "created"
                            | "created_at"
                            | "completed_at"
                            | "cached_tokens"
                    )
                })
                .map(|(k, v)| (k.clone(), normalized(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalized).collect()),
        other => other.clone(),
    }
}

/// `GET path` until `done` holds for its JSON answer (60 s at most); that answer.
pub async fn poll(s: &TestServer, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    eventually(what, async || {
        last = s.get(path).await.json();
        done(&last)
    })
    .await;
    last
}

/// The whole tool calls a chat stream's `tool_calls` pieces make, joined as OpenAI clients join
/// them: a call's first piece (`index`, `id`, `type`, `function.name`) opens it, each later
/// piece (its `index` and more `function.arguments`, nothing else) extends its arguments.
pub fn joined_calls(pieces: &[Value]) -> Vec<Value> {
    let mut calls: Vec<Value> = Vec::new();
    for p in pieces {
        let i = p["index"].as_u64().expect("a piece names its call") as usize;
        if p.get("id").is_some() {
            assert_eq!(i, calls.len(), "calls open in index order: {p}");
            assert_eq!(p["type"], "function", "{p}");
            assert!(p["function"]["name"].is_string(), "{p}");
            calls.push(p.clone());
        } else {
            let only_arguments = p.get("type").is_none() && p["function"].get("name").is_none();
            assert!(only_arguments, "a later piece carries only arguments: {p}");
            let call = calls.get_mut(i).expect("a piece after its call's first");
            let more = p["function"]["arguments"].as_str().unwrap();
            let now = call["function"]["arguments"].as_str().unwrap().to_string() + more;
            call["function"]["arguments"] = json!(now);
        }
    }
    calls
}

/// One line of an OpenAI Batch API input file.
pub fn batch_line(custom_id: &str, url: &str, body: Value) -> String {
    json!({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).to_string()
}

/// The boundary of [`form`] bodies.
pub const BOUNDARY: &str = "dsv4-test-boundary";

/// A form field: name, filename (a file part), bytes.
pub type Field<'a> = (&'a str, Option<&'a str>, &'a [u8]);

/// A multipart/form-data body with `fields`.
pub fn form(fields: &[Field<'_>]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, filename, bytes) in fields {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        let disposition = match filename {
            Some(f) => format!("form-data; name=\"{name}\"; filename=\"{f}\""),
            None => format!("form-data; name=\"{name}\""),
        };
        body.extend_from_slice(format!("Content-Disposition: {disposition}\r\n\r\n").as_bytes());
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

/// POST a multipart upload to `/v1/files`.
pub async fn post_form(s: &TestServer, fields: &[Field<'_>]) -> Reply {
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    request(
        s.addr,
        "POST",
        "/v1/files",
        &[("Content-Type", &ct)],
        &form(fields),
    )
    .await
}

/// The value of the unlabelled metric `name` on `/metrics` (a gauge or a counter).
pub async fn metric(s: &TestServer, name: &str) -> u64 {
    let text = s.get("/metrics").await.body;
    let line = text
        .lines()
        .find(|l| l.split_once(' ').is_some_and(|(n, _)| n == name))
        .unwrap_or_else(|| panic!("{name} is not on /metrics:\n{text}"));
    line.split_once(' ').unwrap().1.parse::<f64>().unwrap() as u64
}

/// POST `body` to `path` in the background; its reply and when it arrived.
pub fn send_later(s: &TestServer, path: &'static str, body: Value) -> JoinHandle<(Reply, Instant)> {
    let addr = s.addr;
    tokio::spawn(async move {
        let r = request(addr, "POST", path, &[], body.to_string().as_bytes()).await;
        (r, Instant::now())
    })
}

//! [`ServerConfig`]: what the HTTP server is configured with, as plain values (the CLI maps the
//! profile's `[server]` section here, so this crate does not depend on how a profile spells it).

use crate::error::ServerError;
use std::time::Duration;

/// How completions are turned into assistant messages (`server.tool_call_parser` and
/// `server.reasoning_parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputParsing {
    /// The strict DSV4 parser: `reasoning_content`, content and DSML `tool_calls`.
    Dsv4,
    /// The DSV4 parser for tool calls, with the reasoning (and its `</think>`) left in the
    /// content.
    Dsv4ReasoningInContent,
    /// No parsing: the raw completion text is the content.
    Raw,
}

impl OutputParsing {
    /// From the two profile switches; the reasoning parser needs the tool-call parser (one DSV4
    /// parser does both).
    pub fn from_switches(tool_calls: bool, reasoning: bool) -> Result<Self, ServerError> {
        match (tool_calls, reasoning) {
            (true, true) => Ok(Self::Dsv4),
            (true, false) => Ok(Self::Dsv4ReasoningInContent),
            (false, false) => Ok(Self::Raw),
            (false, true) => Err(ServerError::Config {
                option: "server.reasoning_parser",
                message: "deepseek-v4 needs server.tool_call_parser = \"deepseek-v4\" too (one \
                          DSV4 parser splits reasoning and tool calls); set both to \"none\" \
                          for raw text"
                    .into(),
            }),
        }
    }
}

/// Compiled grammars kept for reuse unless the profile says otherwise (`server.grammar_cache`).
pub const DEFAULT_GRAMMAR_CACHE: usize = 64;

/// Everything the HTTP server is configured with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (`server.host`).
    pub host: String,
    /// TCP port (`server.port`); 0 picks a free port.
    pub port: u16,
    /// Bearer token clients must send to `/v1/*` (`server.api_key`); None accepts everyone.
    pub api_key: Option<String>,
    /// Largest accepted request body (`server.max_request_bytes`).
    pub max_request_bytes: usize,
    /// `/health` answers 503 when requests are pending and the step loop has not completed a
    /// step for this long (`server.health_stall_s`).
    pub health_stall: Duration,
    /// Most responses of `/v1/responses` kept for `previous_response_id` and `GET
    /// /v1/responses/{id}` (`server.responses_store`; 0 stores none).
    pub responses_store: usize,
    /// Most bytes those stored responses hold of their own (`server.responses_store_mib`).
    pub responses_store_bytes: usize,
    /// Where stored responses are also kept as files, to survive a restart
    /// (`server.responses_dir`); None: in memory only.
    pub responses_dir: Option<std::path::PathBuf>,
    /// Most bytes of files the Files and Batch APIs keep (`server.files_mib`); 0 turns both off.
    pub files_bytes: usize,
    /// Where the Files and Batch APIs keep files and batches, to survive a restart
    /// (`server.files_dir`); None: in memory only.
    pub files_dir: Option<std::path::PathBuf>,
    /// Most lines of `/v1/batches` batches in flight together (`server.batch_max_running`);
    /// 0, or more than the engine's `max_running_requests`: as many as that.
    pub batch_max_running: usize,
    /// How long no interactive request must have been in flight before batch lines may fill
    /// every running slot past `batch_max_running` (`server.batch_fill_idle_ms`); `None`: never.
    pub batch_fill_idle: Option<Duration>,
    /// What a request's `priority` field does (`server.request_priority`).
    pub request_priority: RequestPriority,
    /// Requests waiting for a running slot at which new generation requests are refused with a
    /// 503 (`scheduler.max_queued_requests`; batch lines still queue); 0: no limit.
    pub max_queued_requests: usize,
    /// The model id clients name in `model` and `/v1/models` lists.
    pub model_id: String,
    /// How completions are parsed.
    pub output: OutputParsing,
    /// The thinking budget of requests that give none (`server.thinking_token_budget`); None:
    /// the model ends its reasoning.
    pub thinking_token_budget: Option<u64>,
    /// The name of the dsv4 profile being served, reported in `GET /v1/models` (`dsv4.profile`).
    pub profile_name: Option<String>,
    /// SHA-256 of the resolved profile (every key and value), reported in `GET /v1/models`
    /// (`dsv4.profile_sha256`) so clients such as `dsv4 stress` can record which configuration
    /// answered.
    pub profile_sha256: Option<String>,
    /// Every setting of the resolved profile as nested JSON, secrets redacted, reported by
    /// `GET /get_server_info` (`dsv4.settings`).
    pub profile_settings: Option<serde_json::Value>,
    /// Where the weights come from (a checkpoint directory, or `tiny` for the embedded model),
    /// reported by `GET /get_model_info` and `GET /get_server_info` as `model_path`.
    pub model_path: String,
    /// HTTPS (`server.ssl_certfile`, `server.ssl_keyfile`, `server.ssl_ca_certs`); None
    /// serves plain HTTP.
    pub tls: Option<crate::tls::TlsFiles>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8000,
            api_key: None,
            max_request_bytes: 16 * 1024 * 1024,
            health_stall: Duration::from_secs(60),
            responses_store: 256,
            responses_store_bytes: 256 << 20,
            responses_dir: None,
            files_bytes: 1024 << 20,
            files_dir: None,
            batch_max_running: 0,
            batch_fill_idle: None,
            request_priority: RequestPriority::Use,
            max_queued_requests: 0,
            model_id: "dsv4-tiny".into(),
            output: OutputParsing::Dsv4,
            thinking_token_budget: None,
            profile_name: None,
            profile_sha256: None,
            profile_settings: None,
            model_path: "tiny".into(),
            tls: None,
        }
    }
}

/// What a request's `priority` field does (`server.request_priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestPriority {
    /// The request runs at the priority it asks for.
    Use,
    /// The field is ignored: requests run at the server's own priorities (0; batch lines
    /// [`crate::batch::LINE_PRIORITY`]).
    Ignore,
    /// A request that sets the field is refused (400 naming `priority`).
    Refuse,
}

//! [`StressOptions`]: what one `dsv4 stress` run does (server, workload shape, bounds, checks).

use crate::error::StressError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Whether turns are sent as streaming (SSE) or plain JSON requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamMode {
    /// Every turn streams.
    Always,
    /// No turn streams.
    Never,
    /// Each turn streams or not by the seeded workload (about half each).
    #[default]
    Mixed,
}

impl std::str::FromStr for StreamMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            "mixed" => Ok(Self::Mixed),
            _ => Err(format!(
                "unknown stream mode `{s}` (allowed: always, never, mixed)"
            )),
        }
    }
}

/// Which API the turns are sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `POST /v1/chat/completions`.
    #[default]
    Chat,
    /// `POST /v1/responses`: each turn sends the whole conversation as input items with
    /// `store: false` (as agents that keep their own history do), so a turn and its solo replay
    /// are the same request.
    Responses,
    /// `POST /v1/responses` with `background: true` (and `store: true`): a plain turn is polled
    /// with `GET /v1/responses/{id}` until it finished; a streamed turn drops its connection
    /// after a few tokens and resumes with `GET /v1/responses/{id}?stream=true&starting_after=N`.
    /// Each finished response is deleted.
    #[serde(rename = "responses-background")]
    ResponsesBackground,
}

impl Api {
    /// Whether turns go to `/v1/responses`.
    pub fn is_responses(self) -> bool {
        self != Self::Chat
    }
}

impl std::str::FromStr for Api {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "chat" => Ok(Self::Chat),
            "responses" => Ok(Self::Responses),
            "responses-background" => Ok(Self::ResponsesBackground),
            _ => Err(format!(
                "unknown api `{s}` (allowed: chat, responses, responses-background)"
            )),
        }
    }
}

/// A reference every turn is compared with after the concurrent run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Oracle {
    /// Replay every turn alone (one request at a time, same body) and require the same answer
    /// token for token; with [`StreamMode::Mixed`] also replay it in the other stream mode and
    /// require the same answer. Exact only for greedy decoding on a batch-invariant server.
    Solo,
}

impl std::str::FromStr for Oracle {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "solo" => Ok(Self::Solo),
            _ => Err(format!("unknown oracle `{s}` (allowed: solo)")),
        }
    }
}

/// Stop strings that end an answer before any special token or tool/think markup: for models with
/// random weights (dsv4's tiny model), whose free text is noise full of special tokens that would
/// otherwise be (correctly) reported as signatures. Needs a server that accepts more than four stop
/// strings (dsv4, vLLM, SGLang do; OpenAI itself allows four).
pub const STOP_BEFORE_MARKUP: [&str; 7] = [
    "<｜",
    "｜DSML｜",
    "</｜",
    "<think>",
    "</think>",
    "<tool_result>",
    "</tool_result>",
];

/// Everything a stress run needs. Build with `..Default::default()`; [`StressOptions::validate`]
/// checks the values ([`crate::run_stress`] calls it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StressOptions {
    /// Base URL of the server (`http://host:port`, with or without a trailing `/v1`).
    pub url: String,
    /// The `model` sent with every request; None: the first id `GET /v1/models` lists.
    pub model: Option<String>,
    /// Number of sessions (conversations).
    pub sessions: usize,
    /// Sessions run at the same time.
    pub concurrency: usize,
    /// Turns (requests) per session, at most; a session ends earlier when its prompt would not
    /// fit the model's context or the time bound passes.
    pub turns: usize,
    /// Seed of the workload: the same seed gives the same sessions, prompts, tools, tool choices
    /// and stream flags.
    pub seed: u64,
    /// Wall-clock bound: after it no new turn starts (sessions in flight finish their turn).
    pub duration: Option<Duration>,
    /// `max_tokens` of every request.
    pub max_tokens: u32,
    /// Streaming, non-streaming or mixed.
    pub stream: StreamMode,
    /// The reference answers are compared with, if any.
    pub oracle: Option<Oracle>,
    /// Sent as `Authorization: Bearer KEY`. Never written into reports.
    #[serde(skip_serializing, default)]
    pub api_key: Option<String>,
    /// PEM CA certificates trusted for an `https://` server besides the bundled web roots
    /// (a server with a private CA, e.g. `dsv4 serve` with `server.ssl_certfile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Show a progress bar on stderr (only when stderr is a terminal).
    pub progress: bool,
    /// `temperature` of every request (0: greedy, which the solo oracle needs).
    pub temperature: f64,
    /// Share of turns (0..=1) whose `tool_choice` forces a tool call ("required" or a named tool);
    /// the rest use "auto".
    pub forced_tool_rate: f64,
    /// Stop strings sent with every request whose `tool_choice` is "auto" (see
    /// [`STOP_BEFORE_MARKUP`]); forced turns get none, so a stop string never cuts a forced call.
    pub stop: Vec<String>,
    /// `repeated_token` fires when one unit of text (1..=16 characters) repeats back to back
    /// more than this many times.
    pub repeat_threshold: usize,
    /// Approximate characters of new user text per turn (prompts grow by this much plus the
    /// tool results and the answers).
    pub growth_chars: usize,
    /// Per-request timeout.
    pub request_timeout: Duration,
    /// How long to wait for the server's `GET /health` to answer 200 before the run (a server
    /// still loading its model answers 503); zero does not wait.
    #[serde(default)]
    pub ready_timeout: Duration,
    /// `parallel_tool_calls` of every request (off by default: one call per forced turn keeps
    /// the answer length bounded).
    pub parallel_tool_calls: bool,
    /// Ask for every token's log-probability (`logprobs: true`); the solo oracle then also
    /// requires them to be identical, which catches numerical corruption that flips no token.
    #[serde(default)]
    pub logprobs: bool,
    /// The API every turn is sent to.
    #[serde(default)]
    pub api: Api,
    /// Declare every tool `"strict": true`, so that a server honouring it (dsv4 does)
    /// constrains "auto" turns too: content, then optionally calls under the tools' schemas.
    #[serde(default)]
    pub strict_tools: bool,
}

impl Default for StressOptions {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:8000".into(),
            model: None,
            sessions: 16,
            concurrency: 8,
            turns: 4,
            seed: 0,
            duration: None,
            max_tokens: 32,
            stream: StreamMode::Mixed,
            oracle: None,
            api_key: None,
            ca_cert: None,
            progress: false,
            temperature: 0.0,
            forced_tool_rate: 0.5,
            stop: Vec::new(),
            repeat_threshold: 48,
            growth_chars: 400,
            request_timeout: Duration::from_secs(300),
            ready_timeout: Duration::from_secs(600),
            logprobs: false,
            parallel_tool_calls: false,
            api: Api::Chat,
            strict_tools: false,
        }
    }
}

impl StressOptions {
    /// Check the values; the error names the option and what is allowed.
    pub fn validate(&self) -> Result<(), StressError> {
        let bad =
            |option: &'static str, message: String| Err(StressError::Options { option, message });
        if self.sessions == 0 {
            return bad("sessions", "must be at least 1".into());
        }
        if self.concurrency == 0 {
            return bad("concurrency", "must be at least 1".into());
        }
        if self.turns == 0 {
            return bad("turns", "must be at least 1".into());
        }
        if self.max_tokens == 0 {
            return bad("max-tokens", "must be at least 1".into());
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return bad(
                "temperature",
                format!("{} is outside 0..=2", self.temperature),
            );
        }
        if !(0.0..=1.0).contains(&self.forced_tool_rate) {
            return bad(
                "forced-tool-rate",
                format!("{} is outside 0..=1", self.forced_tool_rate),
            );
        }
        if self.repeat_threshold < 2 {
            return bad("repeat-threshold", "must be at least 2".into());
        }
        if self.oracle == Some(Oracle::Solo) && self.temperature != 0.0 {
            return bad(
                "oracle",
                "the solo oracle compares answers exactly, which needs greedy decoding \
                 (temperature 0)"
                    .into(),
            );
        }
        if self.request_timeout.is_zero() {
            return bad("request-timeout", "must be positive".into());
        }
        crate::client::base_url(&self.url)?;
        // A bad --ca-cert file is refused here, before anything runs.
        let _checked = crate::client::http_builder(self.ca_cert.as_deref())?;
        Ok(())
    }
}

/// Parse a duration such as `90`, `90s`, `1500ms`, `5m` or `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 90s, 1500ms, 5m, 1h)"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{s}` (allowed: ms, s, m, h)"
            ));
        }
    };
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("`{s}` must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_garbage() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_duration("1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("5d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("0").is_err());
    }

    #[test]
    fn validation_names_the_bad_option() {
        let ok = StressOptions::default();
        ok.validate().unwrap();
        let e = StressOptions {
            sessions: 0,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("--sessions"), "{e}");
        let e = StressOptions {
            oracle: Some(Oracle::Solo),
            temperature: 0.7,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("greedy"), "{e}");
        let e = StressOptions {
            url: "ftp://x".into(),
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("http"), "{e}");
        let tls = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../dsv4-server/tests/fixtures/tls"
        );
        let with_ca = |file: &str| StressOptions {
            ca_cert: Some(format!("{tls}/{file}").into()),
            ..Default::default()
        };
        with_ca("ca.pem").validate().unwrap();
        for (file, says) in [
            ("gone.pem", "No such file"),
            ("server.key", "no PEM certificate"),
        ] {
            let e = with_ca(file).validate().unwrap_err().to_string();
            assert!(e.contains("--ca-cert") && e.contains(file), "{e}");
            assert!(e.contains(says), "{file}: {e}");
        }
    }

    #[test]
    fn the_api_key_is_never_serialised() {
        let o = StressOptions {
            api_key: Some("sk-secret".into()),
            ..Default::default()
        };
        let text = serde_json::to_string(&o).unwrap();
        assert!(
            !text.contains("sk-secret") && !text.contains("api_key"),
            "{text}"
        );
        let back: StressOptions = serde_json::from_str(&text).unwrap();
        assert_eq!(back.api_key, None);
    }

    #[test]
    fn modes_parse() {
        assert_eq!("mixed".parse::<StreamMode>().unwrap(), StreamMode::Mixed);
        assert!("sometimes".parse::<StreamMode>().is_err());
        assert_eq!("solo".parse::<Oracle>().unwrap(), Oracle::Solo);
    }
}

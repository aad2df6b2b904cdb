//! [`StressReport`] and its parts: per-turn and per-session records, the server's identity, the
//! summary printed for people, and the JSON / JSONL files written for the ledger.

use crate::answer::ToolCall;
use crate::error::StressError;
use crate::metrics::Metrics;
use crate::options::StressOptions;
use crate::signatures::{Finding, Signature};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Who answered: what `GET /v1/models` said, and dsv4's profile when the server is dsv4.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerIdentity {
    /// The base URL the run used.
    pub url: String,
    /// The model id sent with every request.
    pub model: String,
    /// The `GET /v1/models` answer as received.
    pub models: serde_json::Value,
    /// The model's context length (`max_model_len` in the model object), when given.
    pub max_model_len: Option<u64>,
    /// dsv4's resolved profile name (`dsv4.profile` in the model object), when the server is dsv4.
    pub dsv4_profile: Option<String>,
    /// SHA-256 of dsv4's resolved profile (`dsv4.profile_sha256`), when the server is dsv4.
    pub dsv4_profile_sha256: Option<String>,
}

/// One request of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// 0-based turn index.
    pub turn: usize,
    /// Whether the request streamed.
    pub stream: bool,
    /// `tool_choice` sent: `auto`, `required` or `named:TOOL`.
    pub tool_choice: String,
    /// Messages in the request (input items with `--api responses`).
    pub messages: usize,
    /// SHA-256 of the request body (the solo replay sends the same body).
    pub request_sha256: String,
    /// Whether the request produced an answer.
    pub ok: bool,
    /// HTTP status of a failed request, when one came.
    pub status: Option<u16>,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// The answer's `finish_reason`.
    pub finish_reason: Option<String>,
    /// The answer's content.
    pub content: String,
    /// The answer's tool calls.
    pub tool_calls: Vec<ToolCall>,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens` (or the number of chunks without usage).
    pub completion_tokens: Option<u64>,
    /// Token log-probabilities received (with `--logprobs`; one per generated token from a
    /// server that returns them).
    #[serde(default)]
    pub logprobs: usize,
    /// Times the stream was dropped and resumed by sequence number (`--api
    /// responses-background`).
    #[serde(default)]
    pub resumed: usize,
    /// Time to the first token in ms (streamed only).
    pub ttft_ms: Option<f64>,
    /// End-to-end latency in ms.
    pub e2el_ms: f64,
    /// Signatures found in this turn.
    pub findings: Vec<Finding>,
}

/// One session (conversation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// 0-based session index.
    pub session: usize,
    /// The session's own seed (derived from the run's seed and the index).
    pub seed: u64,
    /// Whether any signature was found.
    pub failed: bool,
    /// Count per signature in this session (only those found).
    pub signatures: BTreeMap<String, usize>,
    /// The tools the session declared.
    pub tools: Vec<String>,
    /// Why the session stopped: `turns` (all done), `context` (the next prompt would not fit),
    /// `deadline` (the time bound passed), `error` (a request failed).
    pub ended: String,
    /// Its turns in order.
    pub turns: Vec<TurnRecord>,
}

/// Everything one stress run found. Serialised with the [`Metrics`] keys flat at the top level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StressReport {
    /// Sessions run.
    pub sessions: usize,
    /// Sessions with at least one signature.
    pub failed_sessions: usize,
    /// Requests that produced an answer (vLLM's `completed`).
    pub completed: usize,
    /// Requests that produced no answer (vLLM's `failed`).
    pub failed: usize,
    /// Occurrences per signature over all turns (every signature listed, zeros included).
    pub signatures: BTreeMap<String, usize>,
    /// Sessions showing each signature (every signature listed).
    pub signature_sessions: BTreeMap<String, usize>,
    /// The vLLM-named metrics.
    #[serde(flatten)]
    pub metrics: Metrics,
    /// Who answered.
    pub server: ServerIdentity,
    /// The options of the run (the workload is reproducible from them).
    pub options: StressOptions,
    /// Whether the solo replay ran, and how many requests it sent.
    pub oracle_requests: usize,
    /// Per-session records.
    pub records: Vec<SessionRecord>,
}

/// Every signature name with a count of 0.
pub fn zero_counts() -> BTreeMap<String, usize> {
    Signature::ALL
        .iter()
        .map(|s| (s.name().to_owned(), 0))
        .collect()
}

impl StressReport {
    /// Share of sessions that failed (0 with no sessions).
    pub fn failure_rate(&self) -> f64 {
        if self.sessions == 0 {
            0.0
        } else {
            self.failed_sessions as f64 / self.sessions as f64
        }
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }

    /// Write the report as JSON to `path`.
    pub fn write_json(&self, path: &Path) -> Result<(), StressError> {
        write(path, self.to_json() + "\n")
    }

    /// Write one JSON line per session to `path`.
    pub fn write_jsonl(&self, path: &Path) -> Result<(), StressError> {
        let mut s = String::new();
        for r in &self.records {
            s.push_str(&serde_json::to_string(r).expect("a record always serialises"));
            s.push('\n');
        }
        write(path, s)
    }

    /// The summary printed for people.
    pub fn summary(&self) -> String {
        let m = &self.metrics;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "server:            {} (model {})",
            self.server.url, self.server.model
        );
        if let Some(h) = &self.server.dsv4_profile_sha256 {
            let name = self.server.dsv4_profile.as_deref().unwrap_or("?");
            let _ = writeln!(s, "dsv4 profile:      {name} sha256 {h}");
        }
        let _ = writeln!(
            s,
            "sessions:          {} ({} failed, {:.1}%)",
            self.sessions,
            self.failed_sessions,
            100.0 * self.failure_rate()
        );
        let _ = writeln!(
            s,
            "requests:          {} completed, {} failed",
            self.completed, self.failed
        );
        if self.oracle_requests > 0 {
            let _ = writeln!(s, "solo replay:       {} requests", self.oracle_requests);
        }
        let _ = writeln!(s, "duration:          {:.2} s", m.duration);
        let _ = writeln!(
            s,
            "tokens:            {} in, {} out ({:.1} out tok/s, {:.2} req/s)",
            m.total_input_tokens, m.total_output_tokens, m.output_throughput, m.request_throughput
        );
        for (name, mean, median, p99) in [
            ("TTFT", m.mean_ttft_ms, m.median_ttft_ms, m.p99_ttft_ms),
            ("TPOT", m.mean_tpot_ms, m.median_tpot_ms, m.p99_tpot_ms),
            ("ITL", m.mean_itl_ms, m.median_itl_ms, m.p99_itl_ms),
            ("E2EL", m.mean_e2el_ms, m.median_e2el_ms, m.p99_e2el_ms),
        ] {
            let _ = writeln!(
                s,
                "{name:<5} ms:          mean {mean:.2}, median {median:.2}, p99 {p99:.2}"
            );
        }
        let found: Vec<_> = self.signatures.iter().filter(|(_, n)| **n > 0).collect();
        if found.is_empty() {
            let _ = writeln!(s, "signatures:        none");
        } else {
            let _ = writeln!(s, "signatures (turns / sessions):");
            for (name, n) in found {
                let sessions = self.signature_sessions.get(name).copied().unwrap_or(0);
                let _ = writeln!(s, "  {name:<24} {n} / {sessions}");
            }
            if let Some((r, t, f)) = self.first_finding() {
                let _ = writeln!(
                    s,
                    "first: session {r} turn {t}: {} ({})",
                    f.signature.name(),
                    f.detail
                );
            }
        }
        s
    }

    /// The first finding in session order: (session, turn, finding).
    pub fn first_finding(&self) -> Option<(usize, usize, &Finding)> {
        self.records.iter().find_map(|r| {
            r.turns
                .iter()
                .find_map(|t| t.findings.first().map(|f| (r.session, t.turn, f)))
        })
    }
}

fn write(path: &Path, text: String) -> Result<(), StressError> {
    std::fs::write(path, text).map_err(|source| StressError::Io {
        path: path.display().to_string(),
        source,
    })
}

//! The sections of subsystems that later issues build (cache pools, scheduler, HTTP server, debug
//! checks, disaggregation). They are validated configuration today; an engine that does not implement
//! one of these settings yet must reject it with "not supported by backend X yet", never ignore it.

use crate::values::{
    AutoOrCount, CanaryPool, DisaggMode, Fault, ReasoningParser, RequestPriority, SchedulePolicy,
    ToolCallParser,
};
use serde::{Deserialize, Serialize};

/// `[cache]`: KV cache pages, the prefix cache and the host tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSection {
    /// Tokens per KV cache page (a power of two).
    pub page_size: u64,
    /// Finished requests leave their KV pages in a prefix cache that later requests reuse.
    pub prefix_cache: bool,
    /// Pages evicted from the device pool move to a host-memory tier instead of being dropped.
    pub hicache: bool,
    /// Size of the host tier as a multiple of the device pool (must exceed 1 when `hicache` is on).
    pub hicache_ratio: f64,
    /// Capacity of the device KV pool in tokens; 0 sizes it from free memory.
    pub max_total_tokens: u64,
}

impl Default for CacheSection {
    fn default() -> Self {
        CacheSection {
            page_size: 64,
            prefix_cache: true,
            hicache: false,
            hicache_ratio: 2.0,
            max_total_tokens: 0,
        }
    }
}

/// `[scheduler]`: how many requests run at once and how prompts are chunked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSection {
    /// Most requests in one running batch; 0 lets the engine derive it from the pool size.
    pub max_running_requests: u64,
    /// Prompt tokens prefilled per step for one request; 0 lets the engine choose.
    pub chunked_prefill_size: u64,
    /// Order in which waiting requests are admitted.
    pub schedule_policy: SchedulePolicy,
    /// Hold back a waiting request while a running one prefills prompt pages both share, so
    /// it reuses that request's prefix snapshots (needs the prefix cache).
    pub in_batch_prefix_caching: bool,
    /// Preempt a running request to admit a waiting one of a priority higher by more than
    /// `priority_preemption_threshold` when every running slot is taken.
    pub priority_preemption: bool,
    /// How much higher a waiting request's priority must be (strictly more) to preempt.
    pub priority_preemption_threshold: u64,
    /// Requests waiting for a running slot past which the server refuses new ones (503); 0:
    /// no limit.
    pub max_queued_requests: u64,
}

impl Default for SchedulerSection {
    fn default() -> Self {
        SchedulerSection {
            max_running_requests: 0,
            chunked_prefill_size: 0,
            schedule_policy: SchedulePolicy::default(),
            in_batch_prefix_caching: true,
            priority_preemption: false,
            priority_preemption_threshold: 10,
            max_queued_requests: 0,
        }
    }
}

/// `[server]`: the OpenAI-compatible HTTP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Address to listen on.
    pub host: String,
    /// TCP port to listen on.
    pub port: u16,
    /// Bearer token clients must send; `None` accepts every client.
    #[serde(default)]
    pub api_key: Option<String>,
    /// How tool calls are parsed out of generated text.
    pub tool_call_parser: ToolCallParser,
    /// How reasoning is split from the answer.
    pub reasoning_parser: ReasoningParser,
    /// The thinking budget of requests that give none (tokens); auto: none, the model ends
    /// its reasoning.
    pub thinking_token_budget: AutoOrCount,
    /// Largest accepted request body in bytes.
    pub max_request_bytes: u64,
    /// `/health` answers 503 when requests are pending and no engine step completed for this
    /// many seconds.
    pub health_stall_s: u64,
    /// Most `/v1/responses` answers kept in memory for `previous_response_id`; 0 stores none.
    pub responses_store: u64,
    /// Most MiB those stored responses hold of their own.
    pub responses_store_mib: u64,
    /// A directory where the stored responses are also kept as files, so they survive a
    /// restart; None: in memory only.
    pub responses_dir: Option<String>,
    /// Compiled constrained-decoding grammars kept for reuse; 0 keeps none.
    pub grammar_cache: u64,
    /// Most MiB of uploaded and batch output files kept in memory (`/v1/files`,
    /// `/v1/batches`); 0 turns the Files and Batch APIs off.
    pub files_mib: u64,
    /// A directory where those files and the batches are kept, so they survive a restart;
    /// None: in memory only.
    pub files_dir: Option<String>,
    /// Most lines of `/v1/batches` batches in flight together; 0: as many as
    /// `scheduler.max_running_requests`.
    pub batch_max_running: u64,
    /// Milliseconds without an interactive request after which batch lines may fill every
    /// running slot past `batch_max_running`; 0: never.
    pub batch_fill_idle_ms: u64,
    /// What a request's `priority` field does: used, ignored or refused.
    pub request_priority: RequestPriority,
    /// A PEM certificate chain: with `ssl_keyfile`, the server answers HTTPS only.
    pub ssl_certfile: Option<String>,
    /// The PEM private key of `ssl_certfile`.
    pub ssl_keyfile: Option<String>,
    /// PEM CA certificates: when set, every client must present a certificate one of them
    /// signed (mutual TLS).
    pub ssl_ca_certs: Option<String>,
    /// Seconds between checks of the TLS files for changes (a renewed certificate is served to
    /// new connections without a restart); 0 never re-reads them.
    pub ssl_refresh_s: u64,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            host: "127.0.0.1".to_string(),
            port: 8000,
            api_key: None,
            tool_call_parser: ToolCallParser::default(),
            reasoning_parser: ReasoningParser::default(),
            thinking_token_budget: AutoOrCount::Auto,
            max_request_bytes: 16 * 1024 * 1024,
            health_stall_s: 60,
            responses_store: 256,
            responses_store_mib: 256,
            responses_dir: None,
            grammar_cache: 64,
            files_mib: 1024,
            files_dir: None,
            batch_max_running: 0,
            batch_fill_idle_ms: 0,
            request_priority: RequestPriority::default(),
            ssl_certfile: None,
            ssl_keyfile: None,
            ssl_ca_certs: None,
            ssl_refresh_s: 0,
        }
    }
}

impl ServerSection {
    /// Whether `host` only accepts connections from this machine.
    pub fn is_loopback(&self) -> bool {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

/// `[debug]`: run-time checks and deliberate faults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DebugSection {
    /// Pools whose page checksums are compared, around each step, with the step's declared write
    /// set (empty: no canary).
    pub canary: Vec<CanaryPool>,
    /// Fail the step's requests when the canary finds a page changed outside the write set.
    pub canary_abort: bool,
    /// Faults to inject (each rehearses one incident class; results are wrong on purpose).
    pub inject: Vec<Fault>,
}

/// `[disagg]`: prefill/decode disaggregation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DisaggSection {
    /// This server's role.
    pub mode: DisaggMode,
    /// `host:port` of the prefill server's bootstrap endpoint (where KV transfers are arranged).
    #[serde(default)]
    pub bootstrap: Option<String>,
}

impl DisaggSection {
    /// The port of `bootstrap`, when it is a valid `host:port` (port 1–65535, host non-empty).
    pub fn bootstrap_port(&self) -> Option<u16> {
        parse_host_port(self.bootstrap.as_deref()?).map(|(_, port)| port)
    }
}

/// Split `host:port` (IPv6 hosts in brackets), requiring a non-empty host and a port in 1–65535.
pub fn parse_host_port(text: &str) -> Option<(&str, u16)> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let ok = !bare.is_empty() && (!bare.contains(':') || host.starts_with('['));
    ok.then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_parsing() {
        assert_eq!(parse_host_port("10.0.0.2:8998"), Some(("10.0.0.2", 8998)));
        assert_eq!(parse_host_port("[::1]:8998"), Some(("[::1]", 8998)));
        assert_eq!(parse_host_port("::1:8998"), None);
        assert_eq!(parse_host_port("host"), None);
        assert_eq!(parse_host_port(":80"), None);
        assert_eq!(parse_host_port("h:0"), None);
        assert_eq!(parse_host_port("h:70000"), None);
    }

    #[test]
    fn loopback_hosts() {
        let mut s = ServerSection::default();
        assert!(s.is_loopback());
        for (host, lo) in [
            ("localhost", true),
            ("::1", true),
            ("[::1]", true),
            ("0.0.0.0", false),
            ("example.org", false),
        ] {
            s.host = host.to_string();
            assert_eq!(s.is_loopback(), lo, "{host}");
        }
    }
}

//! SGLang's load endpoints, which routers, gateways and autoscalers poll: `GET /get_load`, the
//! older one sglang-router 0.3 balances on, and `GET /v1/loads`, SGLang's supported one, with
//! optional sections and a Prometheus text format. Shapes follow SGLang's `GetLoadReqOutput`,
//! `GetLoadsReqOutput` and `v1_loads.py` (github.com/sgl-project/sglang,
//! python/sglang/srt/managers/io_struct.py and python/sglang/srt/entrypoints/v1_loads.py).
//! dsv4 runs one data-parallel rank, 0. Sections it has nothing true to put in (`memory`,
//! `spec`, `lora`) are left out, as SGLang leaves out a section that does not apply.

use super::page::query_pairs;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use dsv4_engine::EngineMetrics;
use serde_json::{Map, Value, json};
use std::fmt::Write as _;

/// The sections `include` may name (SGLang's `GetLoadsReqInput.VALID_SECTIONS`).
const SECTIONS: &[&str] = &["core", "memory", "spec", "lora", "disagg", "queues", "all"];

/// One entry per data-parallel rank (dsv4 runs one): requests running and waiting, and
/// `num_tokens`, the tokens the running requests hold plus those the waiting ones will
/// prefill; `num_pending_tokens` is the waiting ones' part, as SGLang's compatibility shim
/// for this route states it. SGLang's router sums `num_tokens` for its load-aware policies and
/// `num_waiting_reqs` for queue-aware ones.
fn load_entries(m: &EngineMetrics) -> Value {
    json!([{
        "dp_rank": 0,
        "num_reqs": m.running_requests + m.queued_requests,
        "num_waiting_reqs": m.queued_requests,
        "num_tokens": m.running_tokens + m.queued_tokens,
        "num_pending_tokens": m.queued_tokens,
    }])
}

/// The 503 while the model loads.
fn loading() -> Response {
    let body = json!({"status": "loading", "message": "the model is loading"});
    (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
}

/// `GET /get_load`: 503 while the model loads.
pub async fn get_load(State(state): State<AppState>) -> Response {
    match state.loaded() {
        Some(l) => axum::Json(load_entries(&l.engine.metrics())).into_response(),
        None => loading(),
    }
}

/// What a `/v1/loads` request asks for.
#[derive(Debug, Clone, PartialEq)]
struct LoadsQuery {
    /// Sections beside the core fields.
    disagg: bool,
    queues: bool,
    /// Prometheus text instead of JSON.
    prometheus: bool,
}

impl LoadsQuery {
    /// Read `include` (comma-separated sections, default all), `dp_rank` (0, the one rank) and
    /// `format` (`json`, the default, or `prometheus`); anything else is a 400 naming it.
    fn parse(uri: &Uri) -> Result<Self, ApiError> {
        let mut include: Option<Vec<String>> = None;
        let mut prometheus = false;
        for (key, value) in query_pairs(uri)? {
            match key.as_str() {
                "include" => {
                    let names: Vec<String> =
                        value.split(',').map(|s| s.trim().to_string()).collect();
                    if let Some(bad) = names.iter().find(|n| !SECTIONS.contains(&n.as_str())) {
                        return Err(ApiError::bad_param(
                            "include",
                            format!(
                                "unknown section {bad:?}; use a comma-separated list of {}",
                                SECTIONS.join(", ")
                            ),
                        ));
                    }
                    include = Some(names);
                }
                "dp_rank" => {
                    if value != "0" {
                        return Err(ApiError::bad_param(
                            "dp_rank",
                            format!(
                                "dp_rank {value:?} does not exist: this server runs one rank, 0"
                            ),
                        ));
                    }
                }
                "format" => {
                    prometheus = match value.as_str() {
                        "json" => false,
                        "prometheus" => true,
                        other => {
                            return Err(ApiError::bad_param(
                                "format",
                                format!("format must be json or prometheus, not {other:?}"),
                            ));
                        }
                    };
                }
                other => {
                    return Err(ApiError::bad_param(
                        other,
                        format!(
                            "unknown query parameter {other:?}; use include, dp_rank and format"
                        ),
                    ));
                }
            }
        }
        let wants = |section: &str| {
            include
                .as_ref()
                .is_none_or(|i| i.iter().any(|n| n == section || n == "all"))
        };
        Ok(Self {
            disagg: wants("disagg"),
            queues: wants("queues"),
            prometheus,
        })
    }
}

/// What one rank's load is computed from: the engine's metrics and what the server knows.
#[derive(Debug, Clone, Default)]
struct LoadInputs {
    metrics: EngineMetrics,
    /// The cache's token budget (None when the pools were sized by explicit page counts).
    max_total_tokens: Option<usize>,
    max_running: usize,
    grammar_waiting: usize,
}

/// `x` rounded to `places` decimals, as SGLang rounds these fields.
fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

impl LoadInputs {
    /// The used share of the cache: the running requests' tokens over the token budget, or
    /// without a budget the fullest pool's used pages.
    fn token_usage(&self) -> f64 {
        let m = &self.metrics;
        match self.max_total_tokens {
            Some(max) if max > 0 => m.running_tokens as f64 / max as f64,
            _ => m
                .pools
                .iter()
                .map(|p| p.used_pages as f64 / p.total_pages.max(1) as f64)
                .fold(0.0, f64::max),
        }
    }

    /// One rank's entry of `/v1/loads`: the core fields, then the sections asked for.
    fn entry(&self, q: &LoadsQuery) -> Map<String, Value> {
        let m = &self.metrics;
        let usage = self.token_usage();
        let slots = m.running_requests as f64 / self.max_running.max(1) as f64;
        let mut e = Map::new();
        let mut put = |k: &str, v: Value| {
            e.insert(k.to_string(), v);
        };
        put("dp_rank", json!(0));
        put("num_running_reqs", json!(m.running_requests));
        put("num_waiting_reqs", json!(m.queued_requests));
        put("num_used_tokens", json!(m.running_tokens));
        put(
            "num_total_tokens",
            json!(m.running_tokens + m.queued_tokens),
        );
        if let Some(max) = self.max_total_tokens {
            put("max_total_num_tokens", json!(max));
        }
        put("token_usage", json!(round(usage, 4)));
        put("gen_throughput", json!(round(m.generated_tokens_per_s, 2)));
        put("cache_hit_rate", json!(round(m.prefix_hit_rate, 4)));
        put("utilization", json!(round(usage.max(slots), 4)));
        put("max_running_requests", json!(self.max_running));
        put(
            "num_total_reqs",
            json!(m.running_requests + m.queued_requests),
        );
        if q.disagg {
            put(
                "disaggregation",
                json!({
                    "mode": "null",
                    "prefill_prealloc_queue_reqs": 0,
                    "prefill_inflight_queue_reqs": 0,
                    "decode_prealloc_queue_reqs": 0,
                    "decode_transfer_queue_reqs": 0,
                    "decode_retracted_queue_reqs": 0,
                    "kv_transfer_speed_gb_s": 0.0,
                    "kv_transfer_latency_ms": 0.0,
                }),
            );
        }
        if q.queues {
            put(
                "queues",
                json!({
                    "waiting": m.queued_requests,
                    "grammar": self.grammar_waiting,
                    // dsv4 never pauses requests to update weights.
                    "paused": 0,
                    "retracted": m.preempted_waiting,
                }),
            );
        }
        e
    }
}

/// The aggregate over ranks, as SGLang computes it.
fn aggregate(loads: &[Map<String, Value>]) -> Value {
    let sum = |k: &str| -> f64 { loads.iter().filter_map(|l| l[k].as_f64()).sum() };
    let n = loads.len().max(1) as f64;
    let (running, waiting) = (sum("num_running_reqs"), sum("num_waiting_reqs"));
    json!({
        "total_running_reqs": running as u64,
        "total_waiting_reqs": waiting as u64,
        "total_reqs": (running + waiting) as u64,
        "avg_token_usage": round(sum("token_usage") / n, 4),
        "avg_throughput": round(sum("gen_throughput") / n, 2),
        "avg_utilization": round(sum("utilization") / n, 4),
    })
}

/// Metric fields and their descriptions (SGLang's).
type Described = &'static [(&'static str, &'static str)];

/// The core fields in Prometheus text, with SGLang's descriptions.
const CORE_METRICS: Described = &[
    ("num_running_reqs", "Number of running requests"),
    ("num_waiting_reqs", "Number of waiting requests"),
    ("num_used_tokens", "Number of tokens in use"),
    (
        "num_total_tokens",
        "Used tokens plus pending prefill tokens",
    ),
    ("max_total_num_tokens", "Maximum token capacity"),
    ("token_usage", "Token pool usage ratio"),
    ("gen_throughput", "Generation throughput tokens/sec"),
    ("cache_hit_rate", "Prefix cache hit rate"),
    ("utilization", "Overall utilization ratio"),
    ("max_running_requests", "Maximum running requests capacity"),
];

/// The sections in Prometheus text: (entry key, metric prefix, [(field, description)]).
const SECTION_METRICS: &[(&str, &str, Described)] = &[
    (
        "disaggregation",
        "disagg",
        &[
            ("prefill_prealloc_queue_reqs", "Prefill prealloc queue size"),
            ("prefill_inflight_queue_reqs", "Prefill inflight queue size"),
            ("decode_prealloc_queue_reqs", "Decode prealloc queue size"),
            ("decode_transfer_queue_reqs", "Decode transfer queue size"),
            ("decode_retracted_queue_reqs", "Decode retracted queue size"),
            ("kv_transfer_speed_gb_s", "KV transfer speed in GB/s"),
            ("kv_transfer_latency_ms", "KV transfer latency in ms"),
        ],
    ),
    (
        "queues",
        "queues",
        &[
            ("waiting", "Main waiting queue size"),
            ("grammar", "Grammar compilation queue size"),
            ("paused", "Requests paused by weight sync"),
            ("retracted", "Retracted requests count"),
        ],
    ),
];

/// The entries as Prometheus text under SGLang's names (`sglang_num_running_reqs{dp_rank="0"}`),
/// so tools written for SGLang's format read dsv4's.
fn prometheus(loads: &[Map<String, Value>]) -> String {
    let mut out = String::new();
    let mut gauge = |name: String, help: &str, values: Vec<(&Value, &Value)>| {
        if values.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (rank, v) in values {
            let _ = writeln!(out, "{name}{{dp_rank=\"{rank}\"}} {v}");
        }
    };
    for (field, help) in CORE_METRICS {
        let values = loads
            .iter()
            .filter_map(|l| Some((&l["dp_rank"], l.get(*field)?)))
            .collect();
        gauge(format!("sglang_{field}"), help, values);
    }
    for (key, prefix, fields) in SECTION_METRICS {
        for (field, help) in *fields {
            let values = loads
                .iter()
                .filter_map(|l| Some((&l["dp_rank"], l.get(*key)?.get(*field)?)))
                .collect();
            gauge(format!("sglang_{prefix}_{field}"), help, values);
        }
    }
    out
}

/// `GET /v1/loads`: every rank's load (dsv4's one) with the sections `include` names, as JSON
/// (`timestamp`, `version`, `dp_rank_count`, `loads`, `aggregate`) or with
/// `format=prometheus` as Prometheus text; 503 while the model loads.
pub async fn v1_loads(State(state): State<AppState>, uri: Uri) -> Result<Response, ApiError> {
    let q = LoadsQuery::parse(&uri)?;
    let Some(loaded) = state.loaded() else {
        return Ok(loading());
    };
    let inputs = LoadInputs {
        metrics: loaded.engine.metrics(),
        max_total_tokens: loaded.engine.pool_report().max_total_tokens,
        max_running: loaded.max_running,
        grammar_waiting: state.stats().grammar_waiting(),
    };
    let loads = vec![inputs.entry(&q)];
    if q.prometheus {
        let text = prometheus(&loads);
        return Ok((
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response());
    }
    Ok(axum::Json(json!({
        "timestamp": dsv4_core::time::rfc3339(dsv4_core::time::now_unix()),
        "version": env!("CARGO_PKG_VERSION"),
        "dp_rank_count": loads.len(),
        "aggregate": aggregate(&loads),
        "loads": loads,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_engine::PoolUsage;

    fn uri(q: &str) -> Uri {
        format!("/v1/loads?{q}").parse().unwrap()
    }

    fn busy() -> LoadInputs {
        LoadInputs {
            metrics: EngineMetrics {
                running_requests: 3,
                queued_requests: 2,
                running_tokens: 300,
                queued_tokens: 45,
                preempted_waiting: 1,
                generated_tokens_per_s: 123.456,
                prefix_hit_rate: 0.25,
                pools: vec![PoolUsage {
                    pool: "c4_kv",
                    used_pages: 3,
                    total_pages: 4,
                    used_bytes: 0,
                }],
                ..Default::default()
            },
            max_total_tokens: Some(1000),
            max_running: 4,
            grammar_waiting: 2,
        }
    }

    #[test]
    fn the_load_counts_running_and_waiting_requests_and_their_tokens() {
        assert_eq!(
            load_entries(&busy().metrics),
            json!([{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 345,
                    "num_pending_tokens": 45}])
        );
    }

    #[test]
    fn a_rank_entry_has_the_core_fields_and_the_sections_asked_for() {
        let all = LoadsQuery::parse(&uri("")).unwrap();
        let e = Value::Object(busy().entry(&all));
        assert_eq!(e["num_running_reqs"], 3);
        assert_eq!(e["num_waiting_reqs"], 2);
        assert_eq!(e["num_total_reqs"], 5);
        assert_eq!(e["num_used_tokens"], 300);
        assert_eq!(e["num_total_tokens"], 345);
        assert_eq!(e["max_total_num_tokens"], 1000);
        assert_eq!(e["token_usage"], 0.3);
        // Three of four slots busy outweighs a third of the cache.
        assert_eq!(e["utilization"], 0.75);
        assert_eq!(e["gen_throughput"], 123.46);
        assert_eq!(e["cache_hit_rate"], 0.25);
        assert_eq!(e["max_running_requests"], 4);
        assert_eq!(
            e["queues"],
            json!({"waiting": 2, "grammar": 2, "paused": 0, "retracted": 1})
        );
        assert_eq!(e["disaggregation"]["mode"], "null");
        for absent in ["memory", "speculative", "lora"] {
            assert!(e.get(absent).is_none(), "{absent}: {e}");
        }

        let core = LoadsQuery::parse(&uri("include=core")).unwrap();
        let e = busy().entry(&core);
        assert!(e.get("queues").is_none() && e.get("disaggregation").is_none());
        let queues = LoadsQuery::parse(&uri("include=core%2Cqueues")).unwrap();
        let e = busy().entry(&queues);
        assert!(e.get("queues").is_some() && e.get("disaggregation").is_none());

        // Pools sized by explicit page counts: no budget, the fullest pool's share.
        let pages = LoadInputs {
            max_total_tokens: None,
            ..busy()
        };
        let e = pages.entry(&core);
        assert!(e.get("max_total_num_tokens").is_none());
        assert_eq!(e["token_usage"], 0.75);
    }

    #[test]
    fn bad_queries_are_refused_naming_the_parameter() {
        for (q, param, says) in [
            ("include=core,gpu", "include", "unknown section \"gpu\""),
            ("dp_rank=1", "dp_rank", "one rank, 0"),
            ("format=xml", "format", "json or prometheus"),
            ("colour=red", "colour", "use include, dp_rank and format"),
        ] {
            let e = LoadsQuery::parse(&uri(q)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{q}");
            assert!(e.message.contains(says), "{q}: {}", e.message);
        }
        assert!(LoadsQuery::parse(&uri("dp_rank=0&format=json&include=all")).is_ok());
    }

    #[test]
    fn the_aggregate_sums_requests_and_averages_the_ratios() {
        let q = LoadsQuery::parse(&uri("include=core")).unwrap();
        let idle = LoadInputs {
            metrics: EngineMetrics::default(),
            ..busy()
        };
        let loads = [busy().entry(&q), idle.entry(&q)];
        assert_eq!(
            aggregate(&loads),
            json!({"total_running_reqs": 3, "total_waiting_reqs": 2, "total_reqs": 5,
                   "avg_token_usage": 0.15, "avg_throughput": 61.73, "avg_utilization": 0.375})
        );
    }

    #[test]
    fn prometheus_text_uses_sglangs_names_per_rank() {
        let q = LoadsQuery::parse(&uri("include=queues&format=prometheus")).unwrap();
        assert!(q.prometheus);
        let text = prometheus(&[busy().entry(&q)]);
        for line in [
            "# TYPE sglang_num_running_reqs gauge",
            "sglang_num_running_reqs{dp_rank=\"0\"} 3",
            "sglang_num_total_tokens{dp_rank=\"0\"} 345",
            "sglang_token_usage{dp_rank=\"0\"} 0.3",
            "sglang_queues_retracted{dp_rank=\"0\"} 1",
            "sglang_queues_grammar{dp_rank=\"0\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}:\n{text}");
        }
        assert!(!text.contains("sglang_disagg_"), "{text}");
    }
}

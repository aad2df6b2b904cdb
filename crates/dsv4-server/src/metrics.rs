//! Server statistics and their Prometheus text exposition (`GET /metrics`). Names follow vLLM's
//! (`vllm:time_to_first_token_seconds` → `dsv4:time_to_first_token_seconds`, …) so dashboards
//! and the stress harness read either server. Engine gauges (running/queued requests, pool
//! pages, prefix hit rate, steps) come from [`EngineMetrics`] at scrape time.

mod engine;

use dsv4_engine::{EngineMetrics, FinishReason, Finished};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bucket upper bounds (seconds) of the time-to-first-token histogram (vLLM's).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];
/// Bucket upper bounds (seconds) of the time-per-output-token histogram (vLLM's).
const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// Bucket upper bounds (seconds) of the end-to-end latency histogram.
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0,
];

/// Bucket upper bounds (seconds) of the grammar compile-time histogram.
const GRAMMAR_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A cumulative histogram.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug)]
struct Inner {
    http: BTreeMap<(&'static str, u16), u64>,
    finished: BTreeMap<&'static str, u64>,
    output_errors: BTreeMap<&'static str, u64>,
    prompt_tokens: u64,
    generation_tokens: u64,
    ttft: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    grammar: Histogram,
    grammar_cache_hits: u64,
}

/// Counters and histograms the handlers update.
#[derive(Debug)]
pub struct Stats {
    inner: Mutex<Inner>,
    grammar_waiting: AtomicUsize,
    tls: Arc<crate::tls::TlsCounters>,
}

/// A request waiting for its grammar (compiling it, or waiting for a compiler or for another
/// request compiling the same one); dropping it ends the wait.
#[derive(Debug)]
pub struct GrammarWait<'a>(&'a AtomicUsize);

impl Drop for GrammarWait<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                http: BTreeMap::new(),
                finished: BTreeMap::new(),
                output_errors: BTreeMap::new(),
                prompt_tokens: 0,
                generation_tokens: 0,
                ttft: Histogram::new(TTFT_BUCKETS),
                tpot: Histogram::new(TPOT_BUCKETS),
                e2e: Histogram::new(E2E_BUCKETS),
                queue: Histogram::new(E2E_BUCKETS),
                grammar: Histogram::new(GRAMMAR_BUCKETS),
                grammar_cache_hits: 0,
            }),
            grammar_waiting: AtomicUsize::new(0),
            tls: Arc::default(),
        }
    }
}

/// The `finished_reason` label of a finished request (vLLM's values plus ours).
fn reason_label(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "abort",
        FinishReason::Error => "error",
    }
}

impl Stats {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An HTTP answer on `endpoint` with `status`.
    pub fn http(&self, endpoint: &'static str, status: u16) {
        *self.lock().http.entry((endpoint, status)).or_default() += 1;
    }

    /// A completion broke the DSV4 completion grammar (`class`: the parser's error class).
    pub fn output_error(&self, class: &'static str) {
        *self.lock().output_errors.entry(class).or_default() += 1;
    }

    /// A request's grammar compiled (or failed to) in `secs`, waiting for a compiler included.
    pub fn grammar_compiled(&self, secs: f64) {
        self.lock().grammar.observe(secs);
    }

    /// A request starts waiting for its grammar, until the returned guard is dropped.
    pub fn grammar_wait(&self) -> GrammarWait<'_> {
        self.grammar_waiting.fetch_add(1, Ordering::Relaxed);
        GrammarWait(&self.grammar_waiting)
    }

    /// Requests waiting for their grammar now (SGLang's grammar queue).
    pub fn grammar_waiting(&self) -> usize {
        self.grammar_waiting.load(Ordering::Relaxed)
    }

    /// What TLS has done (the TLS listener counts into it).
    pub fn tls_counters(&self) -> Arc<crate::tls::TlsCounters> {
        self.tls.clone()
    }

    /// A request compiled no grammar: it was kept, or another request was compiling it.
    pub fn grammar_cache_hit(&self) {
        self.lock().grammar_cache_hits += 1;
    }

    /// A generation request ended (any way) with the engine's final event.
    pub fn finished(&self, f: &Finished) {
        let mut s = self.lock();
        *s.finished.entry(reason_label(f.reason)).or_default() += 1;
        s.prompt_tokens += f.usage.prompt_tokens as u64;
        s.generation_tokens += f.usage.completion_tokens as u64;
        let n = f.usage.completion_tokens;
        if n > 0 {
            s.ttft.observe(f.timing.ttft_ms / 1e3);
            if n > 1 {
                s.tpot
                    .observe((f.timing.e2e_ms - f.timing.ttft_ms) / 1e3 / (n - 1) as f64);
            }
        }
        s.e2e.observe(f.timing.e2e_ms / 1e3);
        s.queue.observe(f.timing.queue_ms / 1e3);
    }

    /// The Prometheus text of the server's counters and the engine's gauges (`engine` is None
    /// while the model loads).
    pub fn render(&self, engine: Option<&EngineMetrics>, in_flight: u64) -> String {
        let s = self.lock();
        let mut out = String::new();
        let o = &mut out;
        let name = header(
            o,
            "dsv4:http_requests_total",
            "counter",
            "HTTP requests answered, by endpoint and status code.",
        );
        for ((endpoint, status), n) in &s.http {
            let _ = writeln!(
                o,
                "{name}{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        let name = header(
            o,
            "dsv4:request_success_total",
            "counter",
            "Generation requests finished, by reason (stop, length, abort, error).",
        );
        for (reason, n) in &s.finished {
            let _ = writeln!(o, "{name}{{finished_reason=\"{reason}\"}} {n}");
        }
        let name = header(
            o,
            "dsv4:model_output_errors_total",
            "counter",
            "Completions refused because they broke the DSV4 grammar, by parser error class.",
        );
        for (class, n) in &s.output_errors {
            let _ = writeln!(o, "{name}{{class=\"{class}\"}} {n}");
        }
        scalar(
            o,
            "dsv4:prompt_tokens_total",
            "counter",
            "Prompt tokens of finished generation requests.",
            s.prompt_tokens as f64,
        );
        scalar(
            o,
            "dsv4:generation_tokens_total",
            "counter",
            "Tokens generated for finished generation requests.",
            s.generation_tokens as f64,
        );
        scalar(
            o,
            "dsv4:server_requests_in_flight",
            "gauge",
            "Generation requests the server is waiting on.",
            in_flight as f64,
        );
        s.ttft.render(
            o,
            "dsv4:time_to_first_token_seconds",
            "Submission to first generated token.",
        );
        s.tpot.render(
            o,
            "dsv4:time_per_output_token_seconds",
            "Mean time between output tokens after the first, per request.",
        );
        s.e2e.render(
            o,
            "dsv4:e2e_request_latency_seconds",
            "Submission to the end of a generation request.",
        );
        s.queue.render(
            o,
            "dsv4:request_queue_time_seconds",
            "Submission to the first admission to a running slot (to the end, for a request that never ran).",
        );
        s.grammar.render(
            o,
            "dsv4:grammar_compile_seconds",
            "Compiling a request's constrained-decoding grammar, waiting for a compiler included.",
        );
        scalar(
            o,
            "dsv4:grammar_cache_hits_total",
            "counter",
            "Requests that compiled no grammar: theirs was kept (server.grammar_cache) or another request was compiling it.",
            s.grammar_cache_hits as f64,
        );
        scalar(
            o,
            "dsv4:num_grammar_queue_reqs",
            "gauge",
            "Requests waiting for their constrained-decoding grammar (compiling, or waiting for a compiler).",
            self.grammar_waiting() as f64,
        );
        for (name, help, n) in [
            (
                "dsv4:tls_handshake_failures_total",
                "Connections dropped in or before their TLS handshake: not TLS, an untrusted or missing client certificate, or past the 10 s deadline (0 without server.ssl_certfile).",
                &self.tls.handshake_failures,
            ),
            (
                "dsv4:tls_reloads_total",
                "Changed TLS files read and put in use for new connections (server.ssl_refresh_s).",
                &self.tls.reloads,
            ),
            (
                "dsv4:tls_reload_failures_total",
                "Changed TLS files that could not be used; the configuration in use stayed.",
                &self.tls.reload_failures,
            ),
        ] {
            scalar(o, name, "counter", help, n.load(Ordering::Relaxed) as f64);
        }
        if let Some(m) = engine {
            engine::render_engine(o, m);
        }
        out
    }
}

/// The gauges of `/v1/responses`' store: responses stored, their own bytes (what
/// `server.responses_store_mib` bounds), and background responses running.
pub fn render_responses(out: &mut String, stored: usize, bytes: usize, running: usize) {
    scalar(
        out,
        "dsv4:responses_stored",
        "gauge",
        "Responses kept for previous_response_id and GET /v1/responses/{id}.",
        stored as f64,
    );
    scalar(
        out,
        "dsv4:responses_stored_bytes",
        "gauge",
        "Bytes the stored responses hold of their own (server.responses_store_mib bounds it).",
        bytes as f64,
    );
    scalar(
        out,
        "dsv4:responses_background_running",
        "gauge",
        "Background responses running.",
        running as f64,
    );
}

/// The batch lines' share of the running slots now, for [`render_batches`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ShareNow {
    /// Lines of batches in flight.
    pub lines: usize,
    /// The most lines that may be in flight now.
    pub limit: usize,
    /// Generation requests in flight that are not batch lines.
    pub interactive: usize,
    /// The idle time in force before lines fill idle slots (`None` without a fill).
    pub fill_idle: Option<std::time::Duration>,
}

/// The gauges of the Files and Batch APIs: files kept, their bytes (what `server.files_mib`
/// bounds), batches not yet ended, and their lines in flight with the most there may be.
pub fn render_batches(
    out: &mut String,
    files: usize,
    bytes: usize,
    running: usize,
    share: ShareNow,
) {
    let ShareNow {
        lines,
        limit,
        interactive,
        fill_idle,
    } = share;
    scalar(
        out,
        "dsv4:files_stored",
        "gauge",
        "Files kept for the Files and Batch APIs (uploads and batch outputs).",
        files as f64,
    );
    scalar(
        out,
        "dsv4:files_stored_bytes",
        "gauge",
        "Bytes of those files (server.files_mib bounds uploads).",
        bytes as f64,
    );
    scalar(
        out,
        "dsv4:batches_running",
        "gauge",
        "Batches validating, running or cancelling.",
        running as f64,
    );
    scalar(
        out,
        "dsv4:batch_lines_running",
        "gauge",
        "Lines of batches in flight.",
        lines as f64,
    );
    scalar(
        out,
        "dsv4:batch_lines_limit",
        "gauge",
        "Most lines of batches in flight together now (server.batch_max_running, or every \
         running slot while server.batch_fill_idle_ms lets them fill idle ones).",
        limit as f64,
    );
    scalar(
        out,
        "dsv4:interactive_requests_in_flight",
        "gauge",
        "Generation requests in flight that are not batch lines (batch lines fill idle running slots only while there are none, server.batch_fill_idle_ms).",
        interactive as f64,
    );
    if let Some(idle) = fill_idle {
        scalar(
            out,
            "dsv4:batch_fill_idle_seconds",
            "gauge",
            "How long no interactive request must have been in flight before batch lines fill idle running slots: server.batch_fill_idle_ms, raised up to 32 times while fills are cut short.",
            idle.as_secs_f64(),
        );
    }
}

/// The gauge of the compiled-grammar cache: grammars it holds (`server.grammar_cache` bounds it).
pub fn render_grammar_cache(out: &mut String, entries: usize) {
    scalar(
        out,
        "dsv4:grammar_cache_entries",
        "gauge",
        "Compiled grammars kept for reuse (server.grammar_cache bounds it).",
        entries as f64,
    );
}

/// The counter of answers whose reasoning a thinking budget ended.
pub fn render_thinking_budget_cuts(out: &mut String, cuts: u64) {
    scalar(
        out,
        "dsv4:thinking_budget_cuts_total",
        "counter",
        "Thinking-mode answers whose reasoning a thinking budget ended with </think> (the request's or server.thinking_token_budget).",
        cuts as f64,
    );
}

/// Write the HELP and TYPE lines of `name`; returns the name.
fn header<'a>(out: &mut String, name: &'a str, kind: &str, help: &str) -> &'a str {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    name
}

/// One unlabelled sample with its header.
fn scalar(out: &mut String, name: &str, kind: &str, help: &str, v: f64) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {v}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every canary, host-tier and retracted field reaches its own sample, with HELP and TYPE
    /// lines.
    #[test]
    fn canary_and_host_tier_counters_are_exported() {
        let m = EngineMetrics {
            canary_rounds_flagged: 3,
            canary_unexpected_pages: 17,
            host_tier_snapshots: 2,
            host_tier_used_pages: 40,
            host_tier_pages: 96,
            host_tier_spilled_pages_total: 55,
            host_tier_loaded_pages_total: 12,
            host_tier_hits_total: 4,
            host_tier_load_failures_total: 1,
            host_tier_dropped_snapshots_total: 6,
            preempted_waiting: 2,
            ..Default::default()
        };
        let text = Stats::default().render(Some(&m), 0);
        for line in [
            "# TYPE dsv4:canary_flagged_rounds_total counter",
            "dsv4:canary_flagged_rounds_total 3",
            "dsv4:canary_unexpected_pages_total 17",
            "# TYPE dsv4:host_tier_snapshots gauge",
            "dsv4:host_tier_snapshots 2",
            "dsv4:host_tier_used_pages 40",
            "dsv4:host_tier_total_pages 96",
            "# TYPE dsv4:host_tier_spilled_pages_total counter",
            "dsv4:host_tier_spilled_pages_total 55",
            "dsv4:host_tier_loaded_pages_total 12",
            "dsv4:host_tier_hits_total 4",
            "dsv4:host_tier_load_failures_total 1",
            "dsv4:host_tier_dropped_snapshots_total 6",
            "# TYPE dsv4:num_retracted_reqs gauge",
            "dsv4:num_retracted_reqs 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
        // One HELP line per metric name: no name is written twice.
        let helps: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP")).collect();
        let mut names: Vec<&str> = helps.iter().map(|l| l.split(' ').nth(2).unwrap()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), helps.len(), "{text}");
    }

    /// The grammar queue counts a request from the start of its wait to the guard's drop.
    #[test]
    fn the_grammar_queue_counts_the_requests_waiting_for_a_grammar() {
        let stats = Stats::default();
        let gauge = |s: &Stats| {
            let text = s.render(None, 0);
            let line = text
                .lines()
                .find(|l| l.starts_with("dsv4:num_grammar_queue_reqs "))
                .map(str::to_string);
            line.unwrap_or_else(|| panic!("no gauge:\n{text}"))
        };
        assert_eq!(gauge(&stats), "dsv4:num_grammar_queue_reqs 0");
        let (a, b) = (stats.grammar_wait(), stats.grammar_wait());
        assert_eq!(
            (stats.grammar_waiting(), gauge(&stats).as_str()),
            (2, "dsv4:num_grammar_queue_reqs 2")
        );
        drop(a);
        assert_eq!(stats.grammar_waiting(), 1);
        drop(b);
        assert_eq!(stats.grammar_waiting(), 0);
    }
}

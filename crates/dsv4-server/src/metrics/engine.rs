//! The engine's part of `/metrics`: request and token gauges, preemption and step counters,
//! pool pages, and the canary's and host tier's counters, from [`EngineMetrics`] at scrape time.

use super::{header, scalar};
use dsv4_engine::EngineMetrics;
use std::fmt::Write as _;

/// The engine's gauges and counters, and its pools' pages.
pub(super) fn render_engine(o: &mut String, m: &EngineMetrics) {
    scalar(
        o,
        "dsv4:num_requests_running",
        "gauge",
        "Requests in the engine's running batch.",
        m.running_requests as f64,
    );
    scalar(
        o,
        "dsv4:num_requests_waiting",
        "gauge",
        "Requests queued for admission.",
        m.queued_requests as f64,
    );
    scalar(
        o,
        "dsv4:num_tokens_running",
        "gauge",
        "Tokens the running requests hold in the cache (prompt and generated so far).",
        m.running_tokens as f64,
    );
    scalar(
        o,
        "dsv4:num_tokens_waiting",
        "gauge",
        "Tokens the waiting requests will prefill when admitted, before prefix-cache reuse.",
        m.queued_tokens as f64,
    );
    scalar(
        o,
        "dsv4:num_retracted_reqs",
        "gauge",
        "Of the waiting requests, those preempted after admission (cache freed, to recompute).",
        m.preempted_waiting as f64,
    );
    scalar(
        o,
        "dsv4:prefix_cache_hit_rate",
        "gauge",
        "Cached prompt tokens / prompt tokens over admitted requests.",
        m.prefix_hit_rate,
    );
    scalar(
        o,
        "dsv4:prefix_cache_snapshots",
        "gauge",
        "Prefix-cache state snapshots held.",
        m.prefix_snapshots as f64,
    );
    scalar(
        o,
        "dsv4:num_preemptions_total",
        "counter",
        "Requests preempted (cache freed, recomputed later).",
        m.preemptions_total as f64,
    );
    scalar(
        o,
        "dsv4:num_priority_preemptions_total",
        "counter",
        "Of those, requests preempted to admit a higher-priority one (scheduler.priority_preemption).",
        m.priority_preemptions_total as f64,
    );
    scalar(
        o,
        "dsv4:num_yield_preemptions_total",
        "counter",
        "Of those, batch lines paused past their share when interactive requests came (server.batch_fill_idle_ms).",
        m.yield_preemptions_total as f64,
    );
    scalar(
        o,
        "dsv4:requests_refused_queue_full_total",
        "counter",
        "Engine requests refused with 503 at a full queue (scheduler.max_queued_requests): new ones, and waiting ones that gave their place to a higher-priority one.",
        m.queue_refusals_total as f64,
    );
    scalar(
        o,
        "dsv4:requests_displaced_queue_full_total",
        "counter",
        "Of those, waiting requests that gave their place to a higher-priority one.",
        m.queue_displacements_total as f64,
    );
    scalar(
        o,
        "dsv4:engine_requests_cancelled_total",
        "counter",
        "Requests the engine cancelled (client gone, or cancelled explicitly).",
        m.requests_cancelled as f64,
    );
    scalar(
        o,
        "dsv4:engine_steps_total",
        "counter",
        "Steps the engine's loop has run.",
        m.steps_total as f64,
    );
    scalar(
        o,
        "dsv4:engine_computed_tokens_total",
        "counter",
        "Tokens run through the model (prefill and decode, recomputation included).",
        m.computed_tokens_total as f64,
    );
    scalar(
        o,
        "dsv4:engine_logit_rows_total",
        "counter",
        "Rows whose logits the model computed (sampled tokens and prompt_logprobs rows).",
        m.logit_rows_total as f64,
    );
    scalar(
        o,
        "dsv4:engine_prefill_waits_total",
        "counter",
        "Requests held back to reuse a running request's prefill of the prompt pages they share.",
        m.prefill_waits_total as f64,
    );
    let used: usize = m.pools.iter().map(|p| p.used_pages).sum();
    let total: usize = m.pools.iter().map(|p| p.total_pages).sum();
    scalar(
        o,
        "dsv4:cache_usage_perc",
        "gauge",
        "Used / total cache pages over all pools (0 to 1).",
        used as f64 / total.max(1) as f64,
    );
    let name = header(
        o,
        "dsv4:cache_pool_used_pages",
        "gauge",
        "Pages in use, per cache pool.",
    );
    for p in &m.pools {
        let _ = writeln!(o, "{name}{{pool=\"{}\"}} {}", p.pool, p.used_pages);
    }
    let name = header(
        o,
        "dsv4:cache_pool_total_pages",
        "gauge",
        "Pages of each cache pool.",
    );
    for p in &m.pools {
        let _ = writeln!(o, "{name}{{pool=\"{}\"}} {}", p.pool, p.total_pages);
    }
    render_canary(o, m);
    render_host_tier(o, m);
}

/// The canary's findings (`debug.canary`; both stay 0 while it is off): an alert on either
/// going up catches cache corruption as it happens.
fn render_canary(o: &mut String, m: &EngineMetrics) {
    scalar(
        o,
        "dsv4:canary_flagged_rounds_total",
        "counter",
        "Forward rounds in which the canary saw cache pages change outside the step's declared \
         write set.",
        m.canary_rounds_flagged as f64,
    );
    scalar(
        o,
        "dsv4:canary_unexpected_pages_total",
        "counter",
        "Cache pages the canary saw change outside the declared write sets.",
        m.canary_unexpected_pages as f64,
    );
}

/// The host tier of the prefix cache (`cache.hicache`; all 0 while it is off).
fn render_host_tier(o: &mut String, m: &EngineMetrics) {
    let gauges = [
        (
            "dsv4:host_tier_snapshots",
            "Prefix snapshots held in the host tier.",
            m.host_tier_snapshots,
        ),
        (
            "dsv4:host_tier_used_pages",
            "Host-tier pages in use.",
            m.host_tier_used_pages,
        ),
        (
            "dsv4:host_tier_total_pages",
            "Host-tier pages in all.",
            m.host_tier_pages,
        ),
    ];
    for (name, help, v) in gauges {
        scalar(o, name, "gauge", help, v as f64);
    }
    let counters = [
        (
            "dsv4:host_tier_spilled_pages_total",
            "Pages spilled from the device pools to the host tier (evicted snapshots).",
            m.host_tier_spilled_pages_total,
        ),
        (
            "dsv4:host_tier_loaded_pages_total",
            "Pages loaded back from the host tier into the device pools.",
            m.host_tier_loaded_pages_total,
        ),
        (
            "dsv4:host_tier_hits_total",
            "Prefix hits served from the host tier.",
            m.host_tier_hits_total,
        ),
        (
            "dsv4:host_tier_load_failures_total",
            "Host-tier hits not loaded back for lack of device room (recomputed instead).",
            m.host_tier_load_failures_total,
        ),
        (
            "dsv4:host_tier_dropped_snapshots_total",
            "Snapshots dropped from the host tier to make room.",
            m.host_tier_dropped_snapshots_total,
        ),
    ];
    for (name, help, v) in counters {
        scalar(o, name, "counter", help, v as f64);
    }
}

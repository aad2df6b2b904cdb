//! Engine metrics as a plain struct a server can export: requests, pool usage, prefix hit rate,
//! step time and throughput, plus the counters they are computed from.

use crate::pools::PoolUsage;
use serde::Serialize;
use std::collections::VecDeque;

/// Steps the recent step time and throughput are averaged over.
const WINDOW: usize = 64;

/// A snapshot of the engine's state and counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineMetrics {
    /// Requests with a cache state, being stepped.
    pub running_requests: usize,
    /// Requests waiting for admission (new or preempted).
    pub queued_requests: usize,
    /// Tokens the running requests hold in the cache (prompt and generated so far).
    pub running_tokens: u64,
    /// Tokens the waiting requests will prefill when admitted (a preempted request's generated
    /// tokens included), before any prefix-cache reuse.
    pub queued_tokens: u64,
    /// Of the waiting requests, those preempted after admission (SGLang's "retracted"): their
    /// cache was freed and they wait to recompute it.
    pub preempted_waiting: usize,
    /// Usage of each cache pool.
    pub pools: Vec<PoolUsage>,
    /// Prefix snapshots held.
    pub prefix_snapshots: usize,
    /// Cached prompt tokens / prompt tokens, over requests admitted so far.
    pub prefix_hit_rate: f64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens_total: u64,
    /// Of those, tokens reused from the prefix cache.
    pub cached_tokens_total: u64,
    /// Tokens run through the model (prefill chunks and decode tokens, recomputation included).
    pub computed_tokens_total: u64,
    /// Rows whose logits the model computed: one per sampled token, plus the rows scored for
    /// `prompt_logprobs` (prefill rows that neither sample nor score need none).
    pub logit_rows_total: u64,
    /// Requests admission passed over at least once to wait for a running request's prefill
    /// of prompt pages they share (in-batch prefix caching).
    pub prefill_waits_total: u64,
    /// Tokens generated.
    pub generated_tokens_total: u64,
    /// Steps run.
    pub steps_total: u64,
    /// Wall time of the last step, ms.
    pub last_step_ms: f64,
    /// Mean step time over the recent steps, ms.
    pub mean_step_ms: f64,
    /// Generated tokens per second over the recent steps.
    pub generated_tokens_per_s: f64,
    /// Computed tokens per second over the recent steps.
    pub computed_tokens_per_s: f64,
    /// Requests finished (any reason but cancellation).
    pub requests_finished: u64,
    /// Requests cancelled (explicitly, or their stream dropped).
    pub requests_cancelled: u64,
    /// Preemptions (cache freed, recomputed later).
    pub preemptions_total: u64,
    /// Of those, preemptions to admit a higher-priority request (`scheduler.priority_preemption`).
    pub priority_preemptions_total: u64,
    /// Requests refused at a full queue (`Request::queue_limit`): new ones, and waiting ones
    /// that gave their place to a higher-priority one.
    pub queue_refusals_total: u64,
    /// Of those, waiting requests that gave their place to a higher-priority one.
    pub queue_displacements_total: u64,
    /// Of the preemptions, requests that yield preempted past the yield cap.
    pub yield_preemptions_total: u64,
    /// Forward rounds in which the canary saw pages change outside the declared write set.
    pub canary_rounds_flagged: u64,
    /// Pages the canary saw change outside the declared write sets.
    pub canary_unexpected_pages: u64,
    /// Prefix snapshots held in the host tier (`cache.hicache`; also in `prefix_snapshots`).
    pub host_tier_snapshots: usize,
    /// Host-tier pages in use.
    pub host_tier_used_pages: usize,
    /// Host-tier pages in all.
    pub host_tier_pages: usize,
    /// Pages spilled device → host (evicted snapshots).
    pub host_tier_spilled_pages_total: u64,
    /// Pages loaded back host → device.
    pub host_tier_loaded_pages_total: u64,
    /// Prefix hits served from the host tier.
    pub host_tier_hits_total: u64,
    /// Host hits that could not be loaded back for lack of device room (recomputed instead).
    pub host_tier_load_failures_total: u64,
    /// Snapshots dropped from the host tier to make room.
    pub host_tier_dropped_snapshots_total: u64,
}

/// Counters the scheduler updates; [`EngineMetrics`] is built from them.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub computed_tokens: u64,
    pub logit_rows: u64,
    pub prefill_waits: u64,
    pub generated_tokens: u64,
    pub steps: u64,
    pub finished: u64,
    pub cancelled: u64,
    pub preemptions: u64,
    pub priority_preemptions: u64,
    pub queue_refusals: u64,
    pub queue_displacements: u64,
    pub yield_preemptions: u64,
    pub canary_rounds: u64,
    pub canary_pages: u64,
    pub last_step_ms: f64,
    /// (step ms, generated tokens, computed tokens) of recent steps.
    recent: VecDeque<(f64, u64, u64)>,
}

impl Counters {
    /// Record one step that generated and computed the given tokens (already counted in the
    /// totals).
    pub fn step(&mut self, ms: f64, generated: u64, computed: u64) {
        self.steps += 1;
        self.last_step_ms = ms;
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back((ms, generated, computed));
    }

    /// Fill the counter fields of `m`.
    pub fn fill(&self, m: &mut EngineMetrics) {
        let (ms, generated, computed) = self
            .recent
            .iter()
            .fold((0.0, 0, 0), |(a, b, c), &(x, y, z)| (a + x, b + y, c + z));
        let per_s = |n: u64| if ms > 0.0 { n as f64 / (ms / 1e3) } else { 0.0 };
        m.prompt_tokens_total = self.prompt_tokens;
        m.cached_tokens_total = self.cached_tokens;
        m.prefix_hit_rate = self.cached_tokens as f64 / self.prompt_tokens.max(1) as f64;
        m.computed_tokens_total = self.computed_tokens;
        m.logit_rows_total = self.logit_rows;
        m.prefill_waits_total = self.prefill_waits;
        m.generated_tokens_total = self.generated_tokens;
        m.steps_total = self.steps;
        m.last_step_ms = self.last_step_ms;
        m.mean_step_ms = ms / self.recent.len().max(1) as f64;
        m.generated_tokens_per_s = per_s(generated);
        m.computed_tokens_per_s = per_s(computed);
        m.requests_finished = self.finished;
        m.requests_cancelled = self.cancelled;
        m.preemptions_total = self.preemptions;
        m.priority_preemptions_total = self.priority_preemptions;
        m.queue_refusals_total = self.queue_refusals;
        m.queue_displacements_total = self.queue_displacements;
        m.yield_preemptions_total = self.yield_preemptions;
        m.canary_rounds_flagged = self.canary_rounds;
        m.canary_unexpected_pages = self.canary_pages;
    }
}

//! The scheduler: admission queue, continuous batching and chunked prefill over the pooled
//! caches, with prefix snapshots and preemption. It is synchronous — [`Scheduler::step`] runs one
//! step — so tests can drive it exactly; [`crate::Engine`] runs it on its own thread.
//!
//! A step: drop requests whose client is gone; admit waiting requests (restoring the longest
//! cached prefix, or starting fresh) up to `max_running_requests` (past it, with priority
//! preemption, by preempting a running request of a priority lower by more than the
//! threshold), passing over those whose uncached prompt pages a running request is still
//! prefilling (in-batch prefix caching); give
//! every running request its next tokens (one for a decode, a prefill chunk within the step's
//! `chunked_prefill_size` budget); then run them in rounds of one forward step each (through
//! the model's plan, with the canary around it when `debug.canary` is on) — with the prefix
//! cache on, a chunk is cut at page boundaries so a snapshot can be kept at each. Before a round, the pages
//! it will take are counted; when a pool is short the least recently used snapshots are dropped,
//! then the lowest-priority, latest admitted requests are preempted (cache freed, requeued,
//! recomputed later).
//! With the host tier on, dropped snapshots spill to it and host hits load back
//! ([`crate::hicache`]); each round's declared write set includes the load-backs' writes.
//! Admission is in `scheduler/admit.rs`, a round in `scheduler/round.rs`. With `overlap_schedule` a step is pipelined with the
//! next one instead (`scheduler/overlap.rs`).

mod admit;
mod device;
mod overlap;
mod queue;
mod round;
mod yields;

use crate::canary::{CanaryFinding, DebugOptions};
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::hicache::HostTier;
pub use crate::limits::Limits;
use crate::metrics::{Counters, EngineMetrics};
use crate::pool::PoolKind;
use crate::pools::CachePools;
use crate::prefix::PrefixCache;
use crate::request::{Event, FinishReason, Request, RequestId, RequestStream};
use crate::sequence::{Detokenizer, Seq};
use dsv4_model::forward::Fault;
use dsv4_model::{ForwardError, Model};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio::sync::oneshot;

pub use overlap::StepTiming;
pub use queue::QUEUE_FULL;
pub(crate) use queue::queued_channel;

/// The engine's request state machine over one model and its cache pools.
pub struct Scheduler {
    model: Arc<Model>,
    cfg: EngineConfig,
    ratios: Vec<usize>,
    pools: CachePools,
    prefix: Option<PrefixCache>,
    hicache: Option<HostTier>,
    detok: Option<Arc<dyn Detokenizer>>,
    limits: Limits,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    next_id: u64,
    admissions: u64,
    /// Most running requests that yield ([`Request::yields`]; [`Self::set_yield_cap`]).
    yield_cap: usize,
    counters: Counters,
    outbox: Vec<(UnboundedSender<Event>, Event)>,
    metrics_sink: Option<Arc<Mutex<EngineMetrics>>>,
    debug: DebugOptions,
    canary_log: VecDeque<CanaryFinding>,
    /// The overlap pipeline (`overlap_schedule`).
    overlap: Option<overlap::Pipeline>,
    /// Recent step timings (for the serving benchmark).
    timings: VecDeque<StepTiming>,
    /// Forward time of the current (non-overlapped) step so far, ms.
    forward_ms: f64,
}

impl Scheduler {
    /// A scheduler with freshly sized pools; `detok` enables stop strings and final text.
    pub fn new(
        model: Arc<Model>,
        cfg: EngineConfig,
        detok: Option<Arc<dyn Detokenizer>>,
    ) -> Result<Self, EngineError> {
        let pools = CachePools::new(&model, &cfg)?;
        let limits = Limits {
            vocab: model.cfg.vocab_size,
            max_position: model.cfg.max_position_embeddings,
            geometry: pools.geometry().clone(),
            capacity: std::array::from_fn(|i| pools.pool(PoolKind::ALL[i]).capacity()),
            has_detokenizer: detok.is_some(),
        };
        let hicache = match &cfg.hicache {
            Some(h) => Some(HostTier::new(&pools, h).map_err(EngineError::Spawn)?),
            None => None,
        };
        let overlap = if cfg.overlap_schedule {
            let fault = model.exec().has(Fault::StalePageReuse);
            Some(overlap::Pipeline::new(
                Arc::clone(&model),
                fault,
                cfg.choice_threads,
            )?)
        } else {
            None
        };
        Ok(Self {
            hicache,
            overlap,
            timings: VecDeque::new(),
            forward_ms: 0.0,
            ratios: model.layer_ratios(),
            prefix: cfg.prefix_cache.then(|| PrefixCache::new(cfg.page_size)),
            model,
            cfg,
            pools,
            detok,
            limits,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            admissions: 0,
            yield_cap: usize::MAX,
            counters: Counters::default(),
            outbox: Vec::new(),
            metrics_sink: None,
            debug: DebugOptions::default(),
            canary_log: VecDeque::new(),
        })
    }

    /// The same scheduler with run-time checks (the canary) on.
    pub fn with_debug(mut self, debug: DebugOptions) -> Self {
        self.debug = debug;
        self
    }

    /// The most recent canary findings, oldest first.
    pub fn canary_findings(&self) -> impl Iterator<Item = &CanaryFinding> {
        self.canary_log.iter()
    }

    /// What requests are checked against.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The cache pools.
    pub fn pools(&self) -> &CachePools {
        &self.pools
    }

    /// The options the scheduler runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Queue a request; its events arrive on the returned stream.
    pub fn submit(&mut self, req: Request) -> Result<RequestStream, EngineError> {
        self.limits.check(&req)?;
        let id = RequestId(self.next_id);
        self.next_id += 1;
        let (tx, rx) = unbounded_channel();
        let (queued, told) = queued_channel(&req);
        self.enqueue(id, req, tx, queued);
        Ok(RequestStream {
            id,
            rx,
            queued: told,
        })
    }

    /// Queue an already checked request under `id` (the engine thread's path), or refuse it at
    /// a full queue ([`Request::queue_limit`]); `queued` is told when it is queued.
    pub(crate) fn enqueue(
        &mut self,
        id: RequestId,
        req: Request,
        tx: UnboundedSender<Event>,
        queued: Option<oneshot::Sender<()>>,
    ) {
        let seq = Seq::new(id, req, tx);
        if let Err(why) = self.make_room(&seq) {
            tracing::debug!(%id, why, "refused");
            self.retire(seq, FinishReason::Error, Some(why));
            self.settle();
            return;
        }
        tracing::debug!(%id, prompt = seq.prompt_len, max_tokens = seq.req.max_tokens, "queued");
        if let Some(q) = queued {
            // A closed channel only means the client is gone.
            let _ = q.send(());
        }
        let p = seq.req.priority;
        // Behind every waiting request of its priority or higher (the queue stays ordered by
        // priority, first come first within one).
        let at = self.waiting.partition_point(|s| s.req.priority >= p);
        self.waiting.insert(at, seq);
    }

    /// Cancel a queued or running request: its pages are freed now and its stream ends with
    /// [`FinishReason::Cancelled`]. False when no such request is held.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i).expect("index from position")
        } else {
            return false;
        };
        self.counters.cancelled += 1;
        self.retire(seq, FinishReason::Cancelled, None);
        self.settle();
        true
    }

    /// Free a request and queue its Finished event (sent by [`Self::settle`]).
    fn retire(&mut self, seq: Seq, reason: FinishReason, error: Option<String>) {
        let (tx, finished) = seq.finish(reason, error, self.detok.as_ref());
        self.outbox.push((tx, Event::Finished(finished)));
    }

    /// Publish the metrics (to the engine's sink, if any), then send the queued Finished
    /// events, so a client that has its Finished sees metrics that include it.
    fn settle(&mut self) {
        if let Some(sink) = &self.metrics_sink {
            let m = self.metrics();
            *sink.lock().unwrap_or_else(|e| e.into_inner()) = m;
        }
        for (tx, ev) in self.outbox.drain(..) {
            // A closed channel only means the client is gone.
            let _ = tx.send(ev);
        }
    }

    /// Keep `sink` up to date with the metrics at the end of every step (the engine's handle
    /// reads it).
    pub(crate) fn publish_to(&mut self, sink: Arc<Mutex<EngineMetrics>>) {
        self.metrics_sink = Some(sink);
        self.settle();
    }

    /// Cancel every request (engine shutdown).
    pub fn cancel_all(&mut self) {
        let ids: Vec<RequestId> = self
            .running
            .iter()
            .chain(&self.waiting)
            .map(|s| s.id)
            .collect();
        for id in ids {
            self.cancel(id);
        }
    }

    /// Whether no request is queued or running (and no overlapped step is in flight).
    pub fn is_idle(&self) -> bool {
        self.running.is_empty()
            && self.waiting.is_empty()
            && self.overlap.as_ref().is_none_or(|p| !p.busy())
    }

    /// Drop every prefix snapshot, device and host tier (their pages are freed unless a
    /// request shares them); the number dropped.
    pub fn clear_prefix_cache(&mut self) -> usize {
        let dropped = self.prefix.as_mut().map_or(0, |p| {
            let n = p.snapshots();
            p.clear();
            n
        });
        self.settle();
        dropped
    }

    /// The metrics now.
    pub fn metrics(&self) -> EngineMetrics {
        let mut m = EngineMetrics {
            running_requests: self.running.len(),
            queued_requests: self.waiting.len(),
            running_tokens: self.running.iter().map(|s| s.tokens.len() as u64).sum(),
            queued_tokens: self.waiting.iter().map(|s| s.tokens.len() as u64).sum(),
            preempted_waiting: self.waiting.iter().filter(|s| s.preemptions > 0).count(),
            pools: self.pools.usage(),
            prefix_snapshots: self.prefix.as_ref().map_or(0, |p| p.snapshots()),
            host_tier_snapshots: self.prefix.as_ref().map_or(0, |p| p.host_snapshots()),
            ..Default::default()
        };
        self.counters.fill(&mut m);
        if let Some(h) = &self.hicache {
            h.fill(&mut m);
        }
        m
    }

    /// Run one step; false when there was nothing to do.
    pub fn step(&mut self) -> bool {
        if let Some(mut pipe) = self.overlap.take() {
            let more = self.step_overlap(&mut pipe);
            self.overlap = Some(pipe);
            self.settle();
            return more;
        }
        let t0 = Instant::now();
        self.reap_disconnected();
        self.admit();
        if self.running.is_empty() {
            self.settle();
            return false;
        }
        let (computed0, generated0) = (
            self.counters.computed_tokens,
            self.counters.generated_tokens,
        );
        let plan = self.plan();
        let (members, decode) = (plan.len(), plan.iter().all(|p| p.2 == 1));
        self.forward_ms = 0.0;
        let mut segments: Vec<(RequestId, VecDeque<usize>)> = plan
            .into_iter()
            .map(|(id, fed, n)| (id, self.segments(fed, n)))
            .collect();
        loop {
            let round: Vec<(RequestId, usize)> = segments
                .iter_mut()
                .filter_map(|(id, q)| q.pop_front().map(|n| (*id, n)))
                .collect();
            if round.is_empty() {
                break;
            }
            self.run_round(round);
        }
        let computed = self.counters.computed_tokens - computed0;
        let generated = self.counters.generated_tokens - generated0;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        self.counters.step(ms, generated, computed);
        self.record_timing(StepTiming {
            running: members,
            decode,
            run_ms: self.forward_ms,
            exposed_ms: (ms - self.forward_ms).max(0.0),
        });
        tracing::debug!(
            running = self.running.len(),
            queued = self.waiting.len(),
            computed,
            generated,
            ms,
            "step"
        );
        self.settle();
        true
    }

    fn reap_disconnected(&mut self) {
        let gone: Vec<RequestId> = self
            .running
            .iter()
            .chain(&self.waiting)
            .filter(|s| s.tx.is_closed())
            .map(|s| s.id)
            .collect();
        for id in gone {
            tracing::debug!(%id, "client gone; cancelling");
            self.cancel(id);
        }
    }

    /// (id, tokens fed, tokens to run) per running request for this step.
    fn plan(&self) -> Vec<(RequestId, usize, usize)> {
        let mut budget = self.cfg.chunked_prefill_size.unwrap_or(usize::MAX);
        let mut plan = Vec::new();
        for s in &self.running {
            let fed = s.fed();
            let unfed = s.tokens.len() - fed;
            let n = if unfed <= 1 {
                unfed
            } else {
                let n = unfed.min(budget);
                budget -= n;
                n
            };
            if n > 0 {
                plan.push((s.id, fed, n));
            }
        }
        plan
    }

    /// Split `n` tokens after `fed` at prefix-cache page boundaries (one piece without it).
    fn segments(&self, fed: usize, n: usize) -> VecDeque<usize> {
        let Some(p) = &self.prefix else {
            return VecDeque::from([n]);
        };
        let page = p.page_size();
        let mut out = VecDeque::new();
        let (mut at, end) = (fed, fed + n);
        while at < end {
            let next = ((at / page + 1) * page).min(end);
            out.push_back(next - at);
            at = next;
        }
        out
    }

    fn position(&self, id: RequestId) -> Option<usize> {
        self.running.iter().position(|s| s.id == id)
    }

    /// Free a running request's cache and requeue it at the front of its priority.
    fn preempt(&mut self, i: usize) {
        let mut seq = self.running.remove(i);
        seq.state = None;
        seq.preemptions += 1;
        self.counters.preemptions += 1;
        tracing::debug!(id = %seq.id, generated = seq.generated().len(), "preempted");
        // Ahead of the waiting requests of its priority, behind those of higher priority.
        let p = seq.req.priority;
        let at = self.waiting.partition_point(|s| s.req.priority > p);
        self.waiting.insert(at, seq);
    }

    fn fail(&mut self, i: usize, message: String) {
        let seq = self.running.remove(i);
        tracing::warn!(id = %seq.id, error = %message, "request failed");
        self.counters.finished += 1;
        self.retire(seq, FinishReason::Error, Some(message));
    }

    /// Finish the running request `id` if it generates nothing (`max_tokens` 0) and its whole
    /// prompt has run, sending its prompt's entries first.
    fn finish_prompt_only(&mut self, id: RequestId) {
        let Some(i) = self
            .position(id)
            .filter(|&i| self.running[i].prompt_only_done())
        else {
            return;
        };
        let mut seq = self.running.remove(i);
        seq.prompt_done();
        tracing::debug!(id = %seq.id, "prompt run; nothing to generate");
        self.counters.finished += 1;
        self.retire(seq, FinishReason::Length, None);
    }

    /// After step `e` failed for members `ids` (in running order): a pool that ran out
    /// preempts them (latest first), any other error fails them.
    fn step_failed(&mut self, ids: &[RequestId], e: &ForwardError) {
        let pool = matches!(e, ForwardError::PoolExhausted { .. });
        tracing::warn!(error = %e, "step failed");
        for id in ids.iter().rev() {
            if let Some(i) = self.position(*id) {
                if pool {
                    self.preempt(i);
                } else {
                    self.fail(i, format!("forward pass failed: {e}"));
                }
            }
        }
    }
}

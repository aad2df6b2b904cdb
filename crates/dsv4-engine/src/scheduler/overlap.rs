//! Overlap scheduling (`exec.overlap_schedule`): the forward of step N runs on the device
//! worker while this thread prepares step N+1. One [`Scheduler::step`] under overlap:
//!
//! 1. prepare (hidden behind step N): reap, admit (new requests take their pages now), plan
//!    N+1 — a request whose step-N row is sampled gets a [`Slot::Future`] for that token;
//! 2. collect step N: states and samplers come home, canary, prefix snapshots; requests
//!    that only run their prompt finish;
//! 3. launch N+1 (exposed): make room (snapshot eviction, preemption), hand the states over;
//! 4. process step N's tokens (hidden behind N+1): events, stop conditions, finishing.
//!
//! A request that finishes at step N is usually already in step N+1: it is retired at once (its
//! stream ends), but its pages are freed only when N+1 completes, the last step that touches
//! them, and its N+1 output is dropped. The `stale-page-reuse` fault frees them when N
//! completes instead (as N+1 is handed over), so N+1's other requests can take them while the
//! finished one still writes them. A step runs its prefill chunks before its decodes.

use super::Scheduler;
use super::device::{Device, Done, FutureId, Job, Member, MemberDone, Sampler, Slot};
use crate::canary::{self, Snapshot};
use crate::pool::PoolKind;
use crate::request::{FinishReason, RequestId};
use crate::sampler::Choice;
use crate::sequence::AfterToken;
use dsv4_model::forward::pages::{PageStore, PooledPages};
use dsv4_model::{Model, SequenceState};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Timing of one engine step, for `dsv4 bench --serving`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepTiming {
    /// Requests in the step.
    pub running: usize,
    /// Whether every request ran one token (a decode step).
    pub decode: bool,
    /// Forward and sampling time, ms.
    pub run_ms: f64,
    /// Scheduling time not hidden behind execution, ms: the whole step minus its forwards
    /// without overlap; the time the device waited for this step with overlap.
    pub exposed_ms: f64,
}

/// The overlap scheduler's state between steps.
pub(crate) struct Pipeline {
    device: Device,
    in_flight: Option<InFlight>,
    next_future: FutureId,
    launched: u64,
    /// `stale-page-reuse` is injected.
    fault: bool,
    /// Requests retired while in flight whose pages the fault released early: those pages.
    early: HashMap<RequestId, BTreeSet<(PoolKind, u32)>>,
}

/// The launched step.
struct InFlight {
    tracks: HashMap<RequestId, Track>,
    decode: bool,
    snapshot: Option<Snapshot>,
    /// Pages of requests admitted while the step ran (the canary lets them change).
    admitted: BTreeMap<&'static str, BTreeSet<u32>>,
}

/// A request in the launched step.
struct Track {
    /// Its position once the step has run.
    pos_after: usize,
    /// Where the token the step samples for it is published.
    future: Option<FutureId>,
    /// The pages it held at launch (recorded only under the fault).
    pages: Vec<(PoolKind, u32)>,
}

/// A request's part of the next step, planned while the current one runs.
struct Planned {
    id: RequestId,
    /// Its position when the step starts.
    fed: usize,
    slots: Vec<Slot>,
    sample: bool,
}

/// A token chosen by a collected step, processed after the next step is launched.
struct Outcome {
    id: RequestId,
    choice: Choice,
    row: Vec<f32>,
}

impl Pipeline {
    /// Start the device worker for `model`.
    /// Start the device worker for `model`; `choice_threads` as [`crate::EngineConfig`]'s.
    pub fn new(
        model: Arc<Model>,
        fault: bool,
        choice_threads: usize,
    ) -> Result<Self, crate::EngineError> {
        Ok(Self {
            device: Device::spawn(model, choice_threads)?,
            in_flight: None,
            next_future: 0,
            launched: 0,
            fault,
            early: HashMap::new(),
        })
    }

    /// Whether a step is running on the device.
    pub fn busy(&self) -> bool {
        self.in_flight.is_some()
    }
}

impl Drop for Pipeline {
    /// Take back a step still running (the scheduler is going away): its states free their
    /// pages as they drop, except those the fault already released early.
    fn drop(&mut self) {
        if self.in_flight.take().is_some()
            && let Some(done) = self.device.wait()
        {
            for m in done.members {
                if self.early.contains_key(&m.id) {
                    std::mem::forget(m.state);
                }
            }
        }
    }
}

/// The pool kind of a store name.
fn kind_of(name: &str) -> Option<PoolKind> {
    PoolKind::ALL.into_iter().find(|k| k.name() == name)
}

/// Every pooled page a sequence's state holds.
pub(crate) fn state_pages(st: &SequenceState) -> Vec<(PoolKind, u32)> {
    let mut out = Vec::new();
    let mut add = |p: Option<&PooledPages>| {
        if let Some(p) = p
            && let Some(k) = kind_of(p.store().name())
        {
            out.extend(p.ids().iter().map(|&id| (k, id)));
        }
    };
    for l in &st.layers {
        add(l.swa.pooled_pages());
        for c in l.compressor.iter().chain(&l.indexer) {
            add(c.ring.pooled_pages());
            add(c.entries.pooled_pages());
        }
    }
    out
}

/// Step timings the scheduler keeps (the most recent).
const TIMING_LOG: usize = 1 << 16;

impl Scheduler {
    /// The timings of the steps run since the last call, oldest first (the most recent 65536).
    pub fn take_step_timings(&mut self) -> Vec<StepTiming> {
        self.timings.drain(..).collect()
    }

    pub(super) fn record_timing(&mut self, t: StepTiming) {
        if self.timings.len() == TIMING_LOG {
            self.timings.pop_front();
        }
        self.timings.push_back(t);
    }

    /// One overlapped step (see the module docs); false when there was nothing to do.
    pub(super) fn step_overlap(&mut self, pipe: &mut Pipeline) -> bool {
        let t0 = std::time::Instant::now();
        self.reap_disconnected();
        let before = self.running.len();
        self.admit();
        if let Some(f) = pipe.in_flight.as_mut()
            && f.snapshot.is_some()
        {
            for st in self.running[before..]
                .iter()
                .filter_map(|s| s.state.as_ref())
            {
                for (k, p) in state_pages(st) {
                    f.admitted.entry(k.name()).or_default().insert(p);
                }
            }
        }
        if self.running.is_empty() && !pipe.busy() {
            return false;
        }
        let (computed0, generated0) = (
            self.counters.computed_tokens,
            self.counters.generated_tokens,
        );
        let mut plan = self.plan_overlap(pipe.in_flight.as_ref());
        let mut outcomes = Vec::new();
        if let Some(f) = pipe.in_flight.take() {
            match pipe.device.wait() {
                Some(done) => match self.collect(pipe, f, done) {
                    Some(o) => outcomes = o,
                    None => plan.clear(),
                },
                None => {
                    for id in f.tracks.keys() {
                        if let Some(i) = self.position(*id) {
                            self.fail(i, "the overlap scheduler's device thread stopped".into());
                        }
                    }
                    plan.clear();
                }
            }
        }
        if !plan.is_empty() {
            self.launch(pipe, plan, &outcomes);
        }
        for o in outcomes {
            self.accept(o);
        }
        let computed = self.counters.computed_tokens - computed0;
        let generated = self.counters.generated_tokens - generated0;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        self.counters.step(ms, generated, computed);
        true
    }

    /// The next step's members and inputs, given the step in flight.
    fn plan_overlap(&self, in_flight: Option<&InFlight>) -> Vec<Planned> {
        let mut budget = self.cfg.chunked_prefill_size.unwrap_or(usize::MAX);
        let mut plan = Vec::new();
        for s in &self.running {
            let (fed, future) = match in_flight.and_then(|f| f.tracks.get(&s.id)) {
                Some(t) => (t.pos_after, t.future),
                None => (s.fed(), None),
            };
            let total = s.tokens.len() + usize::from(future.is_some());
            let unfed = total.saturating_sub(fed);
            let mut n = if unfed <= 1 { unfed } else { unfed.min(budget) };
            if let Some(p) = &self.prefix {
                let page = p.page_size();
                n = n.min((fed / page + 1) * page - fed);
            }
            if unfed > 1 {
                budget -= n;
            }
            if n == 0 {
                continue;
            }
            let slots = (fed..fed + n)
                .map(|i| match s.tokens.get(i) {
                    Some(&t) => Slot::Known(t),
                    // Unresolvable (and reported by the device) if there is no future.
                    None => Slot::Future(future.unwrap_or(FutureId::MAX)),
                })
                .collect();
            plan.push(Planned {
                id: s.id,
                fed,
                slots,
                sample: fed + n == total && s.req.max_tokens > 0,
            });
        }
        plan
    }

    /// Take a finished step back; None when its members failed or were preempted (the planned
    /// next step is then dropped and planned again).
    fn collect(&mut self, pipe: &mut Pipeline, f: InFlight, done: Done) -> Option<Vec<Outcome>> {
        let Done {
            step,
            members,
            result,
            idle_ms,
            run_ms,
        } = done;
        self.record_timing(StepTiming {
            running: members.len(),
            decode: f.decode,
            run_ms,
            exposed_ms: idle_ms,
        });
        let mut held: BTreeMap<&'static str, BTreeSet<u32>> = BTreeMap::new();
        if f.snapshot.is_some() {
            for m in &members {
                let early = pipe.early.get(&m.id);
                for (k, p) in state_pages(&m.state) {
                    if !early.is_some_and(|e| e.contains(&(k, p))) {
                        held.entry(k.name()).or_default().insert(p);
                    }
                }
            }
        }
        let (mut live, mut outcomes) = (Vec::new(), Vec::new());
        for m in members {
            let MemberDone {
                id,
                state,
                sampler,
                rows,
                choice,
                row,
                prompt,
            } = m;
            self.counters.computed_tokens += rows as u64;
            let Some(i) = self.position(id) else {
                self.release_retired(pipe, id, state);
                continue;
            };
            let s = &mut self.running[i];
            s.state = Some(state);
            if let Some(sm) = sampler {
                s.sampler = sm.state;
            }
            if let Some((first, entries)) = prompt {
                s.record_prompt(first, entries);
            }
            live.push(id);
            if let Some(choice) = choice {
                outcomes.push(Outcome { id, choice, row });
            }
        }
        // Finish the host-tier load-backs the step started; their waited-for writes are declared.
        let transfers = self.hicache.as_mut().map(crate::hicache::HostTier::settle);
        let report = match result {
            Ok(r) => {
                self.counters.logit_rows += r.logit_rows as u64;
                r
            }
            Err(e) => {
                self.step_failed(&live, &e);
                return None;
            }
        };
        if let (Some(snap), Some(cfg)) = (f.snapshot, self.debug.canary.clone()) {
            // Load-backs write pages of requests admitted while the step ran: they join the
            // write set, not the ownership check of the step's own writes.
            let mut writes = report.writes.clone();
            writes.extend(transfers.into_iter().flatten());
            let mut findings = snap.compare_except(step, &writes, &f.admitted);
            findings.extend(canary::ownership(
                step,
                self.pools.all(),
                &cfg,
                &report.writes,
                &held,
            ));
            if !findings.is_empty() && self.canary(findings) {
                for id in live.iter().rev() {
                    if let Some(i) = self.position(*id) {
                        self.fail(
                            i,
                            "the cache-page canary saw pages change outside the step's write \
                             set, or written for a request that does not hold them (debug.canary)"
                                .into(),
                        );
                    }
                }
                return None;
            }
        }
        if let Some(p) = &mut self.prefix {
            for id in &live {
                let Some(s) = self.running.iter().find(|s| s.id == *id) else {
                    continue;
                };
                if let Some(st) = &s.state
                    && st.pos.is_multiple_of(p.page_size())
                    && st.pos <= s.tokens.len()
                {
                    p.insert(&s.tokens[..st.pos], st);
                }
            }
        }
        for id in &live {
            self.finish_prompt_only(*id);
        }
        Some(outcomes)
    }

    /// Free a request retired while its last step ran, now that the step is done; under the
    /// fault its launch-time pages were already released, so only pages taken since are.
    fn release_retired(&mut self, pipe: &mut Pipeline, id: RequestId, state: SequenceState) {
        let Some(early) = pipe.early.remove(&id) else {
            drop(state);
            return;
        };
        for (k, p) in state_pages(&state) {
            if !early.contains(&(k, p)) {
                self.pools.pool(k).release(p);
            }
        }
        // Dropping the state would release the early pages a second time.
        std::mem::forget(state);
    }

    /// Make room for the planned step and hand it to the device.
    fn launch(&mut self, pipe: &mut Pipeline, mut plan: Vec<Planned>, outcomes: &[Outcome]) {
        // A request whose token could not be chosen fails once the outcomes are processed.
        let failed: BTreeSet<RequestId> = outcomes
            .iter()
            .filter(|o| o.choice.token.is_err())
            .map(|o| o.id)
            .collect();
        plan.retain(|p| {
            !failed.contains(&p.id)
                && self
                    .position(p.id)
                    .and_then(|i| self.running[i].state.as_ref())
                    .is_some_and(|st| st.pos == p.fed)
        });
        let kept = self.reserve(plan.iter().map(|p| (p.id, p.slots.len())).collect());
        plan.retain(|p| kept.iter().any(|(id, _)| *id == p.id));
        if plan.is_empty() {
            return;
        }
        // Prefill chunks first, then decodes (rows are independent, so only the order of the
        // store launches' writes changes).
        plan.sort_by_key(|p| p.slots.len() == 1);
        let snapshot = self
            .debug
            .canary
            .as_ref()
            .map(|c| Snapshot::take(self.pools.all(), c));
        let eos = self.model.cfg.eos_token_id;
        let decode = plan.iter().all(|p| p.slots.len() == 1);
        let (mut tracks, mut members) = (HashMap::new(), Vec::new());
        for p in plan {
            let Some(i) = self.position(p.id) else {
                continue;
            };
            let s = &mut self.running[i];
            let Some(state) = s.state.take() else {
                continue;
            };
            s.launched_from = state.pos;
            let sampler = p.sample.then(|| {
                pipe.next_future += 1;
                Sampler {
                    params: s.req.sampling.clone(),
                    state: std::mem::take(&mut s.sampler),
                    eos: (eos, s.req.ignore_eos),
                    logprobs: s.req.logprobs,
                    token_ids: s.req.logprob_token_ids.clone(),
                    keep_row: s.req.return_logits,
                    future: pipe.next_future,
                }
            });
            let track = Track {
                pos_after: state.pos + p.slots.len(),
                future: sampler.as_ref().map(|x| x.future),
                pages: if pipe.fault {
                    state_pages(&state)
                } else {
                    Vec::new()
                },
            };
            tracks.insert(p.id, track);
            members.push(Member {
                id: p.id,
                prompt: s.prompt_rows(p.fed, p.slots.len()),
                state,
                slots: p.slots,
                sampler,
            });
        }
        if pipe.fault {
            self.free_early(pipe, &tracks, outcomes);
        }
        let step = pipe.launched;
        pipe.launched += 1;
        match pipe.device.launch(Job { step, members }) {
            Ok(()) => {
                pipe.in_flight = Some(InFlight {
                    tracks,
                    decode,
                    snapshot,
                    admitted: BTreeMap::new(),
                });
            }
            Err(job) => {
                for m in job.members {
                    if let Some(i) = self.position(m.id) {
                        let s = &mut self.running[i];
                        s.state = Some(m.state);
                        if let Some(sm) = m.sampler {
                            s.sampler = sm.state;
                        }
                        self.fail(i, "the overlap scheduler's device thread stopped".into());
                    }
                }
            }
        }
    }

    /// The `stale-page-reuse` fault: release now the pages held only by the step's requests
    /// that the collected step's token finishes (end of sequence, or the length limit), although
    /// they are in the step about to run. (A shared page is left alone: the finished request's
    /// stale write would copy it and release it a second time.)
    fn free_early(
        &mut self,
        pipe: &mut Pipeline,
        tracks: &HashMap<RequestId, Track>,
        outcomes: &[Outcome],
    ) {
        let eos = self.model.cfg.eos_token_id;
        for o in outcomes {
            let (Ok(tok), Some(t)) = (&o.choice.token, tracks.get(&o.id)) else {
                continue;
            };
            let Some(s) = self.running.iter().find(|s| s.id == o.id) else {
                continue;
            };
            let ends = s.req.sampling.ends(*tok, (eos, s.req.ignore_eos))
                || s.generated().len() + 1 >= s.req.max_tokens;
            if !ends {
                continue;
            }
            // The pages only this request holds go back to the free list; pages it shares (with
            // prefix snapshots) keep their other holders and are released when the step returns.
            let early: BTreeSet<(PoolKind, u32)> = t
                .pages
                .iter()
                .copied()
                .filter(|&(k, p)| self.pools.pool(k).refs(p) == 1)
                .collect();
            tracing::debug!(id = %o.id, pages = early.len(), "fault: pages freed a step early");
            for &(k, p) in &early {
                self.pools.pool(k).release(p);
            }
            pipe.early.insert(o.id, early);
        }
    }

    /// Process one collected token (the request may have been preempted meanwhile).
    fn accept(&mut self, o: Outcome) {
        let eos = self.model.cfg.eos_token_id;
        let (running, i) = match self.position(o.id) {
            Some(i) => (true, i),
            None => match self.waiting.iter().position(|s| s.id == o.id) {
                Some(i) => (false, i),
                None => return,
            },
        };
        let s = if running {
            &mut self.running[i]
        } else {
            &mut self.waiting[i]
        };
        let before = s.generated().len();
        let after = s.accept(o.choice, &o.row, eos, self.detok.as_ref());
        self.counters.generated_tokens += (s.generated().len() - before) as u64;
        let (reason, error) = match after {
            AfterToken::Continue => return,
            AfterToken::Finish(r) => (r, None),
            AfterToken::Fail(m) => (FinishReason::Error, Some(m)),
        };
        let seq = if running {
            self.running.remove(i)
        } else {
            self.waiting.remove(i).expect("index from position")
        };
        match &error {
            Some(m) => tracing::warn!(id = %seq.id, error = %m, "request failed"),
            None => tracing::debug!(id = %seq.id, reason = reason.as_str(), "finished"),
        }
        self.counters.finished += 1;
        // If it is in the launched step, its pages are freed when that step completes.
        self.retire(seq, reason, error);
    }
}

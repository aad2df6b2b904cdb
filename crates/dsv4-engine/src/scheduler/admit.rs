//! Admission: which waiting request runs next (under the schedule policy, highest priority
//! first, passing over those that wait for a running request's prefill of pages they share, and
//! those that yield while the yield cap is reached), restoring its longest cached prefix, and
//! priority preemption when every running slot is taken.

use super::Scheduler;
use crate::config::SchedulePolicy;
use crate::hicache;
use crate::sequence::Seq;
use dsv4_model::ForwardError;
use std::time::Instant;

/// Waiting requests a first-come-first-served admission looks at for one that need not wait for
/// a running request's prefill (bounds the cost of a step under a long queue).
const HELD_SCAN: usize = 64;

impl Scheduler {
    /// Index of the next waiting request to admit under the policy, among those of the highest
    /// priority waiting (the queue's front), passing over those that wait for a running
    /// request's prefill ([`Self::waits_for_shared_prefill`]; each counts once in
    /// `prefill_waits`); None when every request looked at waits (first come, first served
    /// looks at the first [`HELD_SCAN`]).
    fn pick(&mut self) -> Option<usize> {
        let mut held = Vec::new();
        // Requests that yield wait while the yield cap is reached.
        let capped = self.yielding() >= self.yield_cap;
        let eligible = |s: &Seq| !(capped && s.req.yields);
        let top = self
            .waiting
            .iter()
            .find(|s| eligible(s))
            .map(|s| s.req.priority);
        let group = || {
            self.waiting
                .iter()
                .enumerate()
                .filter(move |(_, s)| eligible(s))
                .take_while(move |(_, s)| Some(s.req.priority) == top)
        };
        let picked = match (self.cfg.schedule_policy, &self.prefix) {
            (SchedulePolicy::Lpm, Some(p)) => {
                let mut best: Option<(usize, usize)> = None;
                for (i, s) in group() {
                    let m = p.match_len(&s.tokens, s.prefix_limit());
                    if best.is_some_and(|(_, b)| m <= b) {
                        continue;
                    }
                    if self.waits_for_shared_prefill(s, Some(m)) {
                        held.push(i);
                    } else {
                        best = Some((i, m));
                    }
                }
                best.map(|(i, _)| i)
            }
            _ => {
                let mut found = None;
                for (i, s) in group().take(HELD_SCAN) {
                    if self.waits_for_shared_prefill(s, None) {
                        held.push(i);
                    } else {
                        found = Some(i);
                        break;
                    }
                }
                found
            }
        };
        for i in held {
            let s = &mut self.waiting[i];
            if !s.waited_for_prefill {
                s.waited_for_prefill = true;
                self.counters.prefill_waits += 1;
            }
        }
        picked
    }

    /// Whether waiting request `s`, whose first `cached` tokens the prefix cache holds (None:
    /// not looked up yet), should wait (`in_batch_prefix_caching`): a running request is still
    /// prefilling the next whole page of prompt `s` shares with it past those, and will
    /// snapshot it there, so `s` admitted a little later reuses it instead of computing it
    /// again. The running request always progresses, so the wait ends.
    fn waits_for_shared_prefill(&self, s: &Seq, cached: Option<usize>) -> bool {
        let Some(p) = self
            .prefix
            .as_ref()
            .filter(|_| self.cfg.in_batch_prefix_caching)
        else {
            return false;
        };
        let page = p.page_size();
        let limit = s.prefix_limit();
        let cached = cached.unwrap_or_else(|| p.match_len(&s.tokens, limit));
        self.running.iter().any(|r| {
            let end = (cached.max(r.progress()) / page + 1) * page;
            end <= limit && end <= r.tokens.len() && r.tokens[..end] == s.tokens[..end]
        })
    }

    /// Drop the least recently used prefix snapshot (spilling it to the host tier when that is
    /// on); false when none is left.
    pub(super) fn evict_snapshot(&mut self) -> bool {
        let tier = self.hicache.as_mut();
        self.prefix
            .as_mut()
            .is_some_and(|p| hicache::evict(p, tier))
    }

    /// Admit waiting requests while running slots (and cache pages) allow, under the policy,
    /// the priorities and the yield cap.
    pub(super) fn admit(&mut self) {
        self.enforce_yield_cap();
        while !self.waiting.is_empty() {
            let full = self.running.len() >= self.cfg.max_running_requests;
            if full && self.cfg.priority_preemption.is_none() {
                break;
            }
            let Some(i) = self.pick() else {
                break;
            };
            // A preempted request goes behind the picked one (of the highest priority), so `i`
            // still names it.
            if full && !self.preempt_for_priority() {
                break;
            }
            let mut seq = self
                .waiting
                .remove(i)
                .expect("pick returns a waiting index");
            let limit = seq.prefix_limit();
            let hit = self.prefix.as_mut().and_then(|p| {
                let hit = p.lookup_node(&seq.tokens, limit)?;
                hicache::serve_hit(p, self.hicache.as_mut(), &self.pools, hit)
            });
            let cached = hit.as_ref().map_or(0, |h| h.0);
            seq.state = match hit {
                Some((_, st)) => Some(st),
                None => loop {
                    match self.model.new_sequence_in(self.pools.stores()) {
                        Ok(st) => break Some(st),
                        Err(ForwardError::PoolExhausted { .. }) if self.evict_snapshot() => {}
                        Err(e) => {
                            tracing::debug!(id = %seq.id, error = %e, "no room to admit; queued");
                            break None;
                        }
                    }
                },
            };
            if seq.state.is_none() {
                self.waiting.insert(i, seq);
                break;
            }
            if seq.cached_tokens.is_none() {
                seq.cached_tokens = Some(cached);
                seq.admitted = Some(Instant::now());
                self.counters.prompt_tokens += seq.prompt_len as u64;
                self.counters.cached_tokens += cached as u64;
            }
            self.admissions += 1;
            seq.admit_order = self.admissions;
            tracing::debug!(id = %seq.id, cached, "admitted");
            self.running.push(seq);
        }
    }

    /// Priority preemption (`EngineConfig::priority_preemption`), when every running slot is
    /// taken: if the highest waiting priority exceeds the lowest running one by more than the
    /// threshold, preempt that request (the latest admitted among equals) and say so. Memory
    /// pressure then preempts by priority too (`reserve`, in `round.rs`).
    fn preempt_for_priority(&mut self) -> bool {
        let (Some(threshold), Some(top)) = (
            self.cfg.priority_preemption,
            self.waiting.front().map(|s| s.req.priority),
        ) else {
            return false;
        };
        let victim = (0..self.running.len()).max_by_key(|&i| {
            let s = &self.running[i];
            (std::cmp::Reverse(s.req.priority), s.admit_order)
        });
        let Some(victim) = victim else {
            return false;
        };
        let gap = i64::from(top) - i64::from(self.running[victim].req.priority);
        if gap <= i64::from(threshold) {
            return false;
        }
        tracing::debug!(
            id = %self.running[victim].id,
            gap,
            "preempted for a higher-priority request"
        );
        self.counters.priority_preemptions += 1;
        self.preempt(victim);
        true
    }
}

//! One round of a step: make room for its members (drop snapshots, preempt), run their forward
//! step with the canary around it, keep prefix snapshots and prompt entries, finish the members
//! that only run their prompt, then choose the sampled members' tokens together
//! (`sampler::choose_all`) and send them, checking the stop conditions in running order.

use super::Scheduler;
use crate::canary::{CanaryFinding, Snapshot};
use crate::hicache::HostTier;
use crate::pools::fresh_pages;
use crate::request::RequestId;
use crate::sampler::{Choice, ChoiceJob, choose_all};
use crate::sequence::{AfterToken, PromptRows, Seq, last_row, logit_rows};
use dsv4_model::forward::Taps;
use dsv4_model::{LogitRows, StepOutputs};
use std::time::Instant;

/// Canary findings the scheduler keeps (the most recent).
const CANARY_LOG: usize = 64;

impl Scheduler {
    /// Make room for `round`: drop snapshots, then preempt the latest admitted requests.
    /// Returns the members still running.
    pub(super) fn reserve(
        &mut self,
        mut round: Vec<(RequestId, usize)>,
    ) -> Vec<(RequestId, usize)> {
        loop {
            round.retain(|(id, _)| self.position(*id).is_some());
            let mut need = [0usize; 7];
            for (id, n) in &round {
                let s = &self.running[self.position(*id).expect("retained")];
                if let Some(st) = &s.state {
                    let f = fresh_pages(st, &self.ratios, *n);
                    need.iter_mut().zip(f).for_each(|(a, b)| *a += b);
                }
            }
            let free = self.pools.free();
            if need.iter().zip(&free).all(|(n, f)| n <= f) || round.is_empty() {
                return round;
            }
            if self.evict_snapshot() {
                continue;
            }
            // The lowest priority, then the latest admitted.
            let victim = (0..self.running.len())
                .max_by_key(|&i| {
                    let s = &self.running[i];
                    (std::cmp::Reverse(s.req.priority), s.admit_order)
                })
                .expect("round members are running");
            if self.running.len() == 1 {
                // Cannot happen for a request that passed Limits::check; never loop forever.
                self.fail(
                    victim,
                    "the cache pools cannot hold this request even alone; raise \
                     cache.max_total_tokens"
                        .into(),
                );
            } else {
                self.preempt(victim);
            }
        }
    }

    /// Log, count and keep canary findings; true when the round must be failed.
    pub(super) fn canary(&mut self, findings: Vec<CanaryFinding>) -> bool {
        self.counters.canary_rounds += 1;
        for f in findings {
            tracing::error!(finding = %f, "canary finding");
            self.counters.canary_pages += f.unexpected_total as u64;
            if self.canary_log.len() == CANARY_LOG {
                self.canary_log.pop_front();
            }
            self.canary_log.push_back(f);
        }
        self.debug.canary.as_ref().is_some_and(|c| c.abort)
    }

    pub(super) fn run_round(&mut self, round: Vec<(RequestId, usize)>) {
        let round = self.reserve(round);
        if round.is_empty() {
            return;
        }
        // Members in running order: (index in running, tokens to run).
        let mut members: Vec<(usize, usize)> = round
            .iter()
            .map(|(id, n)| (self.position(*id).expect("reserved members run"), *n))
            .collect();
        members.sort_by_key(|m| m.0);
        let ids: Vec<RequestId> = members.iter().map(|&(i, _)| self.running[i].id).collect();
        let snapshot = self
            .debug
            .canary
            .as_ref()
            .map(|c| Snapshot::take(self.pools.all(), c));
        let exec = self.model.exec().clone();
        // Per member: the rows it scores for `prompt_logprobs`, and its rows that need logits.
        let mut prompts: Vec<Option<PromptRows>> = Vec::with_capacity(members.len());
        let mut want: Vec<usize> = Vec::with_capacity(members.len());
        let result = {
            let mut states = Vec::with_capacity(members.len());
            let mut toks: Vec<&[u32]> = Vec::with_capacity(members.len());
            let mut next = members.iter().peekable();
            for (i, s) in self.running.iter_mut().enumerate() {
                let Some(&&(j, n)) = next.peek() else {
                    break;
                };
                if i != j {
                    continue;
                }
                next.next();
                let fed = s.fed();
                let rows = s.prompt_rows(fed, n);
                let samples = fed + n == s.tokens.len() && s.req.max_tokens > 0;
                want.push(logit_rows(n, rows.as_ref(), samples));
                prompts.push(rows);
                let Seq { state, tokens, .. } = s;
                let st = state.as_mut().expect("running requests have a state");
                toks.push(&tokens[st.pos..st.pos + n]);
                states.push(st);
            }
            let t = Instant::now();
            let r = self.model.forward_step(
                &mut states,
                &toks,
                StepOutputs {
                    logits: LogitRows::Last(&want),
                    residual: false,
                },
                &exec,
                &mut Taps::none(),
            );
            self.forward_ms += t.elapsed().as_secs_f64() * 1e3;
            r
        };
        // Finish the load-backs the round started; their waited-for writes are declared.
        let transfers = self.hicache.as_mut().map(HostTier::settle);
        let outs = match result {
            Ok((outs, mut report)) => {
                self.counters.logit_rows += report.logit_rows as u64;
                report.writes.extend(transfers.into_iter().flatten());
                let findings = snapshot
                    .map_or_else(Vec::new, |s| s.compare(self.counters.steps, &report.writes));
                if !findings.is_empty() && self.canary(findings) {
                    for id in ids.iter().rev() {
                        if let Some(i) = self.position(*id) {
                            self.fail(
                                i,
                                "the cache-page canary saw pages change outside the \
                                          step's write set (debug.canary)"
                                    .into(),
                            );
                        }
                    }
                    return;
                }
                outs
            }
            Err(e) => {
                self.step_failed(&ids, &e);
                return;
            }
        };
        // Snapshots and prompt entries per member; the members whose last row is sampled.
        let threads = self.cfg.choice_threads;
        let mut due: Vec<(RequestId, usize)> = Vec::new();
        let mut prompt_only: Vec<RequestId> = Vec::new();
        for (k, ((&id, &(_, n)), rows)) in ids.iter().zip(&members).zip(prompts).enumerate() {
            self.counters.computed_tokens += n as u64;
            let i = self
                .position(id)
                .expect("members stay running during the round");
            let s = &mut self.running[i];
            let st = s.state.as_ref().expect("running requests have a state");
            if let Some(p) = &mut self.prefix
                && st.pos.is_multiple_of(p.page_size())
            {
                p.insert(&s.tokens[..st.pos], st);
            }
            let pos = st.pos;
            if let Some(rows) = rows {
                let entries = rows.score(&outs[k].logits, outs[k].vocab, threads);
                s.record_prompt(rows.first, entries);
            }
            if s.prompt_only_done() {
                prompt_only.push(id);
            } else if pos == s.tokens.len() {
                due.push((id, k));
            }
        }
        for id in prompt_only {
            self.finish_prompt_only(id);
        }
        // The members' tokens, chosen in parallel; then their events and stop conditions, in
        // running order.
        let eos = self.model.cfg.eos_token_id;
        let row = |k: usize| last_row(&outs[k].logits, outs[k].vocab);
        let choices: Vec<Choice> = {
            let mut jobs = Vec::with_capacity(due.len());
            let mut next = due.iter().peekable();
            for s in &mut self.running {
                let Some(&&(id, k)) = next.peek() else {
                    break;
                };
                if s.id != id {
                    continue;
                }
                next.next();
                jobs.push(ChoiceJob {
                    state: &mut s.sampler,
                    params: &s.req.sampling,
                    eos: (eos, s.req.ignore_eos),
                    logprobs: s.req.logprobs,
                    token_ids: &s.req.logprob_token_ids,
                    row: row(k),
                    out: None,
                });
            }
            choose_all(&mut jobs, threads);
            jobs.into_iter()
                .map(|j| j.out.expect("choose_all makes every choice"))
                .collect()
        };
        for ((id, k), choice) in due.into_iter().zip(choices) {
            let i = self
                .position(id)
                .expect("members stay running until their token is taken");
            let s = &mut self.running[i];
            let before = s.generated().len();
            let after = s.accept(choice, row(k), eos, self.detok.as_ref());
            self.counters.generated_tokens += (s.generated().len() - before) as u64;
            match after {
                AfterToken::Continue => {}
                AfterToken::Finish(reason) => {
                    let seq = self.running.remove(i);
                    tracing::debug!(id = %seq.id, reason = reason.as_str(), "finished");
                    self.counters.finished += 1;
                    self.retire(seq, reason, None);
                }
                AfterToken::Fail(message) => self.fail(i, message),
            }
        }
    }
}

//! In-batch prefix caching (`EngineConfig::in_batch_prefix_caching`): requests that arrive
//! together sharing whole pages of prompt wait for the first one's prefill and reuse its
//! snapshots instead of computing those pages again (each counted once as a prefill wait), in
//! both schedulers and under both policies; their tokens and logits are the solo runs'.
//! Turned off, each computes its whole prompt. A request scoring its prompt (which cannot skip
//! rows) does not wait.

use super::*;
use dsv4_engine::{EngineConfig, SchedulePolicy, Scheduler};

/// Four prompts sharing 35 tokens (four whole pages of 8), each with its own tail.
fn prompts() -> Vec<Vec<u32>> {
    let shared = tokens(35, 41);
    (0..4)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(tokens(3 + i, 50 + i as u64));
            p
        })
        .collect()
}

fn config(overlap: bool, policy: SchedulePolicy, on: bool) -> EngineConfig {
    EngineConfig {
        page_size: 8,
        chunked_prefill_size: Some(16),
        overlap_schedule: overlap,
        schedule_policy: policy,
        in_batch_prefix_caching: on,
        ..Default::default()
    }
}

#[test]
fn requests_sharing_a_prompt_prefill_the_shared_pages_once() {
    let m = model();
    let prompts = prompts();
    let solos: Vec<Solo> = prompts.iter().map(|p| solo(&m, p, 3)).collect();
    for overlap in [false, true] {
        for policy in [SchedulePolicy::Fcfs, SchedulePolicy::Lpm] {
            for on in [false, true] {
                let what = format!("overlap={overlap} {policy:?} in_batch_prefix_caching={on}");
                let mut s = Scheduler::new(m.clone(), config(overlap, policy, on), None).unwrap();
                let streams: Vec<_> = prompts
                    .iter()
                    .map(|p| s.submit(greedy(p.clone(), 3)).unwrap())
                    .collect();
                while s.step() {}
                let done: Vec<Completion> = streams
                    .into_iter()
                    .map(|st| st.collect_blocking())
                    .collect();
                for (i, (c, solo)) in done.iter().zip(&solos).enumerate() {
                    assert_same_as_solo(c, solo, &format!("{what}: request {i}"));
                }
                let cached: Vec<usize> = done
                    .iter()
                    .map(|c| c.finished.usage.cached_tokens)
                    .collect();
                let want = if on { [0, 32, 32, 32] } else { [0; 4] };
                assert_eq!(cached, want, "{what}");
                let m = s.metrics();
                assert_eq!(m.cached_tokens_total, want.iter().sum::<usize>() as u64);
                assert_eq!(m.prefill_waits_total, if on { 3 } else { 0 }, "{what}");
            }
        }
    }
}

#[test]
fn a_request_scoring_its_prompt_does_not_wait() {
    let m = model();
    let prompts = prompts();
    let mut s = Scheduler::new(m.clone(), config(false, SchedulePolicy::Fcfs, true), None).unwrap();
    let first = s.submit(greedy(prompts[0].clone(), 2)).unwrap();
    let waits = s.submit(greedy(prompts[1].clone(), 2)).unwrap();
    let scores = s
        .submit(Request {
            prompt_logprobs: Some(1),
            ..greedy(prompts[2].clone(), 2)
        })
        .unwrap();
    assert!(s.step());
    let metrics = s.metrics();
    assert_eq!(
        (metrics.running_requests, metrics.queued_requests),
        (2, 1),
        "the first request and the scoring one run; the other waits"
    );
    while s.step() {}
    let cached: Vec<usize> = [first, waits, scores]
        .into_iter()
        .map(|st| st.collect_blocking().finished.usage.cached_tokens)
        .collect();
    assert_eq!(cached, [0, 32, 0]);
}

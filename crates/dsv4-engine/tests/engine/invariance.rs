//! Batch invariance: 32 different prompts submitted in staggered waves (each wave's prefills
//! join the previous wave's decode steps) give bitwise the tokens and logits of each run alone,
//! with the prefix cache on and off and chunked prefill on and off.

use super::*;
use dsv4_engine::{
    CacheBudget, Completion, Engine, EngineConfig, EngineHandle, Event, FinishReason,
    RequestStream, SchedulePolicy,
};
use std::sync::OnceLock;

const MAX_TOKENS: usize = 4;

/// 32 prompts: three families share a 24-token prefix after BOS (so the prefix cache has
/// something to reuse), every fourth is unrelated; two are longer than 128 tokens so C128
/// entries exist.
fn prompts() -> &'static Vec<Vec<u32>> {
    static P: OnceLock<Vec<Vec<u32>>> = OnceLock::new();
    P.get_or_init(|| {
        (0..32usize)
            .map(|i| {
                let mut p = vec![0];
                if i % 4 != 3 {
                    p.extend(tokens(24, 1000 + (i % 4) as u64));
                }
                let len = if i == 5 || i == 18 {
                    132
                } else {
                    3 + (i * 7) % 23
                };
                p.extend(tokens(len, 2000 + i as u64));
                p
            })
            .collect()
    })
}

fn solos() -> &'static Vec<Solo> {
    static S: OnceLock<Vec<Solo>> = OnceLock::new();
    S.get_or_init(|| {
        let m = model();
        prompts().iter().map(|p| solo(&m, p, MAX_TOKENS)).collect()
    })
}

/// Fold a stream (after `seen` events already read) into a completion.
fn finish(mut s: RequestStream, seen: Vec<Event>) -> Completion {
    let mut c = Completion {
        id: s.id(),
        tokens: Vec::new(),
        logits: Vec::new(),
        logprobs: Vec::new(),
        prompt_logprobs: Vec::new(),
        finished: dsv4_engine::Finished {
            reason: FinishReason::Error,
            usage: Default::default(),
            timing: Default::default(),
            text: None,
            error: Some("stream ended without Finished".into()),
            stop_token: None,
        },
    };
    let mut events = seen.into_iter();
    while let Some(ev) = events.next().or_else(|| s.blocking_next()) {
        match ev {
            Event::Prompt(p) => c.prompt_logprobs = p,
            Event::Token(t) => {
                c.tokens.push(t.token);
                c.logits.extend(t.logits);
                c.logprobs.extend(t.logprob);
            }
            Event::Finished(f) => {
                c.finished = f;
                break;
            }
        }
    }
    c
}

/// Submit `requests` in waves of 4; each wave goes in once the previous wave's last request
/// has its first token (so new prefills join running decodes).
pub fn staggered(engine: &EngineHandle, requests: Vec<Request>) -> Vec<Completion> {
    let mut held: Vec<(RequestStream, Vec<Event>)> = Vec::new();
    for wave in requests.chunks(4) {
        for r in wave {
            held.push((engine.submit(r.clone()).unwrap(), Vec::new()));
        }
        let (s, seen) = held.last_mut().unwrap();
        seen.extend(s.blocking_next());
    }
    held.into_iter().map(|(s, seen)| finish(s, seen)).collect()
}

/// `choice_threads` above 1 chooses the tokens of a step on that many threads (at the tiny
/// model's vocabulary the automatic count is 1).
fn check(
    prefix_cache: bool,
    chunked_prefill_size: Option<usize>,
    policy: SchedulePolicy,
    choice_threads: usize,
) {
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(4096),
        page_size: 8,
        prefix_cache,
        max_running_requests: 32,
        chunked_prefill_size,
        schedule_policy: policy,
        in_batch_prefix_caching: true,
        hicache: None,
        overlap_schedule: false,
        choice_threads,
        priority_preemption: None,
    };
    let engine = Engine::spawn(model(), cfg).unwrap();
    let reqs = prompts()
        .iter()
        .map(|p| greedy(p.clone(), MAX_TOKENS))
        .collect();
    let done = staggered(&engine, reqs);
    let what = format!(
        "prefix_cache={prefix_cache} chunked={chunked_prefill_size:?} threads={choice_threads}"
    );
    for (i, (c, s)) in done.iter().zip(solos()).enumerate() {
        assert_eq!(
            c.finished.reason,
            FinishReason::Length,
            "{what}: request {i}"
        );
        assert_same_as_solo(c, s, &format!("{what}: request {i}"));
    }
    let m = engine.metrics();
    if prefix_cache {
        let cached: usize = done.iter().map(|c| c.finished.usage.cached_tokens).sum();
        assert!(
            cached >= 24,
            "{what}: the shared prefixes were reused ({cached} tokens)"
        );
        assert!(m.prefix_hit_rate > 0.0, "{what}: hit rate in the metrics");
    } else {
        assert_eq!(m.cached_tokens_total, 0);
    }
    assert!(m.steps_total > 0 && m.generated_tokens_total == 32 * MAX_TOKENS as u64);
}

#[test]
fn concurrent_equals_solo_without_prefix_cache_or_chunking() {
    check(false, None, SchedulePolicy::Fcfs, 0);
}

#[test]
fn concurrent_equals_solo_with_chunked_prefill() {
    check(false, Some(16), SchedulePolicy::Fcfs, 0);
}

#[test]
fn concurrent_equals_solo_with_prefix_cache() {
    check(true, None, SchedulePolicy::Fcfs, 0);
}

#[test]
fn concurrent_equals_solo_with_prefix_cache_chunking_lpm_and_parallel_choice() {
    check(true, Some(16), SchedulePolicy::Lpm, 3);
}

#[test]
fn seeded_sampling_does_not_depend_on_the_batch() {
    use dsv4_engine::sampling::sample;
    let m = model();
    let reqs: Vec<Request> = prompts()[..8]
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            sampling: SamplingParams {
                temperature: 0.8,
                top_p: 0.9,
                top_k: 50,
                seed: 77 + i as u64,
                ..Default::default()
            },
            ..greedy(p.clone(), 5)
        })
        .collect();
    let alone: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| {
            let mut rng = SplitMix64::new(r.sampling.seed);
            let mut st = m.new_sequence();
            let out = m.forward(&mut st, &r.prompt).unwrap();
            let mut row = out.logits[out.logits.len() - out.vocab..].to_vec();
            let mut toks = Vec::new();
            while toks.len() < r.max_tokens {
                let t = sample(&row, &r.sampling, &mut rng);
                if t == m.cfg.eos_token_id {
                    break;
                }
                toks.push(t);
                row = m.forward(&mut st, &[t]).unwrap().logits;
            }
            toks
        })
        .collect();
    let engine = Engine::spawn(m, EngineConfig::default()).unwrap();
    let done = staggered(&engine, reqs);
    for (i, (c, a)) in done.iter().zip(&alone).enumerate() {
        assert_eq!(&c.tokens, a, "request {i}");
    }
    assert!(
        done.iter()
            .zip(solos())
            .any(|(c, s)| c.tokens[..4] != s.0[..]),
        "sampling departs from greedy somewhere"
    );
}

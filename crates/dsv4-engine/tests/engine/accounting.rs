//! Pool accounting: after any mix of finished, cancelled (explicitly or by dropping the stream)
//! and preempted requests, every page of every pool is free again; preempted requests still
//! produce exactly the tokens of their solo run.

use super::*;
use dsv4_engine::pools::CacheGeometry;
use dsv4_engine::{
    CacheBudget, EngineConfig, EngineError, FinishReason, PoolKind, RequestStream, Scheduler,
};
use std::collections::BTreeMap;

/// Pools for `slots` sequences of `len` tokens, with the KV and index-K pools of ratio-4
/// layers cut to `c4_slots` sequences.
pub fn tight_pages(len: usize, slots: usize, c4_slots: usize) -> BTreeMap<PoolKind, usize> {
    let per = CacheGeometry::of(&model()).pages_for_len(len);
    PoolKind::ALL
        .into_iter()
        .map(|k| {
            let n = if matches!(k, PoolKind::C4Kv | PoolKind::C4IndexK) {
                c4_slots
            } else {
                slots
            };
            (k, per[k.index()] * n)
        })
        .collect()
}

/// Twelve requests (half sharing an 8-token prefix) on pools cut so the C4 pools force
/// preemptions, chunked prefill of 12 tokens, three steps run: the scheduler, the prompts and
/// the streams (shared by the serial and the overlapped accounting tests).
pub fn tight_mixed_workload(
    m: &Arc<Model>,
    overlap_schedule: bool,
) -> (Scheduler, Vec<Vec<u32>>, Vec<Option<RequestStream>>) {
    let cfg = EngineConfig {
        cache: CacheBudget::Pages(tight_pages(40, 12, 3)),
        page_size: 8,
        prefix_cache: true,
        max_running_requests: 12,
        chunked_prefill_size: Some(12),
        overlap_schedule,
        ..Default::default()
    };
    let mut s = Scheduler::new(m.clone(), cfg, None).unwrap();
    let prompts: Vec<Vec<u32>> = (0..12usize)
        .map(|i| {
            let mut p = vec![0];
            if i % 2 == 0 {
                p.extend(tokens(8, 500));
            }
            p.extend(tokens(8 + (i * 5) % 17, 600 + i as u64));
            p
        })
        .collect();
    let streams: Vec<Option<_>> = prompts
        .iter()
        .map(|p| Some(s.submit(greedy(p.clone(), 6)).unwrap()))
        .collect();
    for _ in 0..3 {
        assert!(s.step());
    }
    (s, prompts, streams)
}

#[test]
fn every_page_is_free_after_finished_cancelled_and_preempted_requests() {
    let m = model();
    let (mut s, prompts, mut streams) = tight_mixed_workload(&m, false);
    let cancelled = streams[3].as_ref().unwrap().id();
    assert!(s.cancel(cancelled), "request 3 is held");
    assert!(!s.cancel(cancelled), "and gone after cancelling");
    streams[5] = None; // the client went away
    while s.step() {}
    assert!(s.is_idle());
    let m2 = s.metrics();
    assert!(m2.preemptions_total > 0, "the C4 pools forced preemptions");
    assert_eq!(m2.requests_cancelled, 2);
    assert!(m2.prefix_snapshots > 0, "snapshots still hold pages");
    for (i, st) in streams.into_iter().enumerate() {
        let Some(st) = st else { continue };
        let c = st.collect_blocking();
        if i == 3 {
            assert_eq!(c.finished.reason, FinishReason::Cancelled);
            continue;
        }
        assert_eq!(c.finished.reason, FinishReason::Length, "request {i}");
        assert_same_as_solo(&c, &solo(&m, &prompts[i], 6), &format!("request {i}"));
    }
    assert_eq!(
        s.clear_prefix_cache(),
        m2.prefix_snapshots,
        "every snapshot dropped"
    );
    assert_eq!(s.metrics().prefix_snapshots, 0);
    for u in s.pools().usage() {
        assert_eq!(u.used_pages, 0, "pool {} still has pages in use", u.pool);
    }
    assert!(s.pools().all_free());
}

#[test]
fn requests_the_pools_cannot_hold_are_refused_up_front() {
    let cfg = EngineConfig {
        cache: CacheBudget::Pages(tight_pages(40, 2, 2)),
        ..Default::default()
    };
    let mut s = Scheduler::new(model(), cfg, None).unwrap();
    // 2000 tokens need 8 C4 pages per layer; the pool holds 2.
    let e = s.submit(greedy(tokens(1990, 1), 10)).unwrap_err();
    assert!(matches!(e, EngineError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("max_total_tokens"), "{e}");
    let e = s.submit(greedy(vec![0, 9999], 1)).unwrap_err();
    assert!(e.to_string().contains("9999"), "{e}");
    let e = s.submit(greedy(vec![], 1)).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    let e = s
        .submit(Request {
            stop: vec!["x".into()],
            ..greedy(vec![0, 5], 1)
        })
        .unwrap_err();
    assert!(e.to_string().contains("tokenizer"), "{e}");
    assert!(s.is_idle() && s.pools().all_free());
}

#[test]
fn cancelling_through_the_handle_and_dropping_streams_free_every_page() {
    use dsv4_engine::{Engine, Event};
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(2048),
        prefix_cache: false,
        ..Default::default()
    };
    let engine = Engine::spawn(model(), cfg).unwrap();
    let mut prompt = vec![0];
    prompt.extend(tokens(10, 1));
    let mut a = engine.submit(greedy(prompt.clone(), 1000)).unwrap();
    let b = engine.submit(greedy(prompt, 1000)).unwrap();
    assert!(matches!(a.blocking_next(), Some(Event::Token(_))), "a runs");
    engine.cancel(a.id());
    let reason = loop {
        match a.blocking_next() {
            Some(Event::Finished(f)) => break f.reason,
            Some(Event::Token(_) | Event::Prompt(_)) => {}
            None => panic!("stream ended without Finished"),
        }
    };
    assert_eq!(reason, FinishReason::Cancelled);
    drop(b);
    // The engine notices the dropped stream before its next step; wait for it to go idle.
    let mut m = engine.metrics();
    for _ in 0..10_000 {
        if m.running_requests == 0 && m.queued_requests == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        m = engine.metrics();
    }
    assert_eq!((m.running_requests, m.queued_requests), (0, 0));
    assert_eq!(m.requests_cancelled, 2);
    for u in &m.pools {
        assert_eq!(u.used_pages, 0, "pool {}", u.pool);
    }
}

/// The metrics count the tokens the running requests hold and the waiting ones will prefill
/// (what `/get_load` reports to a router), with and without overlap scheduling, and both fall
/// to zero once the requests end.
#[test]
fn metrics_count_the_tokens_of_running_and_waiting_requests() {
    let m = model();
    for overlap_schedule in [false, true] {
        let cfg = EngineConfig {
            max_running_requests: 1,
            overlap_schedule,
            ..Default::default()
        };
        let mut sched = Scheduler::new(m.clone(), cfg, None).unwrap();
        let a = sched.submit(greedy(prompt8(51), 6)).unwrap();
        let b = sched.submit(greedy(prompt8(52), 6)).unwrap();
        let mt = sched.metrics();
        assert_eq!(
            (mt.running_tokens, mt.queued_tokens),
            (0, 16),
            "both wait (overlap {overlap_schedule})"
        );
        assert!(sched.step());
        let mt = sched.metrics();
        // a holds its prompt and, once a step has sampled, the tokens generated so far.
        let generated = mt.generated_tokens_total;
        assert_eq!(
            (mt.running_requests, mt.queued_requests),
            (1, 1),
            "overlap {overlap_schedule}"
        );
        assert_eq!(
            (mt.running_tokens, mt.queued_tokens),
            (8 + generated, 8),
            "overlap {overlap_schedule}"
        );
        while sched.step() {}
        let mt = sched.metrics();
        assert_eq!((mt.running_tokens, mt.queued_tokens), (0, 0));
        assert_same_as_solo(&a.collect_blocking(), &solo(&m, &prompt8(51), 6), "a");
        assert_same_as_solo(&b.collect_blocking(), &solo(&m, &prompt8(52), 6), "b");
    }
}

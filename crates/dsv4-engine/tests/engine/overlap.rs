//! Overlap scheduling (`overlap_schedule`): with and without overlap, many concurrent requests
//! of different lengths that finish at different steps give bitwise the tokens and logits of
//! their solo runs (prefix cache on and off, under preemption pressure, with the canary on and
//! silent), seeded sampling gives the same tokens in both modes, every page is free at the
//! end; the `stale-page-reuse` fault is caught by the canary's ownership check and shows as a
//! divergence from the solo runs.

use super::accounting::{tight_mixed_workload, tight_pages};
use super::invariance::staggered;
use super::*;
use dsv4_engine::sampling::logprob_with;
use dsv4_engine::{
    CacheBudget, CanaryCheck, CanaryConfig, CanaryFinding, Completion, DebugOptions, Engine,
    EngineConfig, EngineMetrics, FinishReason, Scheduler,
};
use dsv4_model::forward::{ExecOptions, Fault};

/// Greedy requests, then two seeded sampled ones: prompts of 6 to 28 tokens, half sharing an
/// 8-token prefix, asking for 2 to 7 tokens (so they finish at different steps).
pub fn requests() -> Vec<Request> {
    (0..16usize)
        .map(|i| {
            let mut p = vec![0];
            if i % 2 == 0 {
                p.extend(tokens(8, 500));
            }
            p.extend(tokens(5 + (i * 5) % 23, 700 + i as u64));
            let mut r = greedy(p, 2 + i % 6);
            if i >= 14 {
                r.sampling = SamplingParams {
                    temperature: 0.9,
                    seed: 40 + i as u64,
                    ..Default::default()
                };
            }
            r
        })
        .collect()
}

/// The solo runs of the greedy requests.
fn solos() -> &'static Vec<Solo> {
    static S: OnceLock<Vec<Solo>> = OnceLock::new();
    S.get_or_init(|| {
        let m = model();
        requests()
            .iter()
            .filter(|r| r.sampling.temperature == 0.0)
            .map(|r| solo(&m, &r.prompt, r.max_tokens))
            .collect()
    })
}

use std::sync::OnceLock;

/// The tiny model with `stale-page-reuse` injected.
fn faulty_model() -> Arc<Model> {
    let mut m = load_model(
        &ModelSource::Tiny { seed: 0 },
        Arc::new(ReferenceBackend),
        numerics(),
    )
    .expect("tiny model loads");
    m.set_exec(ExecOptions {
        faults: [Fault::StalePageReuse].into(),
        ..Default::default()
    });
    Arc::new(m)
}

pub struct Run {
    pub done: Vec<Completion>,
    pub metrics: EngineMetrics,
    pub findings: Vec<CanaryFinding>,
    pub all_free: bool,
}

/// How the requests arrive.
#[derive(Clone, Copy, Debug)]
pub enum Arrival {
    /// All before the first step.
    AtOnce,
    /// One before each step (so new prefills join steps in which others finish).
    Trickle,
}

/// The requests submitted to a scheduler with the canary on, stepped to the end. `tight`:
/// pools for 10 running requests of 40 tokens with C4 room for 3 (preemptions).
fn serve(
    model: Arc<Model>,
    overlap: bool,
    prefix_cache: bool,
    tight: bool,
    arrival: Arrival,
) -> Run {
    serve_these(model, overlap, prefix_cache, tight, arrival, requests(), 0)
}

/// [`serve`] with the given requests, choosing tokens on `choice_threads` threads (0:
/// automatic, which is one at the tiny model's vocabulary).
pub fn serve_these(
    model: Arc<Model>,
    overlap: bool,
    prefix_cache: bool,
    tight: bool,
    arrival: Arrival,
    requests: Vec<Request>,
    choice_threads: usize,
) -> Run {
    let cfg = EngineConfig {
        cache: if tight {
            CacheBudget::Pages(tight_pages(40, 10, 3))
        } else {
            CacheBudget::Tokens(4096)
        },
        page_size: 8,
        prefix_cache,
        max_running_requests: match (tight, arrival) {
            (true, _) => 10,
            (false, Arrival::AtOnce) => 5,
            (false, Arrival::Trickle) => 16,
        },
        chunked_prefill_size: Some(16),
        overlap_schedule: overlap,
        choice_threads,
        ..Default::default()
    };
    let debug = DebugOptions {
        canary: Some(CanaryConfig::default()),
    };
    let mut s = Scheduler::new(model, cfg, None)
        .expect("scheduler starts")
        .with_debug(debug);
    let mut pending = requests.into_iter();
    let mut streams = Vec::new();
    let mut submit = |s: &mut Scheduler, r: Request| {
        streams.push(s.submit(r).expect("request accepted"));
    };
    if let Arrival::AtOnce = arrival {
        pending.by_ref().for_each(|r| submit(&mut s, r));
    }
    let mut steps = 0;
    loop {
        let next = pending.next();
        let more = next.is_some();
        if let Some(r) = next {
            submit(&mut s, r);
        }
        if !s.step() && !more {
            break;
        }
        steps += 1;
        assert!(steps < 10_000, "the scheduler makes progress");
    }
    assert!(s.is_idle());
    let findings: Vec<CanaryFinding> = s.canary_findings().cloned().collect();
    for f in &findings {
        eprintln!("canary: {f}");
    }
    let metrics = s.metrics();
    let done = streams
        .into_iter()
        .map(|st| st.collect_blocking())
        .collect();
    s.clear_prefix_cache();
    Run {
        done,
        metrics,
        findings,
        all_free: s.pools().all_free(),
    }
}

fn check_clean(run: &Run, what: &str) {
    for (i, (c, s)) in run.done.iter().zip(solos()).enumerate() {
        assert_eq!(
            c.finished.reason,
            FinishReason::Length,
            "{what}: request {i}"
        );
        assert_same_as_solo(c, s, &format!("{what}: request {i}"));
    }
    assert_eq!(
        run.metrics.canary_rounds_flagged, 0,
        "{what}: the canary stays silent: {:?}",
        run.findings
    );
    assert!(run.all_free, "{what}: every page is free at the end");
}

fn same_tokens_and_logits(a: &Completion, b: &Completion) -> bool {
    a.tokens == b.tokens
        && a.logprobs == b.logprobs
        && a.logits.len() == b.logits.len()
        && a.logits.iter().zip(&b.logits).all(|(x, y)| {
            x.iter()
                .map(|v| v.to_bits())
                .eq(y.iter().map(|v| v.to_bits()))
        })
}

#[test]
fn overlap_and_serial_give_the_solo_tokens_and_logits_bitwise() {
    for prefix_cache in [false, true] {
        for tight in [false, true] {
            let arrival = if tight {
                Arrival::AtOnce
            } else {
                Arrival::Trickle
            };
            let what =
                |o| format!("overlap={o} prefix_cache={prefix_cache} tight={tight} {arrival:?}");
            let serial = serve(model(), false, prefix_cache, tight, arrival);
            let overlap = serve(model(), true, prefix_cache, tight, arrival);
            check_clean(&serial, &what(false));
            check_clean(&overlap, &what(true));
            for (i, (a, b)) in serial.done.iter().zip(&overlap.done).enumerate() {
                assert!(
                    same_tokens_and_logits(a, b),
                    "{}: request {i} differs between the modes",
                    what(true)
                );
            }
            if tight {
                assert!(
                    overlap.metrics.preemptions_total > 0,
                    "{}: the tight pools forced preemptions",
                    what(true)
                );
            }
        }
    }
}

/// The requests of [`requests`], all sampled with a logit bias, penalties, min_p and
/// min_tokens, asking for log-probabilities; `penalize` false leaves out the penalties that read the tokens.
fn penalized_requests(penalize: bool) -> Vec<Request> {
    requests()
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            let p = if penalize { 1.0 } else { 0.0 };
            r.sampling = SamplingParams {
                temperature: 0.9,
                seed: 90 + i as u64,
                min_p: 0.01,
                // Token 150 is likely, so repeats and the penalties on them are common.
                logit_bias: vec![(150, 4.0)],
                frequency_penalty: 1.5 * p,
                presence_penalty: 0.5 * p,
                repetition_penalty: 1.0 + 0.3 * p,
                // Held back to the end, so every request runs its length (and the count of
                // generated tokens crosses to the device thread too).
                min_tokens: r.max_tokens,
                ..Default::default()
            };
            r.logprobs = Some(3);
            // Token 150 (often chosen), a fixed one and one per request.
            r.logprob_token_ids = vec![150, 7, 300 + i as u32];
            r.return_logits = true;
            r
        })
        .collect()
}

#[test]
fn penalties_and_logprobs_do_not_depend_on_overlap_preemption_or_the_batch() {
    let alone: Vec<Completion> = penalized_requests(true)
        .into_iter()
        .map(|r| {
            let mut run = serve_these(model(), false, false, false, Arrival::AtOnce, vec![r], 0);
            run.done.remove(0)
        })
        .collect();
    for tight in [false, true] {
        let what = |o| format!("overlap={o} tight={tight}");
        // Both runs choose on several threads; the solo runs on one.
        let serial = serve_these(
            model(),
            false,
            true,
            tight,
            Arrival::AtOnce,
            penalized_requests(true),
            3,
        );
        let overlap = serve_these(
            model(),
            true,
            true,
            tight,
            Arrival::AtOnce,
            penalized_requests(true),
            4,
        );
        for run in [&serial, &overlap] {
            assert_eq!(run.metrics.canary_rounds_flagged, 0, "{}", what(true));
            assert!(run.all_free, "{}", what(true));
        }
        if tight {
            assert!(overlap.metrics.preemptions_total > 0, "{}", what(true));
        }
        for (i, (a, b)) in serial.done.iter().zip(&overlap.done).enumerate() {
            assert_eq!(a.finished.reason, FinishReason::Length, "request {i}");
            assert_eq!(a.logprobs.len(), a.tokens.len(), "request {i}");
            // Each entry is the raw row's, the asked tokens' included.
            let ids = [150, 7, 300 + i as u32];
            for ((e, row), &t) in a.logprobs.iter().zip(&a.logits).zip(&a.tokens) {
                assert_eq!(e, &logprob_with(row, t, 3, &ids), "request {i}");
                assert_eq!(e.asked.len(), 3, "request {i}");
                if t == 150 {
                    assert_eq!(e.asked[0], e.logprob, "request {i}");
                }
            }
            assert!(
                same_tokens_and_logits(a, b),
                "{}: request {i} differs between the modes",
                what(true)
            );
        }
        for (i, (a, b)) in alone.iter().zip(&serial.done).enumerate() {
            assert_eq!(a.tokens, b.tokens, "{}: request {i} alone", what(false));
            assert_eq!(a.logprobs, b.logprobs, "{}: request {i} alone", what(false));
        }
    }
    let plain = serve_these(
        model(),
        true,
        true,
        false,
        Arrival::AtOnce,
        penalized_requests(false),
        0,
    );
    let penalized = serve_these(
        model(),
        true,
        true,
        false,
        Arrival::AtOnce,
        penalized_requests(true),
        0,
    );
    let changed = plain
        .done
        .iter()
        .zip(&penalized.done)
        .filter(|(a, b)| a.tokens != b.tokens)
        .count();
    assert!(
        changed >= 4,
        "the penalties changed only {changed} of 16 requests"
    );
}

#[test]
fn overlap_through_the_engine_thread_equals_solo() {
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(4096),
        page_size: 8,
        prefix_cache: true,
        max_running_requests: 6,
        chunked_prefill_size: Some(16),
        overlap_schedule: true,
        ..Default::default()
    };
    let debug = DebugOptions {
        canary: Some(CanaryConfig::default()),
    };
    let engine = Engine::spawn_debug(model(), cfg, None, debug).expect("engine starts");
    let greedy_reqs: Vec<Request> = requests()
        .into_iter()
        .filter(|r| r.sampling.temperature == 0.0)
        .collect();
    let done = staggered(&engine, greedy_reqs);
    for (i, (c, s)) in done.iter().zip(solos()).enumerate() {
        assert_same_as_solo(c, s, &format!("engine overlap: request {i}"));
    }
    assert_eq!(engine.metrics().canary_rounds_flagged, 0);
}

#[test]
fn stale_page_reuse_is_caught_by_the_canary_and_diverges_from_solo_runs() {
    let run = serve(faulty_model(), true, false, false, Arrival::Trickle);
    let owned: Vec<&CanaryFinding> = run
        .findings
        .iter()
        .filter(|f| f.check == CanaryCheck::Ownership)
        .collect();
    assert!(
        !owned.is_empty() && run.metrics.canary_rounds_flagged > 0,
        "the canary sees steps write pages their requests no longer hold: {:?}",
        run.metrics
    );
    let f = owned[0];
    assert!(
        !f.layers.is_empty() && f.unexpected_total > 0 && !f.unexpected.is_empty(),
        "a finding names layers and pages: {f}"
    );
    let diverged = run
        .done
        .iter()
        .zip(solos())
        .filter(|(c, s)| {
            c.tokens != s.0
                || c.logits.iter().zip(&s.1).any(|(a, b)| {
                    !a.iter()
                        .map(|x| x.to_bits())
                        .eq(b.iter().map(|x| x.to_bits()))
                })
        })
        .count();
    eprintln!(
        "{diverged} of {} requests diverged from their solo runs",
        solos().len()
    );
    assert!(
        diverged > 0,
        "requests that got the stale pages diverge from their solo runs"
    );
}

#[test]
fn the_fault_is_inert_without_overlap() {
    let run = serve(faulty_model(), false, false, false, Arrival::Trickle);
    check_clean(&run, "serial with stale-page-reuse injected");
}

#[test]
fn overlap_frees_every_page_after_cancelled_finished_and_preempted_requests() {
    let m = model();
    let (mut s, prompts, mut streams) = tight_mixed_workload(&m, true);
    // Request 0, admitted first, is in every step until it finishes, so in the one in flight:
    // cancelled now, its pages are freed when that step returns.
    let cancelled = streams[0].as_ref().unwrap().id();
    assert!(s.cancel(cancelled), "request 0 is held");
    assert!(!s.cancel(cancelled), "and gone after cancelling");
    streams[5] = None; // the client went away
    while s.step() {}
    assert!(s.is_idle());
    let metrics = s.metrics();
    assert!(
        metrics.preemptions_total > 0,
        "the C4 pools forced preemptions"
    );
    assert_eq!(metrics.requests_cancelled, 2);
    for (i, st) in streams.into_iter().enumerate() {
        let Some(st) = st else { continue };
        let c = st.collect_blocking();
        if i == 0 {
            assert_eq!(c.finished.reason, FinishReason::Cancelled);
            continue;
        }
        assert_eq!(c.finished.reason, FinishReason::Length, "request {i}");
        assert_same_as_solo(&c, &solo(&m, &prompts[i], 6), &format!("request {i}"));
    }
    s.clear_prefix_cache();
    assert!(s.pools().all_free(), "every page is free again");
}

#[test]
fn a_faulty_overlapped_scheduler_drops_cleanly_with_a_step_in_flight() {
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(4096),
        page_size: 8,
        prefix_cache: true,
        max_running_requests: 4,
        overlap_schedule: true,
        ..Default::default()
    };
    let mut s = Scheduler::new(faulty_model(), cfg, None).expect("scheduler starts");
    let reqs: Vec<Request> = requests().into_iter().take(4).collect();
    let n = reqs.len() as u64;
    let _streams: Vec<_> = reqs.into_iter().map(|r| s.submit(r).unwrap()).collect();
    while s.metrics().requests_finished < n {
        assert!(s.step(), "work is left");
    }
    assert!(
        !s.is_idle(),
        "the step the last request was already in when it finished is still running"
    );
    // Its stale state must not release the pages the fault already gave back.
    drop(s);
}

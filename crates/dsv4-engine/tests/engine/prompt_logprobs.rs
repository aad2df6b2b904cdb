//! Prompt log-probabilities (`Request::prompt_logprobs`): every entry is bitwise what one
//! forward pass over the whole prompt gives, whether the prompt runs in chunks, overlapped,
//! beside a prefix cache holding its prefix, or again after a preemption; such a request never
//! skips prompt rows through the prefix cache (the others still do), and asking changes no
//! generated token. The entries do not depend on how many threads score them.

use super::overlap::{Arrival, requests, serve_these};
use super::*;
use dsv4_engine::sampling::logprob_with;
use dsv4_engine::{EngineConfig, EngineError, Event, FinishReason, Scheduler, TokenLogprob};

/// Alternatives per entry.
const TOP: usize = 3;

/// Tokens whose log-probabilities come with every entry.
const ASKED: [u32; 3] = [5, 0, 211];

/// Whether request `i` of [`requests`] asks (a quarter of them, all sharing the 8-token
/// prefix, so the prefix cache has snapshots they could otherwise use).
fn asking(i: usize) -> bool {
    i.is_multiple_of(4)
}

fn with_prompt_logprobs() -> Vec<Request> {
    requests()
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            if asking(i) {
                r.prompt_logprobs = Some(TOP);
                r.logprob_token_ids = ASKED.to_vec();
            }
            r
        })
        .collect()
}

/// One forward over `prompt`: entry `k` from row `k`, scoring prompt token `k + 1`.
fn oracle(model: &Model, prompt: &[u32]) -> Vec<TokenLogprob> {
    let mut st = model.new_sequence();
    let out = model.forward(&mut st, prompt).unwrap();
    let v = out.vocab;
    (0..prompt.len() - 1)
        .map(|k| logprob_with(&out.logits[k * v..(k + 1) * v], prompt[k + 1], TOP, &ASKED))
        .collect()
}

/// An entry's numbers as bits: the token's, the alternatives' and the asked tokens'.
type EntryBits = (u32, Vec<(u32, u32)>, Vec<u32>);

fn bits(entries: &[TokenLogprob]) -> Vec<EntryBits> {
    entries
        .iter()
        .map(|e| {
            let top = e.top.iter().map(|&(t, l)| (t, l.to_bits())).collect();
            let asked = e.asked.iter().map(|l| l.to_bits()).collect();
            (e.logprob.to_bits(), top, asked)
        })
        .collect()
}

#[test]
fn prompt_logprobs_are_one_forward_over_the_prompt_in_every_schedule() {
    let m = model();
    let reqs = with_prompt_logprobs();
    let want: Vec<Vec<TokenLogprob>> = reqs
        .iter()
        .map(|r| match r.prompt_logprobs {
            Some(_) => oracle(&m, &r.prompt),
            None => Vec::new(),
        })
        .collect();
    for overlap in [false, true] {
        for tight in [false, true] {
            let what = format!("overlap={overlap} tight={tight}");
            let plain = serve_these(
                m.clone(),
                overlap,
                true,
                tight,
                Arrival::AtOnce,
                requests(),
                0,
            );
            // Scored on several threads (the automatic count is one at this vocabulary).
            let run = serve_these(
                m.clone(),
                overlap,
                true,
                tight,
                Arrival::AtOnce,
                reqs.clone(),
                if overlap { 3 } else { 2 },
            );
            assert_eq!(run.metrics.canary_rounds_flagged, 0, "{what}");
            assert!(run.all_free, "{what}: every page is free at the end");
            if tight {
                assert!(run.metrics.preemptions_total > 0, "{what}: preemptions");
            }
            let mut reused = 0;
            for (i, ((c, p), w)) in run.done.iter().zip(&plain.done).zip(&want).enumerate() {
                assert_eq!(c.tokens, p.tokens, "{what}: request {i}'s tokens changed");
                assert_eq!(c.finished.reason, p.finished.reason, "{what}: request {i}");
                assert_eq!(
                    bits(&c.prompt_logprobs),
                    bits(w),
                    "{what}: request {i}'s prompt entries"
                );
                if asking(i) {
                    assert_eq!(w.len(), c.finished.usage.prompt_tokens - 1);
                    assert_eq!(
                        c.finished.usage.cached_tokens, 0,
                        "{what}: request {i} skipped prompt rows"
                    );
                } else if i.is_multiple_of(2) {
                    reused += c.finished.usage.cached_tokens;
                }
            }
            if !tight {
                assert!(
                    reused > 0,
                    "{what}: the requests that do not ask still reuse the shared prefix"
                );
            }
        }
    }
}

#[test]
fn the_prompt_event_comes_first_even_for_a_one_token_prompt() {
    let mut s = Scheduler::new(model(), EngineConfig::default(), None).unwrap();
    let mut one = greedy(vec![0], 2);
    one.prompt_logprobs = Some(0);
    let mut two = greedy(vec![0, 17, 40], 2);
    two.prompt_logprobs = Some(1);
    let streams = [s.submit(one).unwrap(), s.submit(two).unwrap()];
    while s.step() {}
    let firsts: Vec<Option<Event>> = streams
        .into_iter()
        .map(|mut st| st.blocking_next())
        .collect();
    assert_eq!(firsts[0], Some(Event::Prompt(Vec::new())));
    match &firsts[1] {
        Some(Event::Prompt(e)) => {
            assert_eq!(e.len(), 2);
            assert!(e.iter().all(|x| x.top.len() == 1 && x.logprob <= 0.0));
        }
        other => panic!("expected the prompt's entries first, got {other:?}"),
    }
}

#[test]
fn too_many_alternatives_are_refused_naming_the_field() {
    let mut s = Scheduler::new(model(), EngineConfig::default(), None).unwrap();
    for (field, mut r) in [
        ("prompt_logprobs", greedy(vec![0, 5], 1)),
        ("logprobs", greedy(vec![0, 5], 1)),
    ] {
        if field == "logprobs" {
            r.logprobs = Some(21);
        } else {
            r.prompt_logprobs = Some(21);
        }
        match s.submit(r) {
            Err(EngineError::BadRequest(m)) => {
                assert!(m.contains(field) && m.contains("at most 20"), "{m}");
            }
            other => panic!("{field}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn asked_token_ids_are_refused_without_logprobs_outside_the_vocabulary_or_too_many() {
    let mut s = Scheduler::new(model(), EngineConfig::default(), None).unwrap();
    let vocab = model().cfg.vocab_size as u32;
    let ask = |ids: Vec<u32>, logprobs: Option<usize>| {
        let mut r = greedy(vec![0, 5], 1);
        r.logprobs = logprobs;
        r.logprob_token_ids = ids;
        r
    };
    for (r, says) in [
        (ask(vec![1], None), "needs logprobs or prompt_logprobs"),
        (ask(vec![1, vocab], Some(0)), "outside the vocabulary"),
        (
            ask(vec![1; dsv4_engine::MAX_LOGPROB_TOKEN_IDS + 1], Some(0)),
            "at most 256",
        ),
    ] {
        match s.submit(r) {
            Err(EngineError::BadRequest(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("{says}: expected a refusal, got {other:?}"),
        }
    }
    assert!(s.submit(ask(vec![vocab - 1, 0], Some(0))).is_ok());
}

#[test]
fn steps_compute_logits_only_for_the_rows_they_sample_or_score() {
    // A prompt of 20 tokens in chunks of 8 samples 3 tokens: 3 rows. A prompt of 11 tokens
    // that scores itself: 10 scored rows, then 2 sampled (the first from its last prompt
    // row). The chunks that end no prompt and score nothing compute no logits at all.
    let m = model();
    for overlap in [false, true] {
        let cfg = EngineConfig {
            chunked_prefill_size: Some(8),
            overlap_schedule: overlap,
            ..Default::default()
        };
        let mut s = Scheduler::new(m.clone(), cfg, None).unwrap();
        let plain = s
            .submit(Request {
                ignore_eos: true,
                ..greedy(tokens(20, 31), 3)
            })
            .unwrap();
        let scored = s
            .submit(Request {
                ignore_eos: true,
                prompt_logprobs: Some(1),
                ..greedy(tokens(11, 32), 2)
            })
            .unwrap();
        while s.step() {}
        assert_eq!(plain.collect_blocking().tokens.len(), 3);
        assert_eq!(scored.collect_blocking().tokens.len(), 2);
        let metrics = s.metrics();
        // Overlapped, each request also runs the step it was already in when its last token
        // was chosen: one more decode row each, sampled and dropped.
        let extra = if overlap { 2 } else { 0 };
        assert_eq!(
            metrics.computed_tokens_total,
            20 + 2 + 11 + 1 + extra,
            "overlap={overlap}"
        );
        assert_eq!(
            metrics.logit_rows_total,
            3 + 10 + 2 + extra,
            "overlap={overlap}: rows whose logits were computed"
        );
    }
}

#[test]
fn a_request_for_no_tokens_only_runs_and_scores_its_prompt() {
    // max_tokens 0 (what `echo` with `max_tokens: 0` scores a text with): the prompt runs in
    // chunks, its entries are one forward's, nothing is sampled, and it ends `length` with
    // no completion tokens. Without prompt_logprobs it computes no logits at all, and its
    // prefix snapshots stay for the next request (warming the prefix cache).
    let m = model();
    for overlap in [false, true] {
        let what = format!("overlap={overlap}");
        let cfg = EngineConfig {
            chunked_prefill_size: Some(8),
            overlap_schedule: overlap,
            page_size: 8,
            ..Default::default()
        };
        let mut s = Scheduler::new(m.clone(), cfg, None).unwrap();
        let (scored_prompt, warm_prompt) = (tokens(20, 33), tokens(19, 34));
        let mut scored = s
            .submit(Request {
                prompt_logprobs: Some(TOP),
                logprob_token_ids: ASKED.to_vec(),
                ..greedy(scored_prompt.clone(), 0)
            })
            .unwrap();
        let warm = s.submit(greedy(warm_prompt.clone(), 0)).unwrap();
        while s.step() {}
        match scored.blocking_next() {
            Some(Event::Prompt(e)) => {
                assert_eq!(bits(&e), bits(&oracle(&m, &scored_prompt)), "{what}");
            }
            other => panic!("{what}: expected the prompt's entries first, got {other:?}"),
        }
        match scored.blocking_next() {
            Some(Event::Finished(f)) => {
                assert_eq!(f.reason, FinishReason::Length, "{what}");
                assert_eq!(f.usage.completion_tokens, 0, "{what}");
                assert_eq!(f.usage.prompt_tokens, 20, "{what}");
                assert!(
                    f.timing.ttft_ms > 0.0,
                    "{what}: the prompt's end is its first output"
                );
            }
            other => panic!("{what}: expected the end next, got {other:?}"),
        }
        let w = warm.collect_blocking();
        assert!(
            w.tokens.is_empty() && w.prompt_logprobs.is_empty(),
            "{what}"
        );
        assert_eq!(w.finished.reason, FinishReason::Length, "{what}");
        let metrics = s.metrics();
        assert_eq!(metrics.computed_tokens_total, 20 + 19, "{what}");
        assert_eq!(metrics.generated_tokens_total, 0, "{what}");
        // Every scored chunk asks for its rows from the first it scores to its last: all 20
        // of the scored prompt's (its last row scores nothing but is the chunk's last).
        assert_eq!(
            metrics.logit_rows_total, 20,
            "{what}: rows whose logits were computed"
        );
        assert_eq!(
            metrics.prefix_snapshots, 4,
            "{what}: both prompts at 8 and 16 tokens"
        );

        // The warmed prefix serves the next request: two whole pages of 8.
        let mut longer = warm_prompt.clone();
        longer.extend(tokens(5, 35));
        let next = s.submit(greedy(longer.clone(), 2)).unwrap();
        while s.step() {}
        let c = next.collect_blocking();
        assert_eq!(c.finished.usage.cached_tokens, 16, "{what}");
        assert_same_as_solo(&c, &solo(&m, &longer, 2), &what);
    }
}

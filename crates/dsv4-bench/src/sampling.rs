//! What choosing one token costs the engine's step loop, per request, at DSV4's vocabulary
//! (129,280 logits, `tests/data/flash-config.json`): each sampling option and the
//! log-probabilities, against greedy argmax over the same row in the same run; and a decode
//! step's choices for a batch of sampled requests, on one thread and on the engine's
//! automatic count.

use crate::timing::median_secs;
use dsv4_core::SplitMix64;
use dsv4_engine::sampler::{ChoiceJob, SamplerState, choice_threads, choose_all};
use dsv4_engine::sampling::{TokenCounts, argmax, logprob, penalizes, process, sample};
use dsv4_engine::{Request, SamplingParams};
use serde::Serialize;
use std::hint::black_box;
use std::time::Duration;

/// DSV4's vocabulary size.
pub const DSV4_VOCAB: usize = 129_280;

/// One sampling case.
#[derive(Debug, Clone, Serialize)]
pub struct SamplingCost {
    /// What is measured.
    pub case: String,
    /// Median milliseconds per token (one request).
    pub ms: f64,
    /// `ms` over greedy argmax's (one pass over the row).
    pub vs_greedy: f64,
}

/// Logits shaped like a language model's: most near 0 (a sum of uniforms, spread about 2.3),
/// a handful of likely tokens well above them.
fn logits(vocab: usize, seed: u64) -> Vec<f32> {
    let mut g = SplitMix64::new(seed);
    let mut row: Vec<f32> = (0..vocab)
        .map(|_| ((0..4).map(|_| g.next_f64()).sum::<f64>() - 2.0) as f32 * 4.0)
        .collect();
    for k in 0..8 {
        let i = (g.next_u64() % vocab as u64) as usize;
        row[i] = 12.0 - k as f32;
    }
    row
}

/// Time each case on one row of `vocab` logits, `budget` per case.
pub fn sampling_costs(vocab: usize, budget: Duration) -> Vec<SamplingCost> {
    let row = logits(vocab, 7);
    let mut g = SplitMix64::new(1);
    let time = |f: &mut dyn FnMut()| median_secs(f, 5, 200, budget) * 1e3;
    let greedy = time(&mut || {
        black_box(argmax(&row));
    });
    let sampled = |temperature, top_p, top_k, min_p| SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        ..Default::default()
    };
    let cases = [
        ("temperature 0.7", sampled(0.7, 1.0, 0, 0.0)),
        ("temperature 0.7, top_p 0.9", sampled(0.7, 0.9, 0, 0.0)),
        ("temperature 0.7, top_k 50", sampled(0.7, 1.0, 50, 0.0)),
        ("temperature 0.7, min_p 0.05", sampled(0.7, 1.0, 0, 0.05)),
        (
            "temperature 1.0, top_p 0.95, top_k 40",
            sampled(1.0, 0.95, 40, 0.0),
        ),
    ];
    let mut out = vec![SamplingCost {
        case: "greedy (argmax)".into(),
        ms: greedy,
        vs_greedy: 1.0,
    }];
    let mut add = |case: &str, ms: f64| {
        out.push(SamplingCost {
            case: case.into(),
            ms,
            vs_greedy: ms / greedy,
        })
    };
    for (case, p) in cases {
        let ms = time(&mut || {
            black_box(sample(&row, &p, &mut g));
        });
        add(case, ms);
    }
    let ms = time(&mut || {
        black_box(logprob(&row, 5, 5));
    });
    add("logprobs, 5 alternatives", ms);
    // Penalties after 1000 generated tokens (of about 600 distinct ids) and a 4000-token
    // prompt: the copy of the row and the changes, before sampling.
    let p = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.5,
        repetition_penalty: 1.1,
        ..Default::default()
    };
    let prompt: Vec<u32> = (0..4000)
        .map(|_| (g.next_u64() % vocab as u64) as u32)
        .collect();
    let mut counts = TokenCounts::new(&prompt, &p);
    for _ in 0..1000 {
        counts.record((g.next_u64() % 600) as u32, penalizes(&p));
    }
    let ms = time(&mut || {
        let mut r = row.clone();
        process(&mut r, &p, &counts);
        black_box(&r);
    });
    add("penalties (1000 generated, 4000 prompt)", ms);
    // A decode step of 32 sampled requests, each with its own row and state, as the engine
    // chooses them: on one thread, then on the automatic count (per request).
    const BATCH: usize = 32;
    let rows: Vec<Vec<f32>> = (0..BATCH as u64).map(|i| logits(vocab, 100 + i)).collect();
    let p = sampled(0.7, 1.0, 0, 0.0);
    let req = Request {
        prompt: vec![0],
        max_tokens: 1,
        sampling: p.clone(),
        ..Default::default()
    };
    let mut states: Vec<SamplerState> = (0..BATCH).map(|_| SamplerState::new(&req)).collect();
    let auto = choice_threads(0, BATCH, vocab);
    for threads in [1, auto] {
        let ms = time(&mut || {
            let mut jobs: Vec<ChoiceJob<'_>> = states
                .iter_mut()
                .zip(&rows)
                .map(|(state, row)| ChoiceJob {
                    state,
                    params: &p,
                    eos: (0, true),
                    logprobs: None,
                    token_ids: &[],
                    row,
                    out: None,
                })
                .collect();
            choose_all(&mut jobs, threads);
            black_box(&jobs[0].out);
        }) / BATCH as f64;
        add(
            &format!(
                "batch of {BATCH}, temperature 0.7, {threads} thread{}",
                if threads == 1 { "" } else { "s" }
            ),
            ms,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_measured_against_greedy() {
        let c = sampling_costs(4096, Duration::from_millis(5));
        assert_eq!(c.len(), 10);
        assert_eq!(c[0].vs_greedy, 1.0);
        assert!(c.iter().all(|x| x.ms > 0.0 && x.vs_greedy > 0.0), "{c:?}");
    }
}

//! What choosing one token costs the engine's step loop, per request, at DSV4's vocabulary
//! (129,280 logits, `tests/data/flash-config.json`): each sampling option and the
//! log-probabilities, against greedy argmax over the same row in the same run.

use crate::timing::median_secs;
use dsv4_core::SplitMix64;
use dsv4_engine::SamplingParams;
use dsv4_engine::sampling::{TokenCounts, argmax, logprob, penalizes, process, sample};
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_measured_against_greedy() {
        let c = sampling_costs(4096, Duration::from_millis(5));
        assert_eq!(c.len(), 8);
        assert_eq!(c[0].vs_greedy, 1.0);
        assert!(c.iter().all(|x| x.ms > 0.0 && x.vs_greedy > 0.0), "{c:?}");
    }
}

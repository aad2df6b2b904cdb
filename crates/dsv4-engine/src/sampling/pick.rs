//! Picking the token from a processed logits row: greedy [`argmax`], or seeded [`sample`] with
//! temperature, top-k, top-p and min-p; and the log-probabilities a request can ask for
//! ([`logprob`]).

use crate::request::{SamplingParams, TokenLogprob};
use dsv4_core::SplitMix64;

/// The log-probability of `token` under softmax(`row`) with the `top` most likely tokens
/// (ties to the lower id) and its rank in that order (1: the most likely). Sums in f64; NaN
/// logits count as −∞.
pub fn logprob(row: &[f32], token: u32, top: usize) -> TokenLogprob {
    logprob_with(row, token, top, &[])
}

/// [`logprob`], with the log-probability of each of `asked` too (−∞ for an id outside the
/// row).
pub fn logprob_with(row: &[f32], token: u32, top: usize, asked: &[u32]) -> TokenLogprob {
    let finite = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let max = row
        .iter()
        .copied()
        .map(finite)
        .fold(f32::NEG_INFINITY, f32::max);
    let t = row
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&v| finite(v));
    // Terms in f32 (exp of at most 0; about 1e-7 relative error each, below the f32 result's
    // precision), summed in f64; the same pass counts the tokens ranked before `token`.
    let mut before = 0u32;
    let mut sum = 0f64;
    for (i, &v) in row.iter().enumerate() {
        let v = finite(v);
        before += u32::from(v > t || (v == t && (i as u32) < token));
        sum += f64::from((v - max).exp());
    }
    let lse = if max == f32::NEG_INFINITY {
        0.0
    } else {
        f64::from(max) + sum.ln()
    };
    let lp = |v: f32| (f64::from(finite(v)) - lse) as f32;
    // The `top` largest, kept sorted (most likely first, lower id first among equals).
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &v) in row.iter().enumerate() {
            let v = finite(v);
            if best.len() == top && v <= best[top - 1].1 {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= v);
            best.insert(at, (i as u32, v));
            best.truncate(top);
        }
    }
    TokenLogprob {
        logprob: row
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&v| lp(v)),
        top: best.into_iter().map(|(i, v)| (i, lp(v))).collect(),
        rank: before + 1,
        asked: asked
            .iter()
            .map(|&a| row.get(a as usize).map_or(f32::NEG_INFINITY, |&v| lp(v)))
            .collect(),
    }
}

/// The most likely token, ties to the lower id; NaN logits never win.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best: Option<usize> = None;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|b| v > row[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0) as u32
}

/// A sampling candidate: its id, logit and weight relative to the most likely token.
#[derive(Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f32,
    weight: f32,
}

/// Most likely first; equal logits in id order, so the order is total and reproducible.
fn rank(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// A candidate ordered by [`rank`] (the greatest is the least likely), for a bounded heap.
struct ByRank(Candidate);

impl PartialEq for ByRank {
    fn eq(&self, other: &Self) -> bool {
        rank(&self.0, &other.0).is_eq()
    }
}
impl Eq for ByRank {}
impl PartialOrd for ByRank {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ByRank {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        rank(&self.0, &other.0)
    }
}

/// The `k` most likely of `c`, most likely first: one pass with a bounded heap, O(n log k),
/// and most candidates cost one comparison.
fn most_likely(c: impl Iterator<Item = Candidate>, k: usize) -> Vec<Candidate> {
    let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
    for x in c {
        if heap.len() == k {
            match heap.peek() {
                Some(ByRank(worst)) if rank(&x, worst).is_lt() => {
                    heap.pop();
                }
                _ => continue,
            }
        }
        heap.push(ByRank(x));
    }
    heap.into_sorted_vec().into_iter().map(|r| r.0).collect()
}

/// The next token from `row` under `p`, drawing from `rng` only when sampling. Tokens whose
/// logit is −∞ (masked by a token constraint) are never drawn while another is left.
///
/// No full sort: `top_k` keeps the k most likely in one pass with a bounded heap, `min_p`
/// filters by weight, and `top_p` looks at the 64 most likely, then 512, … until they reach
/// its share (a language model's nucleus is usually small). The draw walks the kept tokens
/// most likely first when they were ranked, else in id order. (A full sort of a 129k
/// vocabulary took about 11 ms per token, on the step loop; `dsv4 bench` times each option.)
pub fn sample(row: &[f32], p: &SamplingParams, rng: &mut SplitMix64) -> u32 {
    if p.temperature == 0.0 || p.top_k == 1 {
        return argmax(row);
    }
    let finite = row
        .iter()
        .enumerate()
        .filter(|(_, v)| **v > f32::NEG_INFINITY)
        .map(|(i, &v)| Candidate {
            id: i as u32,
            logit: v,
            weight: 0.0,
        });
    // Ranked (most likely first) when top_k cut them, else in id order.
    let ranked = p.top_k > 0 && p.top_k < row.len();
    let mut kept: Vec<Candidate> = if ranked {
        most_likely(finite, p.top_k)
    } else {
        finite.collect()
    };
    if kept.is_empty() {
        return 0;
    }
    // Weights relative to the most likely token (weight 1), at the temperature.
    let top = kept
        .iter()
        .map(|k| k.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    for k in &mut kept {
        k.weight = ((k.logit - top) / p.temperature).exp();
    }
    // min_p first (as vLLM); top_p then covers what min_p kept.
    if p.min_p > 0.0 {
        kept.retain(|k| k.weight >= p.min_p);
    }
    if p.top_p < 1.0 {
        let total: f64 = kept.iter().map(|k| f64::from(k.weight)).sum();
        let goal = f64::from(p.top_p) * total;
        let mut n = 64;
        loop {
            let best = if ranked {
                kept[..n.min(kept.len())].to_vec()
            } else {
                most_likely(kept.iter().copied(), n)
            };
            let mut cum = 0.0;
            let cut = best.iter().position(|k| {
                cum += f64::from(k.weight);
                cum >= goal
            });
            if let Some(at) = cut {
                kept = best;
                kept.truncate(at + 1);
                break;
            }
            if n >= kept.len() {
                break;
            }
            n = n.saturating_mul(8);
        }
    }
    let sum: f64 = kept.iter().map(|k| f64::from(k.weight)).sum();
    let mut u = rng.next_f64() * sum;
    for k in &kept {
        let w = f64::from(k.weight);
        if u < w {
            return k.id;
        }
        u -= w;
    }
    kept[kept.len() - 1].id
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Sampling parameters with these three set, the rest default.
    pub(in crate::sampling) fn params(
        temperature: f32,
        top_p: f32,
        top_k: usize,
    ) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_the_lowest_id_among_ties_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), 1);
        let mut g = SplitMix64::new(1);
        assert_eq!(sample(&[0.5, 0.7, 0.1], &params(0.0, 1.0, 0), &mut g), 1);
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let row = [2.0, 1.9, 1.8, -5.0, 1.7];
        let mut g = SplitMix64::new(7);
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[sample(&row, &params(1.0, 1.0, 2), &mut g) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        assert_eq!(
            seen[2] + seen[3] + seen[4],
            0,
            "top_k 2 keeps ids 0 and 1: {seen:?}"
        );
        // p(0) ≈ 0.27 of the five; top_p 0.2 keeps only the most likely token.
        for _ in 0..200 {
            assert_eq!(sample(&row, &params(1.0, 0.2, 0), &mut g), 0);
        }
    }

    #[test]
    fn sampling_follows_the_softmax_and_the_seed() {
        let row = [0.0f32, (3.0f32).ln()];
        let draw = |seed| {
            let mut g = SplitMix64::new(seed);
            (0..4000)
                .map(|_| sample(&row, &params(1.0, 1.0, 0), &mut g))
                .collect::<Vec<_>>()
        };
        let a = draw(3);
        assert_eq!(a, draw(3), "same seed, same tokens");
        assert_ne!(a, draw(4));
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.75).abs() < 0.03, "p(1) = 3/4, got {ones}");
    }

    #[test]
    fn logprobs_are_the_log_softmax_with_the_best_alternatives_in_order() {
        let row = [1.0f32, 3.0, 3.0, f32::NEG_INFINITY, 2.0, f32::NAN];
        let lp = logprob(&row, 4, 3);
        let z: f64 = [1.0f64, 3.0, 3.0, 2.0].iter().map(|v| v.exp()).sum();
        assert!(
            (f64::from(lp.logprob) - (2.0 - z.ln())).abs() < 1e-6,
            "{lp:?}"
        );
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 4], "most likely first, ties to the lower id");
        assert_eq!(lp.top[0].1, lp.top[1].1);
        let total: f64 = (0..row.len() as u32)
            .map(|t| f64::from(logprob(&row, t, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "probabilities sum to {total}");
        assert_eq!(logprob(&row, 3, 0).logprob, f32::NEG_INFINITY);
        // Asked tokens get the same values as the chosen one would, in the asked order.
        let asked = logprob_with(&row, 4, 3, &[2, 0, 2, 99]);
        assert_eq!(asked.asked[0], logprob(&row, 2, 0).logprob);
        assert_eq!(asked.asked[1], logprob(&row, 0, 0).logprob);
        assert_eq!(asked.asked[2], asked.asked[0]);
        assert_eq!(asked.asked[3], f32::NEG_INFINITY, "outside the row");
        assert_eq!((asked.logprob, &asked.top), (lp.logprob, &lp.top));
        assert!(logprob(&row, 4, 3).asked.is_empty());
        assert!(logprob(&row, 0, 0).top.is_empty());
        assert_eq!(logprob(&row, 0, 50).top.len(), row.len());
        // Ranks follow the same order: 1 and 2 tie first (lower id first), then 4, 0, and the
        // −∞ and NaN logits last (lower id first).
        let ranks: Vec<u32> = (0..row.len() as u32)
            .map(|t| logprob(&row, t, 0).rank)
            .collect();
        assert_eq!(ranks, [4, 1, 2, 5, 3, 6]);
    }

    #[test]
    fn min_p_keeps_only_tokens_near_the_most_likely() {
        // Relative weights at temperature 1: 1, e^-0.5 ≈ 0.61, e^-3 ≈ 0.05.
        let row = [2.0, 1.5, -1.0];
        let p = SamplingParams {
            temperature: 1.0,
            min_p: 0.1,
            ..Default::default()
        };
        let mut g = SplitMix64::new(5);
        let mut seen = [0usize; 3];
        for _ in 0..3000 {
            seen[sample(&row, &p, &mut g) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        assert_eq!(seen[2], 0, "p(2)/p(0) ≈ 0.05 < min_p: {seen:?}");
        let all = SamplingParams { min_p: 0.0, ..p };
        let hits = (0..3000)
            .filter(|_| sample(&row, &all, &mut g) == 2)
            .count();
        assert!(hits > 0, "without min_p token 2 is drawn");
    }
}

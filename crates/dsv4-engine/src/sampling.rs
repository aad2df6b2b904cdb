//! Choosing the next token from a logits row: the penalties and logit bias ([`process`]),
//! then greedy argmax, or seeded sampling with temperature, top-k, top-p and min-p
//! ([`sample`]); and the log-probabilities a request can ask for ([`logprob`]). Every request
//! draws from its own generator, so its tokens do not depend on what else runs in the batch.

use crate::request::{SamplingParams, TokenLogprob};
use dsv4_core::SplitMix64;
use std::collections::HashMap;

/// Check sampling options, saying which one is bad.
pub fn validate(p: &SamplingParams) -> Result<(), String> {
    if !(p.temperature.is_finite() && p.temperature >= 0.0) {
        return Err(format!(
            "temperature must be a finite number >= 0 (0 = greedy), got {}",
            p.temperature
        ));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return Err(format!("top_p must be in (0, 1], got {}", p.top_p));
    }
    if !(0.0..=1.0).contains(&p.min_p) {
        return Err(format!("min_p must be from 0 to 1, got {}", p.min_p));
    }
    for (name, v) in [
        ("presence_penalty", p.presence_penalty),
        ("frequency_penalty", p.frequency_penalty),
    ] {
        if !(-2.0..=2.0).contains(&v) {
            return Err(format!("{name} must be from -2 to 2, got {v}"));
        }
    }
    if !(p.repetition_penalty.is_finite() && p.repetition_penalty > 0.0) {
        return Err(format!(
            "repetition_penalty must be a finite number > 0 (1 = off), got {}",
            p.repetition_penalty
        ));
    }
    if let Some((t, b)) = p
        .logit_bias
        .iter()
        .find(|(_, b)| !(-100.0..=100.0).contains(b))
    {
        return Err(format!(
            "logit_bias of token {t} must be from -100 to 100, got {b}"
        ));
    }
    let words = &p.bad_words_ids;
    if words.len() > MAX_BAD_WORD_SEQUENCES
        || words
            .iter()
            .any(|w| w.is_empty() || w.len() > MAX_BAD_WORD_TOKENS)
    {
        return Err(format!(
            "bad_words_ids must be at most {MAX_BAD_WORD_SEQUENCES} sequences of 1 to \
             {MAX_BAD_WORD_TOKENS} tokens"
        ));
    }
    Ok(())
}

/// Most bad-word token sequences a request may give (the server makes up to two of a word).
pub const MAX_BAD_WORD_SEQUENCES: usize = 128;

/// Most tokens of one bad word.
pub const MAX_BAD_WORD_TOKENS: usize = 64;

/// The generated tokens and how often each was generated, as the penalties need them.
#[derive(Debug, Clone, Default)]
pub struct TokenCounts {
    /// Times each generated token was generated (kept only when a penalty needs it).
    counts: HashMap<u32, u32>,
    /// The prompt's tokens (kept only for the repetition penalty).
    prompt: Vec<u32>,
    /// Tokens generated so far.
    generated: usize,
    /// The last generated tokens, as many as the longest bad word needs (its length − 1).
    recent: Vec<u32>,
    /// How many `recent` keeps.
    keep_recent: usize,
}

impl TokenCounts {
    /// The counts of a request with `prompt` under `p` (the prompt is kept only when the
    /// repetition penalty reads it).
    pub fn new(prompt: &[u32], p: &SamplingParams) -> Self {
        let mut kept = Vec::new();
        if p.repetition_penalty != 1.0 {
            kept = prompt.to_vec();
            kept.sort_unstable();
            kept.dedup();
        }
        let keep_recent = p
            .bad_words_ids
            .iter()
            .map(|w| w.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        Self {
            counts: HashMap::new(),
            prompt: kept,
            generated: 0,
            recent: Vec::with_capacity(keep_recent + 1),
            keep_recent,
        }
    }

    /// Count a generated token (`track`: whether a penalty reads the counts).
    pub fn record(&mut self, token: u32, track: bool) {
        self.generated += 1;
        if track {
            *self.counts.entry(token).or_insert(0) += 1;
        }
        if self.keep_recent > 0 {
            if self.recent.len() == self.keep_recent {
                self.recent.remove(0);
            }
            self.recent.push(token);
        }
    }

    /// The tokens a bad word bans next: the last token of each one whose other tokens the
    /// generated tokens end with.
    fn banned<'a>(&'a self, p: &'a SamplingParams) -> impl Iterator<Item = u32> + 'a {
        p.bad_words_ids.iter().filter_map(|w| {
            let (&last, head) = w.split_last()?;
            self.recent.ends_with(head).then_some(last)
        })
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated
    }
}

/// Whether [`process`] changes anything under `p`.
pub fn processes(p: &SamplingParams) -> bool {
    penalizes(p)
        || !p.logit_bias.is_empty()
        || !p.allowed_token_ids.is_empty()
        || !p.bad_words_ids.is_empty()
}

/// Whether `p` has a penalty that reads the generated tokens.
pub fn penalizes(p: &SamplingParams) -> bool {
    p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repetition_penalty != 1.0
}

/// Apply `p`'s allowed tokens (every other one becomes −∞) and bad words (the tokens they ban
/// next become −∞), its logit bias, then its repetition, frequency and presence penalties (in
/// vLLM's order), to `row` in place. −∞ stays −∞, so a token constraint's mask survives.
pub fn process(row: &mut [f32], p: &SamplingParams, counts: &TokenCounts) {
    if !p.allowed_token_ids.is_empty() {
        let kept: Vec<(usize, f32)> = p
            .allowed_token_ids
            .iter()
            .filter_map(|&t| row.get(t as usize).map(|&v| (t as usize, v)))
            .collect();
        row.fill(f32::NEG_INFINITY);
        for (t, v) in kept {
            row[t] = v;
        }
    }
    for t in counts.banned(p) {
        if let Some(v) = row.get_mut(t as usize) {
            *v = f32::NEG_INFINITY;
        }
    }
    for &(t, b) in &p.logit_bias {
        if let Some(v) = row.get_mut(t as usize) {
            *v += b;
        }
    }
    let rp = p.repetition_penalty;
    if rp != 1.0 {
        let repeated = counts.prompt.iter().chain(
            counts
                .counts
                .keys()
                .filter(|t| counts.prompt.binary_search(t).is_err()),
        );
        for &t in repeated {
            if let Some(v) = row.get_mut(t as usize) {
                *v = if *v > 0.0 { *v / rp } else { *v * rp };
            }
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        for (&t, &n) in &counts.counts {
            if let Some(v) = row.get_mut(t as usize) {
                *v -= p.frequency_penalty * n as f32 + p.presence_penalty;
            }
        }
    }
}

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
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize) -> SamplingParams {
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
    fn bad_options_are_refused_with_the_option_named() {
        assert!(
            validate(&params(-1.0, 1.0, 0))
                .unwrap_err()
                .contains("temperature")
        );
        assert!(validate(&params(f32::NAN, 1.0, 0)).is_err());
        assert!(
            validate(&params(1.0, 0.0, 0))
                .unwrap_err()
                .contains("top_p")
        );
        assert!(validate(&params(0.7, 0.9, 40)).is_ok());
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

    #[test]
    fn bias_and_penalties_move_the_logits_they_name() {
        let p = SamplingParams {
            logit_bias: vec![(0, 5.0), (9, 1.0)],
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        let mut counts = TokenCounts::new(&[1], &p);
        for t in [2, 2, 1] {
            counts.record(t, penalizes(&p));
        }
        let mut row = [0.0f32, 1.0, 1.0, f32::NEG_INFINITY];
        process(&mut row, &p, &counts);
        assert_eq!(row, [5.0, 1.0 - 0.75, 1.0 - 1.0, f32::NEG_INFINITY]);
        assert!(!processes(&SamplingParams::default()));
        assert_eq!(counts.generated(), 3);
    }

    #[test]
    fn bad_words_ban_their_last_token_after_the_rest_of_them() {
        let p = SamplingParams {
            bad_words_ids: vec![vec![2], vec![0, 1, 3], vec![1, 3]],
            ..Default::default()
        };
        assert!(processes(&p) && validate(&p).is_ok());
        let mut counts = TokenCounts::new(&[0, 1], &p);
        let row = [1.0f32; 4];
        let after = |counts: &TokenCounts| {
            let mut r = row;
            process(&mut r, &p, counts);
            r.map(|v| v > f32::NEG_INFINITY)
        };
        // Token 2 always; token 3 once the generated tokens end with [1] (the prompt's do not
        // count) or [0, 1].
        assert_eq!(after(&counts), [true, true, false, true]);
        counts.record(0, false);
        assert_eq!(after(&counts), [true, true, false, true]);
        counts.record(1, false);
        assert_eq!(after(&counts), [true, true, false, false]);
        counts.record(0, false);
        assert_eq!(after(&counts), [true, true, false, true]);
        for bad in [
            vec![vec![]],
            vec![vec![1; MAX_BAD_WORD_TOKENS + 1]],
            vec![vec![1]; MAX_BAD_WORD_SEQUENCES + 1],
        ] {
            let p = SamplingParams {
                bad_words_ids: bad,
                ..Default::default()
            };
            assert!(validate(&p).unwrap_err().contains("bad_words_ids"));
        }
    }

    #[test]
    fn only_allowed_tokens_survive_and_keep_their_processed_logits() {
        let p = SamplingParams {
            allowed_token_ids: vec![3, 1, 99],
            logit_bias: vec![(1, 2.0), (2, 50.0)],
            temperature: 1.0,
            ..Default::default()
        };
        assert!(processes(&p));
        let counts = TokenCounts::new(&[], &p);
        let mut row = [4.0f32, 0.5, 9.0, -1.0];
        process(&mut row, &p, &counts);
        assert_eq!(row, [f32::NEG_INFINITY, 2.5, f32::NEG_INFINITY, -1.0]);
        // Sampled freely, only allowed tokens come out; the id outside the row is ignored.
        let mut rng = SplitMix64::new(7);
        let mut seen = [0usize; 4];
        for _ in 0..200 {
            seen[sample(&row, &p, &mut rng) as usize] += 1;
        }
        assert_eq!((seen[0], seen[2]), (0, 0), "{seen:?}");
        assert!(seen[1] > 0 && seen[3] > 0, "{seen:?}");
    }

    #[test]
    fn bad_new_options_are_refused_with_the_option_named() {
        let with = |f: fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            f(&mut p);
            validate(&p).unwrap_err()
        };
        assert!(with(|p| p.min_p = 1.5).contains("min_p"));
        assert!(with(|p| p.presence_penalty = 2.5).contains("presence_penalty"));
        assert!(with(|p| p.frequency_penalty = f32::NAN).contains("frequency_penalty"));
        assert!(with(|p| p.repetition_penalty = 0.0).contains("repetition_penalty"));
        assert!(with(|p| p.logit_bias = vec![(3, 101.0)]).contains("logit_bias of token 3"));
    }
}

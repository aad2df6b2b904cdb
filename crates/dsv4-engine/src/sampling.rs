//! Choosing the next token from a logits row: the penalties and logit bias ([`process`]),
//! then greedy argmax, or seeded sampling with temperature, top-k, top-p and min-p
//! ([`sample`]); and the log-probabilities a request can ask for ([`logprob`]). Every request
//! draws from its own generator, so its tokens do not depend on what else runs in the batch.

mod pick;

pub use pick::{argmax, logprob, logprob_with, sample};

use crate::request::SamplingParams;
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

#[cfg(test)]
mod tests {
    use super::pick::tests::params;
    use super::*;
    use dsv4_core::SplitMix64;

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

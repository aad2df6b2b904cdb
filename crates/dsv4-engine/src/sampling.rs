//! Choosing the next token from a logits row: greedy argmax, or seeded sampling with
//! temperature, top-k and top-p. Every request draws from its own generator, so its tokens do
//! not depend on what else runs in the batch.

use crate::request::SamplingParams;
use dsv4_core::SplitMix64;

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
    Ok(())
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

/// The next token from `row` under `p`, drawing from `rng` only when sampling. Tokens whose
/// logit is −∞ (masked by a token constraint) are never drawn while another is left.
pub fn sample(row: &[f32], p: &SamplingParams, rng: &mut SplitMix64) -> u32 {
    if p.temperature == 0.0 || p.top_k == 1 {
        return argmax(row);
    }
    let mut ids: Vec<u32> = (0..row.len() as u32)
        .filter(|&i| row[i as usize] > f32::NEG_INFINITY)
        .collect();
    if ids.is_empty() {
        return 0;
    }
    // Most likely first; equal logits in id order, so the order is total and reproducible.
    ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    if p.top_k > 0 {
        ids.truncate(p.top_k);
    }
    let t = f64::from(p.temperature);
    let top = f64::from(row[ids[0] as usize]);
    let weights: Vec<f64> = ids
        .iter()
        .map(|&i| ((f64::from(row[i as usize]) - top) / t).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut keep = weights.len();
    if p.top_p < 1.0 {
        let mut cum = 0.0;
        for (k, w) in weights.iter().enumerate() {
            cum += w / total;
            if cum >= f64::from(p.top_p) {
                keep = k + 1;
                break;
            }
        }
    }
    let kept: f64 = weights[..keep].iter().sum();
    let mut u = rng.next_f64() * kept;
    for (k, w) in weights[..keep].iter().enumerate() {
        if u < *w {
            return ids[k];
        }
        u -= w;
    }
    ids[keep - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: 0,
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
}

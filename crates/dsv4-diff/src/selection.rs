//! Judging the model's discrete choices in `--model` mode — the indexer's selection, the
//! router's experts: a candidate's choice for one token either equals the oracle's, or is a
//! top-k of the oracle's own scores after each score moved by at most the error the taps allow
//! (a near-tie, which two correct backends may break differently), or it differs.
//!
//! A set C of k entries is the top-k of scores s' with |s' − s| ≤ δ entrywise exactly when
//! min_{i∈C} s_i ≥ max_{j∉C} s_j − 2δ (raise C's scores by δ, lower the others' by δ). So the
//! *gap* max_{j∉C} s_j − min_{i∈C} s_i of the candidate's set, measured on the oracle's scores,
//! decides: gap ≤ 2δ is a near-tie.

use crate::report::ChoiceAgreement;
use crate::tolerance::{coarse_rounding, tap_tolerance};
use dsv4_core::Numerics;
use std::collections::BTreeSet;

/// The tap whose tolerance bounds the input of the indexer's scores.
pub const INDEXER_INPUT: &str = "indexer.q";
/// The tap whose tolerance bounds the input of the router's scores.
pub const ROUTER_INPUT: &str = "ffn_norm";

/// How far one score may move on a correct candidate, relative to the largest |score| of its
/// token: the relative L2 error the tolerance of the scores' input tap `input` allows (√NMSE),
/// or 0 when the sides must agree bitwise.
pub fn score_slack(exact: bool, input: &str, oracle: &Numerics, candidate: &Numerics) -> f64 {
    if exact {
        return 0.0;
    }
    tap_tolerance(input, coarse_rounding(input, oracle, candidate)).sqrt()
}

/// The verdict on one token's selection.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The same set.
    Same,
    /// A different set within a near-tie: `gap / allowed` (≤ 1) of the oracle's scores.
    Tie(f64),
    /// A different set the oracle's scores cannot justify; why.
    Differs(String),
}

/// Judge the candidate's selection `cand` against the oracle's `oracle` over the oracle's
/// `scores` of the token's entries, each score allowed to move by `slack`·max|score|.
pub fn judge(oracle: &[u32], cand: &[u32], scores: &[f32], slack: f64) -> Verdict {
    let (o, c): (BTreeSet<u32>, BTreeSet<u32>) = (
        oracle.iter().copied().collect(),
        cand.iter().copied().collect(),
    );
    if o == c && oracle.len() == cand.len() {
        return Verdict::Same;
    }
    let n = scores.len();
    if c.len() != cand.len() || c.len() != o.len() {
        return Verdict::Differs(format!(
            "the candidate selects {} entries ({} distinct), the oracle {}",
            cand.len(),
            c.len(),
            o.len()
        ));
    }
    if let Some(&j) = c.iter().find(|&&j| j as usize >= n) {
        return Verdict::Differs(format!(
            "the candidate selects entry {j} of {n} compressed entries"
        ));
    }
    let only_c: Vec<u32> = c.difference(&o).copied().collect();
    let only_o: Vec<u32> = o.difference(&c).copied().collect();
    if slack == 0.0 {
        return Verdict::Differs(format!(
            "the candidate selects {only_c:?} instead of {only_o:?}, and the sides must agree \
             bitwise"
        ));
    }
    let score = |j: u32| f64::from(scores[j as usize]);
    let Some(chosen_min) = c
        .iter()
        .map(|&j| (j, score(j)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
    else {
        return Verdict::Same;
    };
    let left_max = (0..n as u32)
        .filter(|j| !c.contains(j))
        .map(|j| (j, score(j)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let Some(left_max) = left_max else {
        return Verdict::Same;
    };
    let scale = scores
        .iter()
        .map(|s| f64::from(s.abs()))
        .fold(0.0, f64::max);
    let allowed = 2.0 * slack * scale;
    let gap = left_max.1 - chosen_min.1;
    if gap.is_nan() || scale.is_nan() {
        return Verdict::Differs("the oracle's scores are not numbers".into());
    }
    if gap <= allowed {
        return Verdict::Tie(if allowed > 0.0 {
            gap.max(0.0) / allowed
        } else {
            0.0
        });
    }
    Verdict::Differs(format!(
        "the candidate selects {only_c:?} instead of {only_o:?}: entry {} (oracle score {:.6e}) \
         over entry {} ({:.6e}), a gap of {:.3e} where near-ties allow {:.3e}",
        chosen_min.0, chosen_min.1, left_max.0, left_max.1, gap, allowed
    ))
}

/// Agreement of one ratio-4 layer, accumulated token by token.
#[derive(Debug, Default)]
pub struct LayerTally {
    tokens: usize,
    same: usize,
    tied: usize,
    worst_tie: f64,
    mismatch: Option<String>,
}

impl LayerTally {
    /// Count token `token`'s verdict.
    pub fn add(&mut self, token: usize, v: Verdict) {
        self.tokens += 1;
        match v {
            Verdict::Same => self.same += 1,
            Verdict::Tie(r) => {
                self.tied += 1;
                self.worst_tie = self.worst_tie.max(r);
            }
            Verdict::Differs(why) => {
                self.mismatch
                    .get_or_insert_with(|| format!("token {token}: {why}"));
            }
        }
    }

    /// The layer's report line.
    pub fn finish(self, layer: usize) -> ChoiceAgreement {
        let agree = self.same + self.tied;
        ChoiceAgreement {
            layer,
            tokens: self.tokens,
            agreeing: self.same,
            tied: self.tied,
            worst_tie: self.worst_tie,
            first_mismatch: self.mismatch,
            rate: if self.tokens == 0 {
                1.0
            } else {
                agree as f64 / self.tokens as f64
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: [f32; 6] = [1.0, 0.5, 0.998, -0.2, 0.1, 0.9];

    #[test]
    fn equal_sets_in_any_order_are_the_same() {
        assert_eq!(judge(&[0, 2], &[2, 0], &S, 0.0), Verdict::Same);
    }

    #[test]
    fn a_swap_across_a_near_tie_is_a_tie_and_a_far_one_differs() {
        // Oracle top-2 of S: {0, 2}. {0, 5} swaps 2 (0.998) for 5 (0.9): gap 0.098.
        assert!(
            matches!(judge(&[0, 2], &[0, 5], &S, 0.05), Verdict::Tie(r) if (r - 0.98).abs() < 1e-3)
        );
        let v = judge(&[0, 2], &[0, 5], &S, 0.04);
        let Verdict::Differs(why) = v else {
            panic!("{v:?}")
        };
        assert!(why.contains("selects [5] instead of [2]"), "{why}");
        assert!(
            why.contains("gap of 9.800e-2 where near-ties allow 8.000e-2"),
            "{why}"
        );
        // An exact tie broken the other way is a tie; bitwise sides (slack 0) allow no flip,
        // not even that one.
        let tied = [1.0f32, 1.0, 0.0];
        assert_eq!(judge(&[0], &[1], &tied, 1e-9), Verdict::Tie(0.0));
        assert!(
            matches!(judge(&[0], &[1], &tied, 0.0), Verdict::Differs(w) if w.contains("bitwise"))
        );
        // All-zero scores: every set is a tie.
        assert_eq!(judge(&[0], &[1], &[0.0; 3], 1e-3), Verdict::Tie(0.0));
    }

    #[test]
    fn malformed_candidate_sets_differ() {
        assert!(
            matches!(judge(&[0, 2], &[0], &S, 1.0), Verdict::Differs(w) if w.contains("selects 1 entries"))
        );
        assert!(
            matches!(judge(&[0, 2], &[0, 0], &S, 1.0), Verdict::Differs(w) if w.contains("1 distinct"))
        );
        assert!(
            matches!(judge(&[0, 2], &[0, 6], &S, 1.0), Verdict::Differs(w) if w.contains("entry 6 of 6"))
        );
        let nan = [1.0, f32::NAN, 0.5];
        assert!(matches!(judge(&[0], &[2], &nan, 1.0), Verdict::Differs(_)));
    }

    #[test]
    fn the_slack_follows_the_indexer_q_tolerance() {
        let fine = Numerics::default();
        let slack = |exact, input, b: &Numerics| score_slack(exact, input, &fine, b);
        assert_eq!(slack(true, INDEXER_INPUT, &fine), 0.0);
        assert!((slack(false, INDEXER_INPUT, &fine) - 1e-5f64.sqrt()).abs() < 1e-12);
        assert!((slack(false, ROUTER_INPUT, &fine) - 1e-6f64.sqrt()).abs() < 1e-12);
        let mut fp8 = fine;
        fp8.index_k_dtype = dsv4_core::IndexKDtype::Fp8;
        assert!((slack(false, INDEXER_INPUT, &fp8) - 1e-3f64.sqrt()).abs() < 1e-12);
        assert!((slack(false, ROUTER_INPUT, &fp8) - 1e-6f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn a_tally_counts_ties_and_keeps_the_first_mismatch() {
        let mut t = LayerTally::default();
        t.add(0, Verdict::Same);
        t.add(1, Verdict::Tie(0.25));
        t.add(2, Verdict::Differs("a".into()));
        t.add(3, Verdict::Differs("b".into()));
        let a = t.finish(3);
        assert_eq!((a.tokens, a.agreeing, a.tied, a.worst_tie), (4, 1, 1, 0.25));
        assert_eq!(a.first_mismatch.as_deref(), Some("token 2: a"));
        assert_eq!(a.rate, 0.5);
    }
}

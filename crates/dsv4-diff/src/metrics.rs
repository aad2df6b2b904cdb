//! The numbers a diff compares by: normalized mean squared error, exact-value and exact-byte
//! mismatch counts, set recall, and the logits statistics of `--model` (max abs error, relative
//! L2, argmax agreement, KL divergence). All accumulate in f64.

/// Σ(a−b)² / Σa² over paired values (a = oracle). 0 when both are all zeros; +∞ when the
/// oracle is all zeros and the candidate is not; NaN when any value is NaN or infinite.
pub fn nmse(oracle: &[f32], candidate: &[f32]) -> f64 {
    let (mut err, mut norm) = (0f64, 0f64);
    for (&a, &b) in oracle.iter().zip(candidate) {
        if !a.is_finite() || !b.is_finite() {
            return f64::NAN;
        }
        let (a, b) = (f64::from(a), f64::from(b));
        err += (a - b) * (a - b);
        norm += a * a;
    }
    if err == 0.0 {
        0.0
    } else if norm == 0.0 {
        f64::INFINITY
    } else {
        err / norm
    }
}

/// Largest |a−b| (NaN when any value is NaN).
pub fn max_abs_diff(oracle: &[f32], candidate: &[f32]) -> f64 {
    let mut m = 0f64;
    for (&a, &b) in oracle.iter().zip(candidate) {
        let d = (f64::from(a) - f64::from(b)).abs();
        if d.is_nan() {
            return f64::NAN;
        }
        m = m.max(d);
    }
    m
}

/// ‖a−b‖₂ / ‖a‖₂ (the square root of [`nmse`]).
pub fn rel_l2(oracle: &[f32], candidate: &[f32]) -> f64 {
    nmse(oracle, candidate).sqrt()
}

/// How many paired values differ (by value: 0.0 equals −0.0, NaN equals NaN).
pub fn value_mismatches(oracle: &[f32], candidate: &[f32]) -> usize {
    oracle
        .iter()
        .zip(candidate)
        .filter(|(a, b)| !(a == b || (a.is_nan() && b.is_nan())))
        .count()
}

/// Index of the first value that differs as [`value_mismatches`] counts, if any.
pub fn first_value_mismatch(oracle: &[f32], candidate: &[f32]) -> Option<usize> {
    oracle
        .iter()
        .zip(candidate)
        .position(|(a, b)| !(a == b || (a.is_nan() && b.is_nan())))
}

/// How many paired bytes differ.
pub fn byte_mismatches(oracle: &[u8], candidate: &[u8]) -> usize {
    oracle.iter().zip(candidate).filter(|(a, b)| a != b).count()
}

/// |oracle ∩ candidate| / |oracle| for index sets (1 when the oracle set is empty).
pub fn recall<T: Ord + Copy>(oracle: &[T], candidate: &[T]) -> f64 {
    if oracle.is_empty() {
        return 1.0;
    }
    let mut c = candidate.to_vec();
    c.sort_unstable();
    let hit = oracle.iter().filter(|x| c.binary_search(x).is_ok()).count();
    hit as f64 / oracle.len() as f64
}

/// Whether two index lists hold the same set (order ignored, duplicates count).
pub fn same_set<T: Ord + Copy>(a: &[T], b: &[T]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

/// Index of the largest value (the first on ties; NaN never wins).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] || row[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best
}

/// log-softmax of one row, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let lse = row
        .iter()
        .map(|&v| (f64::from(v) - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    row.iter().map(|&v| f64::from(v) - lse).collect()
}

/// KL(softmax(oracle) ‖ softmax(candidate)) of one logits row, in nats.
pub fn kl_divergence(oracle: &[f32], candidate: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(oracle), log_softmax(candidate));
    lp.iter()
        .zip(&lq)
        .map(|(&p, &q)| {
            if p == f64::NEG_INFINITY {
                0.0
            } else {
                p.exp() * (p - q)
            }
        })
        .sum()
}

/// Statistics of two logits matrices [rows, vocab] (rows are token positions).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LogitsStats {
    /// Rows compared.
    pub rows: usize,
    /// Largest |a−b| over all logits.
    pub max_abs: f64,
    /// ‖a−b‖₂ / ‖a‖₂ over all logits.
    pub rel_l2: f64,
    /// Fraction of rows whose argmax agrees.
    pub argmax_agreement: f64,
    /// Mean over rows of KL(softmax(oracle) ‖ softmax(candidate)), nats.
    pub mean_kl: f64,
}

/// Compare two logits matrices of `vocab` columns (equal lengths expected; extra values ignored).
pub fn logits_stats(oracle: &[f32], candidate: &[f32], vocab: usize) -> LogitsStats {
    let n = oracle.len().min(candidate.len());
    let (oracle, candidate) = (&oracle[..n], &candidate[..n]);
    let rows = n.checked_div(vocab).unwrap_or(0);
    let (mut agree, mut kl) = (0usize, 0f64);
    for r in 0..rows {
        let (a, b) = (
            &oracle[r * vocab..(r + 1) * vocab],
            &candidate[r * vocab..(r + 1) * vocab],
        );
        agree += usize::from(argmax(a) == argmax(b));
        kl += kl_divergence(a, b);
    }
    let per_row = |x: f64| if rows == 0 { 0.0 } else { x / rows as f64 };
    LogitsStats {
        rows,
        max_abs: max_abs_diff(oracle, candidate),
        rel_l2: rel_l2(oracle, candidate),
        argmax_agreement: if rows == 0 {
            1.0
        } else {
            agree as f64 / rows as f64
        },
        mean_kl: per_row(kl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_of_equal_scaled_and_degenerate_inputs() {
        assert_eq!(nmse(&[1.0, -2.0], &[1.0, -2.0]), 0.0);
        // 1% off everywhere: NMSE 1e-4.
        let a = [1.0f32, -2.0, 3.0];
        let b: Vec<f32> = a.iter().map(|v| v * 1.01).collect();
        assert!((nmse(&a, &b) - 1e-4).abs() < 1e-9, "{}", nmse(&a, &b));
        assert_eq!(nmse(&[0.0, 0.0], &[0.0, 1.0]), f64::INFINITY);
        assert_eq!(nmse(&[0.0], &[0.0]), 0.0);
        assert!(nmse(&[1.0], &[f32::NAN]).is_nan());
        assert!(nmse(&[f32::INFINITY], &[f32::INFINITY]).is_nan());
    }

    #[test]
    fn exact_counts_recall_and_sets() {
        assert_eq!(
            value_mismatches(&[0.0, 1.0, f32::NAN], &[-0.0, 2.0, f32::NAN]),
            1
        );
        assert_eq!(first_value_mismatch(&[1.0, 2.0], &[1.0, 3.0]), Some(1));
        assert_eq!(first_value_mismatch(&[1.0], &[1.0]), None);
        assert_eq!(byte_mismatches(&[1, 2, 3], &[1, 0, 0]), 2);
        assert_eq!(recall(&[1, 2, 3, 4], &[4, 3, 9, 8]), 0.5);
        assert_eq!(recall::<u32>(&[], &[1]), 1.0);
        assert!(same_set(&[3, 1, 2], &[1, 2, 3]));
        assert!(!same_set(&[1, 1], &[1, 2]));
    }

    #[test]
    fn logits_statistics() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 0.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
        let a = [0.0f32, 1.0, 2.0, 5.0, 0.0, 0.0];
        let s = logits_stats(&a, &a, 3);
        assert_eq!(
            (s.rows, s.max_abs, s.rel_l2, s.argmax_agreement),
            (2, 0.0, 0.0, 1.0)
        );
        assert!(s.mean_kl.abs() < 1e-12);
        let b = [0.0f32, 1.0, 2.0, 0.0, 5.0, 0.0];
        let s = logits_stats(&a, &b, 3);
        assert_eq!(s.argmax_agreement, 0.5);
        assert_eq!(s.max_abs, 5.0);
        assert!(s.mean_kl > 1.0, "{}", s.mean_kl);
        // KL of a shifted row is zero (softmax is shift-invariant).
        assert!(kl_divergence(&[1.0, 2.0], &[11.0, 12.0]).abs() < 1e-12);
    }
}

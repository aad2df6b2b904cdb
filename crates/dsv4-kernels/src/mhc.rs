//! Shared mHC math every backend uses as is: the Sinkhorn normalisation of the stream-mixing
//! matrix (spec §3.1). It runs on M×M (4×4) matrices per token, so there is nothing to accelerate.

/// Sinkhorn normalisation of an M×M matrix of logits (row j = source stream, column k = target):
/// row-wise softmax plus `eps`, columns divided by (sum + eps), then `iters − 1` rounds of rows
/// then columns divided by (sum + eps). f64 throughout.
pub fn sinkhorn(logits: &[f64], m: usize, eps: f64, iters: usize) -> Vec<f64> {
    let mut c = vec![0f64; m * m];
    for j in 0..m {
        let row = &logits[j * m..(j + 1) * m];
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        for k in 0..m {
            c[j * m + k] = (row[k] - max).exp() / sum + eps;
        }
    }
    let normalize_cols = |c: &mut [f64]| {
        for k in 0..m {
            let s: f64 = (0..m).map(|j| c[j * m + k]).sum();
            for j in 0..m {
                c[j * m + k] /= s + eps;
            }
        }
    };
    normalize_cols(&mut c);
    for _ in 1..iters {
        for j in 0..m {
            let s: f64 = c[j * m..(j + 1) * m].iter().sum();
            for v in &mut c[j * m..(j + 1) * m] {
                *v /= s + eps;
            }
        }
        normalize_cols(&mut c);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinkhorn_gives_a_doubly_stochastic_matrix() {
        let logits = [
            3.0, -1.0, 0.5, 2.0, 0.0, -4.0, 1.5, 1.0, 0.2, 0.1, -0.3, 2.2, -2.0, 0.7, 0.9, 1.1,
        ];
        let c = sinkhorn(&logits, 4, 1e-6, 20);
        for i in 0..4 {
            let row: f64 = c[i * 4..(i + 1) * 4].iter().sum();
            let col: f64 = (0..4).map(|j| c[j * 4 + i]).sum();
            assert!((row - 1.0).abs() < 1e-3, "row {i} sums to {row}");
            assert!((col - 1.0).abs() < 1e-5, "column {i} sums to {col}");
        }
        assert!(c.iter().all(|&v| v > 0.0));
    }
}

//! RoPE frequency tables (spec §3.2): plain for ratio-0 layers, YaRN-scaled for compressed layers.

/// Per-pair rotation frequencies θ_i (i < rd/2) of one layer kind.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    /// Rotary dims (the last `rd` dims of a vector are rotated).
    pub rd: usize,
    /// θ_i for each pair (x₂ᵢ, x₂ᵢ₊₁) of the rotary part.
    pub freqs: Vec<f64>,
}

/// YaRN parameters (`rope_scaling` of config.json).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// Context extension factor.
    pub factor: f64,
    /// Original training context.
    pub original_max_position: f64,
    /// β_fast.
    pub beta_fast: f64,
    /// β_slow.
    pub beta_slow: f64,
}

impl RopeTable {
    /// θ_i = base^(−2i/rd), no scaling (ratio-0 layers).
    pub fn plain(rd: usize, base: f64) -> Self {
        let freqs = (0..rd / 2)
            .map(|i| base.powf(-((2 * i) as f64) / rd as f64))
            .collect();
        Self { rd, freqs }
    }

    /// YaRN-scaled frequencies (compressed layers): θ'_i = θ_i(1−ramp_i) + (θ_i/factor)·ramp_i with
    /// the correction range low/high clamped to [0, rd−1]; no magnitude scaling.
    pub fn yarn(rd: usize, base: f64, y: Yarn) -> Self {
        let plain = Self::plain(rd, base);
        let d = |n: f64| {
            rd as f64 * (y.original_max_position / (2.0 * std::f64::consts::PI * n)).ln()
                / (2.0 * base.ln())
        };
        let max = (rd - 1) as f64;
        let low = d(y.beta_fast).floor().clamp(0.0, max);
        let mut high = d(y.beta_slow).ceil().clamp(0.0, max);
        if high == low {
            // As the official code: avoid a zero-width ramp.
            high += 0.001;
        }
        let freqs = plain
            .freqs
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                t * (1.0 - ramp) + (t / y.factor) * ramp
            })
            .collect();
        Self { rd, freqs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_frequencies_and_yarn_ramp() {
        let p = RopeTable::plain(64, 10000.0);
        assert_eq!(p.freqs.len(), 32);
        assert_eq!(p.freqs[0], 1.0);
        assert!((p.freqs[1] - 10000f64.powf(-2.0 / 64.0)).abs() < 1e-15);
        let y = Yarn {
            factor: 16.0,
            original_max_position: 65536.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let t = RopeTable::yarn(64, 160000.0, y);
        let base = RopeTable::plain(64, 160000.0);
        // High frequencies (small i) are untouched, the lowest are divided by the factor.
        assert_eq!(t.freqs[0], base.freqs[0]);
        assert!((t.freqs[31] - base.freqs[31] / 16.0).abs() < 1e-18);
        // In between, monotone non-increasing ratio.
        let ratios: Vec<f64> = t
            .freqs
            .iter()
            .zip(&base.freqs)
            .map(|(a, b)| a / b)
            .collect();
        assert!(ratios.windows(2).all(|w| w[1] <= w[0] + 1e-12));
    }
}

//! The statistics `dsv4 ab` reports, in closed form: Wilson score intervals for a failure rate,
//! Newcombe's hybrid score interval for a difference of two rates, Fisher's exact test
//! (two-sided, as R's `fisher.test` computes it), a sample-size note from the two-proportion
//! normal approximation, and mean/sd/min/max of a per-repeat measurement.
//!
//! Distributions come from `statrs`. Every function refuses impossible counts (no trials, more
//! failures than trials) with a [`StatsError`] instead of returning NaN.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Discrete, Hypergeometric, Normal};

/// The two-sided 95% normal quantile, Φ⁻¹(0.975).
pub const Z95: f64 = 1.959_963_984_540_054;

/// Significance level of the sample-size note.
pub const ALPHA: f64 = 0.05;

/// Power of the sample-size note.
pub const POWER: f64 = 0.8;

/// Relative tolerance under which two table probabilities count as equal in Fisher's test
/// (R's `fisher.test` uses `1 + 1e-7`).
const FISHER_REL_TOL: f64 = 1e-7;

/// Why a statistic could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatsError {
    /// A proportion with no trials has no estimate.
    #[error("no sessions ran in {what}: a failure rate needs at least one session")]
    NoTrials {
        /// Which count (e.g. "arm A").
        what: String,
    },
    /// More failures than trials.
    #[error("{what}: {failures} failures out of {trials} sessions is impossible")]
    TooManyFailures {
        /// Which count.
        what: String,
        /// Failures claimed.
        failures: u64,
        /// Trials run.
        trials: u64,
    },
    /// A summary of no values.
    #[error("no values to summarise for {what}")]
    Empty {
        /// Which measurement.
        what: String,
    },
    /// A value that is not a finite number.
    #[error("{what}: {value} is not a finite number")]
    NotFinite {
        /// Which measurement.
        what: String,
        /// The value.
        value: f64,
    },
}

/// A closed interval of a proportion or a difference of proportions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Lower bound.
    pub low: f64,
    /// Upper bound.
    pub high: f64,
}

/// Failures out of trials, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    /// Sessions with a failure.
    pub failures: u64,
    /// Sessions run.
    pub trials: u64,
}

impl Count {
    /// A count, refusing `trials == 0` and `failures > trials`; `what` names it in errors.
    pub fn new(failures: u64, trials: u64, what: &str) -> Result<Self, StatsError> {
        if trials == 0 {
            return Err(StatsError::NoTrials { what: what.into() });
        }
        if failures > trials {
            return Err(StatsError::TooManyFailures {
                what: what.into(),
                failures,
                trials,
            });
        }
        Ok(Self { failures, trials })
    }

    /// The observed rate failures / trials.
    pub fn rate(&self) -> f64 {
        self.failures as f64 / self.trials as f64
    }
}

/// The Wilson score 95% interval of a failure rate.
pub fn wilson(c: Count) -> Interval {
    wilson_z(c, Z95)
}

/// The Wilson score interval with normal quantile `z`.
fn wilson_z(c: Count, z: f64) -> Interval {
    let n = c.trials as f64;
    let p = c.rate();
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = z / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    // At p = 0 or 1 one bound is exactly 0 or 1; clamp away rounding.
    let low = if c.failures == 0 {
        0.0
    } else {
        (center - half).max(0.0)
    };
    let high = if c.failures == c.trials {
        1.0
    } else {
        (center + half).min(1.0)
    };
    Interval { low, high }
}

/// Newcombe's hybrid score 95% interval (his method 10) for the difference of rates
/// `rate(x) - rate(y)`, built from the two Wilson intervals.
pub fn newcombe(x: Count, y: Count) -> Interval {
    let (p1, p2) = (x.rate(), y.rate());
    let (w1, w2) = (wilson(x), wilson(y));
    let d = p1 - p2;
    let low = d - ((p1 - w1.low).powi(2) + (w2.high - p2).powi(2)).sqrt();
    let high = d + ((w1.high - p1).powi(2) + (p2 - w2.low).powi(2)).sqrt();
    Interval {
        low: low.max(-1.0),
        high: high.min(1.0),
    }
}

/// Fisher's exact test, two-sided, on the 2×2 table of failures and successes of `x` and `y`:
/// the probability, under the hypergeometric null with the margins fixed, of every table at
/// most as likely as the observed one (ties within a relative 1e-7, as R does).
pub fn fisher_two_sided(x: Count, y: Count) -> f64 {
    let population = x.trials + y.trials;
    let failures = x.failures + y.failures;
    let draws = x.trials;
    // The margins are consistent by construction (failures ≤ population, draws ≤ population).
    let Ok(h) = Hypergeometric::new(population, failures, draws) else {
        return 1.0;
    };
    let lo = draws.saturating_sub(population - failures);
    let hi = draws.min(failures);
    let logs: Vec<f64> = (lo..=hi).map(|k| h.ln_pmf(k)).collect();
    let max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let dens: Vec<f64> = logs.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = dens.iter().sum();
    let observed = dens[(x.failures - lo) as usize];
    let cut = observed * (1.0 + FISHER_REL_TOL);
    let p: f64 = dens.iter().filter(|&&d| d <= cut).sum::<f64>() / total;
    p.min(1.0)
}

/// How many sessions per arm would detect an effect, from the two-proportion normal
/// approximation (two-sided α = 0.05, power 0.8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PowerNote {
    /// The rates the note is computed for (A's, B's).
    pub rates: (f64, f64),
    /// Sessions per arm needed; `None` when the effect is zero (no finite sample size).
    pub sessions_per_arm: Option<u64>,
    /// Sessions per arm that actually ran.
    pub sessions_run: u64,
    /// One sentence for the human summary.
    pub text: String,
}

/// Sessions per arm to detect rates `p1` vs `p2` with a two-sided test at [`ALPHA`] and power
/// [`POWER`]: n = (z_{α/2}·√(2·p̄·q̄) + z_β·√(p1·q1 + p2·q2))² / (p1 − p2)², rounded up.
/// `None` when p1 == p2.
pub fn sessions_needed(p1: f64, p2: f64) -> Option<u64> {
    let effect = (p1 - p2).abs();
    if !p1.is_finite() || !p2.is_finite() || effect == 0.0 {
        return None;
    }
    let normal = Normal::standard();
    let z_a = normal.inverse_cdf(1.0 - ALPHA / 2.0);
    let z_b = normal.inverse_cdf(POWER);
    let pbar = (p1 + p2) / 2.0;
    let a = z_a * (2.0 * pbar * (1.0 - pbar)).sqrt();
    let b = z_b * (p1 * (1.0 - p1) + p2 * (1.0 - p2)).sqrt();
    let n = ((a + b) / effect).powi(2);
    Some(n.ceil().max(1.0) as u64)
}

/// The power note for an observed A/B result.
///
/// With an arm at 0 failures the observed rate 0 is still used (the formula stays finite while
/// the other arm failed), and the note adds the "rule of three" bound: with 0 failures in n
/// sessions the rate is below about 3/n at 95%. With equal rates there is no finite sample size;
/// the note then says how many sessions would resolve a rate as large as the larger Wilson upper
/// bound against 0.
pub fn power_note(a: Count, b: Count) -> PowerNote {
    let (pa, pb) = (a.rate(), b.rate());
    let run = a.trials.min(b.trials);
    let needed = sessions_needed(pa, pb);
    let mut text = match needed {
        Some(n) => {
            let verdict = if run >= n {
                "this run had enough"
            } else {
                "this run was underpowered for it"
            };
            format!(
                "detecting {:.1}% vs {:.1}% (two-sided α=0.05, power 0.8) needs {n} sessions per arm; \
                 {run} ran per arm, so {verdict}",
                100.0 * pa,
                100.0 * pb
            )
        }
        None => {
            let upper = wilson(a).high.max(wilson(b).high);
            let resolve = sessions_needed(upper, 0.0)
                .map(|n| {
                    format!(
                        "; resolving a {:.1}% rate against 0% would need {n} sessions per arm",
                        100.0 * upper
                    )
                })
                .unwrap_or_default();
            format!(
                "no difference observed ({:.1}% in both arms): no finite sample size detects a zero effect{resolve}",
                100.0 * pa
            )
        }
    };
    for (name, c) in [("A", a), ("B", b)] {
        if c.failures == 0 {
            text.push_str(&format!(
                "; {name} had 0/{} failures, so its rate is below {:.2}% at 95% (rule of three: 3/n)",
                c.trials,
                100.0 * 3.0 / c.trials as f64
            ));
        }
    }
    PowerNote {
        rates: (pa, pb),
        sessions_per_arm: needed,
        sessions_run: run,
        text,
    }
}

/// Mean, sample standard deviation, min and max of a measurement across repeats.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Values summarised.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1 in the denominator; 0 for a single value).
    pub sd: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

/// The spread of `values`; an error for an empty slice or a non-finite value.
pub fn spread(values: &[f64], what: &str) -> Result<Spread, StatsError> {
    if values.is_empty() {
        return Err(StatsError::Empty { what: what.into() });
    }
    if let Some(&value) = values.iter().find(|v| !v.is_finite()) {
        return Err(StatsError::NotFinite {
            what: what.into(),
            value,
        });
    }
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n as f64;
    let sd = if n > 1 {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Ok(Spread {
        n,
        mean,
        sd,
        min,
        max,
    })
}

/// (b − a) / a, or `None` when a is 0 or either value is not finite.
pub fn relative_delta(a: f64, b: f64) -> Option<f64> {
    let d = (b - a) / a;
    (a != 0.0 && d.is_finite()).then_some(d)
}

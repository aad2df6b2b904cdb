//! [`AbBundle`]: the evidence of one A/B run (`"format": "dsv4-ab/1"`, the fields
//! docs/ledger.md lists plus the rest of the evidence: the difference with Newcombe's interval,
//! throughput and latency per arm with their spread across repeats and per-repeat paired deltas,
//! the power note, what ran and where, and every repeat's full stress report with its
//! per-session records), and the summary printed for people.

use super::provenance::{Machine, Versions};
use super::{AbError, AbOptions, Target};
use crate::options::StressOptions;
use crate::report::StressReport;
use crate::stats::{
    Count, PowerNote, Spread, fisher_two_sided, newcombe, power_note, relative_delta, spread,
    wilson,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The `format` of an A/B bundle (the value the ledger looks for).
pub const AB_FORMAT: &str = "dsv4-ab/1";

/// One arm of one repeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepeatRun {
    /// 0-based repeat index.
    pub repeat: usize,
    /// "A" or "B".
    pub arm: String,
    /// The URL the workload ran against.
    pub url: String,
    /// Whether this run booted its own server (false for a URL arm).
    pub booted: bool,
    /// The `dsv4 serve` command line, when booted.
    pub server_command: Option<Vec<String>>,
    /// Seconds from spawn to `/health` 200, when booted.
    pub boot_s: Option<f64>,
    /// How the server exited after SIGTERM, when booted.
    pub server_exit: Option<String>,
    /// The full stress report (metrics, signatures, per-session records).
    pub report: StressReport,
}

/// One arm's totals over all repeats (the first six fields are the ledger's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmResult {
    /// What the arm ran.
    pub label: String,
    /// Sessions over all repeats.
    pub sessions: u64,
    /// Sessions with a corruption signature.
    pub failures: u64,
    /// Wilson 95% interval of the failure rate, lower bound.
    pub ci_low: f64,
    /// Wilson 95% interval of the failure rate, upper bound.
    pub ci_high: f64,
    /// Output tokens per second, pooled: all output tokens over all concurrent-phase seconds.
    pub tokens_per_s: f64,
    /// failures / sessions.
    pub rate: f64,
    /// Requests that produced no answer (not counted as corruption).
    pub requests_failed: u64,
    /// Occurrences per signature over all repeats.
    pub signatures: BTreeMap<String, usize>,
    /// Sessions showing each signature over all repeats.
    pub signature_sessions: BTreeMap<String, usize>,
    /// Where the arm's requests went.
    pub target: Target,
    /// The resolved configuration with provenance (null for a URL arm).
    pub config: serde_json::Value,
}

/// The difference of failure rates B − A.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    /// rate(B) − rate(A).
    pub estimate: f64,
    /// 95% interval, lower bound.
    pub ci_low: f64,
    /// 95% interval, upper bound.
    pub ci_high: f64,
    /// The interval's method.
    pub method: String,
}

/// One throughput or latency metric compared across the arms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricComparison {
    /// The vLLM metric name (e.g. `median_ttft_ms`).
    pub name: String,
    /// A's value across repeats.
    pub a: Spread,
    /// B's value across repeats.
    pub b: Spread,
    /// (mean B − mean A) / mean A; null when A's mean is 0.
    pub delta: Option<f64>,
    /// (B − A) / A within each repeat (the arms of a repeat run back to back), across repeats;
    /// null when some repeat's A value is 0.
    pub paired_delta: Option<Spread>,
}

/// The evidence bundle of an A/B run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbBundle {
    /// [`AB_FORMAT`].
    pub format: String,
    /// The command line that reproduces the run.
    pub command: String,
    /// The baseline.
    pub a: ArmResult,
    /// The change.
    pub b: ArmResult,
    /// Fisher's exact test, two-sided, on the failure counts.
    pub p_value: f64,
    /// (B − A) / A of the pooled output tokens per second; 0 when A produced no tokens (see
    /// `throughput_delta_defined`).
    pub throughput_delta: f64,
    /// False when A produced no output tokens, so no relative delta exists.
    pub throughput_delta_defined: bool,
    /// Failure rate B − A with Newcombe's interval.
    pub difference: Difference,
    /// Throughput and latency metrics per arm across repeats.
    pub metrics: Vec<MetricComparison>,
    /// Sessions per arm needed to detect the observed effect.
    pub power: PowerNote,
    /// Repeats run (each boots every booted arm afresh, A then B).
    pub repeats: usize,
    /// The workload (its `url` is per arm; repeat r used seed `seed + r`).
    pub workload: StressOptions,
    /// Versions of what ran.
    pub versions: Versions,
    /// The machine.
    pub machine: Machine,
    /// Every arm of every repeat, in the order run, with its full stress report.
    pub runs: Vec<RepeatRun>,
}

/// Reads one metric from a report.
type MetricOf = fn(&StressReport) -> f64;

/// The metrics compared across arms, from each report's vLLM metrics.
const METRICS: &[(&str, MetricOf)] = &[
    ("output_throughput", |r| r.metrics.output_throughput),
    ("request_throughput", |r| r.metrics.request_throughput),
    ("median_ttft_ms", |r| r.metrics.median_ttft_ms),
    ("p99_ttft_ms", |r| r.metrics.p99_ttft_ms),
    ("median_tpot_ms", |r| r.metrics.median_tpot_ms),
    ("median_itl_ms", |r| r.metrics.median_itl_ms),
    ("median_e2el_ms", |r| r.metrics.median_e2el_ms),
    ("p99_e2el_ms", |r| r.metrics.p99_e2el_ms),
];

/// Sum the counts of several maps.
fn add_counts(into: &mut BTreeMap<String, usize>, from: &BTreeMap<String, usize>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

impl AbBundle {
    /// Compute the statistics of finished runs (A and B of every repeat, in any order).
    pub fn build(
        opts: &AbOptions,
        runs: Vec<RepeatRun>,
        versions: Versions,
        machine: Machine,
    ) -> Result<Self, AbError> {
        let of = |arm: &str| -> Vec<&RepeatRun> { runs.iter().filter(|r| r.arm == arm).collect() };
        let (ra, rb) = (of("A"), of("B"));
        let a = arm_result(&opts.a, &ra, "arm A")?;
        let b = arm_result(&opts.b, &rb, "arm B")?;
        let ca = Count::new(a.failures, a.sessions, "arm A")?;
        let cb = Count::new(b.failures, b.sessions, "arm B")?;
        let d = newcombe(cb, ca);
        let mut metrics = Vec::new();
        for (name, get) in METRICS {
            metrics.push(compare(name, &ra, &rb, *get)?);
        }
        let throughput = relative_delta(a.tokens_per_s, b.tokens_per_s);
        Ok(AbBundle {
            format: AB_FORMAT.into(),
            command: opts.command.clone(),
            p_value: fisher_two_sided(ca, cb),
            throughput_delta: throughput.unwrap_or(0.0),
            throughput_delta_defined: throughput.is_some(),
            difference: Difference {
                estimate: cb.rate() - ca.rate(),
                ci_low: d.low,
                ci_high: d.high,
                method: "Newcombe hybrid score (method 10), 95%".into(),
            },
            metrics,
            power: power_note(ca, cb),
            repeats: opts.repeat,
            workload: opts.workload.clone(),
            versions,
            machine,
            a,
            b,
            runs,
        })
    }

    /// The bundle as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a bundle always serialises")
    }

    /// The summary printed for people.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "dsv4 ab: {} repeat(s) × {} sessions per arm, A and B interleaved, same seeds",
            self.repeats, self.workload.sessions
        );
        for (name, arm) in [("A", &self.a), ("B", &self.b)] {
            let _ = writeln!(
                s,
                "{name} {}: {}/{} sessions failed, {:.1}% [95% CI {:.1}%, {:.1}%], {:.1} output tok/s",
                arm.label,
                arm.failures,
                arm.sessions,
                100.0 * arm.rate,
                100.0 * arm.ci_low,
                100.0 * arm.ci_high,
                arm.tokens_per_s
            );
            let found: Vec<String> = arm
                .signature_sessions
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            if !found.is_empty() {
                let _ = writeln!(s, "  sessions per signature: {}", found.join(", "));
            }
            if arm.requests_failed > 0 {
                let _ = writeln!(s, "  requests without an answer: {}", arm.requests_failed);
            }
        }
        let d = &self.difference;
        let _ = writeln!(
            s,
            "failure rate B − A: {:+.1} points [95% CI {:+.1}, {:+.1}] (Newcombe)",
            100.0 * d.estimate,
            100.0 * d.ci_low,
            100.0 * d.ci_high
        );
        let verdict = if self.p_value < 0.05 {
            "significant at 0.05"
        } else {
            "not significant at 0.05"
        };
        let _ = writeln!(
            s,
            "Fisher's exact test (two-sided): p = {:.3e} ({verdict})",
            self.p_value
        );
        if self.throughput_delta_defined {
            let _ = writeln!(
                s,
                "throughput (B − A) / A: {:+.1}%",
                100.0 * self.throughput_delta
            );
        } else {
            let _ = writeln!(
                s,
                "throughput: A produced no output tokens, no relative delta"
            );
        }
        let _ = writeln!(
            s,
            "per metric, mean ± sd across repeats (A → B, delta; paired per-repeat delta):"
        );
        for m in &self.metrics {
            let delta = m
                .delta
                .map_or_else(|| "n/a".into(), |d| format!("{:+.1}%", 100.0 * d));
            let paired = m.paired_delta.map_or_else(
                || "n/a".into(),
                |p| {
                    format!(
                        "{:+.1}% ± {:.1}% [{:+.1}%, {:+.1}%]",
                        100.0 * p.mean,
                        100.0 * p.sd,
                        100.0 * p.min,
                        100.0 * p.max
                    )
                },
            );
            let _ = writeln!(
                s,
                "  {:<19} {:.2} ± {:.2} → {:.2} ± {:.2}  {delta}; paired {paired}",
                m.name, m.a.mean, m.a.sd, m.b.mean, m.b.sd
            );
        }
        let _ = writeln!(s, "power: {}", self.power.text);
        for (name, arm) in [("A", &self.a), ("B", &self.b)] {
            if let Target::Url { url } = &arm.target {
                let _ = writeln!(
                    s,
                    "note: {name} ran against {url}, which was not booted by dsv4 ab"
                );
            }
        }
        s
    }
}

/// One arm's totals; an error when it ran no sessions.
fn arm_result(
    spec: &super::ArmSpec,
    runs: &[&RepeatRun],
    what: &str,
) -> Result<ArmResult, AbError> {
    let sessions: u64 = runs.iter().map(|r| r.report.sessions as u64).sum();
    let failures: u64 = runs.iter().map(|r| r.report.failed_sessions as u64).sum();
    let c = Count::new(failures, sessions, what)?;
    let w = wilson(c);
    let tokens: u64 = runs
        .iter()
        .map(|r| r.report.metrics.total_output_tokens)
        .sum();
    let seconds: f64 = runs.iter().map(|r| r.report.metrics.duration).sum();
    let mut signatures = BTreeMap::new();
    let mut signature_sessions = BTreeMap::new();
    for r in runs {
        add_counts(&mut signatures, &r.report.signatures);
        add_counts(&mut signature_sessions, &r.report.signature_sessions);
    }
    Ok(ArmResult {
        label: spec.label.clone(),
        sessions,
        failures,
        ci_low: w.low,
        ci_high: w.high,
        tokens_per_s: if seconds > 0.0 {
            tokens as f64 / seconds
        } else {
            0.0
        },
        rate: c.rate(),
        requests_failed: runs.iter().map(|r| r.report.failed as u64).sum(),
        signatures,
        signature_sessions,
        target: spec.target.clone(),
        config: spec.config.clone(),
    })
}

/// Compare one metric: spread per arm, delta of means, and the per-repeat paired delta.
fn compare(
    name: &str,
    ra: &[&RepeatRun],
    rb: &[&RepeatRun],
    get: MetricOf,
) -> Result<MetricComparison, AbError> {
    let va: Vec<f64> = ra.iter().map(|r| get(&r.report)).collect();
    let vb: Vec<f64> = rb.iter().map(|r| get(&r.report)).collect();
    let a = spread(&va, &format!("{name} of arm A"))?;
    let b = spread(&vb, &format!("{name} of arm B"))?;
    let mut paired = Vec::new();
    for x in ra {
        if let Some(y) = rb.iter().find(|y| y.repeat == x.repeat) {
            paired.push(relative_delta(get(&x.report), get(&y.report)));
        }
    }
    let paired: Option<Vec<f64>> = paired.into_iter().collect();
    let paired_delta = match paired {
        Some(p) if !p.is_empty() => Some(spread(&p, &format!("paired {name} delta"))?),
        _ => None,
    };
    Ok(MetricComparison {
        name: name.into(),
        a,
        b,
        delta: relative_delta(a.mean, b.mean),
        paired_delta,
    })
}

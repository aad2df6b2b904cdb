//! Evidence files: copied under `ledger/evidence/<id>/` with their sha256; when a file is a dsv4
//! A/B bundle (JSON with `"format": "dsv4-ab/1"`, see docs/ledger.md) its summary numbers are
//! lifted into the record.

use crate::error::LedgerError;
use crate::record::hex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

/// The `format` value that marks an A/B evidence bundle.
pub const AB_FORMAT: &str = "dsv4-ab/1";

/// One evidence file of a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceFile {
    /// Path in the repository (`ledger/evidence/<id>/<name>`).
    pub path: String,
    /// sha256 of the contents, lower-case hex.
    pub sha256: String,
    /// Summary numbers when the file is an A/B bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ab: Option<AbSummary>,
}

/// One arm of an A/B run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmSummary {
    /// What the arm ran (e.g. `exec.multi_stream_overlap=true`).
    pub label: String,
    /// Sessions run.
    pub sessions: u64,
    /// Sessions with a corruption signature.
    pub failures: u64,
    /// Wilson 95% interval of the failure rate, lower bound.
    pub ci_low: f64,
    /// Wilson 95% interval of the failure rate, upper bound.
    pub ci_high: f64,
    /// Output tokens per second.
    pub tokens_per_s: f64,
}

impl ArmSummary {
    /// failures / sessions (0 when no sessions ran).
    pub fn rate(&self) -> f64 {
        if self.sessions == 0 {
            0.0
        } else {
            self.failures as f64 / self.sessions as f64
        }
    }
}

/// The summary lifted from an A/B bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbSummary {
    /// The baseline arm.
    pub a: ArmSummary,
    /// The changed arm.
    pub b: ArmSummary,
    /// Fisher's exact test, two-sided, on the failure counts.
    pub p_value: f64,
    /// (B - A) / A throughput, as a fraction.
    pub throughput_delta: f64,
    /// The command that reproduces the run.
    #[serde(default)]
    pub command: String,
}

impl AbSummary {
    /// One line: `A 12/200 (6.0% [3.5%, 10.2%]) vs B 0/200 (...); p=0.0003; throughput -4.1%`.
    pub fn line(&self) -> String {
        let arm = |a: &ArmSummary| {
            format!(
                "{} {}/{} ({:.1}% [{:.1}%, {:.1}%])",
                a.label,
                a.failures,
                a.sessions,
                100.0 * a.rate(),
                100.0 * a.ci_low,
                100.0 * a.ci_high
            )
        };
        format!(
            "{} vs {}; p={:.3e}; throughput {:+.1}%",
            arm(&self.a),
            arm(&self.b),
            self.p_value,
            100.0 * self.throughput_delta
        )
    }
}

/// The bundle as `dsv4 ab` writes it; only the fields the ledger lifts.
#[derive(Deserialize)]
struct Bundle {
    format: String,
    a: ArmSummary,
    b: ArmSummary,
    p_value: f64,
    throughput_delta: f64,
    #[serde(default)]
    command: String,
}

/// sha256 of bytes, lower-case hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The A/B summary of `bytes` when they are an A/B bundle; `Ok(None)` for any other file, an
/// error for a file that says it is a bundle but is malformed.
pub fn ab_summary(bytes: &[u8], path: &Path) -> Result<Option<AbSummary>, LedgerError> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return Ok(None);
    };
    if value.get("format").and_then(|f| f.as_str()) != Some(AB_FORMAT) {
        return Ok(None);
    }
    let bundle: Bundle = serde_json::from_value(value).map_err(|e| {
        LedgerError::Invalid(format!(
            "{}: says it is an A/B bundle ({AB_FORMAT}) but {e}",
            path.display()
        ))
    })?;
    debug_assert_eq!(bundle.format, AB_FORMAT);
    Ok(Some(AbSummary {
        a: bundle.a,
        b: bundle.b,
        p_value: bundle.p_value,
        throughput_delta: bundle.throughput_delta,
        command: bundle.command,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal valid bundle, shared with other tests.
    pub(crate) const BUNDLE: &str = r#"{"format":"dsv4-ab/1","command":"dsv4 ab --set exec.multi_stream_overlap=false",
      "a":{"label":"overlap=true","sessions":200,"failures":12,"ci_low":0.035,"ci_high":0.102,"tokens_per_s":1000.0},
      "b":{"label":"overlap=false","sessions":200,"failures":0,"ci_low":0.0,"ci_high":0.019,"tokens_per_s":959.0},
      "p_value":0.0003,"throughput_delta":-0.041}"#;

    #[test]
    fn lifts_bundle_and_ignores_other_json() {
        let s = ab_summary(BUNDLE.as_bytes(), Path::new("ab.json"))
            .unwrap()
            .unwrap();
        assert_eq!(s.a.failures, 12);
        assert!(
            s.line().contains("12/200 (6.0% [3.5%, 10.2%])"),
            "{}",
            s.line()
        );
        assert!(s.line().contains("throughput -4.1%"));
        assert!(
            ab_summary(b"{\"x\":1}", Path::new("x.json"))
                .unwrap()
                .is_none()
        );
        assert!(
            ab_summary(b"not json", Path::new("x.txt"))
                .unwrap()
                .is_none()
        );
        let broken = br#"{"format":"dsv4-ab/1","a":{}}"#;
        assert!(ab_summary(broken, Path::new("bad.json")).is_err());
    }
}

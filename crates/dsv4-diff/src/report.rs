//! The report of a diff (both modes), serialized as the documented JSON schema (`dsv4.diff/1`,
//! docs/diff.md) and rendered as a human table by [`crate::render()`].

use crate::Op;
use crate::metrics::LogitsStats;
use crate::ops::SizeClass;
use crate::tolerance::Metric;
use dsv4_core::Numerics;
use serde::Serialize;

/// The JSON schema identifier of [`DiffReport`].
pub const SCHEMA: &str = "dsv4.diff/1";

/// Outcome of one op case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Both sides ran cleanly and the metric is within tolerance.
    Pass,
    /// A check failed (guards, poison, non-finite, panic, error) or the metric is out of tolerance.
    Fail,
    /// A side does not implement the op (not a failure).
    Unsupported,
}

impl Status {
    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Unsupported => "unsupported",
        }
    }
}

/// Candidate timing of one case (`--perf`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Perf {
    /// Timed calls.
    pub repeats: usize,
    /// Median wall time of one call, seconds.
    pub median_s: f64,
    /// flops / median time, 1e9/s (None for ops without arithmetic to count).
    pub gflops: Option<f64>,
    /// Minimum bytes moved / median time, 1e9/s.
    pub gbps: Option<f64>,
}

/// One row of the op sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseReport {
    /// `op/class/shape[/numerics]`.
    pub name: String,
    /// The op.
    pub op: Op,
    /// Size family.
    pub class: SizeClass,
    /// Shape text.
    pub shape: String,
    /// Numerics knob exercised, if any.
    pub numerics: Option<String>,
    /// Outcome.
    pub status: Status,
    /// How outputs are compared.
    pub metric: Metric,
    /// The metric's value (None when a check failed before the comparison).
    pub value: Option<f64>,
    /// The op's tolerance for the metric.
    pub tolerance: f64,
    /// What failed, or where the outputs differ most.
    pub detail: Option<String>,
    /// Candidate timing with `--perf`.
    pub perf: Option<Perf>,
}

/// Counts of case outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Cases that passed.
    pub pass: usize,
    /// Cases that failed.
    pub fail: usize,
    /// Cases a side does not support.
    pub unsupported: usize,
}

/// The result of `--ops`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpsReport {
    /// Seed of the inputs.
    pub seed: u64,
    /// Whether `--full` cases were included.
    pub full: bool,
    /// Outcome counts.
    pub summary: Summary,
    /// Wall time of the sweep, seconds.
    pub elapsed_s: f64,
    /// One row per case, in catalog order.
    pub cases: Vec<CaseReport>,
}

impl OpsReport {
    /// True when no case failed.
    pub fn passed(&self) -> bool {
        self.summary.fail == 0
    }
}

/// The comparison of one tap of `--model`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TapDiff {
    /// "prefill" or "decode N" (1-based).
    pub call: String,
    /// Ordinal of the tap within its call.
    pub index: usize,
    /// Layer prefix ("layers.2.", "" for embed/logits).
    pub layer: String,
    /// Op name ("attn.q", "moe.out", …).
    pub op: String,
    /// Values compared.
    pub len: usize,
    /// Normalized mean squared error (NaN, shown as null, when a value is not finite).
    pub nmse: f64,
    /// Largest absolute difference.
    pub max_abs: f64,
    /// The op's NMSE tolerance (coarse or fine, see `tolerance::coarse_rounding`).
    pub tolerance: f64,
    /// Token rows of the tap (1 when its size is not a multiple of the call's tokens).
    pub rows: usize,
    /// Rows whose own NMSE exceeds the tolerance: few for a rounding flip, all for a bug.
    pub rows_over: usize,
    /// nmse ≤ tolerance.
    pub passed: bool,
}

/// Agreement of one layer's discrete choice (the indexer's selection of a ratio-4 layer, or the
/// router's experts of a biased-routing layer) with the oracle's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChoiceAgreement {
    /// Layer index.
    pub layer: usize,
    /// Tokens compared (prefill and decode).
    pub tokens: usize,
    /// Tokens whose chosen set is exactly the oracle's.
    pub agreeing: usize,
    /// Tokens whose set differs within a near-tie of the oracle's scores (see
    /// [`crate::selection`]).
    pub tied: usize,
    /// The largest near-tie gap, as a fraction of what near-ties allow (0 when none).
    pub worst_tie: f64,
    /// The first token whose set differs beyond a near-tie, and how.
    pub first_mismatch: Option<String>,
    /// (agreeing + tied) / tokens (1 when no token).
    pub rate: f64,
}

/// The result of `--model`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelReport {
    /// Prefill tokens.
    pub prefill_tokens: usize,
    /// Decode steps after the prefill.
    pub decode_steps: usize,
    /// Seed of the token ids.
    pub seed: u64,
    /// The first tap above its tolerance, in execution order.
    pub first_divergence: Option<TapDiff>,
    /// Why the two runs could not be compared tap by tap (different tap names or sizes).
    pub structure_error: Option<String>,
    /// Final logits of every call, compared.
    pub logits: LogitsStats,
    /// Selection agreement per ratio-4 layer.
    pub indexer: Vec<ChoiceAgreement>,
    /// Expert-choice agreement per biased-routing layer.
    pub router: Vec<ChoiceAgreement>,
    /// Whether the candidate followed the oracle's choices — attended over its selections,
    /// routed to its experts — while its own were judged.
    pub pinned: bool,
    /// Other sequences in each of the candidate's steps (0: it ran alone, as the oracle).
    pub neighbours: usize,
    /// The ten taps closest to (or furthest past) their tolerance.
    pub worst_taps: Vec<TapDiff>,
    /// Every tap compared, in execution order.
    pub taps: Vec<TapDiff>,
    /// The candidate's device traffic over its calls, on a backend with device memory
    /// (kernels, and how many ran inside replayed graphs under captured plans).
    pub candidate_device: Option<dsv4_kernels::DeviceStats>,
    /// No divergence, no structure error, every indexer and router choice agreeing.
    pub passed: bool,
}

/// What one side of a diff ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideInfo {
    /// Backend registry name.
    pub backend: String,
    /// Numerics knobs (used by `--model`; the op sweep covers every setting itself).
    pub numerics: Numerics,
    /// The model: "tiny (seed N)" or a checkpoint directory.
    pub model: String,
    /// Worker threads asked of the backend (0 = all cores).
    pub threads: usize,
    /// The sums asked of the backend where it offers a choice ("f64" or "f32":
    /// `backend.cpu_sums` on cpu, `backend.cuda_sums` on the CUDA backends); None when it has
    /// one kind or chooses itself.
    pub sums: Option<&'static str>,
}

/// The whole report: both sides and the result of each mode that ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffReport {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    /// The oracle side.
    pub oracle: SideInfo,
    /// The candidate side.
    pub candidate: SideInfo,
    /// True when every mode that ran passed.
    pub passed: bool,
    /// `--ops` result.
    pub ops: Option<OpsReport>,
    /// `--model` result.
    pub model: Option<ModelReport>,
}

impl DiffReport {
    /// A report of the given results; `passed` is computed.
    pub fn new(
        oracle: SideInfo,
        candidate: SideInfo,
        ops: Option<OpsReport>,
        model: Option<ModelReport>,
    ) -> Self {
        let passed =
            ops.as_ref().is_none_or(OpsReport::passed) && model.as_ref().is_none_or(|m| m.passed);
        DiffReport {
            schema: SCHEMA,
            oracle,
            candidate,
            passed,
            ops,
            model,
        }
    }

    /// The report as a JSON value (the `dsv4.diff/1` schema).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self)
            .unwrap_or_else(|e| serde_json::json!({ "schema": SCHEMA, "error": e.to_string() }))
    }
}

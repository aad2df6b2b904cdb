//! Every tolerance of the diff, in one place: the per-op table of `--ops` and the per-tap table
//! of `--model`. docs/diff.md carries both tables as [`op_table_rows`] and [`tap_table_rows`]
//! print them; a test keeps the doc in step.
//!
//! NMSE = Σ(oracle−candidate)² / Σoracle². 1e-7 is a relative RMS error of ≈3e-4: it admits any
//! f32 summation order over the longest reductions of the model (4096–16384 terms) and rejects
//! bf16 rounding of an output (NMSE ≈ 1e-6) or any real bug. Ops without long reductions get
//! 1e-9. Ops whose result is a rounding, a choice or a byte layout must match exactly.

use crate::Op;
use dsv4_core::{ActQuant, IndexKDtype, Numerics};
use serde::Serialize;
use std::fmt;

/// How an op's outputs are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Normalized mean squared error; passes when value ≤ tolerance.
    Nmse,
    /// Count of output values that differ (0.0 = −0.0); passes when value ≤ tolerance.
    Mismatches,
    /// Count of page bytes that differ; passes when value ≤ tolerance.
    ByteMismatches,
    /// |oracle set ∩ candidate set| / |oracle set|; passes when value ≥ tolerance.
    Recall,
}

impl Metric {
    /// Whether `value` is within `tolerance` for this metric (NaN never passes).
    pub fn passes(self, value: f64, tolerance: f64) -> bool {
        match self {
            Metric::Recall => value >= tolerance,
            _ => value <= tolerance,
        }
    }

    /// The metric's name as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Nmse => "nmse",
            Metric::Mismatches => "mismatches",
            Metric::ByteMismatches => "byte_mismatches",
            Metric::Recall => "recall",
        }
    }

    /// "≤" or "≥": how the value must relate to the tolerance.
    pub fn bound(self) -> &'static str {
        match self {
            Metric::Recall => ">=",
            _ => "<=",
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An op's comparison: metric, limit, and why that limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerance {
    /// How outputs are compared.
    pub metric: Metric,
    /// The limit (see [`Metric::passes`]).
    pub limit: f64,
    /// One line on why.
    pub why: &'static str,
}

const fn tol(metric: Metric, limit: f64, why: &'static str) -> Tolerance {
    Tolerance { metric, limit, why }
}

/// The tolerance of an op in `--ops` mode.
pub fn op_tolerance(op: Op) -> Tolerance {
    use Metric::*;
    match op {
        Op::Linear => tol(
            Nmse,
            1e-7,
            "dot products up to 32768 terms in any f32 order",
        ),
        Op::ActQuantFp8 => tol(
            Mismatches,
            0.0,
            "power-of-two scales make the rounding exact",
        ),
        Op::RmsNorm => tol(Nmse, 1e-9, "one sum of squares per row"),
        Op::Rope => tol(
            Nmse,
            1e-9,
            "angles must be formed in f64 (positions up to 2^20)",
        ),
        Op::MhcPre => tol(
            Nmse,
            1e-7,
            "M·D = 16384-term mixing dot products, 20 Sinkhorn rounds",
        ),
        Op::MhcPost => tol(Nmse, 1e-9, "M + 1 terms per output"),
        Op::HcHead => tol(Nmse, 1e-7, "M·D = 16384-term mixing dot products"),
        Op::SoftmaxPool => tol(Nmse, 1e-9, "short per-channel softmax"),
        Op::SoftmaxPoolRows => tol(Nmse, 1e-9, "softmax_pool, several windows per call"),
        Op::Hadamard => tol(Nmse, 1e-9, "log2(d) butterfly stages, or d-term sums"),
        Op::IndexerScores => tol(Nmse, 1e-7, "head-weighted sums with cancellation"),
        Op::IndexerScoresRows => tol(Nmse, 1e-7, "indexer_scores, several rows per call"),
        Op::Topk => tol(
            Recall,
            1.0,
            "same scores must give the same set (ties to the lower index)",
        ),
        Op::TopkRows => tol(Recall, 1.0, "topk, several rows per call"),
        Op::IndexerTopkRows => tol(
            Recall,
            1.0,
            "indexer scores then topk (scores exact in f32: the same set on every backend)",
        ),
        Op::IndexerTopkRanges => tol(
            Recall,
            1.0,
            "indexer_topk_rows with nested key ranges over shared rows",
        ),
        Op::PagedIndexerTopkRows => tol(
            Recall,
            1.0,
            "indexer_topk_rows over exactly dequantized index-K rows (bf16, fp4)",
        ),
        Op::PagedIndexerTopkRanges => tol(
            Recall,
            1.0,
            "paged_indexer_topk_rows with nested key ranges over shared rows",
        ),
        Op::SparseAttention => tol(Nmse, 1e-7, "softmax over up to 4224 keys of 512 dims"),
        Op::SparseAttentionRows => tol(Nmse, 1e-7, "sparse_attention, several rows per call"),
        Op::SparseAttentionIndexed => tol(
            Nmse,
            1e-7,
            "sparse_attention_rows with key rows shared through ids",
        ),
        Op::PagedAttentionRows => tol(
            Nmse,
            1e-7,
            "sparse_attention_rows over exactly dequantized cache rows",
        ),
        Op::PagedAttentionIndexed => tol(
            Nmse,
            1e-7,
            "paged_attention_rows with key rows shared through ids",
        ),
        Op::RouterScores => tol(Nmse, 1e-9, "element-wise"),
        Op::Swiglu => tol(Nmse, 1e-9, "element-wise"),
        Op::CacheStore => tol(ByteMismatches, 0.0, "the spec §4 byte layout is exact"),
        Op::CacheLoad => tol(Mismatches, 0.0, "dequantization is exact"),
        Op::CacheLoadRows => tol(Mismatches, 0.0, "dequantization is exact"),
        Op::CacheEncodeRows => tol(ByteMismatches, 0.0, "the spec §4 byte layout is exact"),
        Op::RoundIndexRows => tol(Mismatches, 0.0, "the rounding is exact"),
    }
}

/// The NMSE tolerances of one `--model` tap op.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TapTolerance {
    /// Op name as the forward pass taps it ("attn.q", "moe.out", …).
    pub op: &'static str,
    /// Limit when no coarse rounding is involved (see [`coarse_rounding`]).
    pub fine: f64,
    /// Limit when coarse rounding is involved.
    pub coarse: f64,
    /// One line on why.
    pub why: &'static str,
}

const fn tap(op: &'static str, fine: f64, coarse: f64, why: &'static str) -> TapTolerance {
    TapTolerance {
        op,
        fine,
        coarse,
        why,
    }
}

/// The tolerances of a tap op that has no row in [`TAP_TOLERANCES`].
pub const DEFAULT_TAP: TapTolerance = tap("(other)", 1e-6, 1e-3, "any new tap");

/// NMSE tolerances of `--model` taps by op name. Errors of f32 reorderings compound through the
/// layers, so taps get more room than single ops. Where a value is rounded coarsely (e4m3
/// activations: steps of 1/8; fp8/fp4 index rows), a difference of one f32 ulp upstream can move
/// a value across a rounding step, and such flips spread downstream: those taps get the
/// `coarse` limit. Measured at the default 64 + 4 tokens of the tiny model, the cpu backend stays
/// ≥ 6× below every limit.
pub const TAP_TOLERANCES: &[TapTolerance] = &[
    tap("embed", 0.0, 0.0, "a copy of embedding rows"),
    tap("attn_norm", 1e-6, 1e-3, "after mHC mixing"),
    tap("attn.q", 1e-6, 1e-3, "two projections, norms, RoPE"),
    tap("attn.kv", 1e-6, 1e-3, "one projection, norm, RoPE"),
    tap(
        "indexer.q",
        1e-5,
        1e-3,
        "rounded to index_k_dtype after RoPE and Hadamard",
    ),
    tap("indexer.weights", 1e-6, 1e-3, "one projection"),
    tap(
        "attn.o",
        1e-5,
        1e-3,
        "reads cache rows rounded to kv_cache_dtype",
    ),
    tap("attn.out", 1e-5, 1e-3, "output projections of attn.o"),
    tap("hc_attn_post", 1e-6, 1e-3, "residual streams"),
    tap("ffn_norm", 1e-6, 1e-3, "after mHC mixing"),
    tap(
        "moe.out",
        1e-5,
        1e-2,
        "expert choice and SwiGLU amplify input flips",
    ),
    tap("hc_ffn_post", 1e-6, 1e-3, "residual streams"),
    tap("logits", 1e-5, 1e-3, "head projection of the final streams"),
];

/// Whether a tap of `op` sees coarse rounding when the sides run `a` and `b`: every tap but
/// `embed` when either side quantizes activations to fp8; `indexer.q` also when either side
/// rounds index rows to fp8 or fp4.
pub fn coarse_rounding(op: &str, a: &Numerics, b: &Numerics) -> bool {
    let act = [a, b].iter().any(|n| n.act_quant == ActQuant::Fp8);
    let index = [a, b].iter().any(|n| n.index_k_dtype != IndexKDtype::Bf16);
    act || (op == "indexer.q" && index)
}

/// The NMSE tolerance of a `--model` tap by op name, with or without coarse rounding.
pub fn tap_tolerance(op: &str, coarse: bool) -> f64 {
    let t = TAP_TOLERANCES
        .iter()
        .find(|t| t.op == op)
        .unwrap_or(&DEFAULT_TAP);
    if coarse { t.coarse } else { t.fine }
}

/// The least fraction of tokens whose indexer selection (per ratio-4 layer) or expert choice
/// (per biased-routing layer) must equal the oracle's set or a near-tie of it
/// ([`crate::selection`]), in `--model` mode.
pub const MIN_CHOICE_AGREEMENT: f64 = 1.0;

/// A limit as the docs print it: `0`, `1`, or `1e-7`.
fn limit_text(x: f64) -> String {
    if x == 0.0 || x == 1.0 {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

/// The per-op table of docs/diff.md, one markdown row per op: op, metric, bound, why.
pub fn op_table_rows() -> Vec<String> {
    Op::ALL
        .iter()
        .map(|&op| {
            let t = op_tolerance(op);
            format!(
                "| `{op}` | {} | {} {} | {} |",
                t.metric,
                t.metric.bound(),
                limit_text(t.limit),
                t.why
            )
        })
        .collect()
}

/// The per-tap table of docs/diff.md, one markdown row per tap op: op, fine and coarse limits, why.
pub fn tap_table_rows() -> Vec<String> {
    TAP_TOLERANCES
        .iter()
        .chain([&DEFAULT_TAP])
        .map(|t| {
            format!(
                "| `{}` | {} | {} | {} |",
                t.op,
                limit_text(t.fine),
                limit_text(t.coarse),
                t.why
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_pass_in_their_direction_and_nan_never_passes() {
        assert!(Metric::Nmse.passes(1e-8, 1e-7));
        assert!(!Metric::Nmse.passes(1e-6, 1e-7));
        assert!(!Metric::Nmse.passes(f64::NAN, 1e-7));
        assert!(Metric::Recall.passes(1.0, 1.0));
        assert!(!Metric::Recall.passes(0.99, 1.0));
        assert!(!Metric::Recall.passes(f64::NAN, 1.0));
        assert!(!Metric::Mismatches.passes(1.0, 0.0));
    }

    #[test]
    fn every_op_has_a_tolerance_and_exact_ops_allow_nothing() {
        for op in Op::ALL {
            let t = op_tolerance(op);
            assert!(!t.why.is_empty());
            if t.metric != Metric::Nmse {
                assert!(t.limit == 0.0 || t.limit == 1.0, "{op}: {t:?}");
            }
        }
        assert_eq!(tap_tolerance("embed", true), 0.0);
        assert_eq!(tap_tolerance("moe.out", false), 1e-5);
        assert_eq!(tap_tolerance("moe.out", true), 1e-2);
        assert_eq!(tap_tolerance("something.new", false), DEFAULT_TAP.fine);
        for t in TAP_TOLERANCES {
            assert!(t.coarse >= t.fine, "{t:?}");
        }
    }

    #[test]
    fn coarse_rounding_follows_the_numerics_of_either_side() {
        let fine = Numerics::default();
        let act = Numerics {
            act_quant: ActQuant::Fp8,
            ..fine
        };
        let fp4 = Numerics {
            index_k_dtype: IndexKDtype::Fp4,
            ..fine
        };
        assert!(!coarse_rounding("attn.o", &fine, &fine));
        assert!(coarse_rounding("attn.o", &fine, &act));
        assert!(coarse_rounding("attn.o", &act, &fine));
        assert!(coarse_rounding("indexer.q", &fp4, &fine));
        assert!(!coarse_rounding("attn.o", &fp4, &fp4));
    }

    #[test]
    fn docs_diff_md_carries_both_tolerance_tables() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/diff.md");
        let doc = std::fs::read_to_string(path).expect("docs/diff.md exists");
        let rows = op_table_rows().into_iter().chain(tap_table_rows());
        for row in rows {
            assert!(doc.contains(&row), "docs/diff.md lacks the row\n{row}");
        }
    }
}

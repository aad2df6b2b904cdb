//! End-to-end tests of the diff against deliberately wrong backends: the op sweep names exactly
//! the broken op, `--model` reports its first divergent tap, poisoning catches an unwritten
//! output, and an unsupported op is reported as such.

use crate::faulty::{FAULTY_NAME, Fault, FaultyBackend};
use crate::report::{ChoiceAgreement, ModelReport};
use crate::{ModelOptions, Op, OpsOptions, Side, SideConfig, Status, run_model, run_ops};
use dsv4_backend_reference::ReferenceBackend;
use std::sync::Arc;

fn faulty_side(fault: Fault) -> Side {
    Side::with_backend(
        SideConfig::default().with_backend(FAULTY_NAME),
        Arc::new(FaultyBackend::new(fault)),
    )
}

fn reference_side() -> Side {
    Side::with_backend(SideConfig::default(), Arc::new(ReferenceBackend))
}

#[test]
fn the_sweep_names_exactly_the_perturbed_op() {
    let bad = FaultyBackend::new(Fault::RmsNormScale);
    let report = run_ops(&ReferenceBackend, &bad, &OpsOptions::default()).unwrap();
    let failing: Vec<&str> = report
        .cases
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| c.name.as_str())
        .collect();
    assert!(!failing.is_empty());
    for c in &report.cases {
        let expect = if c.op == Op::RmsNorm {
            Status::Fail
        } else {
            Status::Pass
        };
        assert_eq!(c.status, expect, "{}: {:?}", c.name, c.detail);
    }
    // 1% off everywhere is an NMSE of 1e-4.
    let v = report.cases.iter().find(|c| c.op == Op::RmsNorm).unwrap();
    let value = v.value.unwrap();
    assert!((value - 1e-4).abs() < 1e-6, "{value}");
    assert_eq!(report.summary.fail, failing.len());
}

#[test]
fn the_model_diff_reports_the_first_divergent_tap_at_the_perturbed_op() {
    let opts = ModelOptions {
        prefill: 12,
        decode: 2,
        seed: 1,
        ..ModelOptions::default()
    };
    let report = run_model(&reference_side(), &faulty_side(Fault::RmsNormScale), &opts).unwrap();
    assert!(!report.passed);
    let first = report.first_divergence.as_ref().unwrap();
    assert_eq!(
        (first.call.as_str(), first.layer.as_str(), first.op.as_str()),
        ("prefill", "layers.0.", "attn_norm")
    );
    assert!(first.nmse > first.tolerance);
    // A systematic error: every token row is over the limit.
    assert_eq!((first.rows, first.rows_over), (12, 12));
    // Every tap before it (the embedding) agrees exactly.
    assert!(report.taps[..first.index].iter().all(|t| t.nmse == 0.0));
    assert!(report.structure_error.is_none());
    assert!(report.logits.max_abs > 0.0);
}

#[test]
fn poisoning_catches_an_output_element_left_unwritten() {
    let bad = FaultyBackend::new(Fault::RmsNormSkipLast);
    let opts = OpsOptions {
        ops: vec!["rms_norm".into(), "swiglu".into()],
        ..OpsOptions::default()
    };
    let report = run_ops(&ReferenceBackend, &bad, &opts).unwrap();
    for c in &report.cases {
        if c.op == Op::RmsNorm {
            assert_eq!(c.status, Status::Fail, "{}", c.name);
            let d = c.detail.as_deref().unwrap();
            assert!(
                d.starts_with("candidate: out[") && d.contains("was not written"),
                "{d}"
            );
            assert_eq!(c.value, None);
        } else {
            assert_eq!(c.status, Status::Pass, "{}", c.name);
        }
    }
}

#[test]
fn an_unsupported_op_is_reported_as_unsupported_not_failed() {
    let bad = FaultyBackend::new(Fault::HadamardUnsupported);
    let opts = OpsOptions {
        ops: vec!["hadamard".into(), "rms_norm".into()],
        ..OpsOptions::default()
    };
    let report = run_ops(&ReferenceBackend, &bad, &opts).unwrap();
    assert_eq!(report.summary.fail, 0);
    assert!(report.passed());
    let hadamards: Vec<_> = report
        .cases
        .iter()
        .filter(|c| c.op == Op::Hadamard)
        .collect();
    assert!(!hadamards.is_empty());
    for c in hadamards {
        assert_eq!(c.status, Status::Unsupported);
        assert!(
            c.detail
                .as_deref()
                .unwrap()
                .starts_with("candidate: unsupported")
        );
    }
    assert!(report.summary.pass > 0);
}

#[test]
fn the_faulty_backend_is_in_the_registry_for_tests() {
    let side = SideConfig::default()
        .with_backend(FAULTY_NAME)
        .open("candidate")
        .unwrap();
    assert_eq!(side.backend.name(), FAULTY_NAME);
}

/// What a faulty choice must look like in the model diff.
struct WrongChoice {
    fault: Fault,
    prefill: usize,
    /// The judged layers of the kind the fault breaks, and of the other kind.
    broken: fn(&ModelReport) -> &[ChoiceAgreement],
    intact: fn(&ModelReport) -> &[ChoiceAgreement],
    layers: &'static [usize],
    /// Tokens per layer and those choosing the oracle's set.
    tokens: usize,
    agreeing: usize,
    /// Unpinned, the first tap that departs and its rows over.
    first_op: &'static str,
    rows_over: usize,
}

/// Pinned, every tap and the other kind of choice agree and the broken choice fails, named at
/// its first differing token; unpinned, the candidate departs at the first tap after it.
fn wrong_choice_is_named(w: WrongChoice) {
    let opts = ModelOptions {
        prefill: w.prefill,
        decode: 1,
        seed: 2,
        ..ModelOptions::default()
    };
    let faulty = faulty_side(w.fault);
    let pinned = run_model(&reference_side(), &faulty, &opts).unwrap();
    assert!(!pinned.passed && pinned.pinned);
    assert!(
        pinned.first_divergence.is_none(),
        "{:?}",
        pinned.first_divergence
    );
    assert!((w.intact)(&pinned).iter().all(|a| a.rate == 1.0));
    let layers: Vec<usize> = (w.broken)(&pinned).iter().map(|a| a.layer).collect();
    assert_eq!(layers, w.layers);
    for a in (w.broken)(&pinned) {
        let counts = (a.tokens, a.agreeing, a.tied);
        assert_eq!(counts, (w.tokens, w.agreeing, 0), "layer {}", a.layer);
        let m = a.first_mismatch.as_deref().unwrap();
        let first = format!("token {}: the candidate selects [", w.agreeing);
        assert!(
            m.starts_with(&first) && m.contains("where near-ties allow"),
            "{m}"
        );
    }
    let free = ModelOptions {
        pin_selections: false,
        ..opts
    };
    let report = run_model(&reference_side(), &faulty, &free).unwrap();
    let first = report.first_divergence.unwrap();
    let at = (first.layer.as_str(), first.op.as_str(), first.rows_over);
    assert_eq!(at, ("layers.1.", w.first_op, w.rows_over));
}

#[test]
fn a_wrong_indexer_choice_is_named_whether_or_not_attention_is_pinned() {
    // 80 tokens: tokens 67.. have more than 16 entries ((p+1)/4), so the fault has a choice
    // for 13 prefill tokens and the decode token.
    wrong_choice_is_named(WrongChoice {
        fault: Fault::IndexerWorstForBest,
        prefill: 80,
        broken: |m| &m.indexer,
        intact: |m| &m.router,
        layers: &[1, 3],
        tokens: 81,
        agreeing: 67,
        first_op: "attn.o",
        rows_over: 13,
    });
}

#[test]
fn a_wrong_expert_choice_is_named_whether_or_not_routing_is_pinned() {
    // Layer 0 hash-routes; layers 1-3 rank their biased scores, every token with a choice.
    wrong_choice_is_named(WrongChoice {
        fault: Fault::RouterWorstForBest,
        prefill: 12,
        broken: |m| &m.router,
        intact: |m| &m.indexer,
        layers: &[1, 2, 3],
        tokens: 13,
        agreeing: 0,
        first_op: "moe.out",
        rows_over: 12,
    });
}

#[test]
fn a_batch_variant_kernel_departs_only_when_the_sequence_is_batched() {
    let faulty = faulty_side(Fault::BatchVariantLinear);
    let opts = ModelOptions {
        prefill: 10,
        decode: 2,
        seed: 5,
        ..ModelOptions::default()
    };
    // Alone on both sides the same rows run the same sums: bitwise.
    let solo = run_model(&faulty, &faulty, &opts).unwrap();
    assert!(solo.passed, "{:?}", solo.first_divergence);
    // Batched with others, a routed expert that had one of the probe's tokens alone gets
    // neighbours' tokens too: more rows, other sums, first in the first MoE.
    let batched = ModelOptions {
        neighbours: 3,
        ..opts
    };
    let m = run_model(&faulty, &faulty, &batched).unwrap();
    let first = m.first_divergence.expect("the batched run departs");
    let at = (first.call.as_str(), first.layer.as_str(), first.op.as_str());
    assert_eq!(at, ("prefill", "layers.0.", "moe.out"));
    assert!(
        first.rows_over < first.rows,
        "only tokens whose expert batched: {first:?}"
    );
    // Every decode step's linears run 4 rows instead of 1: they all depart too.
    let decode_q = m
        .taps
        .iter()
        .find(|t| t.call == "decode 1" && t.op == "attn.q");
    assert!(decode_q.is_some_and(|t| !t.passed), "{decode_q:?}");
}

//! The reference backend diffed against itself passes every op case and every model tap; case
//! selection, perf fields, the JSON form, and a numerics-only difference between the sides.

use dsv4_core::{KvCacheDtype, Numerics};
use dsv4_diff::ops::list_cases;
use dsv4_diff::{
    DiffError, ModelOptions, OpsOptions, SideConfig, Status, diff, render, run_model, run_ops,
};

fn reference() -> dsv4_diff::Side {
    dsv4_backend_reference::link();
    SideConfig::default().open("oracle").unwrap()
}

#[test]
fn reference_against_itself_passes_every_default_case() {
    let side = reference();
    let opts = OpsOptions::default();
    let report = run_ops(side.backend.as_ref(), side.backend.as_ref(), &opts).unwrap();
    eprintln!("{} cases in {:.2} s", report.cases.len(), report.elapsed_s);
    assert!(report.cases.len() > 100, "{}", report.cases.len());
    for c in &report.cases {
        assert_eq!(c.status, Status::Pass, "{}: {:?}", c.name, c.detail);
        let v = c.value.unwrap();
        // Identical code on identical inputs: no difference at all.
        let ideal = if c.metric == dsv4_diff::tolerance::Metric::Recall {
            1.0
        } else {
            0.0
        };
        assert_eq!(v, ideal, "{}", c.name);
        assert!(c.perf.is_none());
    }
    assert_eq!(report.summary.pass, report.cases.len());
    assert!(report.passed());
}

#[test]
fn filters_select_cases_and_bad_filters_are_errors() {
    let only = |ops: &[&str], pattern: Option<&str>, full: bool| {
        list_cases(&OpsOptions {
            ops: ops.iter().map(|s| s.to_string()).collect(),
            pattern: pattern.map(str::to_string),
            full,
            ..OpsOptions::default()
        })
    };
    let norms = only(&["rms_norm"], None, false).unwrap();
    assert!(norms.iter().all(|c| c.op == dsv4_diff::Op::RmsNorm));
    let flash = only(&[], Some("/flash/"), false).unwrap();
    assert!(
        flash
            .iter()
            .all(|c| c.class == dsv4_diff::ops::SizeClass::Flash)
    );
    let fp8 = only(&["linear"], Some("act=fp8$"), false).unwrap();
    assert!(!fp8.is_empty() && fp8.iter().all(|c| c.name.ends_with("act=fp8")));
    let all = only(&[], None, false).unwrap().len();
    let full = only(&[], None, true).unwrap();
    assert!(full.len() > all);
    assert!(full.iter().any(|c| c.shape == "1x1024->32768.fp8"));
    assert!(matches!(
        only(&["rmsnorm"], None, false),
        Err(DiffError::UnknownOp { .. })
    ));
    assert!(matches!(
        only(&[], Some("(unclosed"), false),
        Err(DiffError::Pattern { .. })
    ));
    let e = only(&["topk"], Some("no-such-case"), false).unwrap_err();
    assert!(e.to_string().contains("full-size cases"), "{e}");
}

#[test]
fn model_runs_that_cannot_fit_are_refused_before_any_forward() {
    let side = reference();
    let run = |prefill, decode| {
        let opts = ModelOptions {
            prefill,
            decode,
            progress: false,
            ..ModelOptions::default()
        };
        run_model(&side, &side, &opts).unwrap_err().to_string()
    };
    assert!(run(0, 4).contains("at least one token"));
    // The tiny model's positions end at 65536: a decode past them would run for hours first.
    let e = run(4, 100_000_000);
    assert!(
        e.contains("reach position 100000004") && e.contains("65536") && e.contains("--decode"),
        "{e}"
    );
    assert!(run(usize::MAX, 2).contains("max_position_embeddings"));
}

#[test]
fn perf_reports_median_timings_per_case() {
    let side = reference();
    let opts = OpsOptions {
        ops: vec!["swiglu".into(), "topk".into()],
        perf: true,
        repeats: 3,
        ..OpsOptions::default()
    };
    let report = run_ops(side.backend.as_ref(), side.backend.as_ref(), &opts).unwrap();
    for c in &report.cases {
        let p = c.perf.unwrap();
        assert_eq!(p.repeats, 3);
        assert!(p.median_s.is_finite());
        // topk does no arithmetic worth counting; swiglu does.
        assert_eq!(
            p.gflops.is_some(),
            c.op == dsv4_diff::Op::Swiglu && p.median_s > 0.0
        );
    }
    let text = render(&diff(&side, &side, Some(&opts), None).unwrap());
    assert!(text.contains("GFLOP/s"), "{text}");
}

#[test]
fn the_model_against_itself_agrees_exactly_and_json_follows_the_schema() {
    let side = reference();
    let model = ModelOptions {
        prefill: 20,
        decode: 2,
        seed: 3,
        ..ModelOptions::default()
    };
    let ops = OpsOptions {
        ops: vec!["cache_store".into()],
        ..OpsOptions::default()
    };
    let report = diff(&side, &side, Some(&ops), Some(&model)).unwrap();
    assert!(report.passed);
    let m = report.model.as_ref().unwrap();
    assert!(m.first_divergence.is_none() && m.structure_error.is_none());
    assert!(m.taps.iter().all(|t| t.nmse == 0.0 && t.passed));
    assert_eq!(m.logits.rows, 22);
    assert_eq!((m.logits.max_abs, m.logits.argmax_agreement), (0.0, 1.0));
    // The tiny model's ratio-4 layers are 1 and 3.
    let layers: Vec<usize> = m.indexer.iter().map(|a| a.layer).collect();
    assert_eq!(layers, [1, 3]);
    assert!(m.indexer.iter().all(|a| a.tokens == 22 && a.rate == 1.0));

    let json = report.to_json();
    assert_eq!(json["schema"], "dsv4.diff/1");
    assert_eq!(json["passed"], true);
    assert_eq!(json["oracle"]["backend"], "reference");
    assert_eq!(json["oracle"]["numerics"]["kv_cache_dtype"], "bf16");
    let case = &json["ops"]["cases"][0];
    for key in [
        "name",
        "op",
        "class",
        "shape",
        "numerics",
        "status",
        "metric",
        "value",
        "tolerance",
        "detail",
        "perf",
    ] {
        assert!(case.get(key).is_some(), "case field {key} missing: {case}");
    }
    assert_eq!(case["op"], "cache_store");
    assert_eq!(case["metric"], "byte_mismatches");
    assert_eq!(case["status"], "pass");
    let tap = &json["model"]["taps"][0];
    assert_eq!(tap["op"], "embed");
    assert_eq!(json["model"]["first_divergence"], serde_json::Value::Null);
    assert_eq!(json["model"]["pinned"], true);
    let layer = &json["model"]["indexer"][0];
    assert_eq!(
        (&layer["agreeing"], &layer["tied"], &layer["worst_tie"]),
        (&22.into(), &0.into(), &0.0.into())
    );
    assert_eq!(layer["first_mismatch"], serde_json::Value::Null);
    let routed: Vec<u64> = json["model"]["router"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["layer"].as_u64().unwrap())
        .collect();
    assert_eq!(routed, [1, 2, 3], "the biased-routing layers");
    assert_eq!(json["model"]["router"][0]["agreeing"], 22);
    let text = serde_json::to_string(&json).unwrap();
    let back: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(back, json);
}

#[test]
fn a_numerics_knob_on_one_side_diverges_first_where_the_cache_is_read() {
    let oracle = reference();
    let candidate = SideConfig {
        numerics: Numerics {
            kv_cache_dtype: KvCacheDtype::Fp8,
            ..Numerics::default()
        },
        ..SideConfig::default()
    }
    .open("candidate")
    .unwrap();
    let opts = ModelOptions {
        prefill: 8,
        decode: 1,
        seed: 0,
        ..ModelOptions::default()
    };
    let m = run_model(&oracle, &candidate, &opts).unwrap();
    assert!(!m.passed);
    let first = m.first_divergence.unwrap();
    // q, kv and everything before attention are identical; the fp8 cache shows in attn.o.
    assert_eq!(
        (first.layer.as_str(), first.op.as_str()),
        ("layers.0.", "attn.o")
    );
    assert!(m.taps[..first.index].iter().all(|t| t.nmse == 0.0));
}

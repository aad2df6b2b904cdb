//! DSV4 step plans: every shape verifies clean (serial and multi-stream overlap, eager and
//! captured), overlap plans carry SGLang's streams and events, the faulty arena is caught by
//! the verifier with both launches named, and the threaded executor refuses it.

mod common;

use dsv4_core::Numerics;
use dsv4_model::forward::build::{PlanSpec, StepKind, build_plan};
use dsv4_model::forward::op::{Chain, OpKind};
use dsv4_model::forward::{ExecOptions, Executor, Fault, ForwardError, Taps};
use dsv4_model::{LogitRows, ModelConfig, ModelSource, load_model};
use dsv4_plan::{FindingKind, Lifetimes, Placement, place, verify};
use std::sync::Arc;

fn specs() -> Vec<PlanSpec> {
    let mut out = Vec::new();
    for kind in [StepKind::Decode, StepKind::Prefill] {
        for overlap in [false, true] {
            for rows in [1, 3, 8] {
                for mtp in [false, true] {
                    // Every row's logits, and (a prefill asking for fewer) two rows' or none.
                    for head_rows in [rows, 2, 0] {
                        if head_rows > rows || (head_rows < rows && kind == StepKind::Decode) {
                            continue;
                        }
                        out.push(PlanSpec {
                            kind,
                            rows,
                            head_rows,
                            overlap,
                            mtp,
                        });
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_plan_shape_verifies_clean_eager_and_captured() {
    for cfg in [ModelConfig::tiny(), common::flash()] {
        for spec in specs() {
            let plan = build_plan(&cfg, spec);
            let logits = plan.buffers.iter().find(|b| b.name == "logits");
            assert_eq!(
                logits.map_or(0, |b| b.bytes),
                (spec.head_rows * cfg.vocab_size * 4) as u64
            );
            assert_eq!(
                plan.launches.iter().any(|l| l.op.kind == OpKind::HeadRows),
                (1..spec.rows).contains(&spec.head_rows),
                "{spec:?}: the head gathers its rows only when it computes fewer, but some"
            );
            let v = verify(&plan).unwrap();
            assert!(v.passed(), "{spec:?} eager: {:?}", v.findings.first());
            let placed = place(plan, Lifetimes::StreamAware).unwrap();
            let v = verify(&placed).unwrap();
            assert!(v.passed(), "{spec:?} captured: {:?}", v.findings.first());
            let Placement::Arena { bytes, .. } = placed.placement else {
                panic!("placed plans have an arena");
            };
            assert!(
                bytes < placed.transient_bytes(),
                "{spec:?}: the arena reuses bytes ({bytes} of {})",
                placed.transient_bytes()
            );
        }
    }
}

#[test]
fn overlap_plans_follow_sglangs_streams_and_events() {
    let spec = PlanSpec {
        kind: StepKind::Decode,
        rows: 4,
        head_rows: 4,
        overlap: true,
        mtp: false,
    };
    let plan = build_plan(&ModelConfig::tiny(), spec);
    let find = |scope: &str, kind: OpKind| {
        plan.launches
            .iter()
            .find(|l| l.scope == scope && l.op.kind == kind)
            .unwrap_or_else(|| panic!("{scope} {kind:?}"))
    };
    let events = |ids: &[dsv4_plan::EventId]| -> Vec<String> {
        ids.iter()
            .map(|e| plan.events[e.0 as usize].clone())
            .collect()
    };
    // Layer 1 is a ratio-4 layer of the tiny model.
    let s = "layers.1";
    assert_eq!(plan.stream_name(find(s, OpKind::Kv).stream), "kv");
    let comp = find(s, OpKind::Compress(Chain::Attn));
    assert_eq!(plan.stream_name(comp.stream), "compressor");
    let iq = find(s, OpKind::IndexerQ);
    assert_eq!(plan.stream_name(iq.stream), "indexer_q");
    assert_eq!(
        events(&iq.waits),
        ["layers.1.fork", "layers.1.q_lora_ready"]
    );
    let iw = find(s, OpKind::IndexerWeights);
    assert_eq!(events(&iw.records), ["layers.1.weights_ready"]);
    let topk = find(s, OpKind::IndexerTopk);
    assert_eq!(plan.stream_name(topk.stream), "indexer");
    assert_eq!(
        events(&topk.waits),
        ["layers.1.indexer_q_ready", "layers.1.weights_ready"]
    );
    let att = find(s, OpKind::Attention { stores: false });
    assert_eq!(plan.stream_name(att.stream), "main");
    assert_eq!(
        events(&att.waits),
        [
            "layers.1.kv_done",
            "layers.1.compressor_done",
            "layers.1.indexer_done"
        ]
    );
    let shared = find(s, OpKind::SharedExpert);
    assert_eq!(plan.stream_name(shared.stream), "shared_expert");
    let serial = build_plan(
        &ModelConfig::tiny(),
        PlanSpec {
            overlap: false,
            ..spec
        },
    );
    assert_eq!(serial.streams, ["main"]);
    assert!(serial.events.is_empty());
    let names = |p: &dsv4_plan::Plan<_>| p.launches.iter().map(|l| l.label()).collect::<Vec<_>>();
    assert_eq!(
        names(&serial),
        names(&plan),
        "the same launches in the same order"
    );
}

#[test]
fn the_faulty_arena_is_a_named_race_between_streams() {
    let spec = PlanSpec {
        kind: StepKind::Decode,
        rows: 4,
        head_rows: 4,
        overlap: true,
        mtp: false,
    };
    let plan = place(
        build_plan(&ModelConfig::tiny(), spec),
        Lifetimes::IgnoreStreams,
    )
    .unwrap();
    let v = verify(&plan).unwrap();
    assert!(v.count(FindingKind::Race) > 0);
    for f in &v.findings {
        let (a, b) = (&f.first, f.second.as_ref().expect("races have two sides"));
        assert_ne!(a.stream, b.stream);
        assert!(a.scope.starts_with("layers.") && b.scope.starts_with("layers."));
        assert!(a.access == "write" || b.access == "write");
        let ((s1, e1), (s2, e2)) = (a.arena.unwrap(), b.arena.unwrap());
        assert!(s1 < e2 && s2 < e1, "the byte ranges overlap: {f:?}");
    }
    // The indexer's side-stream scratch is among the culprits, as in the incident.
    assert!(v.findings.iter().any(|f| {
        [&f.first, f.second.as_ref().unwrap()]
            .iter()
            .any(|s| s.stream.starts_with("indexer"))
    }));
}

#[test]
fn the_threaded_executor_refuses_a_plan_the_verifier_rejects() {
    let mut model = load_model(
        &ModelSource::Tiny { seed: 0 },
        Arc::new(dsv4_backend_reference::ReferenceBackend),
        Numerics::default(),
    )
    .unwrap();
    let exec = ExecOptions {
        captured: true,
        overlap: true,
        executor: Executor::Threaded,
        faults: [Fault::ArenaIgnoresStreams].into(),
        ..Default::default()
    };
    model.set_exec(exec.clone());
    let mut a = model.new_sequence();
    model.forward(&mut a, &[0, 5, 9]).unwrap(); // prefill: eager, verified, runs
    let err = model.forward(&mut a, &[7]).unwrap_err(); // decode: the captured faulty plan
    assert!(
        matches!(&err, ForwardError::Plan { message } if message.contains("verifier") && message.contains("RACE")),
        "{err}"
    );
    let clean = ExecOptions {
        faults: Default::default(),
        ..exec
    };
    let mut b = model.new_sequence();
    model
        .forward_step(
            &mut [&mut b],
            &[&[0, 5, 9]],
            LogitRows::All,
            &clean,
            &mut Taps::none(),
        )
        .unwrap();
    let (_, report) = model
        .forward_step(
            &mut [&mut b],
            &[&[7]],
            LogitRows::All,
            &clean,
            &mut Taps::none(),
        )
        .unwrap();
    assert!(report.captured && report.plan_rows == 1);
    assert!(
        report.writes.iter().any(|w| w.store == "c4_index_state"),
        "the declared write set names the pools written: {:?}",
        report.writes
    );
}

#[test]
fn a_step_with_mismatched_inputs_is_refused_without_changes() {
    let model = load_model(
        &ModelSource::Tiny { seed: 0 },
        Arc::new(dsv4_backend_reference::ReferenceBackend),
        Numerics::default(),
    )
    .unwrap();
    let mut a = model.new_sequence();
    let err = model
        .forward_batch(&mut [&mut a], &[&[1], &[2]])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("1 sequences was given 2 token slices"),
        "{err}"
    );
    let err = model
        .forward_batch(&mut [&mut a], &[&[999_999]])
        .unwrap_err();
    assert!(matches!(err, ForwardError::InvalidToken { .. }), "{err}");
    assert_eq!(a.pos, 0);
    assert!(
        a.layers.iter().all(|l| l.swa.is_empty()),
        "no row was reserved"
    );
}

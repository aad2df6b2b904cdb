//! Bench plumbing: the shipped small config, op cases on the reference backend, the target
//! verdicts computed from a report, and bad options refused up front (no timing is asserted).

use dsv4_backend_reference::ReferenceBackend;
use dsv4_bench::e2e::{self, E2eResult};
use dsv4_bench::machine::MachinePeaks;
use dsv4_bench::ops::{self, OpResult};
use dsv4_bench::{BenchError, BenchOptions, BenchReport, render_table, targets};
use dsv4_engine::bench::ServingBenchSpec;
use std::time::Duration;

#[test]
fn small_config_is_valid_and_flash_like() {
    let cfg = e2e::config("small").unwrap();
    assert_eq!(
        (cfg.hidden_size, cfg.num_hidden_layers, cfg.n_routed_experts),
        (1024, 8, 32)
    );
    assert_eq!(&cfg.compress_ratios[..8], &[0, 0, 4, 128, 4, 128, 4, 0]);
    assert!(
        e2e::config("huge")
            .unwrap_err()
            .to_string()
            .contains("tiny, small")
    );
}

#[test]
fn op_cases_run_on_the_reference_and_big_ones_are_skipped() {
    let r = ops::run(&ReferenceBackend, Some(5e6), Duration::from_millis(1));
    assert!(
        r.iter().any(|o| o.skipped.is_some()),
        "big cases skipped on a slow backend"
    );
    let ran: Vec<&OpResult> = r.iter().filter(|o| o.ms.is_some()).collect();
    assert!(!ran.is_empty());
    for o in ran {
        assert!(
            o.gflops.unwrap().is_finite() && o.gbs.unwrap() > 0.0,
            "{o:?}"
        );
    }
}

fn e(backend: &str, config: &str, metric: &str, value: f64) -> E2eResult {
    E2eResult {
        backend: backend.into(),
        config: config.into(),
        metric: metric.into(),
        value,
        unit: "x",
    }
}

fn op(case: &str, gflops: f64, gbs: f64) -> OpResult {
    OpResult {
        backend: "cpu".into(),
        case: case.into(),
        ms: Some(1.0),
        gflops: Some(gflops),
        gbs: Some(gbs),
        skipped: None,
    }
}

#[test]
fn targets_compare_against_the_same_runs_peaks() {
    let mut r = BenchReport {
        machine: Some(MachinePeaks {
            threads: 2,
            fma_gflops: 200.0,
            fma_gflops_avx2: Some(200.0),
            fma_gflops_1t: 100.0,
            read_gbs: 20.0,
            triad_gbs: 28.0,
            fma_kernel: "avx2+fma",
        }),
        ops: vec![
            op("gemm_f32 prefill 512x4096x4096", 150.0, 1.0),
            op("gemv_fp8 decode 4096x4096", 1.0, 8.0),
        ],
        e2e: vec![
            e("cpu", "small", "prefill 512 tokens", 300.0),
            e("reference", "small", "prefill 512 tokens", 10.0),
            e("cpu", "small", "decode batch 1", 100.0),
            e("cpu", "small", "decode ms/token at context 1024", 10.0),
            e("cpu", "small", "decode ms/token at context 16384", 30.0),
        ],
        serving: Vec::new(),
        sampling: vec![dsv4_bench::sampling::SamplingCost {
            case: "greedy (argmax)".into(),
            ms: 0.1,
            vs_greedy: 1.0,
        }],
        active_weight_bytes: vec![("small".into(), 60_000_000)],
        cpu_sums: "f32",
        targets: Vec::new(),
    };
    let t = targets(&r);
    let met: Vec<Option<bool>> = t.iter().map(|x| x.met).collect();
    // 75% of peak: met; 40% of bandwidth: not met; 30x: met; 10 ms vs 3 ms floor: not met;
    // 3x time for 16x context: met.
    assert_eq!(
        met,
        vec![Some(true), Some(false), Some(true), Some(false), Some(true)]
    );
    r.machine = None;
    assert!(
        targets(&r)
            .iter()
            .filter(|x| x.name.contains("GEMM"))
            .all(|x| x.met.is_none())
    );
    r.targets = targets(&r);
    let table = render_table(&r);
    assert!(
        table.contains("not measured")
            && table.contains("prefill 512 tokens")
            && table.contains("targets (cpu backend with f32 sums)")
            && table.contains("token choice (per request, 129,280 logits)"),
        "{table}"
    );
}

/// Options that pass `validate`: tiny and small, a 512-token prefill, contexts up to 16384.
fn good_options() -> BenchOptions {
    BenchOptions {
        backends: vec!["no-such-backend".into()],
        threads: 1,
        backend_options: Default::default(),
        machine: true,
        ops: true,
        e2e: Some(e2e::E2ePlan {
            configs: vec!["tiny".into(), "small".into()],
            prefill_tokens: 512,
            contexts: vec![1024, 16384],
        }),
        serving: Some(ServingBenchSpec::default()),
        sampling: true,
    }
}

/// One change to [`good_options`].
type Edit = Box<dyn Fn(&mut BenchOptions)>;

#[test]
fn bad_plans_are_refused_before_anything_is_measured() {
    good_options().validate().unwrap();
    let max = e2e::config("small").unwrap().max_position_embeddings;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "unknown bench config `huge`",
            Box::new(|o| o.e2e.as_mut().unwrap().configs.push("huge".into())),
        ),
        (
            "no end-to-end config",
            Box::new(|o| o.e2e.as_mut().unwrap().configs.clear()),
        ),
        (
            "at least 1 token",
            Box::new(|o| o.e2e.as_mut().unwrap().prefill_tokens = 0),
        ),
        (
            "does not fit config `tiny`",
            Box::new(move |o| o.e2e.as_mut().unwrap().prefill_tokens = max),
        ),
        (
            "context 0 is outside",
            Box::new(|o| o.e2e.as_mut().unwrap().contexts.push(0)),
        ),
        (
            "is outside what config `small` can decode at",
            Box::new(move |o| o.e2e.as_mut().unwrap().contexts.push(max)),
        ),
        (
            "every concurrency must be >= 1",
            Box::new(|o| o.serving.as_mut().unwrap().concurrency.push(0)),
        ),
        (
            "no concurrency level",
            Box::new(|o| o.serving.as_mut().unwrap().concurrency.clear()),
        ),
    ];
    for (want, edit) in cases {
        let mut o = good_options();
        edit(&mut o);
        let err = o.validate().unwrap_err();
        assert!(err.to_string().contains(want), "{want}: got {err}");
        // `run` refuses the same options before creating a backend or timing anything: the
        // unknown backend of these options would otherwise be the error.
        match dsv4_bench::run(&o) {
            Err(BenchError::Invalid(m)) => assert!(m.contains(want), "{want}: run said {m}"),
            other => panic!("{want}: run gave {:?}", other.map(|_| ())),
        }
    }
    // Contexts only bind the small config: a tiny-only plan ignores them.
    let mut o = good_options();
    let plan = o.e2e.as_mut().unwrap();
    plan.configs = vec!["tiny".into()];
    plan.contexts = vec![max];
    o.validate().unwrap();
}

//! Bench plumbing: the shipped small config, op cases on the reference backend, and the target
//! verdicts computed from a report (no timing is asserted).

use dsv4_backend_reference::ReferenceBackend;
use dsv4_bench::e2e::{self, E2eResult};
use dsv4_bench::machine::MachinePeaks;
use dsv4_bench::ops::{self, OpResult};
use dsv4_bench::{BenchReport, render_table, targets};
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
            && table.contains("targets (cpu backend with f32 sums)"),
        "{table}"
    );
}

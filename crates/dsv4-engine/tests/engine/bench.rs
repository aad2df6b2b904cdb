//! The serving benchmark runs each concurrency level to completion and reports consistent
//! counts (no timing is asserted).

use super::*;
use dsv4_engine::bench::{ServingBenchSpec, serving_throughput};
use dsv4_engine::{CacheBudget, EngineConfig};

#[test]
fn serving_throughput_reports_every_level() {
    let spec = ServingBenchSpec {
        concurrency: vec![1, 3],
        requests_per_level: 3,
        prompt_len: 6,
        shared_prefix: 0,
        max_tokens: 3,
        seed: 1,
    };
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(1024),
        max_running_requests: 4,
        ..Default::default()
    };
    let r = serving_throughput(model(), cfg, &spec).unwrap();
    assert_eq!(r.backend, "reference");
    assert_eq!(r.levels.len(), 2);
    for l in &r.levels {
        assert_eq!(
            (l.completed, l.failed),
            (3, 0),
            "concurrency {}",
            l.concurrency
        );
        assert_eq!(l.total_output_tokens, 9);
        assert_eq!(l.total_input_tokens, 18);
        assert!(l.output_throughput > 0.0 && l.mean_e2el_ms >= l.mean_ttft_ms);
        assert!(l.p99_itl_ms >= l.median_itl_ms);
    }
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["levels"][0]["mean_tpot_ms"].is_number());
    let bad = ServingBenchSpec {
        concurrency: vec![0],
        ..spec
    };
    assert!(serving_throughput(model(), EngineConfig::default(), &bad).is_err());
}

#[test]
fn a_shared_prefix_is_prefilled_once_with_in_batch_prefix_caching() {
    // Three requests at once sharing 17 prompt tokens: two whole pages of 8 each for the two
    // that wait for the first's prefill.
    let spec = ServingBenchSpec {
        concurrency: vec![3],
        requests_per_level: 3,
        prompt_len: 20,
        shared_prefix: 17,
        max_tokens: 2,
        seed: 3,
    };
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(1024),
        page_size: 8,
        ..Default::default()
    };
    let r = serving_throughput(model(), cfg, &spec).unwrap();
    assert_eq!(r.levels[0].completed, 3);
    assert_eq!(r.levels[0].cached_tokens, 2 * 16);
    assert_eq!(
        serde_json::to_value(&r).unwrap()["spec"]["shared_prefix"],
        17
    );
    let bad = ServingBenchSpec {
        shared_prefix: 21,
        ..spec
    };
    let e = serving_throughput(model(), EngineConfig::default(), &bad).unwrap_err();
    assert!(e.to_string().contains("longer than the prompt"), "{e}");
}

#[test]
fn overlap_schedule_reports_both_modes_and_a_decode_fit() {
    use dsv4_engine::bench::overlap_schedule;
    let spec = ServingBenchSpec {
        concurrency: vec![1, 3],
        requests_per_level: 4,
        prompt_len: 6,
        shared_prefix: 0,
        max_tokens: 4,
        seed: 2,
    };
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(1024),
        ..Default::default()
    };
    let r = overlap_schedule(model(), cfg.clone(), &spec).unwrap();
    assert_eq!(r.modes.len(), 2);
    assert_eq!((r.modes[0].overlap, r.modes[1].overlap), (false, true));
    for m in &r.modes {
        assert_eq!(m.levels.len(), 2);
        // With one running request each request takes a prefill step and three decode steps,
        // plus under overlap the step it was already in when its last token was sampled.
        let per_request = if m.overlap { 5 } else { 4 };
        assert_eq!(m.levels[0].steps, 4 * per_request, "overlap={}", m.overlap);
        assert!(m.decode_steps > 0 && m.decode_steps < m.steps);
        assert!(m.exposed_ms_per_step >= 0.0 && m.decode_fit_r2 >= 0.0);
        assert!(m.decode_fit_r2 <= 1.0 + 1e-9);
    }
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["modes"][1]["decode_marginal_ms"].is_number());
    let bad = ServingBenchSpec {
        concurrency: vec![],
        ..spec
    };
    assert!(overlap_schedule(model(), cfg, &bad).is_err());
}

#[test]
fn linear_fit_recovers_a_line() {
    use dsv4_engine::bench::linear_fit;
    let pts: Vec<(f64, f64)> = (1..6).map(|x| (x as f64, 2.0 + 0.5 * x as f64)).collect();
    let (a, b, r2) = linear_fit(&pts);
    assert!((a - 2.0).abs() < 1e-12 && (b - 0.5).abs() < 1e-12 && (r2 - 1.0).abs() < 1e-12);
    let (a, b, r2) = linear_fit(&[(3.0, 1.0), (3.0, 3.0)]);
    assert_eq!((a, b, r2), (2.0, 0.0, 0.0), "x does not vary: a flat fit");
    let (_, _, r2) = linear_fit(&[(1.0, 1.0), (2.0, 3.0), (3.0, 2.0)]);
    assert!(r2 > 0.0 && r2 < 1.0);
}

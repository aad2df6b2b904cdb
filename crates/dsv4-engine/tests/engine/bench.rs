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

//! The canary's findings reach `GET /metrics`: with `debug.canary` on, concurrent requests over
//! captured overlap plans leave the canary counters at 0, and the same requests with the
//! `arena-ignores-streams` fault (buffers of different streams overlapping) make them count.

use super::common::*;
use dsv4_core::Numerics;
use dsv4_engine::{CacheBudget, CanaryConfig, DebugOptions, EngineConfig};
use dsv4_kernels::{BackendOptions, registry};
use dsv4_model::forward::{ExecOptions, Executor, Fault};
use dsv4_model::{ModelSource, load_model};
use dsv4_server::Loaded;
use serde_json::json;
use std::sync::Arc;

/// An engine on a fresh tiny model with captured overlap plans (and `faults`), interleaved
/// side streams, and the canary on every pool.
fn loaded_with(faults: &[Fault]) -> Loaded {
    dsv4_backend_reference::link();
    let backend = registry::create(
        "reference",
        &BackendOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut m = load_model(&ModelSource::Tiny { seed: 0 }, backend, Numerics::default()).unwrap();
    m.set_exec(ExecOptions {
        captured: true,
        overlap: true,
        executor: Executor::Interleaved { seed: 0 },
        faults: faults.iter().copied().collect(),
        ..Default::default()
    });
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(4096),
        max_running_requests: 8,
        ..Default::default()
    };
    let debug = DebugOptions {
        canary: Some(CanaryConfig::default()),
    };
    Loaded::new(
        Arc::new(m),
        dsv4_chat::Tokenizer::tiny().unwrap(),
        cfg,
        debug,
        dsv4_server::config::DEFAULT_GRAMMAR_CACHE,
    )
    .unwrap()
}

/// Serve four concurrent completions on `loaded`; the scraped value of each canary counter.
async fn canary_counts(loaded: Loaded) -> (f64, f64) {
    let s = start_loading(config()).await;
    s.state.set_ready(loaded);
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let addr = s.addr;
            let body = json!({"model": MODEL, "prompt": format!("Canary {i}: the quick brown fox"),
                              "max_tokens": 4, "temperature": 0});
            tokio::spawn(async move {
                request(
                    addr,
                    "POST",
                    "/v1/completions",
                    &[],
                    body.to_string().as_bytes(),
                )
                .await
            })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let m = s.get("/metrics").await.body;
    let value = |name: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{m}"))
    };
    let counts = (
        value("dsv4:canary_flagged_rounds_total"),
        value("dsv4:canary_unexpected_pages_total"),
    );
    s.shutdown().await.unwrap();
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_findings_are_exported_on_metrics() {
    let clean = canary_counts(loaded_with(&[])).await;
    assert_eq!(clean, (0.0, 0.0), "a clean plan: the canary stays silent");
    let (rounds, pages) = canary_counts(loaded_with(&[Fault::ArenaIgnoresStreams])).await;
    assert!(
        rounds > 0.0 && pages >= rounds,
        "the arena fault shows on /metrics: {rounds} rounds, {pages} pages"
    );
}

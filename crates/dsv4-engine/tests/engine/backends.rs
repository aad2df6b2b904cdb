//! The engine on every registered backend, chosen by registry name: concurrent requests with
//! the prefix cache and chunked prefill give bitwise the tokens and logits of each request run
//! alone on the same backend.

use super::*;
use dsv4_engine::{CacheBudget, Engine, EngineConfig, FinishReason};
use dsv4_kernels::BackendOptions;
use dsv4_kernels::registry;

fn on_backend(name: &str) {
    let backend = registry::create(
        name,
        &BackendOptions {
            threads: 2,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("backend {name}: {e}"));
    let m = Arc::new(load_model(&ModelSource::Tiny { seed: 0 }, backend, numerics()).unwrap());
    let shared = tokens(16, 40);
    let prompts: Vec<Vec<u32>> = (0..8usize)
        .map(|i| {
            let mut p = vec![0];
            p.extend(&shared);
            p.extend(tokens(3 + i * 5, 50 + i as u64));
            p
        })
        .collect();
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(2048),
        page_size: 8,
        prefix_cache: true,
        max_running_requests: 8,
        chunked_prefill_size: Some(12),
        ..Default::default()
    };
    let engine = Engine::spawn(m.clone(), cfg).unwrap();
    let reqs = prompts.iter().map(|p| greedy(p.clone(), 4)).collect();
    let done = super::invariance::staggered(&engine, reqs);
    for (i, c) in done.iter().enumerate() {
        assert_eq!(
            c.finished.reason,
            FinishReason::Length,
            "{name}: request {i}"
        );
        assert_same_as_solo(
            c,
            &solo(&m, &prompts[i], 4),
            &format!("{name}: request {i}"),
        );
    }
    assert!(
        engine.metrics().cached_tokens_total >= 16,
        "{name}: prefix reused"
    );
}

#[test]
fn every_registered_backend_serves_batch_invariantly() {
    dsv4_backend_reference::link();
    dsv4_backend_cpu::link();
    let names = registry::names();
    assert!(
        names.contains(&"reference") && names.contains(&"cpu"),
        "{names:?}"
    );
    for name in names {
        on_backend(name);
    }
}

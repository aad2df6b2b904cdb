//! Overload: 200 requests against pools that hold 20 sequences all complete without error; the
//! pools (allocated once) bound the memory, and admission waits for pages instead of failing.

use super::accounting::tight_pages;
use super::*;
use dsv4_engine::pools::CacheGeometry;
use dsv4_engine::{CacheBudget, Engine, EngineConfig, FinishReason, PoolKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[test]
fn two_hundred_requests_through_pools_that_fit_twenty() {
    let m = model();
    const LEN: usize = 16;
    let pages = tight_pages(LEN, 20, 20);
    let geom = CacheGeometry::of(&m);
    let expected_bytes: u64 = PoolKind::ALL
        .into_iter()
        .map(|k| pages[&k] as u64 * geom.page_bytes[k.index()] as u64)
        .sum();
    let cfg = EngineConfig {
        cache: CacheBudget::Pages(pages),
        page_size: 8,
        prefix_cache: true,
        max_running_requests: 64,
        chunked_prefill_size: Some(32),
        ..Default::default()
    };
    let engine = Engine::spawn(m.clone(), cfg).unwrap();
    assert_eq!(engine.pool_report().total_bytes, expected_bytes);
    let prompts: Vec<Vec<u32>> = (0..200usize)
        .map(|i| {
            let mut p = vec![0];
            p.extend(tokens(4 + i % 9, 7000 + i as u64));
            p
        })
        .collect();
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(greedy(p.clone(), 3)).unwrap())
        .collect();
    // Watch the engine while it works: running requests never exceed what the pools hold.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (engine, done) = (engine.clone(), done.clone());
        std::thread::spawn(move || {
            let mut peak_running = 0;
            while !done.load(Ordering::Relaxed) {
                let mt = engine.metrics();
                peak_running = peak_running.max(mt.running_requests);
                for u in &mt.pools {
                    assert!(u.used_pages <= u.total_pages, "{}", u.pool);
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            peak_running
        })
    };
    let completions: Vec<_> = streams.into_iter().map(|s| s.collect_blocking()).collect();
    done.store(true, Ordering::Relaxed);
    let peak_running = watcher.join().unwrap();
    assert!(
        peak_running <= 20,
        "at most 20 sequences fit, saw {peak_running}"
    );
    for (i, c) in completions.iter().enumerate() {
        assert_eq!(
            c.finished.reason,
            FinishReason::Length,
            "request {i}: {:?}",
            c.finished.error
        );
        if i % 25 == 0 {
            assert_same_as_solo(c, &solo(&m, &prompts[i], 3), &format!("request {i}"));
        }
    }
    let mt = engine.metrics();
    assert_eq!(mt.requests_finished, 200);
    assert_eq!((mt.running_requests, mt.queued_requests), (0, 0));
}

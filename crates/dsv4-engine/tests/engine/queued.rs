//! `EngineHandle::queued`: requests submitted to a stalled loop count at once, before any step
//! has seen them, less the running slots free for them; requests behind the running slots
//! count while they wait; and nothing stays counted once every request has finished.

use super::*;
use dsv4_engine::{Engine, EngineConfig};
use std::time::{Duration, Instant};

/// Poll `f` until it holds (panics after a generous deadline).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn queued_counts_submitted_and_waiting_requests_and_nothing_after() {
    let cfg = EngineConfig {
        max_running_requests: 1,
        ..Default::default()
    };
    let engine = Engine::spawn(model(), cfg).unwrap();
    assert_eq!(engine.queued(), 0);
    let request = |seed: u64, n: usize| {
        let mut p = vec![0];
        p.extend(tokens(7, seed));
        greedy(p, n)
    };
    // The loop is stalled: no step sees the requests, yet they count, but for the one that
    // will take the free slot.
    let stall = engine.stall();
    let mut streams = vec![engine.submit(request(60, 40)).unwrap()];
    assert_eq!(engine.queued(), 0);
    streams.extend((1..4).map(|i| engine.submit(request(60 + i, 40)).unwrap()));
    assert_eq!(engine.queued(), 3);
    drop(stall);
    // One runs, three wait.
    eventually("one running and three queued", || {
        let m = engine.metrics();
        m.running_requests == 1 && engine.queued() == 3
    });
    for s in streams {
        s.collect_blocking();
    }
    eventually("nothing queued", || engine.queued() == 0);
    assert_eq!(engine.metrics().queued_requests, 0);
}

//! `Request::queue_limit`: past the limit a new request is refused at once, unless a waiting
//! request of lower priority that has a limit and was never admitted gives up its place (the
//! one admission would take last); a request without a limit always queues and never gives
//! way, nor does a preempted one; the refused end with a `QUEUE_FULL` error and the others
//! run as they would alone.

use super::*;
use dsv4_engine::scheduler::Scheduler;
use dsv4_engine::{Completion, EngineConfig, FinishReason, QUEUE_FULL, RequestStream};

/// Submit a greedy request of `n` tokens at `priority`, under `limit`; its stream and
/// whether it was queued.
fn submit(
    sched: &mut Scheduler,
    (priority, seed, n): (i32, u64, usize),
    limit: Option<usize>,
) -> (RequestStream, bool) {
    let mut s = sched
        .submit(Request {
            priority,
            queue_limit: limit,
            ..greedy(prompt8(seed), n)
        })
        .unwrap();
    let queued = s.blocking_queued();
    (s, queued)
}

/// The refusal message of `c`, which must have been refused at a full queue.
fn refusal(c: &Completion) -> &str {
    assert_eq!(c.finished.reason, FinishReason::Error);
    assert!(c.tokens.is_empty(), "a refused request generates nothing");
    let e = c.finished.error.as_deref().unwrap();
    e.strip_prefix(QUEUE_FULL)
        .unwrap_or_else(|| panic!("not a queue refusal: {e}"))
}

#[test]
fn a_full_queue_refuses_or_makes_room_by_priority() {
    let m = model();
    let cfg = EngineConfig {
        max_running_requests: 1,
        ..Default::default()
    };
    let mut sched = Scheduler::new(m.clone(), cfg, None).unwrap();
    let limit = Some(2);
    // a takes the free slot at the next step, so it does not count: b and c fill the queue.
    let (a, qa) = submit(&mut sched, (0, 1, 4), limit);
    let (b, qb) = submit(&mut sched, (0, 2, 4), limit);
    assert_eq!(sched.queued(), 1);
    let (c, qc) = submit(&mut sched, (0, 3, 4), limit);
    assert!(qa && qb && qc);
    assert_eq!(sched.queued(), 2);
    // d, of c's priority, cannot take anyone's place.
    let (d, qd) = submit(&mut sched, (0, 4, 4), limit);
    assert!(!qd);
    let d = d.collect_blocking();
    assert!(
        refusal(&d).contains("2 requests wait for a running slot; the limit is 2"),
        "{:?}",
        d.finished.error
    );
    // A line of a batch (no limit) queues past the limit, and never gives way.
    let (line, ql) = submit(&mut sched, (-1, 5, 4), None);
    assert!(ql);
    assert_eq!(sched.queued(), 3);
    // e outranks them: c, the last of the lowest priority with a limit, gives way.
    let (e, qe) = submit(&mut sched, (5, 6, 4), limit);
    assert!(qe);
    assert_eq!(sched.queued(), 3);
    let metrics = sched.metrics();
    assert_eq!(
        (
            metrics.queue_refusals_total,
            metrics.queue_displacements_total
        ),
        (2, 1)
    );
    while sched.step() {}
    let c = c.collect_blocking();
    assert!(
        refusal(&c).contains("a request of higher priority (5, this one 0)"),
        "{:?}",
        c.finished.error
    );
    for (s, seed) in [(a, 1), (b, 2), (line, 5), (e, 6)] {
        let done = s.collect_blocking();
        assert_same_as_solo(&done, &solo(&m, &prompt8(seed), 4), &format!("seed {seed}"));
    }
    // With the queue drained a request queues again.
    let (f, qf) = submit(&mut sched, (0, 7, 2), limit);
    assert!(qf);
    while sched.step() {}
    assert_eq!(f.collect_blocking().finished.reason, FinishReason::Length);
}

#[test]
fn a_preempted_request_keeps_its_place() {
    let m = model();
    let cfg = EngineConfig {
        max_running_requests: 1,
        priority_preemption: Some(0),
        ..Default::default()
    };
    let mut sched = Scheduler::new(m.clone(), cfg, None).unwrap();
    let limit = Some(2);
    let (a, _) = submit(&mut sched, (0, 11, 12), limit);
    assert!(sched.step());
    // h preempts a, which waits again, admitted once already.
    let (h, _) = submit(&mut sched, (9, 12, 12), limit);
    assert!(sched.step());
    assert_eq!(sched.metrics().priority_preemptions_total, 1);
    let (line, _) = submit(&mut sched, (-1, 13, 4), None);
    assert_eq!(sched.queued(), 2);
    // The queue is full of a request that has streamed and a line: i is refused, though it
    // outranks both.
    let (i, qi) = submit(&mut sched, (5, 14, 4), limit);
    assert!(!qi);
    refusal(&i.collect_blocking());
    while sched.step() {}
    for (s, seed, n) in [(a, 11, 12), (h, 12, 12), (line, 13, 4)] {
        let done = s.collect_blocking();
        assert_same_as_solo(&done, &solo(&m, &prompt8(seed), n), &format!("seed {seed}"));
    }
    let metrics = sched.metrics();
    assert_eq!(
        (
            metrics.queue_refusals_total,
            metrics.queue_displacements_total
        ),
        (1, 0)
    );
}

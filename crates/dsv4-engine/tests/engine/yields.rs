//! The yield cap (`Scheduler::set_yield_cap`): lowering it pauses the latest admitted requests
//! that yield at the next step, so a request that does not yield runs beside the cap's number
//! only; the paused ones wait, outside the queue limit's count, and resume when it rises, their
//! outputs bitwise their solo runs; under the overlap scheduler too.

use super::*;
use dsv4_engine::EngineConfig;
use dsv4_engine::scheduler::Scheduler;

#[test]
fn lines_past_the_yield_cap_pause_at_once_and_resume_unchanged() {
    let m = model();
    for overlap_schedule in [false, true] {
        let what = format!("overlap {overlap_schedule}");
        let cfg = EngineConfig {
            max_running_requests: 4,
            overlap_schedule,
            ..Default::default()
        };
        let mut sched = Scheduler::new(m.clone(), cfg, None).unwrap();
        let line = |seed: u64| Request {
            yields: true,
            priority: -1,
            ..greedy(prompt8(seed), 16)
        };
        let lines: Vec<_> = (0..4)
            .map(|i| sched.submit(line(20 + i)).unwrap())
            .collect();
        assert!(sched.step());
        assert_eq!(sched.metrics().running_requests, 4, "{what}");

        // An interactive request comes and the cap falls to 1: three lines pause at once.
        sched.set_yield_cap(1);
        let interactive = sched
            .submit(Request {
                queue_limit: Some(1),
                ..greedy(prompt8(30), 6)
            })
            .unwrap();
        assert!(sched.step());
        let metrics = sched.metrics();
        assert_eq!(metrics.running_requests, 2, "{what}");
        assert_eq!(metrics.yield_preemptions_total, 3, "{what}");
        // The paused lines wait, but not in the queue a limit counts.
        assert_eq!((metrics.queued_requests, sched.queued()), (3, 0), "{what}");
        for _ in 0..3 {
            assert!(sched.step());
            assert!(sched.metrics().running_requests <= 2, "{what}");
        }

        // Idle again: the cap rises and the lines resume.
        sched.set_yield_cap(usize::MAX);
        while sched.step() {}
        let interactive = interactive.collect_blocking();
        assert_same_as_solo(&interactive, &solo(&m, &prompt8(30), 6), &what);
        let mut paused = Vec::new();
        for (i, s) in lines.into_iter().enumerate() {
            let done = s.collect_blocking();
            assert_same_as_solo(&done, &solo(&m, &prompt8(20 + i as u64), 16), &what);
            paused.push(done.finished.usage.preemptions);
        }
        // The latest admitted paused: all but the first.
        assert_eq!(paused, [0, 1, 1, 1], "{what}");
    }
}

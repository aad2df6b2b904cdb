//! Request priority: waiting requests are admitted highest priority first, first come first
//! within one, under both schedule policies; memory pressure preempts the lowest priority
//! first; priority preemption frees a running slot for a request above the threshold, and only
//! then; and what each request generates does not depend on its priority.

use super::*;
use dsv4_engine::scheduler::Scheduler;
use dsv4_engine::{EngineConfig, SchedulePolicy};

#[test]
fn waiting_requests_are_admitted_highest_priority_first() {
    let m = model();
    // (name, priority), in submission order.
    let asked = [("a", 0), ("b", 0), ("c", 5), ("d", -1), ("e", 5), ("f", 0)];
    for policy in [SchedulePolicy::Fcfs, SchedulePolicy::Lpm] {
        let cfg = EngineConfig {
            max_running_requests: 1,
            schedule_policy: policy,
            prefix_cache: true,
            ..Default::default()
        };
        let mut sched = Scheduler::new(m.clone(), cfg, None).unwrap();
        let streams: Vec<_> = asked
            .iter()
            .enumerate()
            .map(|(i, (_, priority))| {
                let mut p = vec![0];
                p.extend(tokens(6, 900 + i as u64));
                sched
                    .submit(Request {
                        priority: *priority,
                        ..greedy(p, 3)
                    })
                    .unwrap()
            })
            .collect();
        while sched.step() {}
        let done: Vec<_> = streams.into_iter().map(|s| s.collect_blocking()).collect();
        let mut order: Vec<usize> = (0..asked.len()).collect();
        order.sort_by(|&x, &y| {
            let t = |i: usize| done[i].finished.timing.queue_ms;
            t(x).total_cmp(&t(y))
        });
        let names: Vec<&str> = order.iter().map(|&i| asked[i].0).collect();
        // All queued before the first step: 5, 5, then 0, 0, 0, then -1, each in arrival order.
        assert_eq!(names, ["c", "e", "a", "b", "f", "d"], "{policy:?}");
        for (i, c) in done.iter().enumerate() {
            let mut p = vec![0];
            p.extend(tokens(6, 900 + i as u64));
            assert_same_as_solo(c, &solo(&m, &p, 3), asked[i].0);
        }
    }
}

#[test]
fn memory_pressure_preempts_the_lowest_priority_first() {
    let m = model();
    // The ratio-4 pools hold one 40-token sequence: two requests growing to 38 tokens each
    // cannot both stay.
    let cfg = EngineConfig {
        cache: dsv4_engine::CacheBudget::Pages(super::accounting::tight_pages(40, 2, 1)),
        page_size: 8,
        max_running_requests: 2,
        ..Default::default()
    };
    let mut sched = Scheduler::new(m.clone(), cfg, None).unwrap();
    // The low one is admitted first, so the high one is the latest admitted: without
    // priorities it would be the one preempted.
    let low = sched.submit(greedy(prompt8(31), 30)).unwrap();
    assert!(sched.step());
    let high = sched
        .submit(Request {
            priority: 5,
            ..greedy(prompt8(32), 30)
        })
        .unwrap();
    while sched.step() {}
    let (low, high) = (low.collect_blocking(), high.collect_blocking());
    assert!(
        sched.metrics().preemptions_total > 0,
        "the pools forced a preemption"
    );
    assert_eq!(
        high.finished.usage.preemptions, 0,
        "the high one kept its place"
    );
    assert!(low.finished.usage.preemptions > 0);
    assert_same_as_solo(&low, &solo(&m, &prompt8(31), 30), "low");
    assert_same_as_solo(&high, &solo(&m, &prompt8(32), 30), "high");
}

#[test]
fn priority_preemption_frees_a_slot_for_a_request_above_the_threshold() {
    let m = model();
    for overlap_schedule in [false, true] {
        for threshold in [None, Some(3)] {
            let what = format!("overlap {overlap_schedule}, threshold {threshold:?}");
            let cfg = EngineConfig {
                max_running_requests: 2,
                priority_preemption: threshold,
                overlap_schedule,
                ..Default::default()
            };
            let mut sched = Scheduler::new(m.clone(), cfg, None).unwrap();
            // (priority, prompt seed, tokens); a and b take both slots first.
            let asked = [(0, 41, 24), (1, 42, 24), (5, 43, 6), (4, 44, 6)];
            let submit = |sched: &mut Scheduler, (priority, seed, n): (i32, u64, usize)| {
                sched
                    .submit(Request {
                        priority,
                        ..greedy(prompt8(seed), n)
                    })
                    .unwrap()
            };
            let mut streams = vec![submit(&mut sched, asked[0]), submit(&mut sched, asked[1])];
            assert!(sched.step());
            assert_eq!(sched.metrics().running_requests, 2, "{what}");
            // c (5) outranks a (0) by more than 3; d (4) outranks b (1) by exactly 3.
            streams.push(submit(&mut sched, asked[2]));
            streams.push(submit(&mut sched, asked[3]));
            // The next step admits c in a's slot (a prompt's tokens count at its first
            // admission), and not d; without preemption neither.
            let prompts = sched.metrics().prompt_tokens_total;
            assert!(sched.step());
            let admitted = (sched.metrics().prompt_tokens_total - prompts) / 8;
            assert_eq!(admitted, u64::from(threshold.is_some()), "{what}");
            // a, preempted, waits again beside d; without preemption c and d wait, neither
            // preempted.
            let mt = sched.metrics();
            assert_eq!(mt.queued_requests, 2, "{what}");
            assert_eq!(
                mt.preempted_waiting,
                usize::from(threshold.is_some()),
                "{what}"
            );
            while sched.step() {}
            let done: Vec<_> = streams.into_iter().map(|s| s.collect_blocking()).collect();
            let preempted: Vec<usize> = done.iter().map(|c| c.finished.usage.preemptions).collect();
            let expected = if threshold.is_some() {
                [1, 0, 0, 0]
            } else {
                [0, 0, 0, 0]
            };
            assert_eq!(preempted, expected, "{what}: preemptions of a, b, c, d");
            assert_eq!(
                sched.metrics().priority_preemptions_total,
                u64::from(threshold.is_some()),
                "{what}"
            );
            for (c, &(_, seed, n)) in done.iter().zip(&asked) {
                assert_same_as_solo(c, &solo(&m, &prompt8(seed), n), &what);
            }
        }
    }
}

#[test]
fn churn_under_priority_preemption_leaves_every_output_as_its_solo_run() {
    // Requests of random priorities arrive in waves onto three slots with threshold 0, so
    // running requests are preempted mid-prefill and mid-decode again and again; prompts share
    // a prefix, so preempted requests come back onto prefix snapshots. Both scheduling modes.
    let m = model();
    let shared = tokens(16, 77);
    let mut rng = SplitMix64::new(2026);
    let asked: Vec<(Vec<u32>, usize, i32)> = (0..18)
        .map(|i| {
            let mut p = vec![0];
            p.extend(&shared[..(rng.next_u64() % 17) as usize]);
            p.extend(tokens(3 + (rng.next_u64() % 20) as usize, 500 + i));
            let n = 4 + (rng.next_u64() % 24) as usize;
            let priority = (rng.next_u64() % 7) as i32 - 3;
            (p, n, priority)
        })
        .collect();
    for overlap_schedule in [false, true] {
        let cfg = EngineConfig {
            page_size: 8,
            max_running_requests: 3,
            chunked_prefill_size: Some(16),
            priority_preemption: Some(0),
            overlap_schedule,
            ..Default::default()
        };
        let mut sched = Scheduler::new(m.clone(), cfg, None).unwrap();
        let mut streams = Vec::new();
        for wave in asked.chunks(3) {
            for (p, n, priority) in wave {
                let req = Request {
                    priority: *priority,
                    ..greedy(p.clone(), *n)
                };
                streams.push(sched.submit(req).unwrap());
            }
            for _ in 0..5 {
                sched.step();
            }
        }
        while sched.step() {}
        let metrics = sched.metrics();
        assert!(
            metrics.priority_preemptions_total >= 3,
            "overlap {overlap_schedule}: only {} priority preemptions",
            metrics.priority_preemptions_total
        );
        for (s, (p, n, priority)) in streams.into_iter().zip(&asked) {
            let c = s.collect_blocking();
            let what = format!("overlap {overlap_schedule}, priority {priority}");
            assert_same_as_solo(&c, &solo(&m, p, *n), &what);
        }
    }
}

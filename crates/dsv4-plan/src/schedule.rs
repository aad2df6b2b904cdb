//! Execution orders of a plan for executors that run one launch at a time: the serial order
//! (issue order) and seeded interleavings that respect only stream order and events, so a
//! missing ordering edge shows up as a different, reproducible order.

use crate::error::PlanError;
use crate::ir::Plan;
use dsv4_core::SplitMix64;

/// Issue order.
pub fn serial<O>(plan: &Plan<O>) -> Vec<usize> {
    (0..plan.launches.len()).collect()
}

/// An order in which, at each point, the next launch is drawn (with `seed`) among the heads
/// of all streams whose awaited events have been recorded.
pub fn interleaved<O>(plan: &Plan<O>, seed: u64) -> Result<Vec<usize>, PlanError> {
    plan.validate()?;
    let mut queues: Vec<std::collections::VecDeque<usize>> =
        vec![Default::default(); plan.streams.len()];
    for (i, l) in plan.launches.iter().enumerate() {
        queues[l.stream.0 as usize].push_back(i);
    }
    let mut recorded = vec![false; plan.events.len()];
    let mut rng = SplitMix64::for_name(seed, "dsv4-plan/interleave");
    let mut order = Vec::with_capacity(plan.launches.len());
    while order.len() < plan.launches.len() {
        let ready: Vec<usize> = queues
            .iter()
            .enumerate()
            .filter_map(|(s, q)| {
                let &head = q.front()?;
                let l = &plan.launches[head];
                l.waits.iter().all(|e| recorded[e.0 as usize]).then_some(s)
            })
            .collect();
        // A validated plan always has a ready stream: the earliest launch not yet run has all
        // its events recorded by earlier launches and heads its stream.
        let s = ready[rng.below(ready.len() as u64) as usize];
        let i = queues[s].pop_front().expect("ready streams have a head");
        for e in &plan.launches[i].records {
            recorded[e.0 as usize] = true;
        }
        order.push(i);
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::PlanBuilder;
    use crate::hb::HappensBefore;
    use crate::ir::{Launch, StreamId};

    #[test]
    fn interleavings_respect_happens_before_and_differ_by_seed() {
        let mut pb = PlanBuilder::<()>::new();
        let side = pb.stream("side");
        let fork = pb.event("fork");
        let join = pb.event("join");
        let l = |stream, waits: Vec<_>, records: Vec<_>| Launch {
            op: (),
            scope: String::new(),
            name: "op".into(),
            stream,
            reads: vec![],
            writes: vec![],
            waits,
            records,
        };
        pb.push(l(StreamId(0), vec![], vec![fork]));
        for _ in 0..4 {
            pb.push(l(StreamId(0), vec![], vec![]));
            pb.push(l(side, vec![fork], vec![]));
        }
        pb.push(l(side, vec![], vec![join]));
        pb.push(l(StreamId(0), vec![join], vec![]));
        let plan = pb.finish();
        let hb = HappensBefore::of(&plan).unwrap();
        let mut distinct = std::collections::BTreeSet::new();
        for seed in 0..16 {
            let order = interleaved(&plan, seed).unwrap();
            assert_eq!(order, interleaved(&plan, seed).unwrap(), "deterministic");
            let mut at = vec![0; order.len()];
            for (k, &i) in order.iter().enumerate() {
                at[i] = k;
            }
            for a in 0..order.len() {
                for b in 0..order.len() {
                    if hb.before(a, b) {
                        assert!(at[a] < at[b], "seed {seed}: {a} must run before {b}");
                    }
                }
            }
            distinct.insert(order);
        }
        assert!(distinct.len() > 4, "seeds explore different orders");
        assert_eq!(serial(&plan), (0..plan.launches.len()).collect::<Vec<_>>());
    }
}

//! Happens-before of a plan's launches: launch a ≺ b when b follows a on the same stream, or
//! b waits for an event recorded by a launch that a precedes or is — and transitively. Since
//! every event is recorded before it is waited for in issue order, issue order is a
//! topological order and one pass over the launches computes the relation.

use crate::error::PlanError;
use crate::ir::Plan;

/// The happens-before relation of one plan, as one bitset of predecessors per launch.
#[derive(Debug, Clone)]
pub struct HappensBefore {
    words: usize,
    preds: Vec<u64>,
}

impl HappensBefore {
    /// Compute the relation (the plan is validated first).
    pub fn of<O>(plan: &Plan<O>) -> Result<Self, PlanError> {
        plan.validate()?;
        let n = plan.launches.len();
        let words = n.div_ceil(64).max(1);
        let mut preds = vec![0u64; n * words];
        let mut last_on_stream: Vec<Option<usize>> = vec![None; plan.streams.len()];
        let mut recorder: Vec<usize> = vec![usize::MAX; plan.events.len()];
        for (i, l) in plan.launches.iter().enumerate() {
            let mut direct: Vec<usize> = Vec::new();
            if let Some(p) = last_on_stream[l.stream.0 as usize] {
                direct.push(p);
            }
            direct.extend(l.waits.iter().map(|e| recorder[e.0 as usize]));
            for p in direct {
                let (done, rest) = preds.split_at_mut(i * words);
                let row = &mut rest[..words];
                row.iter_mut()
                    .zip(&done[p * words..(p + 1) * words])
                    .for_each(|(a, b)| *a |= b);
                row[p / 64] |= 1 << (p % 64);
            }
            last_on_stream[l.stream.0 as usize] = Some(i);
            for e in &l.records {
                recorder[e.0 as usize] = i;
            }
        }
        Ok(Self { words, preds })
    }

    /// Whether launch `a` happens before launch `b`.
    pub fn before(&self, a: usize, b: usize) -> bool {
        self.preds
            .get(b * self.words + a / 64)
            .is_some_and(|w| w & (1 << (a % 64)) != 0)
    }

    /// Whether the two launches are ordered either way (a launch is ordered with itself).
    pub fn ordered(&self, a: usize, b: usize) -> bool {
        a == b || self.before(a, b) || self.before(b, a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::PlanBuilder;
    use crate::ir::Launch;

    fn launch(stream: crate::StreamId) -> Launch<()> {
        Launch {
            op: (),
            scope: String::new(),
            name: "x".into(),
            stream,
            reads: vec![],
            writes: vec![],
            waits: vec![],
            records: vec![],
        }
    }

    #[test]
    fn stream_order_and_events_are_transitive() {
        let mut b = PlanBuilder::<()>::new();
        let main = crate::StreamId(0);
        let side = b.stream("side");
        let fork = b.event("fork");
        let join = b.event("join");
        b.push(Launch {
            records: vec![fork],
            ..launch(main)
        }); // 0
        b.push(launch(main)); // 1
        b.push(Launch {
            waits: vec![fork],
            ..launch(side)
        }); // 2
        b.push(Launch {
            records: vec![join],
            ..launch(side)
        }); // 3
        b.push(launch(main)); // 4
        b.push(Launch {
            waits: vec![join],
            ..launch(main)
        }); // 5
        let hb = HappensBefore::of(&b.finish()).unwrap();
        assert!(hb.before(0, 1) && hb.before(0, 2) && hb.before(0, 3));
        assert!(!hb.ordered(1, 2), "main's 1 and side's 2 are concurrent");
        assert!(!hb.ordered(3, 4));
        assert!(hb.before(2, 5) && hb.before(3, 5) && hb.before(1, 5));
        assert!(!hb.before(5, 0) && !hb.before(2, 2));
    }
}

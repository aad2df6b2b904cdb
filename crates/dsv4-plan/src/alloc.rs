//! The arena allocator of captured plans: every transient buffer gets a fixed byte offset in one
//! arena, and two buffers may share bytes only when their lifetimes cannot overlap.
//!
//! With [`Lifetimes::StreamAware`], buffer b may reuse the bytes of buffer a only when every
//! launch touching a happens before every launch touching b (stream order and events). With
//! [`Lifetimes::IgnoreStreams`] — the fault `arena-ignores-streams` — a buffer is considered
//! dead after its last use in issue order, as if all streams were one: the allocator that
//! made a side stream's scratch alias main-stream tensors in the incident this project grew
//! from. Placement is first fit at 256-byte alignment (the most any wgpu device asks of a binding offset), buffers taken in order of first use.

use crate::error::PlanError;
use crate::hb::HappensBefore;
use crate::ir::{Placement, Plan};
use serde::Serialize;

/// Alignment of every arena offset, in bytes.
pub const ALIGN: u64 = 256;

/// How the allocator decides that a buffer is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lifetimes {
    /// Dead once every launch touching it happens before the next user (correct).
    StreamAware,
    /// Dead after its last use in issue order (the fault `arena-ignores-streams`).
    IgnoreStreams,
}

/// Launch indices touching each buffer, ascending.
fn accesses<O>(plan: &Plan<O>) -> Vec<Vec<usize>> {
    let mut acc = vec![Vec::new(); plan.buffers.len()];
    for (i, l) in plan.launches.iter().enumerate() {
        for s in l.reads.iter().chain(&l.writes) {
            let v: &mut Vec<usize> = &mut acc[s.buffer.0 as usize];
            if v.last() != Some(&i) {
                v.push(i);
            }
        }
    }
    acc
}

/// Whether buffer `a` (placed earlier) may still be live while buffer `b` is in use.
fn overlaps_in_time(
    hb: &HappensBefore,
    lifetimes: Lifetimes,
    a: &[usize],
    a_host_read: bool,
    b: &[usize],
) -> bool {
    if a_host_read {
        return true;
    }
    if a.is_empty() || b.is_empty() {
        return false;
    }
    match lifetimes {
        Lifetimes::StreamAware => !a.iter().all(|&u| b.iter().all(|&v| hb.before(u, v))),
        Lifetimes::IgnoreStreams => a[a.len() - 1] >= b[0],
    }
}

/// Whether every launch of `a` comes before every launch of `b` at positions `pos`.
fn before_in(pos: &[usize], a: &[usize], b: &[usize]) -> bool {
    let last_a = a.iter().map(|&u| pos[u]).max();
    let first_b = b.iter().map(|&v| pos[v]).min();
    match (last_a, first_b) {
        (Some(x), Some(y)) => x < y,
        _ => true,
    }
}

/// Place the plan's transient buffers in one arena under `lifetimes`.
pub fn place<O>(plan: Plan<O>, lifetimes: Lifetimes) -> Result<Plan<O>, PlanError> {
    place_for_order(plan, lifetimes, &[])
}

/// [`place`], with the arena also valid when an executor runs the launches in `order` (a
/// permutation of them that keeps the plan's order of every two launches touching the same
/// bytes, such as [`crate::deferred`]'s): two buffers share bytes only when, besides what
/// `lifetimes` asks, every launch touching the first comes before every launch touching the
/// second in `order`. An empty `order` adds nothing; one that is not a permutation of the
/// launches is refused.
pub fn place_for_order<O>(
    mut plan: Plan<O>,
    lifetimes: Lifetimes,
    order: &[usize],
) -> Result<Plan<O>, PlanError> {
    let n = plan.launches.len();
    let mut pos = vec![usize::MAX; n];
    for (k, &i) in order.iter().enumerate() {
        match pos.get_mut(i) {
            Some(p) if *p == usize::MAX => *p = k,
            _ => return Err(PlanError::NotAnOrder { launches: n }),
        }
    }
    if !order.is_empty() && order.len() != n {
        return Err(PlanError::NotAnOrder { launches: n });
    }
    let hb = HappensBefore::of(&plan)?;
    let acc = accesses(&plan);
    let mut by_first_use: Vec<usize> = (0..plan.buffers.len())
        .filter(|&i| plan.buffers[i].class.is_transient())
        .collect();
    by_first_use.sort_by_key(|&i| (acc[i].first().copied().unwrap_or(usize::MAX), i));
    let mut offsets: Vec<Option<u64>> = vec![None; plan.buffers.len()];
    let mut placed: Vec<(u64, u64, usize)> = Vec::new(); // (start, end, buffer)
    let mut arena = 0u64;
    for &b in &by_first_use {
        let size = plan.buffers[b].bytes;
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&(_, _, a)| {
                overlaps_in_time(&hb, lifetimes, &acc[a], plan.buffers[a].host_read, &acc[b])
                    || (!order.is_empty() && !before_in(&pos, &acc[a], &acc[b]))
            })
            .map(|&(s, e, _)| (s, e))
            .collect();
        busy.sort_unstable();
        let mut at = 0u64;
        for (s, e) in busy {
            if at + size <= s {
                break;
            }
            at = at.max(e.div_ceil(ALIGN) * ALIGN);
        }
        offsets[b] = Some(at);
        placed.push((at, at + size, b));
        arena = arena.max(at + size);
    }
    plan.placement = Placement::Arena {
        offsets,
        bytes: arena.div_ceil(ALIGN) * ALIGN,
        lifetimes,
    };
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::PlanBuilder;
    use crate::ir::{BufferClass, Launch, StreamId};

    /// main: w(a) → r(a),w(c); side (after fork): w(b). With stream-aware lifetimes b never
    /// shares a's bytes; ignoring streams, b lands on a, which main still reads.
    #[test]
    fn stream_aware_lifetimes_keep_side_stream_buffers_apart() {
        let mut pb = PlanBuilder::<()>::new();
        let side = pb.stream("side");
        let fork = pb.event("fork");
        let a = pb.buffer(BufferClass::Transient, "", "a", 256);
        let b = pb.buffer(BufferClass::Transient, "", "b", 256);
        let c = pb.buffer(BufferClass::Transient, "", "c", 256);
        let l = |stream, reads, writes, waits, records| Launch {
            op: (),
            scope: String::new(),
            name: "op".into(),
            stream,
            reads,
            writes,
            waits,
            records,
        };
        let (sa, sb, sc) = (pb.all(a), pb.all(b), pb.all(c));
        pb.push(l(StreamId(0), vec![], vec![sa], vec![], vec![fork]));
        pb.push(l(StreamId(0), vec![sa], vec![sc], vec![], vec![]));
        pb.push(l(side, vec![], vec![sb], vec![fork], vec![]));
        let plan = pb.finish();
        let good = place(plan.clone(), Lifetimes::StreamAware).unwrap();
        let bad = place(plan, Lifetimes::IgnoreStreams).unwrap();
        assert_ne!(good.offset(a), good.offset(b));
        assert_eq!(bad.offset(a), bad.offset(b), "b reuses a's bytes");
        assert_ne!(
            good.offset(a),
            good.offset(c),
            "c is written while a is read"
        );
    }

    /// w(a), r(a), w(b), r(b) on one stream: in list order b may take a's bytes; run as
    /// w(a), w(b), r(a), r(b) it may not. Orders that are not permutations are refused.
    #[test]
    fn an_execution_order_keeps_the_buffers_it_overlaps_apart() {
        let mut pb = PlanBuilder::<()>::new();
        let a = pb.buffer(BufferClass::Transient, "", "a", 256);
        let b = pb.buffer(BufferClass::Transient, "", "b", 256);
        let (sa, sb) = (pb.all(a), pb.all(b));
        for (reads, writes) in [(vec![], vec![sa]), (vec![sa], vec![]), (vec![], vec![sb])] {
            pb.push(Launch {
                op: (),
                scope: String::new(),
                name: "op".into(),
                stream: StreamId(0),
                reads,
                writes,
                waits: vec![],
                records: vec![],
            });
        }
        let mut last = pb.plan().launches[1].clone();
        last.reads = vec![sb];
        pb.push(last);
        let plan = pb.finish();
        let listed = place(plan.clone(), Lifetimes::StreamAware).unwrap();
        assert_eq!(listed.offset(a), listed.offset(b));
        let run = place_for_order(plan.clone(), Lifetimes::StreamAware, &[0, 2, 1, 3]).unwrap();
        assert_ne!(run.offset(a), run.offset(b));
        for bad in [&[0, 1, 1, 3][..], &[0, 1], &[0, 1, 2, 7]] {
            assert_eq!(
                place_for_order(plan.clone(), Lifetimes::StreamAware, bad),
                Err(PlanError::NotAnOrder { launches: 4 })
            );
        }
    }
}

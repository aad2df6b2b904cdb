//! Deferred execution orders: the plan's launches in an order that runs some of them (on a
//! device backend, the ops that run on the host and so cost a device round trip each) as late
//! as what depends on them allows, and every other launch ahead of them, so the deferred
//! launches run back to back and one round trip can serve a run of them.
//!
//! The plan itself is unchanged (its list order is what the verifier, the allocator, taps and
//! the other executors see); only the order an executor runs it in differs, as with
//! [`crate::interleaved`]. A launch runs ahead of a deferred launch only when:
//! - neither touches bytes the other writes, judged where the bytes live (two buffers that share
//!   arena bytes in a captured plan conflict as one buffer would);
//! - it waits for no event the deferred launch records;
//! - on the deferred launch's stream, it records no event (an event stands for all earlier
//!   work of its stream) and the deferred launch waits for none (the stream order carried that
//!   wait to it).
//!
//! Launches of each kind keep their relative order, so every pair of launches that touch the
//! same bytes, one writing, runs in the plan's order: the order computes the plan's values.

use crate::error::PlanError;
use crate::ir::{Launch, Plan, Slice};

/// The launch indices of `plan` in an order that runs each launch `deferred` picks as late as
/// its dependents allow (see the module docs); an invalid plan is refused.
pub fn deferred<O>(
    plan: &Plan<O>,
    deferred: impl Fn(&Launch<O>) -> bool,
) -> Result<Vec<usize>, PlanError> {
    plan.validate()?;
    let launches = &plan.launches;
    let mut order = Vec::with_capacity(launches.len());
    let mut pending: Vec<usize> = Vec::new();
    for (i, l) in launches.iter().enumerate() {
        if deferred(l) {
            pending.push(i);
            continue;
        }
        // The deferred launches up to the last one `l` depends on go first, in their order.
        if let Some(last) = pending
            .iter()
            .rposition(|&p| depends(plan, l, &launches[p]))
        {
            order.extend(pending.drain(..=last));
        }
        order.push(i);
    }
    order.extend(pending);
    Ok(order)
}

/// Whether `later` must stay after `earlier`, which comes before it in `plan`.
fn depends<O>(plan: &Plan<O>, later: &Launch<O>, earlier: &Launch<O>) -> bool {
    let meet = |a: &Slice, b: &Slice| {
        let ((ma, sa, ea), (mb, sb, eb)) = (plan.locate(a), plan.locate(b));
        ma == mb && sa < eb && sb < ea
    };
    let touches = |a: &[Slice], b: &[Slice]| a.iter().any(|x| b.iter().any(|y| meet(x, y)));
    let same_stream = later.stream == earlier.stream;
    touches(&later.reads, &earlier.writes)
        || touches(&later.writes, &earlier.reads)
        || touches(&later.writes, &earlier.writes)
        || later.waits.iter().any(|e| earlier.records.contains(e))
        || (same_stream && !later.records.is_empty())
        || (same_stream && !earlier.waits.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::PlanBuilder;
    use crate::ir::{BufferClass, BufferId, EventId, StreamId};

    const NONE: (&[EventId], &[EventId]) = (&[], &[]);

    /// A launch named `name` ("h…" for host ops, which are deferred) touching whole 16-byte
    /// buffers.
    fn l(
        name: &str,
        stream: StreamId,
        reads: &[BufferId],
        writes: &[BufferId],
        events: (&[EventId], &[EventId]),
    ) -> Launch<()> {
        let all = |b: &[BufferId]| {
            b.iter()
                .map(|&buffer| Slice {
                    buffer,
                    start: 0,
                    len: 16,
                })
                .collect()
        };
        Launch {
            op: (),
            scope: String::new(),
            name: name.into(),
            stream,
            reads: all(reads),
            writes: all(writes),
            waits: events.0.to_vec(),
            records: events.1.to_vec(),
        }
    }

    fn host(l: &Launch<()>) -> bool {
        l.name.starts_with('h')
    }

    fn buffers<const N: usize>(pb: &mut PlanBuilder<()>) -> [BufferId; N] {
        std::array::from_fn(|i| pb.buffer(BufferClass::Transient, "", &format!("t{i}"), 16))
    }

    /// The deferred order's launch names.
    fn run(plan: &Plan<()>) -> Vec<&str> {
        let order = deferred(plan, host).unwrap();
        let mut seen = order.clone();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..plan.launches.len()).collect::<Vec<_>>(),
            "a permutation"
        );
        order
            .iter()
            .map(|&i| plan.launches[i].name.as_str())
            .collect()
    }

    #[test]
    fn host_launches_gather_after_the_device_launches_that_do_not_need_them() {
        // The shape of a decode layer: the KV projection's store, the compressor's pool and
        // attention run on the host between device projections.
        let mut pb = PlanBuilder::<()>::new();
        let [x, kv, a, q, o, y] = buffers(&mut pb);
        let pool = pb.buffer(BufferClass::Pool, "", "pool", 16);
        let m = StreamId(0);
        pb.push(l("embed", m, &[], &[x], NONE));
        pb.push(l("kv", m, &[x], &[kv], NONE));
        pb.push(l("h_store", m, &[kv], &[pool], NONE));
        pb.push(l("comp", m, &[x], &[a], NONE));
        pb.push(l("h_pool", m, &[a], &[pool], NONE));
        pb.push(l("q", m, &[x], &[q], NONE));
        pb.push(l("h_attn", m, &[q, pool], &[o], NONE));
        pb.push(l("out", m, &[o], &[y], NONE));
        pb.push(l("h_late", m, &[y], &[], NONE));
        assert_eq!(
            run(&pb.finish()),
            [
                "embed", "kv", "comp", "q", "h_store", "h_pool", "h_attn", "out", "h_late"
            ]
        );
    }

    #[test]
    fn a_launch_stays_after_a_host_launch_it_conflicts_with() {
        let mut pb = PlanBuilder::<()>::new();
        let [a, b, c] = buffers(&mut pb);
        let m = StreamId(0);
        pb.push(l("w_a", m, &[], &[a], NONE));
        // Read after write, write after read, write after write: each keeps its place.
        pb.push(l("h1", m, &[a], &[b], NONE));
        pb.push(l("raw", m, &[b], &[c], NONE));
        pb.push(l("h2", m, &[c], &[], NONE));
        pb.push(l("war", m, &[], &[c], NONE));
        pb.push(l("h3", m, &[], &[a], NONE));
        pb.push(l("waw", m, &[], &[a], NONE));
        pb.push(l("free", m, &[], &[b], NONE));
        assert_eq!(
            run(&pb.finish()),
            ["w_a", "h1", "raw", "h2", "war", "h3", "waw", "free"]
        );
    }

    #[test]
    fn buffers_sharing_arena_bytes_conflict() {
        // `b` is first written after `a`'s last use, so the allocator gives it `a`'s bytes:
        // writing `b` ahead of the host launch that reads `a` would clobber its operand.
        let mut pb = PlanBuilder::<()>::new();
        let [a, b] = buffers(&mut pb);
        let m = StreamId(0);
        pb.push(l("w_a", m, &[], &[a], NONE));
        pb.push(l("h_read_a", m, &[a], &[], NONE));
        pb.push(l("w_b", m, &[], &[b], NONE));
        pb.push(l("h_read_b", m, &[b], &[], NONE));
        let fresh = pb.finish();
        assert_eq!(run(&fresh), ["w_a", "w_b", "h_read_a", "h_read_b"]);
        let placed = crate::place(fresh, crate::Lifetimes::StreamAware).unwrap();
        assert_eq!(
            placed.offset(a),
            placed.offset(b),
            "the arena reuses a's bytes"
        );
        assert_eq!(run(&placed), ["w_a", "h_read_a", "w_b", "h_read_b"]);
    }

    #[test]
    fn events_keep_launches_behind_the_host_work_they_stand_for() {
        let mut pb = PlanBuilder::<()>::new();
        let side = pb.stream("side");
        let [e1, e2, e3, e4] = ["e1", "e2", "e3", "e4"].map(|n| pb.event(n));
        let [a, b, c, d, e] = buffers(&mut pb);
        let m = StreamId(0);
        // A side-stream host launch recording an event: its waiter stays after it.
        pb.push(l("h_side", side, &[], &[a], (&[], &[e1])));
        pb.push(l("waiter", m, &[], &[b], (&[e1], &[])));
        // A device launch recording an event on the stream of a pending host launch stays
        // after it (the event stands for the host launch too); on another stream it moves,
        // and so does a launch that only waits.
        pb.push(l("h_main", m, &[], &[c], NONE));
        pb.push(l("rec_other", side, &[], &[d], (&[], &[e2])));
        pb.push(l("wait_only", m, &[], &[], (&[e2], &[])));
        pb.push(l("rec_same", m, &[], &[], (&[], &[e3])));
        pb.push(l("waiter2", side, &[c], &[], (&[e3], &[])));
        // A host launch that waits carries its wait to the launches after it on its stream.
        pb.push(l("rec_e4", side, &[], &[e], (&[], &[e4])));
        pb.push(l("h_waits", m, &[], &[], (&[e4], &[])));
        pb.push(l("reads_e", m, &[e], &[], NONE));
        assert_eq!(
            run(&pb.finish()),
            [
                "h_side",
                "waiter",
                "rec_other",
                "wait_only",
                "h_main",
                "rec_same",
                "waiter2",
                "rec_e4",
                "h_waits",
                "reads_e"
            ]
        );
    }

    #[test]
    fn an_invalid_plan_is_refused() {
        let mut pb = PlanBuilder::<()>::new();
        let e = pb.event("never");
        pb.push(l("waits", StreamId(0), &[], &[], (&[e], &[])));
        assert!(matches!(
            deferred(&pb.finish(), host),
            Err(PlanError::WaitBeforeRecord { .. })
        ));
    }
}

//! Verifier tests on small hand-built plans: every finding kind fires on a plan that has the
//! problem and stays silent on the same plan without it.

use super::*;
use crate::alloc::{Lifetimes, place};
use crate::builder::PlanBuilder;
use crate::ir::{EventId, Launch, Placement, StreamId};

struct Fork {
    pb: PlanBuilder<()>,
    side: StreamId,
    fork: EventId,
    join: EventId,
}

fn fork() -> Fork {
    let mut pb = PlanBuilder::new();
    let side = pb.stream("side");
    let fork = pb.event("fork");
    let join = pb.event("join");
    Fork {
        pb,
        side,
        fork,
        join,
    }
}

fn op(name: &str, stream: StreamId) -> Launch<()> {
    Launch {
        op: (),
        scope: "layers.0".into(),
        name: name.into(),
        stream,
        reads: vec![],
        writes: vec![],
        waits: vec![],
        records: vec![],
    }
}

/// main: produce x (records fork); side: read x, write y (records join); main: read y.
fn fork_join(with_join: bool) -> Plan<()> {
    let Fork {
        mut pb,
        side,
        fork,
        join,
    } = fork();
    let x = pb.buffer(BufferClass::Transient, "layers.0", "x", 128);
    let y = pb.buffer(BufferClass::Transient, "layers.0", "y", 128);
    let (sx, sy) = (pb.all(x), pb.all(y));
    pb.push(Launch {
        writes: vec![sx],
        records: vec![fork],
        ..op("produce", StreamId(0))
    });
    pb.push(Launch {
        reads: vec![sx],
        writes: vec![sy],
        waits: vec![fork],
        records: vec![join],
        ..op("side.work", side)
    });
    pb.push(Launch {
        reads: vec![sy],
        waits: if with_join { vec![join] } else { vec![] },
        ..op("consume", StreamId(0))
    });
    pb.finish()
}

#[test]
fn a_fork_join_plan_passes_and_a_missing_join_is_a_named_race() {
    let v = verify(&fork_join(true)).unwrap();
    assert!(v.passed(), "{:?}", v.findings);
    let v = verify(&fork_join(false)).unwrap();
    assert_eq!(v.count(FindingKind::Race), 1, "{:?}", v.findings);
    let f = &v.findings[0];
    let (a, b) = (&f.first, f.second.as_ref().unwrap());
    assert_eq!(
        (a.op.as_str(), a.stream.as_str(), a.access),
        ("side.work", "side", "write")
    );
    assert_eq!(
        (b.op.as_str(), b.stream.as_str(), b.access),
        ("consume", "main", "read")
    );
    assert_eq!((a.buffer.as_str(), a.bytes), ("layers.0.y", (0, 128)));
}

/// Side stream scratch `s` is allocated after main's `a` is last used in issue order, but
/// main still reads `a` concurrently with the side stream.
fn scratch_plan() -> Plan<()> {
    let Fork {
        mut pb,
        side,
        fork,
        join,
    } = fork();
    let a = pb.buffer(BufferClass::Transient, "layers.0", "a", 256);
    let s = pb.buffer(BufferClass::Transient, "layers.0", "scratch", 256);
    let o = pb.buffer(BufferClass::Transient, "layers.0", "o", 256);
    let (sa, ss, so) = (pb.all(a), pb.all(s), pb.all(o));
    pb.push(Launch {
        writes: vec![sa],
        records: vec![fork],
        ..op("a.write", StreamId(0))
    });
    pb.push(Launch {
        reads: vec![sa],
        writes: vec![so],
        ..op("a.read", StreamId(0))
    });
    pb.push(Launch {
        writes: vec![ss],
        waits: vec![fork],
        records: vec![join],
        ..op("indexer.scratch", side)
    });
    pb.push(Launch {
        reads: vec![so],
        waits: vec![join],
        ..op("attention", StreamId(0))
    });
    pb.finish()
}

#[test]
fn stream_aware_arena_passes_and_the_faulty_arena_is_caught() {
    let good = place(scratch_plan(), Lifetimes::StreamAware).unwrap();
    assert!(verify(&good).unwrap().passed());
    let bad = place(scratch_plan(), Lifetimes::IgnoreStreams).unwrap();
    let v = verify(&bad).unwrap();
    assert_eq!(v.count(FindingKind::Race), 1, "{:?}", v.findings);
    let f = &v.findings[0];
    let (a, b) = (&f.first, f.second.as_ref().unwrap());
    assert_eq!((a.op.as_str(), a.buffer.as_str()), ("a.read", "layers.0.a"));
    assert_eq!(
        (b.op.as_str(), b.buffer.as_str()),
        ("indexer.scratch", "layers.0.scratch")
    );
    assert_eq!(a.arena, b.arena, "the two buffers share arena bytes");
}

#[test]
fn an_ordered_overwrite_between_write_and_read_is_a_clobber() {
    let mut pb = PlanBuilder::<()>::new();
    let b = pb.buffer(BufferClass::Transient, "", "b", 64);
    let c = pb.buffer(BufferClass::Transient, "", "c", 64);
    let (sb, sc) = (pb.all(b), pb.all(c));
    pb.push(Launch {
        writes: vec![sb],
        ..op("w.b", StreamId(0))
    });
    pb.push(Launch {
        writes: vec![sc],
        ..op("w.c", StreamId(0))
    });
    pb.push(Launch {
        reads: vec![sb, sc],
        ..op("r.bc", StreamId(0))
    });
    let mut plan = pb.finish();
    assert!(verify(&plan).unwrap().passed(), "separate buffers are fine");
    plan.placement = Placement::Arena {
        offsets: vec![Some(0), Some(0)],
        bytes: 64,
        lifetimes: Lifetimes::IgnoreStreams,
    };
    let v = verify(&plan).unwrap();
    assert_eq!(v.count(FindingKind::Clobber), 1, "{:?}", v.findings);
    assert_eq!(v.findings[0].first.op, "w.c");
    assert_eq!(v.findings[0].second.as_ref().unwrap().op, "r.bc");
}

#[test]
fn reads_of_unwritten_transient_bytes_are_reported_with_the_gap() {
    let mut pb = PlanBuilder::<()>::new();
    let x = pb.buffer(BufferClass::Transient, "", "x", 128);
    pb.push(Launch {
        writes: vec![Slice {
            buffer: x,
            start: 0,
            len: 64,
        }],
        ..op("half", StreamId(0))
    });
    let all = pb.all(x);
    pb.push(Launch {
        reads: vec![all],
        ..op("whole", StreamId(0))
    });
    let v = verify(&pb.finish()).unwrap();
    assert_eq!(v.count(FindingKind::Uninitialised), 1);
    assert_eq!(v.findings[0].first.bytes, (64, 128));
    assert_eq!(v.findings[0].first.op, "whole");
}

#[test]
fn waiting_for_an_event_recorded_later_is_a_structural_error() {
    let Fork {
        mut pb, side, fork, ..
    } = fork();
    pb.push(Launch {
        waits: vec![fork],
        ..op("early", side)
    });
    pb.push(Launch {
        records: vec![fork],
        ..op("late", StreamId(0))
    });
    let e = verify(&pb.finish()).unwrap_err();
    assert!(
        matches!(e, PlanError::WaitBeforeRecord { launch: 0, .. }),
        "{e}"
    );
}

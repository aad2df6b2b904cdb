//! The verifier: what must hold before a plan runs.
//!
//! - Race: two launches on different streams touch overlapping bytes (of one buffer, or of the
//!   arena when two buffers share it), at least one writes, and neither happens before the
//!   other. Reported with both launches: scope, op, stream, buffer and byte range.
//! - Clobber: a launch writes buffer C over bytes of buffer B after B was produced and before
//!   a launch that reads B (ordered, so no race, but B is destroyed: an allocator bug).
//! - Uninitialised read: a launch reads transient bytes that no launch before it wrote.
//! - Structure: undeclared ids, out-of-bounds slices, events recorded twice or waited for
//!   before they are recorded ([`crate::Plan::validate`]).

use crate::error::PlanError;
use crate::hb::HappensBefore;
use crate::ir::{BufferClass, BufferId, Memory, Plan, Slice};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};

/// What kind of problem a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// Unordered conflicting accesses on different streams.
    Race,
    /// A buffer's bytes overwritten by another buffer between its write and a read.
    Clobber,
    /// A read of transient bytes nothing wrote before it.
    Uninitialised,
}

/// One side of a finding: a launch and the access it makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaunchRef {
    /// Index of the launch in issue order.
    pub index: usize,
    /// Its scope (e.g. "layers.2").
    pub scope: String,
    /// Its op name.
    pub op: String,
    /// Its stream's name.
    pub stream: String,
    /// "read" or "write".
    pub access: &'static str,
    /// The buffer touched ("scope.name").
    pub buffer: String,
    /// Bytes of the buffer touched.
    pub bytes: (u64, u64),
    /// The same bytes in the arena, when the buffer lives there.
    pub arena: Option<(u64, u64)>,
}

/// One problem found in a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What it is.
    pub kind: FindingKind,
    /// The first launch (for uninitialised reads: the reader).
    pub first: LaunchRef,
    /// The second launch (absent for uninitialised reads).
    pub second: Option<LaunchRef>,
}

/// The verifier's result for one plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Launches checked.
    pub launches: usize,
    /// Streams in the plan.
    pub streams: usize,
    /// Events in the plan.
    pub events: usize,
    /// Ordered pairs of launches that touch overlapping bytes, at least one writing, checked.
    pub conflicting_pairs: usize,
    /// Problems, races first.
    pub findings: Vec<Finding>,
}

impl Verdict {
    /// Whether nothing was found.
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }

    /// Findings of one kind.
    pub fn count(&self, kind: FindingKind) -> usize {
        self.findings.iter().filter(|f| f.kind == kind).count()
    }
}

/// One memory access of one launch.
#[derive(Debug, Clone, Copy)]
struct Access {
    launch: usize,
    slice: Slice,
    write: bool,
    mem: Memory,
    lo: u64,
    hi: u64,
}

fn describe<O>(plan: &Plan<O>, a: &Access) -> LaunchRef {
    let l = &plan.launches[a.launch];
    LaunchRef {
        index: a.launch,
        scope: l.scope.clone(),
        op: l.name.clone(),
        stream: plan.stream_name(l.stream).to_string(),
        access: if a.write { "write" } else { "read" },
        buffer: plan.buffer(a.slice.buffer).label(),
        bytes: (a.slice.start, a.slice.end()),
        arena: (a.mem == Memory::Arena).then_some((a.lo, a.hi)),
    }
}

fn collect<O>(plan: &Plan<O>) -> Vec<Access> {
    let mut out = Vec::new();
    for (i, l) in plan.launches.iter().enumerate() {
        let reads = l.reads.iter().map(|s| (s, false));
        for (s, write) in reads.chain(l.writes.iter().map(|s| (s, true))) {
            if plan.buffer(s.buffer).class == BufferClass::Weight || s.len == 0 {
                continue;
            }
            let (mem, lo, hi) = plan.locate(s);
            out.push(Access {
                launch: i,
                slice: *s,
                write,
                mem,
                lo,
                hi,
            });
        }
    }
    out
}

/// Pairs of accesses (indices into `acc`) that overlap in memory.
fn overlapping(acc: &[Access]) -> Vec<(usize, usize)> {
    let mut groups: BTreeMap<(u8, u32), Vec<usize>> = BTreeMap::new();
    for (i, a) in acc.iter().enumerate() {
        let key = match a.mem {
            Memory::Arena => (0, 0),
            Memory::Buffer(BufferId(b)) => (1, b),
        };
        groups.entry(key).or_default().push(i);
    }
    let mut pairs = Vec::new();
    for mut g in groups.into_values() {
        g.sort_by_key(|&i| (acc[i].lo, acc[i].hi));
        for (k, &i) in g.iter().enumerate() {
            for &j in &g[k + 1..] {
                if acc[j].lo >= acc[i].hi {
                    break;
                }
                pairs.push((i, j));
            }
        }
    }
    pairs
}

/// Whether the written bytes of `b` up to `reader` cover `lo..hi` of buffer `b`.
fn covered(
    writes: &[(usize, u64, u64)],
    hb: &HappensBefore,
    reader: usize,
    lo: u64,
    hi: u64,
) -> Option<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = writes
        .iter()
        .filter(|(w, _, _)| hb.before(*w, reader))
        .map(|&(_, s, e)| (s, e))
        .collect();
    spans.sort_unstable();
    let mut at = lo;
    for (s, e) in spans {
        if s > at {
            break;
        }
        at = at.max(e);
        if at >= hi {
            return None;
        }
    }
    (at < hi).then_some((at, hi))
}

/// Check a plan; `Err` only for a structurally invalid plan.
pub fn verify<O>(plan: &Plan<O>) -> Result<Verdict, PlanError> {
    let hb = HappensBefore::of(plan)?;
    let acc = collect(plan);
    let mut findings = Vec::new();
    let mut seen: HashSet<(FindingKind, usize, usize)> = HashSet::new();
    let mut producers: BTreeMap<u32, Vec<(usize, u64, u64)>> = BTreeMap::new();
    for a in acc.iter().filter(|a| a.write) {
        let e = producers.entry(a.slice.buffer.0).or_default();
        e.push((a.launch, a.slice.start, a.slice.end()));
    }
    let mut conflicting_pairs = 0;
    for (i, j) in overlapping(&acc) {
        let (a, b) = (&acc[i], &acc[j]);
        if !(a.write || b.write) || a.launch == b.launch && a.slice.buffer == b.slice.buffer {
            continue;
        }
        conflicting_pairs += 1;
        let (sa, sb) = (
            plan.launches[a.launch].stream,
            plan.launches[b.launch].stream,
        );
        let (x, y) = if a.launch <= b.launch { (a, b) } else { (b, a) };
        if sa != sb && !hb.ordered(a.launch, b.launch) {
            if seen.insert((FindingKind::Race, x.launch, y.launch)) {
                findings.push(Finding {
                    kind: FindingKind::Race,
                    first: describe(plan, x),
                    second: Some(describe(plan, y)),
                });
            }
            continue;
        }
        // Ordered: a write of another buffer between a buffer's production and its read.
        let (r, w) = match (x.write, y.write) {
            (_, false) => (y, x),
            (false, true) => (x, y),
            (true, true) => continue,
        };
        if r.slice.buffer == w.slice.buffer {
            continue;
        }
        let same_launch = r.launch == w.launch;
        let between = same_launch
            || hb.before(w.launch, r.launch)
                && producers.get(&r.slice.buffer.0).is_some_and(|ps| {
                    ps.iter()
                        .any(|&(p, _, _)| p == w.launch || hb.before(p, w.launch))
                });
        if between && seen.insert((FindingKind::Clobber, w.launch, r.launch)) {
            findings.push(Finding {
                kind: FindingKind::Clobber,
                first: describe(plan, w),
                second: Some(describe(plan, r)),
            });
        }
    }
    for a in acc.iter().filter(|a| !a.write) {
        if !plan.buffer(a.slice.buffer).class.is_transient() {
            continue;
        }
        let writes = producers
            .get(&a.slice.buffer.0)
            .map_or(&[][..], Vec::as_slice);
        let key = (
            FindingKind::Uninitialised,
            a.launch,
            a.slice.buffer.0 as usize,
        );
        if let Some((lo, hi)) = covered(writes, &hb, a.launch, a.slice.start, a.slice.end())
            && seen.insert(key)
        {
            let mut first = describe(plan, a);
            first.arena = first
                .arena
                .map(|(s, _)| (s + lo - a.slice.start, s + hi - a.slice.start));
            first.bytes = (lo, hi);
            findings.push(Finding {
                kind: FindingKind::Uninitialised,
                first,
                second: None,
            });
        }
    }
    findings.sort_by_key(|f| {
        let k = match f.kind {
            FindingKind::Race => 0,
            FindingKind::Clobber => 1,
            FindingKind::Uninitialised => 2,
        };
        (k, f.first.index, f.second.as_ref().map_or(0, |s| s.index))
    });
    Ok(Verdict {
        launches: plan.launches.len(),
        streams: plan.streams.len(),
        events: plan.events.len(),
        conflicting_pairs,
        findings,
    })
}

#[cfg(test)]
mod tests;

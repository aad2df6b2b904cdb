//! Text renderings: a plan's launch and buffer tables (`dsv4 plan show`) and a verifier
//! verdict with one paragraph per finding (`dsv4 plan check`).

use crate::ir::{BufferClass, Placement, Plan, Slice};
use crate::verify::{Finding, FindingKind, LaunchRef, Verdict};
use std::fmt::Write;

fn slice<O>(plan: &Plan<O>, s: &Slice) -> String {
    let b = plan.buffer(s.buffer);
    let name = match b.class {
        BufferClass::Transient => b.name.clone(),
        BufferClass::Weight | BufferClass::Pool => b.label(),
    };
    if s.start == 0 && s.len == b.bytes {
        name
    } else {
        format!("{name}[{}..{})", s.start, s.end())
    }
}

fn events<O>(plan: &Plan<O>, ids: &[crate::EventId]) -> String {
    ids.iter()
        .map(|e| plan.events[e.0 as usize].as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// One line per launch: index, stream, scope, op, waits, records, reads, writes.
pub fn launch_table<O>(plan: &Plan<O>) -> String {
    launch_table_in(plan, &crate::serial(plan))
}

/// [`launch_table`] with the launches in `order` (an executor's order, e.g.
/// [`crate::deferred`]'s); `#` stays each launch's index in the plan.
pub fn launch_table_in<O>(plan: &Plan<O>, order: &[usize]) -> String {
    let mut out = format!(
        "{:>4}  {:<15} {:<10} {:<18} {:<22} {:<22} {:<40} {}\n",
        "#", "stream", "scope", "op", "waits", "records", "reads", "writes"
    );
    for (i, l) in order
        .iter()
        .filter_map(|&i| Some((i, plan.launches.get(i)?)))
    {
        let list = |v: &[Slice]| {
            v.iter()
                .map(|s| slice(plan, s))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            out,
            "{:>4}  {:<15} {:<10} {:<18} {:<22} {:<22} {:<40} {}",
            i,
            plan.stream_name(l.stream),
            if l.scope.is_empty() { "-" } else { &l.scope },
            l.name,
            events(plan, &l.waits),
            events(plan, &l.records),
            list(&l.reads),
            list(&l.writes)
        );
    }
    out
}

/// One line per transient buffer: scope, name, bytes, arena offset.
pub fn buffer_table<O>(plan: &Plan<O>) -> String {
    let mut out = format!(
        "{:<10} {:<22} {:>12} {:>12}\n",
        "scope", "transient buffer", "bytes", "arena offset"
    );
    for (i, b) in plan.buffers.iter().enumerate() {
        if !b.class.is_transient() {
            continue;
        }
        let off = plan
            .offset(crate::BufferId(i as u32))
            .map_or("fresh".to_string(), |o| o.to_string());
        let _ = writeln!(
            out,
            "{:<10} {:<22} {:>12} {:>12}",
            if b.scope.is_empty() { "-" } else { &b.scope },
            b.name,
            b.bytes,
            off
        );
    }
    out
}

/// One line summarising a plan: launches, streams, events, buffers, memory.
pub fn summary<O>(plan: &Plan<O>) -> String {
    let transient = plan
        .buffers
        .iter()
        .filter(|b| b.class.is_transient())
        .count();
    let memory = match &plan.placement {
        Placement::Fresh => format!("{} B in fresh allocations", plan.transient_bytes()),
        Placement::Arena {
            bytes, lifetimes, ..
        } => format!(
            "arena {bytes} B for {} B of buffers (lifetimes: {})",
            plan.transient_bytes(),
            match lifetimes {
                crate::Lifetimes::StreamAware => "stream-aware",
                crate::Lifetimes::IgnoreStreams => "IGNORE STREAMS",
            }
        ),
    };
    format!(
        "{} launches on {} stream(s) ({}), {} events, {} transient buffers, {memory}",
        plan.launches.len(),
        plan.streams.len(),
        plan.streams.join(", "),
        plan.events.len(),
        transient
    )
}

fn side(r: &LaunchRef) -> String {
    let arena = r
        .arena
        .map_or(String::new(), |(s, e)| format!(", arena bytes {s}..{e}"));
    format!(
        "#{} {} {} on stream {} {}s {} bytes {}..{}{arena}",
        r.index,
        if r.scope.is_empty() { "-" } else { &r.scope },
        r.op,
        r.stream,
        r.access,
        r.buffer,
        r.bytes.0,
        r.bytes.1
    )
}

/// A finding as a short paragraph.
pub fn finding(f: &Finding) -> String {
    match (f.kind, &f.second) {
        (FindingKind::Race, Some(b)) => format!(
            "RACE: no ordering between\n  {}\n  {}\n  (different streams, overlapping bytes, \
             neither waits for the other)",
            side(&f.first),
            side(b)
        ),
        (FindingKind::Clobber, Some(b)) => format!(
            "CLOBBER: {}\n  overwrites bytes that\n  {}\n  reads afterwards",
            side(&f.first),
            side(b)
        ),
        _ => format!(
            "UNINITIALISED: {}\n  reads bytes no earlier launch wrote",
            side(&f.first)
        ),
    }
}

/// A verdict: the counts, the findings per pair of streams, then the findings (those with a
/// stream whose name starts with `involving`, when given; at most `limit`).
pub fn verdict(v: &Verdict, limit: usize, involving: Option<&str>) -> String {
    let mut out = format!(
        "{} launches, {} streams, {} events, {} conflicting access pairs checked: ",
        v.launches, v.streams, v.events, v.conflicting_pairs
    );
    if v.passed() {
        out.push_str("no hazards\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{} race(s), {} clobber(s), {} uninitialised read(s)",
        v.count(FindingKind::Race),
        v.count(FindingKind::Clobber),
        v.count(FindingKind::Uninitialised)
    );
    let mut pairs: std::collections::BTreeMap<(String, String), usize> = Default::default();
    for f in &v.findings {
        let other = f.second.as_ref().map_or("-", |s| s.stream.as_str());
        let mut key = [f.first.stream.clone(), other.to_string()];
        key.sort();
        let [a, b] = key;
        *pairs.entry((a, b)).or_default() += 1;
    }
    let by: Vec<String> = pairs
        .iter()
        .map(|((a, b), n)| format!("{a}↔{b} {n}"))
        .collect();
    let _ = writeln!(out, "by streams: {}", by.join(", "));
    let shown: Vec<&Finding> = v
        .findings
        .iter()
        .filter(|f| {
            involving.is_none_or(|s| {
                f.first.stream.starts_with(s)
                    || f.second.as_ref().is_some_and(|x| x.stream.starts_with(s))
            })
        })
        .collect();
    for f in shown.iter().take(limit) {
        let _ = writeln!(out, "{}", finding(f));
    }
    if shown.len() > limit {
        let _ = writeln!(out, "… and {} more", shown.len() - limit);
    }
    out
}

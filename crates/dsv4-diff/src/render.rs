//! The human-readable form of a [`DiffReport`]: a table of op cases and a summary of the model
//! comparison.

use crate::report::{
    ChoiceAgreement, DiffReport, ModelReport, OpsReport, SideInfo, Status, TapDiff,
};
use std::fmt::Write;

fn sci(v: Option<f64>) -> String {
    match v {
        None => "-".to_string(),
        Some(x) if x.is_nan() => "NaN".to_string(),
        Some(0.0) => "0".to_string(),
        Some(x) if x.fract() == 0.0 && x.abs() < 1e6 => format!("{x}"),
        Some(x) => format!("{x:.2e}"),
    }
}

fn side_line(role: &str, s: &SideInfo) -> String {
    let sums = s.sums.map(|v| format!(", {v} sums")).unwrap_or_default();
    format!(
        "{role:<10} {} (model {}, {}, threads {}{sums})\n",
        s.backend, s.model, s.numerics, s.threads
    )
}

fn ops_table(out: &mut String, ops: &OpsReport) {
    let perf = ops.cases.iter().any(|c| c.perf.is_some());
    let width = ops
        .cases
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = write!(
        out,
        "{:<11} {:<width$}  {:<15} {:>9} {:>9}",
        "STATUS", "CASE", "METRIC", "VALUE", "TOL"
    );
    if perf {
        let _ = write!(out, " {:>10} {:>9} {:>8}", "TIME", "GFLOP/s", "GB/s");
    }
    out.push('\n');
    for c in &ops.cases {
        let status = match c.status {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Unsupported => "unsupported",
        };
        let _ = write!(
            out,
            "{status:<11} {:<width$}  {:<15} {:>9} {:>9}",
            c.name,
            c.metric.name(),
            sci(c.value),
            format!("{}{}", c.metric.bound(), sci(Some(c.tolerance))),
        );
        if let Some(p) = &c.perf {
            let _ = write!(
                out,
                " {:>8.3}ms {:>9} {:>8}",
                p.median_s * 1e3,
                p.gflops.map_or("-".into(), |g| format!("{g:.2}")),
                p.gbps.map_or("-".into(), |g| format!("{g:.2}")),
            );
        }
        out.push('\n');
        if c.status != Status::Pass
            && let Some(d) = &c.detail
        {
            let _ = writeln!(out, "{:<11} -> {d}", "");
        }
    }
    let s = &ops.summary;
    let _ = writeln!(
        out,
        "ops: {} pass, {} fail, {} unsupported ({} cases, {:.1} s, seed {}{})",
        s.pass,
        s.fail,
        s.unsupported,
        ops.cases.len(),
        ops.elapsed_s,
        ops.seed,
        if ops.full { ", full" } else { "" }
    );
}

fn tap_line(t: &TapDiff) -> String {
    format!(
        "{:<10} {:<28} nmse {:>9} (tol {:>7})  max|diff| {:>9}  rows over tol {}/{}",
        t.call,
        format!("{}{}", t.layer, t.op),
        sci(Some(t.nmse)),
        sci(Some(t.tolerance)),
        sci(Some(t.max_abs)),
        t.rows_over,
        t.rows
    )
}

/// One line per layer of a discrete choice's agreement (`kind`: indexer or router; `what` it
/// chooses), and the first mismatch of each.
fn choice_lines(out: &mut String, kind: &str, what: &str, layers: &[ChoiceAgreement]) {
    for a in layers {
        let mut line = format!(
            "{kind} layer {}: {}/{} tokens agree ({:.1}%): {} the same {what}",
            a.layer,
            a.agreeing + a.tied,
            a.tokens,
            100.0 * a.rate,
            a.agreeing
        );
        if a.tied > 0 {
            let _ = write!(
                line,
                ", {} a near-tie broken the other way (gap up to {:.0}% of what near-ties allow)",
                a.tied,
                100.0 * a.worst_tie
            );
        }
        let _ = writeln!(out, "{line}");
        if let Some(w) = &a.first_mismatch {
            let _ = writeln!(out, "  FIRST MISMATCH  {w}");
        }
    }
}

fn model_summary(out: &mut String, m: &ModelReport) {
    let _ = writeln!(
        out,
        "model: prefill {} tokens + {} decode steps (seed {}), {} taps compared{}",
        m.prefill_tokens,
        m.decode_steps,
        m.seed,
        m.taps.len(),
        match m.neighbours {
            0 => String::new(),
            1 => "; the candidate's sequence batched with 1 other in every step".to_string(),
            n => format!("; the candidate's sequence batched with {n} others in every step"),
        }
    );
    if let Some(e) = &m.structure_error {
        let _ = writeln!(out, "STRUCTURE  {e}");
    }
    match &m.first_divergence {
        Some(t) => {
            let _ = writeln!(out, "FIRST DIVERGENCE  {}", tap_line(t));
        }
        None => out.push_str("first divergence: none (every tap within tolerance)\n"),
    }
    let l = &m.logits;
    let _ = writeln!(
        out,
        "logits ({} rows): max abs {}, rel L2 {}, argmax agreement {:.1}%, mean KL {}",
        l.rows,
        sci(Some(l.max_abs)),
        sci(Some(l.rel_l2)),
        100.0 * l.argmax_agreement,
        sci(Some(l.mean_kl))
    );
    choice_lines(out, "indexer", "set", &m.indexer);
    choice_lines(out, "router", "experts", &m.router);
    if !m.indexer.is_empty() || !m.router.is_empty() {
        out.push_str(match (m.pinned, m.neighbours) {
            (true, _) => "the candidate followed the oracle's choices (its own judged above)\n",
            (false, 0) => "the candidate followed its own choices (--no-pin-selections)\n",
            (false, _) => {
                "the candidate followed its own choices (pins would need every batched row)\n"
            }
        });
    }
    if let Some(d) = &m.candidate_device {
        let _ = writeln!(
            out,
            "candidate device: {} kernels ({} inside {} graph launches, {} graphs built), {} \
             submissions",
            d.dispatches, d.graph_kernels, d.graph_launches, d.graphs_built, d.submissions
        );
    }
    let differing: Vec<&TapDiff> = m.worst_taps.iter().filter(|t| t.nmse != 0.0).collect();
    if !differing.is_empty() {
        out.push_str("closest to (or past) tolerance:\n");
        for t in differing {
            let _ = writeln!(out, "  {}", tap_line(t));
        }
    }
    let _ = writeln!(out, "model: {}", if m.passed { "pass" } else { "FAIL" });
}

/// Render the report for a terminal.
pub fn render(report: &DiffReport) -> String {
    let mut out = String::new();
    out.push_str(&side_line("oracle", &report.oracle));
    out.push_str(&side_line("candidate", &report.candidate));
    if let Some(ops) = &report.ops {
        ops_table(&mut out, ops);
    }
    if let Some(m) = &report.model {
        model_summary(&mut out, m);
    }
    let _ = writeln!(
        out,
        "result: {}",
        if report.passed { "PASS" } else { "FAIL" }
    );
    out
}

//! Selecting cases (`-o`, `-p`, `--full`) and running them on both sides.

use super::case::{Case, CaseMeta};
use super::catalog::all_cases;
use super::harness::{Problem, Ran, compare};
use crate::progress::Progress;
use crate::report::{CaseReport, OpsReport, Perf, Status, Summary};
use crate::tolerance::op_tolerance;
use crate::{DiffError, Op};
use dsv4_core::SplitMix64;
use dsv4_kernels::Backend;
use std::time::{Duration, Instant};

/// What `--ops` runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsOptions {
    /// Only these ops (`-o`, by trait method name); empty = all.
    pub ops: Vec<String>,
    /// Only cases whose name matches this regex (`-p`).
    pub pattern: Option<String>,
    /// Include the expensive Flash-size cases.
    pub full: bool,
    /// Time the candidate (`--perf`).
    pub perf: bool,
    /// Timed calls per case with `perf` (the median is reported).
    pub repeats: usize,
    /// Seed of every case's input generator.
    pub seed: u64,
    /// A progress bar on stderr (when it is a terminal).
    pub progress: bool,
}

impl Default for OpsOptions {
    fn default() -> Self {
        OpsOptions {
            ops: Vec::new(),
            pattern: None,
            full: false,
            perf: false,
            repeats: 5,
            seed: 0,
            progress: false,
        }
    }
}

fn select(opts: &OpsOptions) -> Result<Vec<Case>, DiffError> {
    let ops: Vec<Op> = opts
        .ops
        .iter()
        .map(|name| {
            name.parse::<Op>().map_err(|_| DiffError::UnknownOp {
                name: name.clone(),
                known: Op::known(),
            })
        })
        .collect::<Result<_, _>>()?;
    let pattern = opts
        .pattern
        .as_deref()
        .map(regex::Regex::new)
        .transpose()
        .map_err(|e| DiffError::Pattern {
            pattern: opts.pattern.clone().unwrap_or_default(),
            message: e.to_string(),
        })?;
    let cases: Vec<Case> = all_cases()
        .into_iter()
        .filter(|c| opts.full || !c.meta.full_only)
        .filter(|c| ops.is_empty() || ops.contains(&c.meta.op))
        .filter(|c| pattern.as_ref().is_none_or(|p| p.is_match(&c.meta.name)))
        .collect();
    if cases.is_empty() {
        return Err(DiffError::NoCases {
            ops: opts.ops.clone(),
            pattern: opts.pattern.clone(),
        });
    }
    Ok(cases)
}

/// The cases `opts` selects, without running them.
pub fn list_cases(opts: &OpsOptions) -> Result<Vec<CaseMeta>, DiffError> {
    Ok(select(opts)?.into_iter().map(|c| c.meta).collect())
}

/// Run the selected cases on `oracle` and `candidate` and compare them.
pub fn run_ops(
    oracle: &dyn Backend,
    candidate: &dyn Backend,
    opts: &OpsOptions,
) -> Result<OpsReport, DiffError> {
    if opts.perf && opts.repeats == 0 {
        return Err(DiffError::InvalidOption {
            what: "repeats",
            message: "timing needs at least one timed call per case".into(),
        });
    }
    let start = Instant::now();
    let cases = select(opts)?;
    let mut summary = Summary::default();
    let mut rows = Vec::with_capacity(cases.len());
    let progress = Progress::new(opts.progress, cases.len(), "op cases");
    for case in &cases {
        progress.start(case.meta.name.clone());
        let row = run_case(case, oracle, candidate, opts);
        progress.done();
        tracing::debug!(case = %row.name, status = row.status.name(), value = ?row.value, "op case");
        match row.status {
            Status::Pass => summary.pass += 1,
            Status::Fail => summary.fail += 1,
            Status::Unsupported => summary.unsupported += 1,
        }
        rows.push(row);
    }
    Ok(OpsReport {
        seed: opts.seed,
        full: opts.full,
        summary,
        elapsed_s: start.elapsed().as_secs_f64(),
        cases: rows,
    })
}

/// The outcome of both sides' runs, before any comparison.
enum Sides {
    Unsupported(String),
    Failed(String),
    Ran(Ran, Ran),
}

fn judge(oracle: Result<Ran, Problem>, candidate: Result<Ran, Problem>) -> Sides {
    match (oracle, candidate) {
        (Err(p @ Problem::Unsupported(_)), _) => Sides::Unsupported(format!("oracle: {p}")),
        (_, Err(p @ Problem::Unsupported(_))) => Sides::Unsupported(format!("candidate: {p}")),
        (Err(p), _) => Sides::Failed(format!("oracle: {p}")),
        (_, Err(p)) => Sides::Failed(format!("candidate: {p}")),
        (Ok(o), Ok(c)) => Sides::Ran(o, c),
    }
}

fn run_case(
    case: &Case,
    oracle: &dyn Backend,
    candidate: &dyn Backend,
    opts: &OpsOptions,
) -> CaseReport {
    let m = &case.meta;
    let tol = op_tolerance(m.op);
    let mut row = CaseReport {
        name: m.name.clone(),
        op: m.op,
        class: m.class,
        shape: m.shape.clone(),
        numerics: m.numerics.clone(),
        status: Status::Fail,
        metric: tol.metric,
        value: None,
        tolerance: tol.limit,
        detail: None,
        perf: None,
    };
    // Inputs are drawn fresh for every case from a generator named after it.
    let mut rng = SplitMix64::for_name(opts.seed, &m.name);
    let runner = match (case.build)(&mut rng) {
        Ok(r) => r,
        Err(e) => {
            row.detail = Some(format!("cannot build the inputs: {e}"));
            return row;
        }
    };
    let (o, c) = match judge(runner(oracle), runner(candidate)) {
        Sides::Unsupported(d) => {
            row.status = Status::Unsupported;
            row.detail = Some(d);
            return row;
        }
        Sides::Failed(d) => {
            row.detail = Some(d);
            return row;
        }
        Sides::Ran(o, c) => (o, c),
    };
    match compare(&tol, &o.out, &c.out) {
        Ok(cmp) => {
            row.value = Some(cmp.value);
            if tol.metric.passes(cmp.value, tol.limit) {
                row.status = Status::Pass;
            } else {
                row.detail = Some(cmp.detail.unwrap_or_else(|| "out of tolerance".into()));
            }
        }
        Err(p) => row.detail = Some(format!("candidate: {p}")),
    }
    if opts.perf {
        let mut times = vec![c.elapsed];
        for _ in 1..opts.repeats {
            if let Ok(r) = runner(candidate) {
                times.push(r.elapsed);
            }
        }
        row.perf = Some(perf_of(m, &mut times));
    }
    row
}

fn perf_of(m: &CaseMeta, times: &mut [Duration]) -> Perf {
    times.sort_unstable();
    let median = times[times.len() / 2].as_secs_f64();
    let rate = |amount: f64| (amount > 0.0 && median > 0.0).then(|| amount / median / 1e9);
    Perf {
        repeats: times.len(),
        median_s: median,
        gflops: rate(m.flops),
        gbps: rate(m.bytes),
    }
}

//! `dsv4 diff`: differential testing of two configurations (crate `dsv4-diff`). The oracle is the
//! resolved profile on `--backend` (default `reference`); the candidate is the same profile plus `--against-set`
//! overrides on `--against`. `--mode` diffs one backend against itself with an execution knob
//! flipped. Prints a table, or one JSON document with `--json`; exits 1 when anything fails.

use anyhow::{Context, bail};
use dsv4_config::{Profile, ResolveOptions};
use dsv4_diff::ops::list_cases;
use dsv4_diff::{DiffError, ModeDiff, ModelOptions, OpsOptions, SideConfig, diff, render};
use std::path::{Path, PathBuf};

/// The candidate backend when neither `--against` nor `--against-set backend.kind=…` names one.
pub const DEFAULT_CANDIDATE: &str = "cpu";
/// The oracle backend when `--backend` is not given: the reference defines what every op computes.
pub const DEFAULT_ORACLE: &str = "reference";

/// Arguments of `dsv4 diff`.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// Oracle backend (default: `reference`).
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// Candidate backend (default: `cpu`, or the backend.kind given with --against-set).
    #[arg(long, value_name = "NAME")]
    pub against: Option<String>,
    /// Override one key of the candidate's profile only, e.g. numerics.act_quant=fp8 (repeatable).
    #[arg(long = "against-set", value_name = "KEY=VALUE")]
    pub against_sets: Vec<String>,
    /// Sweep the op catalog (the default when no mode is given).
    #[arg(long)]
    pub ops: bool,
    /// Run the profile's model on both sides and compare every tap.
    #[arg(long)]
    pub model: bool,
    /// An execution-mode diff on one backend (implies --model; the sides must agree bitwise):
    /// captured-vs-eager flips exec.cuda_graph, overlap-vs-serial exec.multi_stream_overlap,
    /// resident-vs-host exec.host_activations; batched-vs-solo runs the candidate's sequence
    /// in every step with 3 others.
    #[arg(long, value_name = "MODE")]
    pub mode: Option<String>,
    /// Only this op, by Backend method name (repeatable), e.g. -o rms_norm.
    #[arg(short = 'o', long = "op", value_name = "OP")]
    pub op: Vec<String>,
    /// Only cases whose name (op/class/shape[/numerics]) matches this regex.
    #[arg(short = 'p', long = "pattern", value_name = "REGEX")]
    pub pattern: Option<String>,
    /// Include the expensive Flash-size cases.
    #[arg(long)]
    pub full: bool,
    /// Time the candidate per case: median time, GFLOP/s, GB/s.
    #[arg(long)]
    pub perf: bool,
    /// Timed calls per case with --perf.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub repeats: usize,
    /// Print the selected op cases and exit.
    #[arg(long)]
    pub list: bool,
    /// Prefill tokens of --model.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub tokens: usize,
    /// Single-token decode steps of --model after the prefill.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub decode: usize,
    /// Seed of the op inputs and of the model's token ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// --model: the candidate's sequence shares every step with N other sequences (prompts of
    /// other lengths, their own decode tokens); its rows are compared with the oracle's run of
    /// it alone. Default 0, 3 with --mode batched-vs-solo.
    #[arg(long, value_name = "N")]
    pub neighbours: Option<usize>,
    /// --model: the candidate follows its own indexer selections and expert choices, not the
    /// oracle's (a near-tie it breaks the other way then shows in every later tap).
    #[arg(long)]
    pub no_pin_selections: bool,
    /// Print one JSON document (schema dsv4.diff/1, docs/diff.md) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// No progress bar on stderr (it is drawn only when stderr is a terminal).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Also write the JSON document to this file (opened before the diff runs, so a path that
    /// cannot be written fails at once).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// The side a resolved profile describes.
fn side_of(p: &Profile) -> anyhow::Result<SideConfig> {
    let model = match p.model.source() {
        dsv4_config::ModelSource::Tiny { seed } => dsv4_model::ModelSource::Tiny { seed },
        dsv4_config::ModelSource::Dir(dir) => dsv4_model::ModelSource::Dir(dir),
    };
    Ok(SideConfig {
        backend: p.backend.kind.clone(),
        options: super::forward::backend_options(p),
        numerics: p.numerics(),
        model,
        exec: super::plan::exec_options(p)?,
    })
}

fn resolve(profile: &str, dir: Option<&Path>, sets: &[String]) -> anyhow::Result<Profile> {
    let opts = ResolveOptions::from_process(profile, dir.map(Path::to_path_buf), sets);
    Ok(Profile::resolve(&opts)?.profile)
}

/// Run `dsv4 diff` with the global profile options.
pub fn run(
    args: &DiffArgs,
    profile: &str,
    profile_dir: Option<&Path>,
    sets: &[String],
) -> anyhow::Result<()> {
    #[cfg(feature = "faulty-backend")]
    dsv4_diff::faulty::link();
    let ops = OpsOptions {
        ops: args.op.clone(),
        pattern: args.pattern.clone(),
        full: args.full,
        perf: args.perf,
        repeats: args.repeats,
        seed: args.seed,
        progress: !args.quiet,
    };
    if args.list {
        let cases = list_cases(&ops)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&cases)?);
        } else {
            cases.iter().for_each(|c| println!("{}", c.name));
        }
        return Ok(());
    }
    let mode = args.mode.as_deref().map(ModeDiff::parse).transpose()?;
    let mut oracle_sets = sets.to_vec();
    let mut cand_sets = sets.to_vec();
    if let Some(m) = mode {
        // One backend on both sides, validated as that backend (its capabilities decide
        // whether it runs captured plans or side streams at all).
        let kind = args.backend.as_deref().unwrap_or(DEFAULT_ORACLE);
        oracle_sets.push(format!("backend.kind={kind}"));
        cand_sets.push(format!("backend.kind={kind}"));
        if let Some((oracle, candidate)) = m.sets() {
            oracle_sets.push(oracle);
            cand_sets.push(candidate);
        }
    }
    let oracle_profile = resolve(profile, profile_dir, &oracle_sets)
        .context("resolving the oracle's profile (--set)")?;
    cand_sets.extend(args.against_sets.iter().cloned());
    let cand_profile = resolve(profile, profile_dir, &cand_sets)
        .context("resolving the candidate's profile (--set and --against-set)")?;
    let kind_overridden = args
        .against_sets
        .iter()
        .any(|s| s.trim_start().starts_with("backend.kind="));
    let oracle_backend = args
        .backend
        .clone()
        .unwrap_or_else(|| DEFAULT_ORACLE.to_string());
    let cand_backend = match (&args.against, kind_overridden, mode) {
        (Some(name), _, _) => name.clone(),
        (None, true, _) => cand_profile.backend.kind.clone(),
        (None, false, Some(_)) => oracle_backend.clone(),
        (None, false, None) => DEFAULT_CANDIDATE.to_string(),
    };
    let oracle = side_of(&oracle_profile)?
        .with_backend(oracle_backend)
        .open("oracle")
        .map_err(|e| hint(e, "--backend"))?;
    let candidate = side_of(&cand_profile)?
        .with_backend(cand_backend)
        .open("candidate")
        .map_err(|e| hint(e, "--against"))?;
    let run_model = args.model || mode.is_some();
    let run_ops = args.ops || !run_model;
    let model = ModelOptions {
        prefill: args.tokens,
        decode: args.decode,
        seed: args.seed,
        pin_selections: !args.no_pin_selections,
        progress: !args.quiet,
        neighbours: args
            .neighbours
            .unwrap_or_else(|| mode.map_or(0, ModeDiff::neighbours)),
    };
    if let Some(m) = mode {
        m.check_neighbours(model.neighbours)?;
    }
    if let Some(path) = &args.out {
        super::check_output_path("--out", path)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    let report = diff(
        &oracle,
        &candidate,
        run_ops.then_some(&ops),
        run_model.then_some(&model),
    )?;
    let json = serde_json::to_string_pretty(&report.to_json())?;
    if let Some(path) = &args.out {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    if args.json {
        println!("{json}");
    } else {
        if let Some(m) = mode {
            println!(
                "mode {}: {} (same backend and numerics: the sides must agree bitwise)",
                m.name(),
                m.describe(model.neighbours)
            );
        }
        print!("{}", render(&report));
    }
    if !report.passed {
        bail!("{}", failure_summary(&report));
    }
    Ok(())
}

/// A backend error with the flag that chooses that side.
fn hint(e: DiffError, flag: &str) -> anyhow::Error {
    anyhow::anyhow!("{e}; choose this side's backend with {flag} NAME")
}

/// One line on what failed, for the error message that sets exit status 1.
fn failure_summary(report: &dsv4_diff::DiffReport) -> String {
    let mut parts = Vec::new();
    if let Some(ops) = report.ops.as_ref().filter(|o| !o.passed()) {
        let first = ops
            .cases
            .iter()
            .find(|c| c.status == dsv4_diff::Status::Fail)
            .map_or("", |c| c.name.as_str());
        parts.push(format!(
            "{} op case(s) failed (first: {first})",
            ops.summary.fail
        ));
    }
    if let Some(m) = report.model.as_ref().filter(|m| !m.passed) {
        let what = match (&m.structure_error, &m.first_divergence) {
            (Some(e), _) => e.clone(),
            (None, Some(t)) => format!("first divergence at {} {}{}", t.call, t.layer, t.op),
            (None, None) => {
                let kinds = [
                    (&m.indexer, "indexer selections"),
                    (&m.router, "expert choices"),
                ];
                kinds
                    .iter()
                    .flat_map(|(layers, what)| layers.iter().map(move |a| (a, what)))
                    .find_map(|(a, what)| {
                        let w = a.first_mismatch.as_ref()?;
                        Some(format!("layer {}'s {what} differ at {w}", a.layer))
                    })
                    .unwrap_or_else(|| "discrete choices differ".to_string())
            }
        };
        parts.push(format!("model diff failed: {what}"));
    }
    format!("diff found differences: {}", parts.join("; "))
}

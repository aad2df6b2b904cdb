//! `dsv4 plan show` and `dsv4 plan check`: the step plans a profile runs (launches on streams,
//! buffers with arena offsets, events) and the verifier's verdict on each (cross-stream races,
//! clobbers, uninitialised reads). Plans depend only on config.json and the `[exec]` and
//! `debug.inject` keys, so no weights are loaded.

use anyhow::{Context, bail};
use dsv4_config::{ExecutorChoice, ModelSource, Profile};
use dsv4_model::ModelConfig;
use dsv4_model::forward::build::{PlanSpec, StepKind, build_plan_under};
use dsv4_model::forward::captured::place_captured;
use dsv4_model::forward::op::Op;
use dsv4_model::forward::{ExecOptions, Executor, Fault, host_last_order};
use dsv4_plan::{Plan, Verdict, render, verify};
use serde::Serialize;
use std::path::Path;

/// The published DeepSeek-V4-Flash config.json (used when the profile's checkpoint is absent).
const FLASH_CONFIG: &str = include_str!("../../../dsv4-model/tests/data/flash-config.json");

/// `dsv4 plan` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum PlanCommand {
    /// Print the plan of one step: launches, streams, events, buffers.
    Show(ShowArgs),
    /// Verify the profile's plans: every captured bucket (or a few batch sizes) and a prefill.
    Check(CheckArgs),
}

/// Options both subcommands take.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// An embedded config ("tiny", "small") or a config.json file (default: the profile's
    /// model; its config.json, or the published Flash config when the checkpoint is absent).
    #[arg(long, value_name = "NAME|FILE")]
    pub config: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `dsv4 plan show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    #[command(flatten)]
    common: Common,
    /// Sequences in the step (decode: one row each).
    #[arg(long, default_value_t = 1, value_name = "N")]
    batch: usize,
    /// A prefill step of `--batch` rows instead of a decode step.
    #[arg(long)]
    prefill: bool,
    /// Rows of the `--prefill` step whose logits the head computes (default: every row). The
    /// engine asks for one per sequence that ends its prompt and none for a chunk that does
    /// not, unless the request scores its prompt.
    #[arg(long, value_name = "N", requires = "prefill")]
    logit_rows: Option<usize>,
    /// Also list the transient buffers with their arena offsets.
    #[arg(long)]
    buffers: bool,
    /// List the launches in the order the serial executor runs them on a device backend: host
    /// launches as late as their readers allow (`#` stays the plan's index; JSON gains
    /// `device_order`).
    #[arg(long)]
    device_order: bool,
}

/// Arguments of `dsv4 plan check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    common: Common,
    /// Only this decode batch size (default: every captured bucket, or 1 and 8 when eager).
    #[arg(long, value_name = "N")]
    batch: Option<usize>,
    /// Rows of the prefill plans checked too (0: none): one computing every row's logits, one
    /// computing a single row's (the last of a prompt).
    #[arg(long, default_value_t = 64, value_name = "N")]
    prefill_rows: usize,
    /// Findings printed per plan.
    #[arg(long, default_value_t = 8, value_name = "N")]
    limit: usize,
    /// Print only findings with a launch on a stream whose name starts with this (e.g. indexer).
    #[arg(long, value_name = "STREAM")]
    involving: Option<String>,
}

/// The execution options a profile asks for (`[exec]`, `debug.inject`).
pub fn exec_options(p: &Profile) -> anyhow::Result<ExecOptions> {
    let faults = p
        .debug
        .inject
        .iter()
        .map(|f| {
            Fault::parse(&f.to_string())
                .with_context(|| format!("debug.inject: the engine does not know fault `{f}`"))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(ExecOptions {
        captured: p.exec.cuda_graph,
        captured_max_bs: usize::try_from(p.exec.cuda_graph_max_bs)
            .context("exec.cuda_graph_max_bs is too large")?,
        overlap: p.exec.multi_stream_overlap,
        host_activations: p.exec.host_activations,
        executor: match p.exec.executor_for(&p.backend.kind) {
            ExecutorChoice::Interleaved => Executor::Interleaved { seed: 0 },
            ExecutorChoice::Threaded => Executor::Threaded,
            ExecutorChoice::Serial | ExecutorChoice::Auto => Executor::Serial,
        },
        faults,
    })
}

/// The engine's run-time checks a profile asks for (`debug.canary`, `debug.canary_abort`).
pub fn debug_options(p: &Profile) -> dsv4_engine::DebugOptions {
    use dsv4_config::values::CanaryPool;
    use dsv4_engine::CanaryPools;
    let pools: std::collections::BTreeSet<CanaryPools> = p
        .debug
        .canary
        .iter()
        .map(|c| match c {
            CanaryPool::IndexK => CanaryPools::IndexK,
            CanaryPool::Kv => CanaryPools::Kv,
            CanaryPool::State => CanaryPools::State,
        })
        .collect();
    dsv4_engine::DebugOptions {
        canary: (!pools.is_empty()).then_some(dsv4_engine::CanaryConfig {
            pools,
            abort: p.debug.canary_abort,
        }),
    }
}

/// The config a plan command describes, and where it came from.
fn config(common: &Common, p: &Profile) -> anyhow::Result<(ModelConfig, String)> {
    if let Some(name) = &common.config {
        if let Some(cfg) = ModelConfig::embedded(name) {
            return Ok((cfg, format!("embedded {name} config")));
        }
        let cfg = ModelConfig::from_file(Path::new(name)).with_context(|| {
            format!(
                "`{name}` is neither an embedded config (tiny, small) nor a readable config.json"
            )
        })?;
        return Ok((cfg, name.clone()));
    }
    match p.model.source() {
        ModelSource::Tiny { .. } => Ok((ModelConfig::tiny(), "embedded tiny config".into())),
        ModelSource::Dir(dir) => {
            let file = dir.join("config.json");
            if file.exists() {
                let cfg = ModelConfig::from_file(&file)
                    .with_context(|| format!("reading {}", file.display()))?;
                return Ok((cfg, file.display().to_string()));
            }
            eprintln!(
                "note: {} does not exist; using the published DeepSeek-V4-Flash config.json \
                 (plans depend only on the config; pass --config to choose another)",
                file.display()
            );
            Ok((
                ModelConfig::from_json_str(FLASH_CONFIG)?,
                "published DeepSeek-V4-Flash config".into(),
            ))
        }
    }
}

/// The plan of one step under `exec`: captured (arena) for a decode batch within a bucket.
/// `logit_rows` (None: every row) is how many rows' logits a prefill computes (a decode step
/// computes every row's).
fn plan_for(
    cfg: &ModelConfig,
    exec: &ExecOptions,
    kind: StepKind,
    batch: usize,
    logit_rows: Option<usize>,
) -> anyhow::Result<(Plan<Op>, Option<usize>)> {
    if batch == 0 {
        bail!("--batch must be at least 1");
    }
    if let Some(n) = logit_rows.filter(|&n| n > batch) {
        bail!("--logit-rows {n} is more than the step's {batch} rows (--batch)");
    }
    let bucket = match kind {
        StepKind::Decode => exec.bucket_for(batch),
        StepKind::Prefill => None,
    };
    let rows = bucket.unwrap_or(batch);
    let spec = PlanSpec {
        kind,
        rows,
        head_rows: match kind {
            StepKind::Prefill => logit_rows.unwrap_or(rows),
            StepKind::Decode => rows,
        },
        overlap: exec.overlap,
        mtp: false,
    };
    let plan = build_plan_under(cfg, spec, exec);
    Ok(match bucket {
        Some(b) => (place_captured(plan, exec)?, Some(b)),
        None => (plan, None),
    })
}

fn describe(exec: &ExecOptions, source: &str) -> String {
    format!(
        "config: {source}; {}; multi-stream overlap {}; faults: {}",
        if exec.captured {
            format!("captured decode plans up to batch {}", exec.max_bs())
        } else {
            "eager plans".to_string()
        },
        if exec.overlap { "on" } else { "off" },
        if exec.faults.is_empty() {
            "none".to_string()
        } else {
            exec.faults
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", ")
        }
    )
}

/// Run a `dsv4 plan` subcommand.
pub fn run(cmd: &PlanCommand, profile: &Profile) -> anyhow::Result<()> {
    match cmd {
        PlanCommand::Show(a) => show(a, profile),
        PlanCommand::Check(a) => check(a, profile),
    }
}

fn show(a: &ShowArgs, p: &Profile) -> anyhow::Result<()> {
    let exec = exec_options(p)?;
    let (cfg, source) = config(&a.common, p)?;
    let kind = if a.prefill {
        StepKind::Prefill
    } else {
        StepKind::Decode
    };
    let (plan, bucket) = plan_for(&cfg, &exec, kind, a.batch, a.logit_rows)?;
    let order = if a.device_order {
        host_last_order(&plan)?
    } else {
        dsv4_plan::serial(&plan)
    };
    if a.common.json {
        let doc = if a.device_order {
            serde_json::json!({ "plan": plan, "device_order": order })
        } else {
            serde_json::to_value(&plan)?
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("{}", describe(&exec, &source));
    let what = match (kind, bucket) {
        (StepKind::Prefill, _) => format!(
            "prefill of {} rows, logits of {}, eager",
            a.batch,
            a.logit_rows.unwrap_or(a.batch)
        ),
        (StepKind::Decode, Some(b)) => format!("decode of batch {}, captured bucket {b}", a.batch),
        (StepKind::Decode, None) => format!("decode of batch {}, eager", a.batch),
    };
    println!("{what}: {}", render::summary(&plan));
    if a.device_order {
        println!(
            "in the order the serial executor runs it on a device (host launches as late as \
             their readers allow)"
        );
    }
    println!();
    print!("{}", render::launch_table_in(&plan, &order));
    if a.buffers {
        println!();
        print!("{}", render::buffer_table(&plan));
    }
    Ok(())
}

/// One checked plan in `plan check --json`.
#[derive(Serialize)]
struct Checked {
    kind: StepKind,
    rows: usize,
    /// Rows whose logits the plan computes.
    logit_rows: usize,
    captured: bool,
    overlap: bool,
    arena_bytes: Option<u64>,
    verdict: Verdict,
}

fn check(a: &CheckArgs, p: &Profile) -> anyhow::Result<()> {
    let exec = exec_options(p)?;
    let (cfg, source) = config(&a.common, p)?;
    let batches = match a.batch {
        Some(b) => vec![b],
        None if exec.captured => exec.buckets(),
        None => vec![1, 8],
    };
    let mut shapes: Vec<(StepKind, usize, usize)> = batches
        .into_iter()
        .map(|b| (StepKind::Decode, b, b))
        .collect();
    if a.prefill_rows > 0 {
        shapes.push((StepKind::Prefill, a.prefill_rows, a.prefill_rows));
        if a.prefill_rows > 1 {
            shapes.push((StepKind::Prefill, a.prefill_rows, 1));
        }
    }
    let mut checked = Vec::new();
    let mut streams: Vec<String> = Vec::new();
    for (kind, n, logit_rows) in shapes {
        let (plan, bucket) = plan_for(&cfg, &exec, kind, n, Some(logit_rows))?;
        let logit_rows = plan
            .buffers
            .iter()
            .find(|b| b.name == "logits")
            .map_or(0, |b| b.bytes as usize / 4 / cfg.vocab_size.max(1));
        for s in &plan.streams {
            if !streams.contains(s) {
                streams.push(s.clone());
            }
        }
        let verdict = verify(&plan)?;
        let arena_bytes = match plan.placement {
            dsv4_plan::Placement::Arena { bytes, .. } => Some(bytes),
            dsv4_plan::Placement::Fresh => None,
        };
        checked.push(Checked {
            kind,
            rows: n,
            logit_rows,
            captured: bucket.is_some(),
            overlap: exec.overlap,
            arena_bytes,
            verdict,
        });
    }
    // A prefix no stream has filters every finding away: a typo would read as "nothing involves
    // that stream".
    if let Some(prefix) = &a.involving
        && !streams.iter().any(|s| s.starts_with(prefix.as_str()))
    {
        let hint = if streams.len() == 1 {
            " (side streams need exec.multi_stream_overlap = true)"
        } else {
            ""
        };
        bail!(
            "--involving `{prefix}`: no stream of these plans starts with it; their streams: \
             {}{hint}",
            streams.join(", ")
        );
    }
    let failed = checked.iter().filter(|c| !c.verdict.passed()).count();
    if a.common.json {
        let doc = serde_json::json!({
            "schema": "dsv4.plan-check/1",
            "config": source,
            "exec": exec,
            "plans": checked,
            "passed": failed == 0,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{}", describe(&exec, &source));
        for c in &checked {
            let mode = match c.arena_bytes {
                Some(b) => format!("captured, arena {b} B"),
                None => "eager".to_string(),
            };
            let shape = match c.kind {
                StepKind::Decode => format!("decode batch {}", c.rows),
                StepKind::Prefill => {
                    format!("prefill rows {}, logits of {}", c.rows, c.logit_rows)
                }
            };
            print!(
                "{shape} ({mode}): {}",
                render::verdict(&c.verdict, a.limit, a.involving.as_deref())
            );
        }
    }
    if failed > 0 {
        bail!("{failed} of {} plans have hazards", checked.len());
    }
    if !a.common.json {
        println!("all {} plans pass", checked.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_config::{ResolveOptions, resolve};

    /// The executor a shipped profile (with `sets`) runs its steps on.
    fn executor(profile: &str, sets: &[&str]) -> Executor {
        let mut o = ResolveOptions::new(profile);
        o.search.local_dir = None;
        o.sets = sets.iter().map(|s| s.to_string()).collect();
        let r = resolve(&o).unwrap_or_else(|e| panic!("{profile}: {e}"));
        exec_options(&r.profile).unwrap().executor
    }

    #[test]
    fn profiles_run_on_the_executor_their_backend_overlaps_with() {
        // Production on CUDA: side streams are CUDA streams, issued in the host-last order.
        assert_eq!(executor("prod-fp8", &[]), Executor::Serial);
        assert_eq!(executor("prod-bf16", &[]), Executor::Serial);
        // The rehearsal pins the seeded order, on any backend.
        let seeded = Executor::Interleaved { seed: 0 };
        assert_eq!(executor("rehearsal", &[]), seeded);
        assert_eq!(
            executor(
                "rehearsal",
                &["backend.kind=cuda-emu", "exec.cuda_graph=true"]
            ),
            seeded
        );
        // dev-cpu: one stream, serial; with side streams on the cpu backend, interleaved.
        assert_eq!(executor("dev-cpu", &[]), Executor::Serial);
        let overlap = ["exec.multi_stream_overlap=true", "exec.cuda_graph=true"];
        assert_eq!(executor("dev-cpu", &overlap), seeded);
        assert_eq!(
            executor("prod-fp8", &["exec.executor=threaded"]),
            Executor::Threaded
        );
        assert_eq!(executor("prod-fp8", &["exec.executor=interleaved"]), seeded);
    }
}

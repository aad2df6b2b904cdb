//! `dsv4 ab`: run the same stress workload against two configurations, A (the baseline) and B
//! (the change), each repeat cold-booting a fresh `dsv4 serve` per arm on loopback, interleaved
//! A B A B, and compare them with the statistics of [`crate::stats`]. The result is an
//! [`AbBundle`]: the evidence file `dsv4 ledger record --evidence` reads (`"format": "dsv4-ab/1"`),
//! with a human summary.
//!
//! An arm may also be the URL of a server that is already running: it is not booted, and the
//! bundle says so.

mod bundle;
mod provenance;
mod server;

pub use bundle::{AB_FORMAT, AbBundle, ArmResult, Difference, MetricComparison, RepeatRun};
pub use provenance::{Machine, Versions, machine, versions};
pub use server::{ServerProcess, serve_args};

use crate::error::StressError;
use crate::options::StressOptions;
use crate::run_stress;
use crate::stats::StatsError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// What an arm runs against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Target {
    /// A fresh `dsv4 serve` per repeat with this profile and these `--set` overrides.
    Boot {
        /// Profile name or path (as `dsv4 serve --profile` takes it).
        profile: String,
        /// `key=value` overrides, in order.
        sets: Vec<String>,
    },
    /// A server that is already running (not booted, not restarted between repeats).
    Url {
        /// Its base URL.
        url: String,
    },
}

/// One arm of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmSpec {
    /// What the arm ran, for people and the ledger (e.g. `exec.multi_stream_overlap=true`).
    pub label: String,
    /// Where its requests go.
    pub target: Target,
    /// The arm's resolved configuration with the origin of every value (recorded as given; the
    /// caller resolves it, e.g. as `dsv4 profile show --json` does). Null for a URL arm.
    #[serde(default)]
    pub config: serde_json::Value,
}

/// Everything an A/B run needs.
#[derive(Debug, Clone)]
pub struct AbOptions {
    /// The baseline.
    pub a: ArmSpec,
    /// The change.
    pub b: ArmSpec,
    /// Repeats; each boots every booted arm afresh, in the order A B.
    pub repeat: usize,
    /// The workload; `url` is replaced per arm and `seed` becomes `seed + repeat index` (the same
    /// seeds for both arms).
    pub workload: StressOptions,
    /// The dsv4 binary that boots servers (`std::env::current_exe()` from the CLI).
    pub binary: PathBuf,
    /// Extra arguments for every `dsv4 serve` (e.g. `--profile-dir DIR`).
    pub serve_extra: Vec<String>,
    /// Time a server may take from spawn to `/health` 200.
    pub boot_timeout: Duration,
    /// The command line that reproduces this run (recorded in the bundle).
    pub command: String,
    /// Print progress lines to stderr.
    pub progress: bool,
}

/// Why an A/B run could not complete.
#[derive(Debug, thiserror::Error)]
pub enum AbError {
    /// Options that cannot run.
    #[error("{0}")]
    Options(String),
    /// A server did not come up.
    #[error("booting dsv4 serve for {what}: {message}{}", tail_text(stderr_tail))]
    Boot {
        /// The arm and repeat.
        what: String,
        /// What went wrong.
        message: String,
        /// The last lines of the server's stderr.
        stderr_tail: String,
    },
    /// The stress workload could not run against an arm.
    #[error("stress run for {what}: {source}")]
    Stress {
        /// The arm and repeat.
        what: String,
        /// Why.
        #[source]
        source: StressError,
    },
    /// The statistics could not be computed (e.g. no sessions ran).
    #[error("statistics: {0}")]
    Stats(#[from] StatsError),
}

fn tail_text(tail: &str) -> String {
    if tail.trim().is_empty() {
        "\n(the server wrote nothing to stderr)".into()
    } else {
        format!("\nlast lines of its stderr:\n{tail}")
    }
}

impl AbOptions {
    /// Check what can be checked before booting anything.
    pub fn validate(&self) -> Result<(), AbError> {
        if self.repeat == 0 {
            return Err(AbError::Options("--repeat must be at least 1".into()));
        }
        if self.a.label.trim().is_empty() || self.b.label.trim().is_empty() {
            return Err(AbError::Options("both arms need a label".into()));
        }
        let booted = [&self.a, &self.b]
            .iter()
            .any(|arm| matches!(arm.target, Target::Boot { .. }));
        if booted && !self.binary.exists() {
            return Err(AbError::Options(format!(
                "the dsv4 binary {} does not exist (needed to boot servers)",
                self.binary.display()
            )));
        }
        self.workload.validate().map_err(|source| AbError::Stress {
            what: "the workload".into(),
            source,
        })
    }
}

/// Run one arm of one repeat: boot (unless it is a URL), run the workload, stop.
async fn run_arm(
    opts: &AbOptions,
    arm: &ArmSpec,
    name: &str,
    repeat: usize,
) -> Result<RepeatRun, AbError> {
    let what = format!("arm {name} ({}), repeat {}", arm.label, repeat + 1);
    let say = |msg: String| {
        if opts.progress {
            eprintln!("dsv4 ab: {msg}");
        }
    };
    let mut workload = opts.workload.clone();
    workload.seed = opts.workload.seed.wrapping_add(repeat as u64);
    let (server, url) = match &arm.target {
        Target::Boot { profile, sets } => {
            let args = serve_args(profile, sets, &opts.serve_extra);
            say(format!("{what}: booting {}", args.join(" ")));
            let s = ServerProcess::start(&opts.binary, args, opts.boot_timeout, &what).await?;
            say(format!("{what}: {} healthy after {:.1} s", s.url, s.boot_s));
            let url = s.url.clone();
            (Some(s), url)
        }
        Target::Url { url } => (None, url.clone()),
    };
    workload.url = url.clone();
    say(format!(
        "{what}: {} sessions (seed {}) against {url}",
        workload.sessions, workload.seed
    ));
    let result = run_stress(&workload).await;
    let (booted, server_command, boot_s, exit) = match server {
        Some(s) => {
            let command = s.command.clone();
            let boot_s = s.boot_s;
            let tail = if result.is_err() {
                s.stderr_tail()
            } else {
                String::new()
            };
            let exit = s.stop().await;
            if let Err(source) = result {
                let what = format!("{what}{}", tail_text(&tail));
                return Err(AbError::Stress { what, source });
            }
            (true, Some(command), Some(boot_s), Some(exit))
        }
        None => (false, None, None, None),
    };
    let report = result.map_err(|source| AbError::Stress {
        what: what.clone(),
        source,
    })?;
    say(format!(
        "{what}: {}/{} sessions failed, {:.1} output tok/s",
        report.failed_sessions, report.sessions, report.metrics.output_throughput
    ));
    Ok(RepeatRun {
        repeat,
        arm: name.into(),
        url,
        booted,
        server_command,
        boot_s,
        server_exit: exit,
        report,
    })
}

/// Run the comparison: for each repeat, arm A then arm B, then the statistics.
pub async fn run_ab(opts: &AbOptions) -> Result<AbBundle, AbError> {
    opts.validate()?;
    // What ran is recorded before the run (the checkout may change while it runs).
    let (versions, machine) = (versions(&opts.binary).await, machine());
    let mut runs = Vec::with_capacity(2 * opts.repeat);
    for repeat in 0..opts.repeat {
        runs.push(run_arm(opts, &opts.a, "A", repeat).await?);
        runs.push(run_arm(opts, &opts.b, "B", repeat).await?);
    }
    AbBundle::build(opts, runs, versions, machine)
}

/// [`run_ab`], abandoned when `stop` completes first (e.g. on SIGTERM or Ctrl-C): the run is
/// dropped, which kills every server it booted. `Ok(None)` when stopped.
pub async fn run_ab_until(
    opts: &AbOptions,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Option<AbBundle>, AbError> {
    tokio::select! {
        result = run_ab(opts) => result.map(Some),
        () = stop => Ok(None),
    }
}

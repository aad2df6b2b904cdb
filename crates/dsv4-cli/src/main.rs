//! `dsv4`: the command-line tool. Thin: parses arguments, resolves the profile, calls a crate.

mod commands;

use clap::{Args, Parser, Subcommand};
use commands::{
    ab, bench, chat, diff, forward, generate, kernels, ledger, model, plan, profile, run_batch,
    serve, stress,
};
use dsv4_config::{DEFAULT_PROFILE, Profile, ResolveOptions, Resolved};
use std::path::PathBuf;
use std::process::ExitCode;

/// dsv4: an inference engine for DeepSeek-V4-class models.
#[derive(Debug, Parser)]
#[command(name = "dsv4", version, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// Flags accepted by every command.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
struct GlobalArgs {
    /// Profile name (see `dsv4 profile show`) or path to a .toml profile file.
    #[arg(long, global = true, value_name = "NAME|PATH", env = "DSV4_PROFILE", default_value = DEFAULT_PROFILE)]
    profile: String,
    /// Directory searched for profiles before ./profiles and the embedded ones.
    #[arg(long, global = true, value_name = "DIR", env = "DSV4_PROFILE_DIR")]
    profile_dir: Option<PathBuf>,
    /// Override one configuration key, e.g. --set numerics.kv_cache_dtype=fp8 (repeatable).
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Log more to stderr (-v info, -vv debug, -vvv trace); `DSV4_LOG=<filter>` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with checkpoints: create the tiny model, inspect a config, run a forward pass.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Generate text greedily from a prompt (the embedded tiny model by default).
    Generate {
        #[command(flatten)]
        args: generate::GenerateArgs,
        /// Print one JSON object instead of streaming text.
        #[arg(long)]
        json: bool,
    },
    /// Measure machine peaks, op-level and end-to-end throughput per backend.
    Bench(bench::BenchArgs),
    /// Diff two configurations op by op (--ops) or tap by tap through the model (--model).
    Diff(diff::DiffArgs),
    /// DSV4 chat format: render a conversation's exact prompt, parse a raw completion.
    #[command(subcommand)]
    Chat(chat::ChatCommand),
    /// Show and verify the step plans a profile runs (streams, buffers, hazards).
    #[command(subcommand)]
    Plan(plan::PlanCommand),
    /// Inspect profiles: list, show, explain, diff, and export to SGLang.
    #[command(subcommand)]
    Profile(profile::ProfileCommand),
    /// Serve the profile's model over an OpenAI-compatible HTTP API (or with SGLang).
    Serve(serve::ServeArgs),
    /// Run an OpenAI Batch API file (JSONL of custom_id/method/url/body) through the server's
    /// routes offline, writing OpenAI's batch output lines in input order.
    RunBatch(run_batch::RunBatchArgs),
    /// Multi-turn tool-calling load against any OpenAI-compatible server, with corruption
    /// signatures and vLLM-named metrics (exit 1 when a session failed).
    Stress(stress::StressArgs),
    /// A/B: the same stress workload against two configurations, each cold-booted per repeat
    /// (A B A B), with failure rates, Fisher's exact test and an evidence bundle for the ledger.
    Ab(Box<ab::AbArgs>),
    /// The change ledger: record profile changes with evidence as commits, verify, render incidents.
    #[command(subcommand)]
    Ledger(ledger::LedgerCommand),
    /// The CUDA backend's kernels: compile them ahead of time into the kernel cache (NVRTC, no
    /// GPU needed).
    #[command(subcommand)]
    Kernels(kernels::KernelsCommand),
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Write the tiny model (config.json, model.safetensors, tokenizer.json) to a directory.
    InitTiny(model::InitTinyArgs),
    /// Write a checkpoint of any config (embedded tiny/small, or a config.json) with random weights.
    InitRandom(model::InitRandomArgs),
    /// Print parameter counts and per-token cache sizes of a config.
    Inspect(model::InspectArgs),
    /// Run a prefill over token ids and write the logits as .npy.
    Forward(forward::ForwardArgs),
}

/// Send tracing output to stderr at the level chosen by `-v` (or the DSV4_LOG filter), in
/// colour only when stderr is a terminal (a log file or journald gets plain text).
fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("DSV4_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// The resolution options for profile `name` with the process environment and the global flags.
fn options(global: &GlobalArgs, name: &str) -> ResolveOptions {
    ResolveOptions::from_process(name, global.profile_dir.clone(), &global.sets)
}

/// Resolve and validate the profile named on the command line (or `name`, when a command takes one
/// itself); validation warnings go to stderr.
fn resolve(global: &GlobalArgs, name: Option<&str>) -> anyhow::Result<Resolved> {
    let name = name.unwrap_or(&global.profile);
    let resolved = Profile::resolve(&options(global, name))?;
    tracing::debug!(profile = name, files = ?resolved.files, "resolved profile");
    for finding in &resolved.findings {
        eprintln!("warning: {}", resolved.describe(finding));
    }
    Ok(resolved)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Model(ModelCommand::InitTiny(args)) => {
            model::init_tiny(args, &resolve(&cli.global, None)?.profile)
        }
        Command::Model(ModelCommand::InitRandom(args)) => {
            model::init_random(args, &resolve(&cli.global, None)?.profile)
        }
        Command::Model(ModelCommand::Inspect(args)) => {
            model::inspect(args, &resolve(&cli.global, None)?.profile)
        }
        Command::Model(ModelCommand::Forward(args)) => {
            forward::run(args, &resolve(&cli.global, None)?.profile)
        }
        Command::Generate { args, json } => {
            generate::run(args, &resolve(&cli.global, None)?.profile, *json)
        }
        Command::Bench(args) => bench::run(args, &resolve(&cli.global, None)?.profile),
        Command::Diff(args) => diff::run(
            args,
            &cli.global.profile,
            cli.global.profile_dir.as_deref(),
            &cli.global.sets,
        ),
        Command::Chat(cmd) => chat::run(cmd),
        Command::Plan(cmd) => plan::run(cmd, &resolve(&cli.global, None)?.profile),
        Command::Profile(cmd) => {
            profile::run(cmd, &|name| options(&cli.global, name), &cli.global.profile)
        }
        Command::Serve(args) => serve::run(args, &resolve(&cli.global, None)?),
        Command::RunBatch(args) => run_batch::run(args, &resolve(&cli.global, None)?),
        Command::Stress(args) => stress::run(args),
        Command::Ab(args) => ab::run(
            args,
            &cli.global.profile,
            cli.global.profile_dir.as_deref(),
            &cli.global.sets,
        ),
        Command::Ledger(cmd) => ledger::run(cmd, &cli.global.profile, &cli.global.sets),
        Command::Kernels(cmd) => kernels::run(cmd),
    }
}

/// Reference every backend crate so the linker keeps their registry entries.
fn link_backends() {
    dsv4_backend_reference::link();
    dsv4_backend_cpu::link();
    dsv4_backend_wgpu::link();
    dsv4_backend_cuda::link();
}

/// Let a command that only prints end quietly when its reader goes away (`dsv4 plan show |
/// head`), as other Unix tools do, instead of panicking on the failed write. Commands that
/// hold sockets (serve, stress, ab, bench's serving runs) keep SIGPIPE ignored, as Rust
/// starts them, so a client that disconnects is an error on that connection only.
fn default_sigpipe_for(command: &Command) {
    let prints_only = matches!(
        command,
        Command::Model(_)
            | Command::Generate { .. }
            | Command::RunBatch(_)
            | Command::Diff(_)
            | Command::Chat(_)
            | Command::Plan(_)
            | Command::Profile(_)
            | Command::Ledger(_)
            | Command::Kernels(_)
    );
    #[cfg(unix)]
    if prints_only {
        // SAFETY: called before any thread starts; SIG_DFL is a valid disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    #[cfg(not(unix))]
    let _ = prints_only;
}

fn main() -> ExitCode {
    link_backends();
    let cli = Cli::parse();
    default_sigpipe_for(&cli.command);
    init_logging(cli.global.verbose);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error with its causes, each said once: many error types already end their message with
/// their source's (`cannot read FILE: No such file…`), and anyhow's `{:#}` would repeat it.
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_says_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let model = dsv4_model::ModelError::io("read", "/x/config.json", io);
        let e = anyhow::Error::new(model).context("cannot load model config /x/config.json");
        assert_eq!(
            error_text(&e),
            "cannot load model config /x/config.json: cannot read /x/config.json: No such file"
        );
        // Causes that their parent does not print are kept, in order.
        let e = anyhow::anyhow!("disk full")
            .context("cannot write bench.json")
            .context("bench failed");
        assert_eq!(
            error_text(&e),
            "bench failed: cannot write bench.json: disk full"
        );
    }

    #[test]
    fn every_linked_backend_is_registered() {
        link_backends();
        let names = dsv4_kernels::registry::names();
        let expected: &[&str] = if cfg!(feature = "faulty-backend") {
            &[
                "cpu",
                "cuda-emu",
                "cuda-sm120",
                "faulty-reference",
                "reference",
                "wgpu",
            ]
        } else {
            &["cpu", "cuda-emu", "cuda-sm120", "reference", "wgpu"]
        };
        assert_eq!(names, expected);
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

//! `dsv4 stress`: the multi-turn agentic workload against any OpenAI-compatible server (dsv4,
//! vLLM, SGLang), with corruption signatures and vLLM-named metrics (crate dsv4-stress).
//! Exit status: 0 when no session failed, 1 when some did, 2 when the run could not happen
//! (bad options, server unreachable).

use dsv4_stress::{
    Api, Oracle, STOP_BEFORE_MARKUP, StreamMode, StressOptions, parse_duration, run_stress,
};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `dsv4 stress`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 when no session failed, 1 when at least one session \
    showed a corruption signature or a failed request, 2 on usage errors or when the server \
    cannot be reached.\nSignatures and metrics: docs/stress.md."
)]
pub struct StressArgs {
    /// Base URL of the OpenAI-compatible server (e.g. http://127.0.0.1:8000 or …/v1).
    #[arg(long)]
    pub url: String,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Write the JSON report to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write one JSON line per session to this file.
    #[arg(long, value_name = "FILE")]
    pub jsonl: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

impl StressArgs {
    /// The library options these arguments describe.
    pub fn options(&self) -> StressOptions {
        self.workload.options(&self.url, !self.quiet)
    }
}

/// The stress workload (shared by `dsv4 stress` and every arm of `dsv4 ab`).
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Workload")]
pub struct WorkloadArgs {
    /// Model id to request (default: the first id GET /v1/models lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Number of sessions (conversations); for `dsv4 ab`, per arm and repeat.
    #[arg(long, default_value_t = 16)]
    pub sessions: usize,
    /// Sessions in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Turns (requests) per session, at most.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Workload seed: same seed, same sessions, prompts, tools, tool choices and stream flags
    /// (`dsv4 ab`: repeat r uses seed + r, the same for both arms).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Time bound (e.g. 90s, 5m): no turn starts after it (`dsv4 ab`: per arm and repeat).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// max_tokens of every request.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u32,
    /// Streaming: always, never, or mixed (seeded per turn).
    #[arg(long, default_value = "mixed")]
    pub stream: StreamMode,
    /// Replay every turn alone afterwards and require the same answer ("solo"; greedy and a
    /// batch-invariant server only, such as dsv4's). With --stream mixed also compares the two
    /// stream modes.
    #[arg(long)]
    pub oracle: Option<Oracle>,
    /// Bearer key for the server.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// server besides the bundled web roots
    /// (e.g. dsv4 serve with server.ssl_certfile signed by a private CA).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Share of turns that force a tool call (tool_choice "required" or a named tool).
    #[arg(long, default_value_t = 0.5)]
    pub forced_tool_rate: f64,
    /// A stop string for turns whose tool_choice is "auto" (repeatable; forced turns get none,
    /// so a stop string never cuts a forced call).
    #[arg(long = "stop", value_name = "TEXT")]
    pub stops: Vec<String>,
    /// Also stop "auto" answers before special tokens and tool/think markup (for random-weight
    /// models such as dsv4's tiny model; needs a server that accepts more than 4 stop strings).
    #[arg(long)]
    pub stop_before_markup: bool,
    /// repeated_token fires when a unit of 1..=16 characters repeats back to back more than this
    /// many times.
    #[arg(long, default_value_t = 48)]
    pub repeat_threshold: usize,
    /// About this many characters of new user text (and of each tool result) per turn.
    #[arg(long, default_value_t = 400)]
    pub growth_chars: usize,
    /// Per-request timeout (e.g. 300s).
    #[arg(long, value_parser = parse_duration, default_value = "300s")]
    pub request_timeout: Duration,
    /// Wait up to this long for the server's /health to answer 200 before starting (a server
    /// still loading answers 503); 0 starts at once. As vLLM's --ready-check-timeout-sec.
    #[arg(long, value_parser = duration_or_zero, default_value = "600s")]
    pub ready_timeout: Duration,
    /// Let the model make several tool calls per answer (parallel_tool_calls: true).
    #[arg(long)]
    pub parallel_tool_calls: bool,
    /// Ask for every token's log-probability (logprobs: true); with --oracle solo they must
    /// then match the solo replay exactly, which catches corruption that flips no token.
    #[arg(long)]
    pub logprobs: bool,
    /// The API every turn is sent to: chat (/v1/chat/completions), responses (/v1/responses,
    /// the whole conversation as input items with store false) or responses-background (the
    /// same in background mode: plain turns polled, streams dropped after a few tokens and
    /// resumed by sequence number, each response deleted once read).
    #[arg(long, default_value = "chat")]
    pub api: Api,
    /// Declare every tool "strict": true: a server that honours it (dsv4 does) then constrains
    /// "auto" turns too (content, then optionally calls under the tools' schemas), so random
    /// weights need no --stop-before-markup.
    #[arg(long)]
    pub strict_tools: bool,
}

/// [`parse_duration`], or `0` for none.
fn duration_or_zero(s: &str) -> Result<Duration, String> {
    match s.trim() {
        "0" | "0s" => Ok(Duration::ZERO),
        _ => parse_duration(s),
    }
}

impl WorkloadArgs {
    /// The library options of this workload against `url`.
    pub fn options(&self, url: &str, progress: bool) -> StressOptions {
        let mut stop = self.stops.clone();
        if self.stop_before_markup {
            stop.extend(STOP_BEFORE_MARKUP.iter().map(|s| (*s).to_owned()));
        }
        StressOptions {
            url: url.to_owned(),
            model: self.model.clone(),
            sessions: self.sessions,
            concurrency: self.concurrency,
            turns: self.turns,
            seed: self.seed,
            duration: self.duration,
            max_tokens: self.max_tokens,
            stream: self.stream,
            oracle: self.oracle,
            api_key: self.api_key.clone(),
            ca_cert: self.ca_cert.clone(),
            progress,
            temperature: self.temperature,
            forced_tool_rate: self.forced_tool_rate,
            stop,
            repeat_threshold: self.repeat_threshold,
            growth_chars: self.growth_chars,
            request_timeout: self.request_timeout,
            ready_timeout: self.ready_timeout,
            parallel_tool_calls: self.parallel_tool_calls,
            logprobs: self.logprobs,
            api: self.api,
            strict_tools: self.strict_tools,
        }
    }
}

/// Run `dsv4 stress`. Sessions that failed are an error (exit 1); a run that could not happen
/// exits 2 here.
pub fn run(args: &StressArgs) -> anyhow::Result<()> {
    for (flag, path) in [("--json", &args.json), ("--jsonl", &args.jsonl)] {
        if let Some(path) = path
            && let Err(e) = super::check_output_path(flag, path)
        {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
    let opts = args.options();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = match rt.block_on(run_stress(&opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    // The summary first: a report that cannot be written (disk full) still shows the run.
    print!("{}", report.summary());
    let written = args
        .json
        .as_ref()
        .map(|p| report.write_json(p))
        .transpose()
        .and_then(|_| {
            args.jsonl
                .as_ref()
                .map(|p| report.write_jsonl(p))
                .transpose()
        });
    if let Err(e) = written {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    if report.failed_sessions > 0 {
        anyhow::bail!(
            "{} of {} sessions failed ({:.1}%)",
            report.failed_sessions,
            report.sessions,
            100.0 * report.failure_rate()
        );
    }
    Ok(())
}

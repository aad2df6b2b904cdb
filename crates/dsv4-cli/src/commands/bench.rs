//! `dsv4 bench`: machine peaks, op-level and end-to-end throughput per backend, as a table or JSON.

use anyhow::Context;
use dsv4_bench::e2e::E2ePlan;
use dsv4_bench::{BenchOptions, render_table};
use std::path::PathBuf;

mod device;
mod serving;

/// Arguments of `dsv4 bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Backends to measure (repeatable); default: the host backends (cpu, reference) — name
    /// device backends such as wgpu explicitly (on lavapipe their op suite takes many minutes).
    #[arg(long = "backend", value_name = "NAME")]
    pub backends: Vec<String>,
    /// Model configs for the end-to-end cases (comma-separated): tiny, small.
    #[arg(long, value_delimiter = ',', default_value = "tiny,small")]
    pub configs: Vec<String>,
    /// Prompt length of the prefill throughput case.
    #[arg(long, default_value_t = 512)]
    pub prefill_tokens: usize,
    /// Contexts of the decode-time-vs-context case (small config, fast backends).
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
    pub contexts: Vec<usize>,
    /// Skip the machine peak measurement.
    #[arg(long)]
    pub no_machine: bool,
    /// Skip the op-level cases.
    #[arg(long)]
    pub no_ops: bool,
    /// Skip the end-to-end cases.
    #[arg(long)]
    pub no_e2e: bool,
    /// Concurrency levels of the serving throughput case (engine, tiny model, non-reference
    /// backends).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub serving_concurrency: Vec<usize>,
    /// Prompt tokens per request of the serving throughput case.
    #[arg(long, default_value_t = 64)]
    pub serving_prompt_tokens: usize,
    /// Leading prompt tokens every request of the serving throughput case shares (as a system
    /// prompt); above 0 the case runs with the prefix cache, with in-batch prefix caching off
    /// and then on.
    #[arg(long, default_value_t = 0)]
    pub serving_shared_prefix: usize,
    /// Skip the serving throughput case.
    #[arg(long)]
    pub no_serving: bool,
    /// Skip the token-choice case (sampling and log-probabilities at DSV4's vocabulary).
    #[arg(long)]
    pub no_sampling: bool,
    /// Run only the serving case, through the scheduler with overlap scheduling off and on:
    /// exposed CPU scheduling time per step and the fit decode step time = fixed + marginal ×
    /// running requests (tiny model; default backends: all but reference).
    #[arg(long, conflicts_with = "no_serving")]
    pub serving: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The backends a plain `dsv4 bench` measures.
const HOST_BACKENDS: [&str; 2] = ["cpu", "reference"];

/// Run `dsv4 bench`.
pub fn run(args: &BenchArgs, profile: &dsv4_config::Profile) -> anyhow::Result<()> {
    if let Some(path) = &args.out {
        super::check_output_path("--out", path)?;
    }
    if args.serving {
        return serving::run(args, profile);
    }
    let backends = if args.backends.is_empty() {
        dsv4_kernels::registry::factories()
            .into_iter()
            .filter(|f| HOST_BACKENDS.contains(&f.name) && (f.probe)().is_ok())
            .map(|f| f.name.to_string())
            .collect()
    } else {
        args.backends.clone()
    };
    let opts = BenchOptions {
        backends,
        threads: profile.exec.threads,
        backend_options: super::forward::backend_options(profile),
        machine: !args.no_machine,
        ops: !args.no_ops,
        e2e: (!args.no_e2e).then(|| E2ePlan {
            configs: args.configs.clone(),
            prefill_tokens: args.prefill_tokens,
            contexts: args.contexts.clone(),
        }),
        serving: (!args.no_serving).then(|| dsv4_engine::bench::ServingBenchSpec {
            concurrency: args.serving_concurrency.clone(),
            requests_per_level: 32,
            prompt_len: args.serving_prompt_tokens,
            shared_prefix: args.serving_shared_prefix,
            max_tokens: 16,
            seed: 0,
        }),
        sampling: !args.no_sampling,
    };
    let report = dsv4_bench::run(&opts)?;
    let device = device::measure(
        &opts.backends,
        &dsv4_kernels::BackendOptions {
            threads: opts.threads,
            ..opts.backend_options.clone()
        },
    )?;
    let mut value = serde_json::to_value(&report)?;
    if !device.is_empty() {
        value["device"] = serde_json::to_value(&device)?;
    }
    let json = serde_json::to_string_pretty(&value)?;
    if let Some(path) = &args.out {
        std::fs::write(path, &json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{}", render_table(&report));
        print!("{}", device::render(&device));
    }
    Ok(())
}

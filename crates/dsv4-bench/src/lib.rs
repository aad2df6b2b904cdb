//! dsv4-bench: the measurements behind `dsv4 bench`. Machine peaks are measured in the same run
//! and every result is reported against them (or against another backend of the same run); no
//! test asserts a timing.

pub mod e2e;
pub mod machine;
pub mod ops;
pub mod placement;
mod report;
pub mod sampling;
pub mod timing;

pub use report::{Target, render_table, targets};

use dsv4_kernels::registry::{self, BackendOptions};
use serde::Serialize;
use std::time::Duration;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Backends by registry name.
    pub backends: Vec<String>,
    /// Threads for backends and the machine measurement (0 = all cores).
    pub threads: usize,
    /// How the backends are created (its `threads` is replaced by `threads`).
    pub backend_options: BackendOptions,
    /// Measure the machine's FMA peak and bandwidth.
    pub machine: bool,
    /// Run the op-level cases.
    pub ops: bool,
    /// End-to-end plan (None = skip).
    pub e2e: Option<e2e::E2ePlan>,
    /// Serving throughput through the engine (None = skip): the tiny model on every backend
    /// but the reference.
    pub serving: Option<dsv4_engine::bench::ServingBenchSpec>,
    /// Time the engine's token choice (sampling options, log-probabilities) at DSV4's
    /// vocabulary.
    pub sampling: bool,
}

/// Everything one `dsv4 bench` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Machine limits of this run.
    pub machine: Option<machine::MachinePeaks>,
    /// Op-level results.
    pub ops: Vec<ops::OpResult>,
    /// End-to-end results.
    pub e2e: Vec<e2e::E2eResult>,
    /// Serving throughput at each concurrency level, per backend (engine, tiny model).
    pub serving: Vec<dsv4_engine::bench::ServingBenchReport>,
    /// Per-token cost of choosing a token (one request, DSV4's vocabulary), against greedy.
    pub sampling: Vec<sampling::SamplingCost>,
    /// Active weight bytes per decode token of each config (for the decode floor).
    pub active_weight_bytes: Vec<(String, usize)>,
    /// What the cpu backend summed its linear layers in (`backend.cpu_sums`): "f64" or "f32".
    pub cpu_sums: &'static str,
    /// The targets, evaluated on this run's numbers.
    pub targets: Vec<Target>,
}

/// Errors of a bench run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A backend could not be created.
    #[error(transparent)]
    Backend(#[from] dsv4_kernels::KernelError),
    /// A model could not be built or run.
    #[error("{0}")]
    Model(String),
    /// The options ask for something no run can measure (checked before anything runs).
    #[error("{0}")]
    Invalid(String),
}

impl BenchOptions {
    /// Check the end-to-end plan and the serving spec, so bad options fail at once rather than
    /// after minutes of machine and op measurements.
    pub fn validate(&self) -> Result<(), BenchError> {
        if let Some(plan) = &self.e2e {
            plan.validate().map_err(BenchError::Invalid)?;
        }
        if let Some(spec) = &self.serving {
            spec.validate().map_err(BenchError::Invalid)?;
        }
        Ok(())
    }
}

/// Slow backends ([`is_slow`]) skip the op cases above this many flops and the long-context
/// decode runs.
const SLOW_BACKEND_FLOPS: f64 = 2.5e9;

/// The reference and the CPU emulators of device backends (cuda-emu) run orders of magnitude
/// slower than the fast backends.
fn is_slow(backend: &str) -> bool {
    backend == "reference" || backend.ends_with("-emu")
}

/// Run the benchmark.
pub fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    opts.validate()?;
    let bopts = BackendOptions {
        threads: opts.threads,
        ..opts.backend_options.clone()
    };
    let backends = opts
        .backends
        .iter()
        .map(|b| registry::create(b, &bopts))
        .collect::<Result<Vec<_>, _>>()?;
    let machine = opts.machine.then(|| {
        eprintln!("measuring the machine (FMA peak, memory bandwidth)…");
        machine::measure(opts.threads)
    });
    let mut op_results = Vec::new();
    if opts.ops {
        for b in &backends {
            let slow = is_slow(b.name()).then_some(SLOW_BACKEND_FLOPS);
            op_results.extend(ops::run(b.as_ref(), slow, Duration::from_millis(400)));
        }
    }
    let mut e2e_results = Vec::new();
    let mut active = Vec::new();
    if let Some(plan) = &opts.e2e {
        // Each device backend's siblings with one on-device path on the host: the same kind,
        // created with the same options less that path.
        let siblings: Vec<Vec<placement::Sibling>> = backends
            .iter()
            .map(|b| {
                let (made, skipped) =
                    placement::siblings(b.as_ref(), &bopts, |o| registry::create(b.name(), o));
                for why in skipped {
                    eprintln!("{why}");
                }
                made
            })
            .collect();
        for cfg_name in &plan.configs {
            eprintln!("generating {cfg_name} weights…");
            let cfg = e2e::config(cfg_name).map_err(|e| BenchError::Model(e.to_string()))?;
            let tensors = e2e::weights(&cfg).map_err(|e| BenchError::Model(e.to_string()))?;
            for (b, sibs) in backends.iter().zip(&siblings) {
                let fast = !is_slow(b.name());
                let (r, bytes) = e2e::run(b.clone(), cfg_name, &cfg, &tensors, plan, fast, sibs)
                    .map_err(|e| BenchError::Model(e.to_string()))?;
                e2e_results.extend(r);
                if !active.iter().any(|(c, _): &(String, usize)| c == cfg_name) {
                    active.push((cfg_name.clone(), bytes));
                }
            }
        }
    }
    let mut serving = Vec::new();
    if let Some(spec) = &opts.serving {
        let cfg = e2e::config("tiny").map_err(|e| BenchError::Model(e.to_string()))?;
        let tensors = e2e::weights(&cfg).map_err(|e| BenchError::Model(e.to_string()))?;
        for b in backends.iter().filter(|b| b.name() != "reference") {
            eprintln!(
                "serving throughput on {} (tiny model, concurrency {:?})…",
                b.name(),
                spec.concurrency
            );
            let model = std::sync::Arc::new(
                dsv4_model::Model::load(cfg.clone(), &tensors, b.clone(), Default::default())
                    .map_err(|e| BenchError::Model(e.to_string()))?,
            );
            // Random prompts share nothing: no prefix cache. A shared prefix runs with it, with
            // in-batch prefix caching off and then on.
            let modes: &[(bool, bool)] = if spec.shared_prefix > 0 {
                &[(true, false), (true, true)]
            } else {
                &[(false, false)]
            };
            for &(prefix_cache, in_batch_prefix_caching) in modes {
                let engine_cfg = dsv4_engine::EngineConfig {
                    prefix_cache,
                    in_batch_prefix_caching,
                    ..Default::default()
                };
                let r = dsv4_engine::bench::serving_throughput(model.clone(), engine_cfg, spec)
                    .map_err(|e| BenchError::Model(e.to_string()))?;
                serving.push(r);
            }
        }
    }
    let sampling = if opts.sampling {
        eprintln!("timing token choice at DSV4's vocabulary…");
        sampling::sampling_costs(sampling::DSV4_VOCAB, Duration::from_millis(300))
    } else {
        Vec::new()
    };
    let mut report = BenchReport {
        machine,
        ops: op_results,
        e2e: e2e_results,
        serving,
        sampling,
        active_weight_bytes: active,
        cpu_sums: if bopts.cpu_f32_sums { "f32" } else { "f64" },
        targets: Vec::new(),
    };
    report.targets = targets(&report);
    Ok(report)
}

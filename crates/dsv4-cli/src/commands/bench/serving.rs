//! `dsv4 bench --serving`: the serving workload on the tiny model through the scheduler with
//! overlap scheduling off and on: the CPU scheduling time per step that execution does not
//! hide, and the fit of decode step time = fixed + marginal × running requests.

use super::BenchArgs;
use anyhow::Context;
use dsv4_engine::EngineConfig;
use dsv4_engine::bench::{ScheduleBenchReport, ServingBenchSpec, overlap_schedule};
use dsv4_kernels::registry::{self, BackendOptions};
use std::fmt::Write as _;
use std::sync::Arc;

/// Run the case on every chosen backend (default: the registered ones that can run here, less
/// the slow reference backend) and print a table or JSON.
pub fn run(args: &BenchArgs, profile: &dsv4_config::Profile) -> anyhow::Result<()> {
    // Checked before the backends are probed (a device probe can take seconds).
    let spec = ServingBenchSpec {
        concurrency: args.serving_concurrency.clone(),
        requests_per_level: 32,
        prompt_len: 64,
        shared_prefix: 0,
        max_tokens: 16,
        seed: 0,
    };
    spec.validate().map_err(anyhow::Error::msg)?;
    let names: Vec<String> = if args.backends.is_empty() {
        registry::factories()
            .into_iter()
            // Emulators (cuda-emu) are for correctness, not speed.
            .filter(|f| {
                (f.probe)().is_ok() && !f.name.starts_with("faulty") && !f.name.ends_with("-emu")
            })
            .map(|f| f.name.to_string())
            .filter(|n| n != "reference")
            .collect()
    } else {
        args.backends.clone()
    };
    if names.is_empty() {
        anyhow::bail!("no backend to run the serving case on; name one with --backend");
    }
    let cfg = dsv4_bench::e2e::config("tiny")?;
    let tensors = dsv4_bench::e2e::weights(&cfg)?;
    let bopts = BackendOptions {
        device: None,
        ..crate::commands::forward::backend_options(profile)
    };
    let mut reports = Vec::new();
    for name in &names {
        let backend = registry::create(name, &bopts)
            .with_context(|| format!("cannot start the {name} backend"))?;
        eprintln!(
            "overlap scheduling on {name} (tiny model, concurrency {:?}, overlap off then on)…",
            spec.concurrency
        );
        let model = dsv4_model::Model::load(cfg.clone(), &tensors, backend, Default::default())?;
        let engine_cfg = EngineConfig {
            prefix_cache: false,
            ..Default::default()
        };
        reports.push(overlap_schedule(Arc::new(model), engine_cfg, &spec)?);
    }
    let json = serde_json::to_string_pretty(&reports)?;
    if let Some(path) = &args.out {
        std::fs::write(path, &json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{json}");
    } else {
        for r in &reports {
            print!("{}", render(r));
        }
    }
    Ok(())
}

/// The report as a table: one row per mode, then one per mode and level.
pub fn render(r: &ScheduleBenchReport) -> String {
    let mode = |overlap: bool| if overlap { "overlap" } else { "serial" };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "serving schedule on {} (tiny model; {} requests per level, prompt {} tokens, {} \
         generated each)",
        r.backend, r.spec.requests_per_level, r.spec.prompt_len, r.spec.max_tokens
    );
    let _ = writeln!(
        out,
        "{:<8} {:>6} {:>16}   decode step = fixed + marginal x running {:>10}",
        "mode", "steps", "exposed ms/step", "R^2"
    );
    for m in &r.modes {
        let _ = writeln!(
            out,
            "{:<8} {:>6} {:>16.4}   {:>9.3} ms + {:>7.4} ms/request {:>16.3}",
            mode(m.overlap),
            m.steps,
            m.exposed_ms_per_step,
            m.decode_fixed_ms,
            m.decode_marginal_ms,
            m.decode_fit_r2
        );
    }
    let _ = writeln!(
        out,
        "{:<8} {:>11} {:>6} {:>16} {:>16} {:>12}",
        "mode", "concurrency", "steps", "exposed ms/step", "decode step ms", "out tok/s"
    );
    for m in &r.modes {
        for l in &m.levels {
            let _ = writeln!(
                out,
                "{:<8} {:>11} {:>6} {:>16.4} {:>16.3} {:>12.1}",
                mode(m.overlap),
                l.concurrency,
                l.steps,
                l.exposed_ms_per_step,
                l.mean_decode_step_ms,
                l.output_throughput
            );
        }
    }
    out
}

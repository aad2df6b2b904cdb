//! Execution modes through the engine: eager and captured plans, serial and multi-stream
//! overlap (seeded interleavings and real threads) give bitwise the tokens and logits of each
//! request run alone, with the canary on and silent; the arena fault `arena-ignores-streams`
//! on the interleaving executor is caught by the canary and shows as a divergence from the
//! solo runs.

use super::*;
use dsv4_engine::{
    CacheBudget, CanaryConfig, Completion, DebugOptions, EngineConfig, EngineMetrics, Scheduler,
};
use dsv4_model::forward::{ExecOptions, Executor, Fault};

const MAX_TOKENS: usize = 6;

fn prompts() -> Vec<Vec<u32>> {
    (0..6usize)
        .map(|i| {
            let mut p = vec![0];
            p.extend(tokens(9 + i * 7, 300 + i as u64));
            p
        })
        .collect()
}

/// The tiny model on the reference backend under `exec`.
fn model_with(exec: ExecOptions) -> Arc<Model> {
    let mut m = load_model(
        &ModelSource::Tiny { seed: 0 },
        Arc::new(ReferenceBackend),
        numerics(),
    )
    .expect("tiny model loads");
    m.set_exec(exec);
    Arc::new(m)
}

/// All prompts submitted at once to a scheduler with the canary on, stepped to the end.
fn serve(model: Arc<Model>) -> (Vec<Completion>, EngineMetrics) {
    let cfg = EngineConfig {
        cache: CacheBudget::Tokens(4096),
        page_size: 16,
        prefix_cache: false,
        max_running_requests: 8,
        chunked_prefill_size: Some(24),
        ..Default::default()
    };
    let debug = DebugOptions {
        canary: Some(CanaryConfig::default()),
    };
    let mut sched = Scheduler::new(model, cfg, None)
        .expect("scheduler starts")
        .with_debug(debug);
    let streams: Vec<_> = prompts()
        .into_iter()
        .map(|p| {
            sched
                .submit(greedy(p, MAX_TOKENS))
                .expect("request accepted")
        })
        .collect();
    while sched.step() {}
    // Shown with --nocapture (docs/plans.md quotes them).
    for f in sched.canary_findings() {
        eprintln!("canary: {f}");
    }
    let metrics = sched.metrics();
    (
        streams.into_iter().map(|s| s.collect_blocking()).collect(),
        metrics,
    )
}

fn solos() -> Vec<Solo> {
    let m = model();
    prompts().iter().map(|p| solo(&m, p, MAX_TOKENS)).collect()
}

#[test]
fn every_execution_mode_gives_the_solo_tokens_and_logits_bitwise() {
    let solos = solos();
    let interleaved = |seed| Executor::Interleaved { seed };
    let modes = [
        ("eager serial", ExecOptions::default()),
        (
            "captured serial",
            ExecOptions {
                captured: true,
                captured_max_bs: 4,
                ..Default::default()
            },
        ),
        (
            "eager overlap interleaved",
            ExecOptions {
                overlap: true,
                executor: interleaved(1),
                ..Default::default()
            },
        ),
        (
            "captured overlap interleaved",
            ExecOptions {
                captured: true,
                overlap: true,
                executor: interleaved(2),
                ..Default::default()
            },
        ),
        (
            "captured overlap threaded",
            ExecOptions {
                captured: true,
                overlap: true,
                executor: Executor::Threaded,
                ..Default::default()
            },
        ),
    ];
    for (name, exec) in modes {
        let (done, metrics) = serve(model_with(exec));
        for (i, c) in done.iter().enumerate() {
            assert_same_as_solo(c, &solos[i], &format!("{name}: request {i}"));
        }
        assert_eq!(
            metrics.canary_rounds_flagged, 0,
            "{name}: the canary stays silent on a clean plan"
        );
    }
}

#[test]
fn the_arena_fault_is_caught_by_the_canary_and_diverges_from_solo_runs() {
    let solos = solos();
    let exec = ExecOptions {
        captured: true,
        overlap: true,
        executor: Executor::Interleaved { seed: 0 },
        faults: [Fault::ArenaIgnoresStreams].into(),
        ..Default::default()
    };
    let (done, metrics) = serve(model_with(exec));
    assert!(
        metrics.canary_rounds_flagged > 0 && metrics.canary_unexpected_pages > 0,
        "the canary sees pages written outside the declared write set: {metrics:?}"
    );
    let diverged = done
        .iter()
        .zip(&solos)
        .filter(|(c, s)| {
            c.tokens != s.0
                || c.logits
                    .iter()
                    .zip(&s.1)
                    .any(|(a, b)| a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits()))
        })
        .count();
    assert!(diverged > 0, "some request departs from its solo run");
}

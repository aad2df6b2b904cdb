//! The host tier (`cache.hicache`): prefix snapshots evicted under pool pressure spill to host
//! pages and load back layer by layer when a later request hits them. With every read waiting
//! on its layer's transfer counter, tokens and logits equal the solo runs bitwise (as with the
//! tier off and with an ample device pool) and the canary is silent; the fault
//! `skip-index-k-transfer-wait` under the lagged transfer pace (the worker copies a pool's
//! layer only when a reader waits for it, or at the end of the round) is caught by the canary
//! (index-K pages written by the load-back after the round read them) and diverges from the
//! solo runs, the same way every time.

use super::*;
use dsv4_engine::pools::CacheGeometry;
use dsv4_engine::{
    CacheBudget, CanaryConfig, Completion, DebugOptions, EngineConfig, EngineMetrics,
    HostTierConfig, PoolKind, Scheduler, TransferPace,
};
use dsv4_model::forward::{ExecOptions, Fault};
use std::collections::BTreeMap;

const MAX_TOKENS: usize = 4;
/// Tokens of each shared prefix: 6 pages of 16, 24 index-K rows (more than index_topk = 16,
/// so the indexer really selects).
const PREFIX: usize = 96;

/// Four prefixes, each first asked with one 3-token tail, then (after the others pushed its
/// snapshots out of the device pools) with another. A 3-token tail after a 96-token hit
/// completes no compressed window, so the hit's first round reads the loaded index-K pages
/// without writing (or copying) any.
fn prompts() -> Vec<Vec<u32>> {
    let prefixes: Vec<Vec<u32>> = (0..4u64)
        .map(|i| {
            let mut p = vec![0];
            p.extend(tokens(PREFIX - 1, 900 + i));
            p
        })
        .collect();
    let with = |p: &Vec<u32>, seed| {
        let mut q = p.clone();
        q.extend(tokens(3, seed));
        q
    };
    let first = prefixes
        .iter()
        .enumerate()
        .map(|(i, p)| with(p, 950 + i as u64));
    let again = prefixes
        .iter()
        .enumerate()
        .map(|(i, p)| with(p, 970 + i as u64));
    first.chain(again).collect()
}

/// Device pools for `n` sequences of the prompts' length.
fn pools_for(n: usize) -> CacheBudget {
    let per = CacheGeometry::of(&model()).pages_for_len(PREFIX + 3 + MAX_TOKENS);
    CacheBudget::Pages(
        PoolKind::ALL
            .into_iter()
            .map(|k| (k, per[k.index()] * n))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// Room for one running request and about two prefix snapshots: older snapshots are evicted.
fn tight() -> CacheBudget {
    pools_for(3)
}

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

/// The prompts, one at a time in order, with the canary on; the scheduler's pools are all free
/// once the prefix cache is cleared.
fn serve(model: Arc<Model>, cache: CacheBudget, hicache: Option<HostTierConfig>) -> Run {
    serve_with(model, cache, hicache, false)
}

/// [`serve`], with overlap scheduling on or off.
fn serve_with(
    model: Arc<Model>,
    cache: CacheBudget,
    hicache: Option<HostTierConfig>,
    overlap_schedule: bool,
) -> Run {
    let cfg = EngineConfig {
        cache,
        page_size: 16,
        prefix_cache: true,
        max_running_requests: 1,
        chunked_prefill_size: None,
        hicache,
        overlap_schedule,
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
        .map(|p| sched.submit(greedy(p, MAX_TOKENS)).expect("accepted"))
        .collect();
    while sched.step() {}
    let findings: Vec<String> = sched.canary_findings().map(|f| f.to_string()).collect();
    // Shown with --nocapture (docs/engine.md quotes them).
    for f in &findings {
        eprintln!("canary: {f}");
    }
    let metrics = sched.metrics();
    eprintln!(
        "host tier {:?}: spilled {} pages, loaded {} pages, {} host hits, {} cached tokens, {} \
         canary rounds flagged",
        hicache.map(|h| h.pace),
        metrics.host_tier_spilled_pages_total,
        metrics.host_tier_loaded_pages_total,
        metrics.host_tier_hits_total,
        metrics.cached_tokens_total,
        metrics.canary_rounds_flagged
    );
    let done = streams.into_iter().map(|s| s.collect_blocking()).collect();
    sched.clear_prefix_cache();
    assert!(sched.pools().all_free(), "every device page is free again");
    assert_eq!(
        sched.metrics().host_tier_used_pages,
        0,
        "and every host page"
    );
    Run {
        done,
        metrics,
        findings,
    }
}

struct Run {
    done: Vec<Completion>,
    metrics: EngineMetrics,
    findings: Vec<String>,
}

fn solos() -> Vec<Solo> {
    let m = model();
    prompts().iter().map(|p| solo(&m, p, MAX_TOKENS)).collect()
}

fn tier(pace: TransferPace) -> Option<HostTierConfig> {
    Some(HostTierConfig { ratio: 16.0, pace })
}

#[test]
fn host_tier_hits_give_the_solo_and_ample_pool_results_bitwise_with_a_silent_canary() {
    let solos = solos();
    let ample = serve(model(), pools_for(64), None);
    let off = serve(model(), tight(), None);
    for (name, run) in [("ample device pool", &ample), ("tight, no host tier", &off)] {
        for (i, c) in run.done.iter().enumerate() {
            assert_same_as_solo(c, &solos[i], &format!("{name}: request {i}"));
        }
        assert_eq!(run.metrics.host_tier_hits_total, 0, "{name}");
    }
    assert!(
        off.metrics.cached_tokens_total < ample.metrics.cached_tokens_total,
        "the tight pool drops snapshots the second tails would have hit: {:?}",
        off.metrics
    );
    for pace in [TransferPace::Eager, TransferPace::Lagged] {
        let run = serve(model(), tight(), tier(pace));
        for (i, c) in run.done.iter().enumerate() {
            assert_same_as_solo(c, &solos[i], &format!("{pace:?} host tier: request {i}"));
        }
        let m = &run.metrics;
        assert!(
            m.host_tier_spilled_pages_total > 0
                && m.host_tier_loaded_pages_total > 0
                && m.host_tier_hits_total >= 4,
            "{pace:?}: pages went device → host → device for every second tail: {m:?}"
        );
        assert_eq!(
            m.cached_tokens_total, ample.metrics.cached_tokens_total,
            "{pace:?}: the host tier serves every hit an ample device pool serves"
        );
        assert_eq!(
            (m.canary_rounds_flagged, run.findings.len()),
            (0, 0),
            "{pace:?}: the canary stays silent when every read waits: {:?}",
            run.findings
        );
    }
}

#[test]
fn host_tier_hits_under_overlap_scheduling_give_the_solo_results_with_a_silent_canary() {
    let solos = solos();
    for pace in [TransferPace::Eager, TransferPace::Lagged] {
        let run = serve_with(model(), tight(), tier(pace), true);
        for (i, c) in run.done.iter().enumerate() {
            assert_same_as_solo(c, &solos[i], &format!("{pace:?} overlapped: request {i}"));
        }
        let m = &run.metrics;
        assert!(
            m.host_tier_loaded_pages_total > 0 && m.host_tier_hits_total >= 4,
            "{pace:?} overlapped: hits loaded back from the host tier: {m:?}"
        );
        assert_eq!(
            (m.canary_rounds_flagged, run.findings.len()),
            (0, 0),
            "{pace:?} overlapped: the canary stays silent: {:?}",
            run.findings
        );
    }
}

#[test]
fn skipping_the_index_k_transfer_wait_is_caught_by_the_canary_and_diverges_reproducibly() {
    let solos = solos();
    let exec = ExecOptions {
        faults: [Fault::SkipIndexKTransferWait].into(),
        ..Default::default()
    };
    let runs: Vec<Run> = (0..2)
        .map(|_| {
            serve(
                model_with(exec.clone()),
                tight(),
                tier(TransferPace::Lagged),
            )
        })
        .collect();
    let run = &runs[0];
    let m = &run.metrics;
    assert!(m.host_tier_hits_total >= 4, "host hits happened: {m:?}");
    assert!(
        m.canary_rounds_flagged > 0 && m.canary_unexpected_pages > 0,
        "the canary sees load-back writes the round did not declare: {m:?}"
    );
    assert!(
        run.findings.iter().all(|f| f.contains("pool c4_index_k")),
        "only index-K pages change undeclared: {:?}",
        run.findings
    );
    let diverged: Vec<usize> = run
        .done
        .iter()
        .zip(&solos)
        .enumerate()
        .filter(|(_, (c, s))| {
            c.tokens != s.0
                || c.logits
                    .iter()
                    .zip(&s.1)
                    .any(|(a, b)| a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits()))
        })
        .map(|(i, _)| i)
        .collect();
    eprintln!("requests departing from their solo runs: {diverged:?}");
    assert_eq!(
        diverged,
        vec![4, 5, 6, 7],
        "every request served from the host tier (and only those) departs from its solo run"
    );
    assert_eq!(
        runs[0].findings, runs[1].findings,
        "the same findings every time"
    );
    let tokens = |r: &Run| r.done.iter().map(|c| c.tokens.clone()).collect::<Vec<_>>();
    assert_eq!(
        tokens(&runs[0]),
        tokens(&runs[1]),
        "the same tokens every time"
    );
}

#[test]
fn concurrent_requests_with_the_host_tier_give_the_solo_results() {
    let solos = solos();
    let cfg = EngineConfig {
        cache: pools_for(5),
        page_size: 16,
        prefix_cache: true,
        max_running_requests: 3,
        chunked_prefill_size: Some(40),
        hicache: tier(TransferPace::Eager),
        ..Default::default()
    };
    let debug = DebugOptions {
        canary: Some(CanaryConfig::default()),
    };
    let engine = dsv4_engine::Engine::spawn_debug(model(), cfg, None, debug).expect("starts");
    assert!(
        engine.pool_report().to_string().contains("host tier"),
        "the start-up table shows the host tier"
    );
    let streams: Vec<_> = prompts()
        .into_iter()
        .map(|p| engine.submit(greedy(p, MAX_TOKENS)).expect("accepted"))
        .collect();
    let done: Vec<Completion> = streams.into_iter().map(|s| s.collect_blocking()).collect();
    for (i, c) in done.iter().enumerate() {
        assert_same_as_solo(c, &solos[i], &format!("concurrent host tier: request {i}"));
    }
    let m = engine.metrics();
    assert!(
        m.host_tier_spilled_pages_total > 0,
        "snapshots spilled: {m:?}"
    );
    assert_eq!(m.canary_rounds_flagged, 0, "the canary stays silent: {m:?}");
}

#[test]
fn pools_that_cannot_be_allocated_are_refused_before_any_allocation() {
    let start = |cache: CacheBudget, ratio: Option<f64>| {
        let cfg = EngineConfig {
            cache,
            page_size: 16,
            prefix_cache: true,
            hicache: ratio.map(|ratio| HostTierConfig {
                ratio,
                ..Default::default()
            }),
            ..Default::default()
        };
        match Scheduler::new(model(), cfg, None) {
            Ok(_) => panic!("pools that cannot be allocated were accepted"),
            Err(e) => e.to_string(),
        }
    };
    // A host tier of 1e300 times the device pools: more pages than a page id names (it was a
    // "capacity overflow" panic).
    let msg = start(CacheBudget::Tokens(4096), Some(1e300));
    assert!(
        msg.contains("cache.hicache_ratio") && msg.contains("page id"),
        "{msg}"
    );
    // 10^11 tokens: each pool fits page ids, but not any machine's memory (it was an abort on
    // a failed allocation of 12.8 TB).
    let msg = start(CacheBudget::Tokens(100_000_000_000), None);
    assert!(
        msg.contains("cache.max_total_tokens") && msg.contains("GiB of memory is available"),
        "{msg}"
    );
}

#[test]
fn the_memory_check_names_the_tier_that_does_not_fit() {
    let geom = CacheGeometry::of(&model());
    let pages = geom.pages_for_len(4096);
    let host = pages.map(|p| p * 3);
    let (device, tier) = (geom.bytes(&pages), geom.bytes(&host));
    let check = |host: &[usize; 7], free: u64| {
        dsv4_engine::pools::check_memory(&geom, &pages, host, Some(free))
    };
    check(&host, device + tier).expect("exactly enough memory");
    dsv4_engine::pools::check_memory(&geom, &pages, &host, None).expect("unknown memory");
    let e = check(&host, device + tier - 1).unwrap_err().to_string();
    assert!(
        e.contains("cache.hicache_ratio"),
        "the host tier tips it: {e}"
    );
    let e = check(&[0; 7], device - 1).unwrap_err().to_string();
    assert!(e.contains("lower cache.max_total_tokens"), "{e}");
}

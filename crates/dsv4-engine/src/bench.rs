//! Serving throughput: a closed loop that keeps `concurrency` requests in flight on a fresh
//! engine and reports vLLM-style numbers (request and token throughput; TTFT, TPOT, ITL and
//! end-to-end latency, mean/median/p99) for each concurrency level. For `dsv4 bench`.
//!
//! [`overlap_schedule`] (`dsv4 bench --serving`) runs the same workload through the scheduler
//! with overlap scheduling off and on and reports, per step, the CPU scheduling time that is
//! exposed (not hidden behind execution), and a least-squares fit of decode step time =
//! fixed + marginal × running requests.

use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::pools::PoolReport;
use crate::request::{Event, FinishReason, Request, SamplingParams};
use crate::scheduler::{Scheduler, StepTiming};
use dsv4_core::SplitMix64;
use dsv4_model::Model;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct ServingBenchSpec {
    /// Requests in flight, one level each (e.g. [1, 8, 32]).
    pub concurrency: Vec<usize>,
    /// Requests per level (at least the level's concurrency is run).
    pub requests_per_level: usize,
    /// Prompt tokens per request (random ids, BOS first).
    pub prompt_len: usize,
    /// Leading prompt tokens every request shares (BOS included; the rest is random per
    /// request); 0: none shared.
    #[serde(default)]
    pub shared_prefix: usize,
    /// Generated tokens per request (end-of-sequence ignored, so every request makes them all).
    pub max_tokens: usize,
    /// Seed of the prompts.
    pub seed: u64,
}

impl ServingBenchSpec {
    /// Check that every level, the prompt and the generation are at least 1.
    pub fn validate(&self) -> Result<(), String> {
        if self.concurrency.is_empty() {
            return Err("serving benchmark: no concurrency level named".into());
        }
        if self.prompt_len == 0 || self.max_tokens == 0 || self.concurrency.contains(&0) {
            return Err(
                "serving benchmark: prompt_len, max_tokens and every concurrency must be >= 1"
                    .into(),
            );
        }
        if self.shared_prefix > self.prompt_len {
            return Err(format!(
                "serving benchmark: the shared prefix ({} tokens) is longer than the prompt ({})",
                self.shared_prefix, self.prompt_len
            ));
        }
        Ok(())
    }
}

impl Default for ServingBenchSpec {
    fn default() -> Self {
        Self {
            concurrency: vec![1, 8, 32],
            requests_per_level: 64,
            prompt_len: 128,
            shared_prefix: 0,
            max_tokens: 32,
            seed: 0,
        }
    }
}

/// Results of one concurrency level (key names as vLLM's serving benchmark).
#[derive(Debug, Clone, Serialize)]
pub struct ServingLevel {
    /// Requests in flight.
    pub concurrency: usize,
    /// Requests that finished normally.
    pub completed: usize,
    /// Requests that ended in an error.
    pub failed: usize,
    /// Wall time of the level, s.
    pub duration: f64,
    /// Prompt tokens sent.
    pub total_input_tokens: usize,
    /// Tokens generated.
    pub total_output_tokens: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Generated tokens per second.
    pub output_throughput: f64,
    /// Prompt and generated tokens per second.
    pub total_token_throughput: f64,
    /// Time to first token, ms.
    pub mean_ttft_ms: f64,
    /// Median time to first token, ms.
    pub median_ttft_ms: f64,
    /// 99th percentile time to first token, ms.
    pub p99_ttft_ms: f64,
    /// Time per output token after the first, ms.
    pub mean_tpot_ms: f64,
    /// Median time per output token, ms.
    pub median_tpot_ms: f64,
    /// 99th percentile time per output token, ms.
    pub p99_tpot_ms: f64,
    /// Gap between consecutive tokens of a request, ms.
    pub mean_itl_ms: f64,
    /// Median inter-token gap, ms.
    pub median_itl_ms: f64,
    /// 99th percentile inter-token gap, ms.
    pub p99_itl_ms: f64,
    /// Submission to last token, ms.
    pub mean_e2el_ms: f64,
    /// Median end-to-end latency, ms.
    pub median_e2el_ms: f64,
    /// 99th percentile end-to-end latency, ms.
    pub p99_e2el_ms: f64,
    /// Preemptions during the level.
    pub preemptions: u64,
    /// Prompt tokens served from the prefix cache instead of computed.
    pub cached_tokens: u64,
}

/// The whole benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct ServingBenchReport {
    /// Backend the model ran on.
    pub backend: String,
    /// The spec that was run.
    pub spec: ServingBenchSpec,
    /// The engine options.
    pub config: EngineConfig,
    /// The pools of each level's engine.
    pub pools: PoolReport,
    /// One entry per concurrency level.
    pub levels: Vec<ServingLevel>,
}

/// (mean, median, p99) of `v` (zeros when empty).
fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (v.iter().sum::<f64>() / v.len() as f64, at(0.5), at(0.99))
}

/// One client's record of one request.
struct Record {
    ok: bool,
    ttft: f64,
    e2el: f64,
    itls: Vec<f64>,
    out: usize,
}

/// Run the benchmark: each level on a fresh engine (empty prefix cache) over the same prompts.
pub fn serving_throughput(
    model: Arc<Model>,
    cfg: EngineConfig,
    spec: &ServingBenchSpec,
) -> Result<ServingBenchReport, EngineError> {
    spec.validate().map_err(EngineError::BadRequest)?;
    let vocab = model.cfg.vocab_size as u64;
    let bos = model.cfg.bos_token_id;
    let mut g = SplitMix64::new(spec.seed);
    let mut random =
        |n: usize| -> Vec<u32> { (0..n).map(|_| (2 + g.below(vocab - 2)) as u32).collect() };
    let shared: Vec<u32> = std::iter::once(bos)
        .chain(random(spec.shared_prefix.saturating_sub(1)))
        .collect();
    let n_max = spec
        .concurrency
        .iter()
        .map(|&c| spec.requests_per_level.max(c))
        .max()
        .unwrap_or(0);
    let prompts: Arc<Vec<Vec<u32>>> = Arc::new(
        (0..n_max)
            .map(|_| {
                let lead = spec.shared_prefix.max(1);
                let mut p = shared[..lead].to_vec();
                p.extend(random(spec.prompt_len - lead));
                p
            })
            .collect(),
    );
    let mut levels = Vec::new();
    let mut pools = None;
    for &c in &spec.concurrency {
        let engine = Engine::spawn(Arc::clone(&model), cfg.clone())?;
        pools.get_or_insert_with(|| engine.pool_report().clone());
        let n = spec.requests_per_level.max(c);
        let next = Arc::new(AtomicUsize::new(0));
        let t0 = Instant::now();
        let clients: Vec<_> = (0..c)
            .map(|_| {
                let (engine, next, prompts) = (engine.clone(), next.clone(), prompts.clone());
                let max_tokens = spec.max_tokens;
                std::thread::spawn(move || -> Result<Vec<Record>, EngineError> {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(out);
                        }
                        let start = Instant::now();
                        let mut stream = engine.submit(Request {
                            prompt: prompts[i].clone(),
                            max_tokens,
                            sampling: SamplingParams::default(),
                            ignore_eos: true,
                            ..Default::default()
                        })?;
                        let mut times = Vec::new();
                        let mut ok = false;
                        while let Some(ev) = stream.blocking_next() {
                            match ev {
                                Event::Prompt(_) => {}
                                Event::Token(_) => times.push(start.elapsed().as_secs_f64() * 1e3),
                                Event::Finished(f) => {
                                    ok = f.reason != FinishReason::Error;
                                    break;
                                }
                            }
                        }
                        out.push(Record {
                            ok,
                            ttft: times.first().copied().unwrap_or(0.0),
                            e2el: start.elapsed().as_secs_f64() * 1e3,
                            itls: times.windows(2).map(|w| w[1] - w[0]).collect(),
                            out: times.len(),
                        });
                    }
                })
            })
            .collect();
        let mut records = Vec::new();
        for h in clients {
            let r = h.join().map_err(|_| EngineError::Stopped)?;
            records.extend(r?);
        }
        let duration = t0.elapsed().as_secs_f64();
        let metrics = engine.metrics();
        let done: Vec<&Record> = records.iter().filter(|r| r.ok).collect();
        let out_tokens: usize = done.iter().map(|r| r.out).sum();
        let in_tokens = done.len() * spec.prompt_len;
        let (mut ttft, mut e2el): (Vec<f64>, Vec<f64>) =
            done.iter().map(|r| (r.ttft, r.e2el)).unzip();
        let mut tpot: Vec<f64> = done
            .iter()
            .filter(|r| r.out > 1)
            .map(|r| (r.e2el - r.ttft) / (r.out - 1) as f64)
            .collect();
        let mut itl: Vec<f64> = done.iter().flat_map(|r| r.itls.iter().copied()).collect();
        let ((a, b, d), (e, f, h), (i, j, k), (l, m, o)) = (
            stats(&mut ttft),
            stats(&mut tpot),
            stats(&mut itl),
            stats(&mut e2el),
        );
        levels.push(ServingLevel {
            concurrency: c,
            completed: done.len(),
            failed: records.len() - done.len(),
            duration,
            total_input_tokens: in_tokens,
            total_output_tokens: out_tokens,
            request_throughput: done.len() as f64 / duration,
            output_throughput: out_tokens as f64 / duration,
            total_token_throughput: (in_tokens + out_tokens) as f64 / duration,
            mean_ttft_ms: a,
            median_ttft_ms: b,
            p99_ttft_ms: d,
            mean_tpot_ms: e,
            median_tpot_ms: f,
            p99_tpot_ms: h,
            mean_itl_ms: i,
            median_itl_ms: j,
            p99_itl_ms: k,
            mean_e2el_ms: l,
            median_e2el_ms: m,
            p99_e2el_ms: o,
            preemptions: metrics.preemptions_total,
            cached_tokens: metrics.cached_tokens_total,
        });
        tracing::info!(
            concurrency = c,
            output_throughput = out_tokens as f64 / duration,
            "serving level done"
        );
    }
    Ok(ServingBenchReport {
        backend: model.backend().name().to_string(),
        spec: spec.clone(),
        config: cfg,
        pools: pools.ok_or_else(|| {
            EngineError::BadRequest("serving benchmark: give at least one concurrency".into())
        })?,
        levels,
    })
}

/// One concurrency level of one scheduling mode.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleLevel {
    /// Requests running at once (`max_running_requests`).
    pub concurrency: usize,
    /// Steps run.
    pub steps: usize,
    /// Mean exposed scheduling time per step, ms.
    pub exposed_ms_per_step: f64,
    /// Mean decode step time (forward plus exposed scheduling), ms.
    pub mean_decode_step_ms: f64,
    /// Generated tokens per second over the level.
    pub output_throughput: f64,
}

/// One scheduling mode over every level.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleMode {
    /// Overlap scheduling on.
    pub overlap: bool,
    /// Steps run over all levels.
    pub steps: usize,
    /// Mean exposed scheduling time per step over all levels, ms.
    pub exposed_ms_per_step: f64,
    /// Fit of decode step time = fixed + marginal × running requests: the fixed part, ms.
    pub decode_fixed_ms: f64,
    /// The marginal part, ms per running request (what caps throughput as concurrency grows).
    pub decode_marginal_ms: f64,
    /// R² of the fit.
    pub decode_fit_r2: f64,
    /// Decode steps the fit is over.
    pub decode_steps: usize,
    /// One entry per concurrency level.
    pub levels: Vec<ScheduleLevel>,
}

/// The overlap scheduling benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleBenchReport {
    /// Backend the model ran on.
    pub backend: String,
    /// The workload (every level runs `max(requests_per_level, concurrency)` requests).
    pub spec: ServingBenchSpec,
    /// Off, then on.
    pub modes: Vec<ScheduleMode>,
}

/// Least-squares fit y = a + b·x: (a, b, R²); a flat fit when x does not vary.
pub fn linear_fit(points: &[(f64, f64)]) -> (f64, f64, f64) {
    let n = points.len() as f64;
    if points.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), &(x, y)| (a + x / n, b + y / n));
    let sxx: f64 = points.iter().map(|&(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|&(x, y)| (x - mx) * (y - my)).sum();
    let syy: f64 = points.iter().map(|&(_, y)| (y - my).powi(2)).sum();
    if sxx == 0.0 {
        return (my, 0.0, 0.0);
    }
    let b = sxy / sxx;
    let r2 = if syy == 0.0 {
        1.0
    } else {
        (sxy * sxy) / (sxx * syy)
    };
    (my - b * mx, b, r2)
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// Run `spec`'s workload with overlap scheduling off and on: at each level, every request is
/// queued at once on a fresh scheduler that runs `concurrency` of them at a time (a closed
/// loop: a finished request's slot goes to the next), stepped to the end on this thread.
pub fn overlap_schedule(
    model: Arc<Model>,
    cfg: EngineConfig,
    spec: &ServingBenchSpec,
) -> Result<ScheduleBenchReport, EngineError> {
    spec.validate().map_err(EngineError::BadRequest)?;
    let vocab = model.cfg.vocab_size as u64;
    let bos = model.cfg.bos_token_id;
    let mut modes = Vec::new();
    for overlap in [false, true] {
        let mut levels = Vec::new();
        let mut all: Vec<StepTiming> = Vec::new();
        for &c in &spec.concurrency {
            let level_cfg = EngineConfig {
                max_running_requests: c,
                overlap_schedule: overlap,
                ..cfg.clone()
            };
            let mut sched = Scheduler::new(Arc::clone(&model), level_cfg, None)?;
            let mut g = SplitMix64::new(spec.seed);
            let mut streams = Vec::new();
            for _ in 0..spec.requests_per_level.max(c) {
                let prompt = std::iter::once(bos)
                    .chain((1..spec.prompt_len).map(|_| (2 + g.below(vocab - 2)) as u32))
                    .collect();
                streams.push(sched.submit(Request {
                    prompt,
                    max_tokens: spec.max_tokens,
                    sampling: SamplingParams::default(),
                    ignore_eos: true,
                    ..Default::default()
                })?);
            }
            let t0 = Instant::now();
            while sched.step() {}
            let secs = t0.elapsed().as_secs_f64();
            let generated = sched.metrics().generated_tokens_total;
            let t = sched.take_step_timings();
            levels.push(ScheduleLevel {
                concurrency: c,
                steps: t.len(),
                exposed_ms_per_step: mean(t.iter().map(|s| s.exposed_ms)),
                mean_decode_step_ms: mean(
                    t.iter()
                        .filter(|s| s.decode)
                        .map(|s| s.run_ms + s.exposed_ms),
                ),
                output_throughput: generated as f64 / secs.max(1e-9),
            });
            all.extend(t);
        }
        let points: Vec<(f64, f64)> = all
            .iter()
            .filter(|s| s.decode)
            .map(|s| (s.running as f64, s.run_ms + s.exposed_ms))
            .collect();
        let (fixed, marginal, r2) = linear_fit(&points);
        modes.push(ScheduleMode {
            overlap,
            steps: all.len(),
            exposed_ms_per_step: mean(all.iter().map(|s| s.exposed_ms)),
            decode_fixed_ms: fixed,
            decode_marginal_ms: marginal,
            decode_fit_r2: r2,
            decode_steps: points.len(),
            levels,
        });
    }
    Ok(ScheduleBenchReport {
        backend: model.backend().name().to_string(),
        spec: spec.clone(),
        modes,
    })
}

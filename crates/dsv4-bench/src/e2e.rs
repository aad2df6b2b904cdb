//! End-to-end benchmarks: prefill and decode throughput of whole models (the embedded tiny model
//! and the "small" config shipped with the bench), and decode time per token against context.

use crate::timing::median_secs;
use dsv4_core::{Numerics, SplitMix64, Tensor};
use dsv4_kernels::{Backend, DeviceStats, Linear};
use dsv4_model::forward::{ExecOptions, Executor, Taps};
use dsv4_model::{LogitRows, Model, ModelConfig, ModelError, SequenceState};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One end-to-end measurement.
#[derive(Debug, Clone, Serialize)]
pub struct E2eResult {
    /// Backend name.
    pub backend: String,
    /// "tiny" or "small".
    pub config: String,
    /// What was measured, e.g. "prefill 512 tokens".
    pub metric: String,
    /// The value.
    pub value: f64,
    /// Its unit ("tokens/s", "ms/token").
    pub unit: &'static str,
}

/// Which model configs and contexts to run.
#[derive(Debug, Clone)]
pub struct E2ePlan {
    /// Config names ("tiny", "small").
    pub configs: Vec<String>,
    /// Prefill length for the prefill throughput case.
    pub prefill_tokens: usize,
    /// Contexts for the decode-vs-context case (small config, fast backends only).
    pub contexts: Vec<usize>,
}

/// Decode steps the prefill case runs after its prompt on a device backend (upload counts).
const PREFILL_DECODE_STEPS: usize = 4;

/// Decode steps the context case leaves room for after its prompt (warm-up and medians).
const CONTEXT_HEADROOM: usize = 16;

impl E2ePlan {
    /// Check every config name, the prefill length and every context against the configs'
    /// position limits, so a bad plan fails before any weights are generated or timed.
    pub fn validate(&self) -> Result<(), String> {
        if self.configs.is_empty() {
            return Err("no end-to-end config named (known: tiny, small)".into());
        }
        if self.prefill_tokens == 0 {
            return Err("the prefill case needs at least 1 token (--prefill-tokens)".into());
        }
        for name in &self.configs {
            let cfg = config(name).map_err(|e| e.to_string())?;
            let max = cfg.max_position_embeddings;
            if self.prefill_tokens + PREFILL_DECODE_STEPS > max {
                return Err(format!(
                    "--prefill-tokens {} does not fit config `{name}`: its prompt and {} decode \
                     steps must stay within max_position_embeddings {max}",
                    self.prefill_tokens, PREFILL_DECODE_STEPS
                ));
            }
            if name == "small" {
                for &ctx in &self.contexts {
                    if ctx == 0 || ctx + CONTEXT_HEADROOM > max {
                        return Err(format!(
                            "context {ctx} is outside what config `small` can decode at: \
                             1..={} (max_position_embeddings {max} less {CONTEXT_HEADROOM} \
                             decode steps)",
                            max - CONTEXT_HEADROOM
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A named config.
pub fn config(name: &str) -> Result<ModelConfig, UnknownConfig> {
    match name {
        "tiny" => Ok(ModelConfig::tiny()),
        "small" => Ok(ModelConfig::small()),
        other => Err(UnknownConfig(other.to_string())),
    }
}

/// A bench config name that is neither tiny nor small.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown bench config `{0}` (known: tiny, small)")]
pub struct UnknownConfig(pub String);

/// Weights of a config generated from seed 0 (shared by every backend of a run).
pub fn weights(cfg: &ModelConfig) -> Result<HashMap<String, Tensor>, ModelError> {
    Ok(dsv4_model::tiny::generate_weights(cfg, 0)?
        .into_iter()
        .collect())
}

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut g = SplitMix64::new(seed);
    (0..n)
        .map(|_| 2 + g.below(vocab as u64 - 2) as u32)
        .collect()
}

/// Bytes of weights one decode token reads: every non-expert linear, the router, the shared
/// expert, `num_experts_per_tok` routed experts (their average size) and the head.
pub fn active_weight_bytes(model: &Model) -> usize {
    let k = model.cfg.num_experts_per_tok;
    let mut total = model.weights.head.stored_bytes();
    for b in &model.weights.layers {
        let a = &b.attn;
        let mut lins: Vec<&Linear> = vec![&a.wq_a, &a.wq_b, &a.wkv, &a.wo_b, &b.moe.gate];
        lins.extend(a.wo_a.iter());
        if let Some(c) = &a.compressor {
            lins.extend([&c.wkv, &c.wgate]);
        }
        if let Some(i) = &a.indexer {
            lins.extend([
                &i.wq_b,
                &i.weights_proj,
                &i.compressor.wkv,
                &i.compressor.wgate,
            ]);
        }
        let s = &b.moe.shared;
        lins.extend([&s.w1, &s.w2, &s.w3]);
        total += lins.iter().map(|l| l.stored_bytes()).sum::<usize>();
        let experts = &b.moe.experts;
        let per_expert: usize = experts
            .iter()
            .map(|e| e.w1.stored_bytes() + e.w2.stored_bytes() + e.w3.stored_bytes())
            .sum::<usize>()
            / experts.len().max(1);
        total += k * per_expert;
    }
    total
}

/// How a batch-16 decode is run on a device backend ([`decode_mode`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecodeMode {
    /// Activations in host memory (every op uploads and reads back) instead of resident.
    pub host: bool,
    /// Captured plans replayed (device graphs where the backend has them).
    pub captured: bool,
    /// Side streams (`exec.multi_stream_overlap`) on the serial executor, what
    /// `exec.executor = "auto"` runs them with on a device that has streams.
    pub side_streams: bool,
}

/// Decode steps each device mode measures after its warm-up: a fixed count, so every mode (and
/// every sibling of the placement A/B) runs the same positions and completes the same
/// compressor windows, and their traffic means are of the same steps.
pub(crate) const MODE_STEPS: usize = 12;

/// Captured plans, resident, one stream: what the placement A/B compares.
pub(crate) const CAPTURED: DecodeMode = DecodeMode {
    host: false,
    captured: true,
    side_streams: false,
};

/// Batch-16 decode throughput in `mode` (the median step of [`MODE_STEPS`] after a warm-up
/// step), and the mean device traffic (every counter) of those steps.
pub(crate) fn decode_mode(
    model: &Model,
    prompt_len: usize,
    mode: DecodeMode,
) -> Result<(f64, DeviceStats), dsv4_model::ForwardError> {
    let batch = 16;
    let v = model.cfg.vocab_size;
    let exec = ExecOptions {
        host_activations: mode.host,
        captured: mode.captured,
        overlap: mode.side_streams,
        executor: Executor::Serial,
        ..model.exec().clone()
    };
    let mut states: Vec<SequenceState> = (0..batch).map(|_| model.new_sequence()).collect();
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|s| tokens(prompt_len, v, 10 + s as u64))
        .collect();
    let step = |states: &mut [SequenceState], toks: Vec<&[u32]>| {
        let mut refs: Vec<&mut SequenceState> = states.iter_mut().collect();
        model.forward_step(&mut refs, &toks, LogitRows::All, &exec, &mut Taps::none())
    };
    step(&mut states, prompts.iter().map(|p| p.as_slice()).collect())?;
    let next = [5u32];
    let (mut total, mut ran) = (DeviceStats::default(), 0u64);
    let secs = median_secs(
        || {
            let (_, report) = step(&mut states, vec![&next[..]; batch]).expect("decode step");
            total = total.zip(&report.device.unwrap_or_default(), |a, b| a + b);
            ran += 1;
        },
        MODE_STEPS,
        MODE_STEPS,
        Duration::from_secs(3),
    );
    // Traffic varies by step (a compressor window completes every few steps): the mean.
    let n = ran.max(1);
    Ok((batch as f64 / secs, total.zip(&total, |a, _| a / n)))
}

fn prefill_chunks(
    model: &Model,
    st: &mut SequenceState,
    toks: &[u32],
    chunk: usize,
) -> Result<(), dsv4_model::ForwardError> {
    for c in toks.chunks(chunk) {
        model.forward(st, c)?;
    }
    Ok(())
}

/// Run the plan's cases for one config on one backend; `fast` = false (the reference) skips the
/// long-context runs and uses short prompts for the decode cases. A device backend's
/// `siblings` (each with one on-device path on the host) are measured against it
/// ([`crate::placement`]).
pub fn run(
    backend: Arc<dyn Backend>,
    cfg_name: &str,
    cfg: &ModelConfig,
    tensors: &HashMap<String, Tensor>,
    plan: &E2ePlan,
    fast: bool,
    siblings: &[crate::placement::Sibling],
) -> Result<(Vec<E2eResult>, usize), Box<dyn std::error::Error>> {
    let model = Model::load(cfg.clone(), tensors, backend.clone(), Numerics::default())?;
    let name = backend.name().to_string();
    let v = cfg.vocab_size;
    let mut out = Vec::new();
    let mut push = |metric: String, value: f64, unit| {
        eprintln!("  {name:<10} {cfg_name:<6} {metric:<36} {value:>10.2} {unit}");
        out.push(E2eResult {
            backend: name.clone(),
            config: cfg_name.to_string(),
            metric,
            value,
            unit,
        });
    };

    // Prefill throughput (one sequence, one call), computing the last row's logits as the
    // engine does; then the same prompt with every row's (what `prompt_logprobs` costs; run
    // second, so warm-up favours it).
    let toks = tokens(plan.prefill_tokens, v, 1);
    let stats = || backend.device().map(|d| d.stats());
    let exec = model.exec().clone();
    let prefill = |st: &mut SequenceState, rows: LogitRows<'_>| {
        let t0 = Instant::now();
        model
            .forward_step(&mut [st], &[&toks], rows, &exec, &mut Taps::none())
            .map(|_| plan.prefill_tokens as f64 / t0.elapsed().as_secs_f64())
    };
    let before = stats();
    let mut long = model.new_sequence();
    let last_row = prefill(&mut long, LogitRows::Last(&[1]))?;
    let after = stats();
    let every_row = prefill(&mut model.new_sequence(), LogitRows::All)?;
    push(
        format!("prefill {} tokens", plan.prefill_tokens),
        last_row,
        "tokens/s",
    );
    push(
        "  prefill: with every row's logits".to_string(),
        every_row,
        "tokens/s",
    );
    // What the prefill uploaded to a device (cache rows for attention and the indexer, and
    // operands): the host-to-device traffic a GPU pays over its bus.
    if let (Some(before), Some(after)) = (before, after) {
        push(
            "  prefill: MiB uploaded".to_string(),
            after.since(&before).write_bytes as f64 / (1024.0 * 1024.0),
            "MiB",
        );
        // Decode steps of that sequence: what one step at this context uploads (its cache
        // rows grow with the context unless the device keeps them).
        let before = stats();
        for t in tokens(PREFILL_DECODE_STEPS, v, 2) {
            model.forward(&mut long, &[t])?;
        }
        if let (Some(before), Some(after)) = (before, stats()) {
            push(
                format!(
                    "  decode at {} tokens: KiB uploaded/step",
                    plan.prefill_tokens
                ),
                after.since(&before).write_bytes as f64 / 1024.0 / PREFILL_DECODE_STEPS as f64,
                "KiB",
            );
        }
    }

    // Decode at batch 1 and 16 after a 64-token prompt each.
    // A slow backend (the reference) gets short prompts: the decode step, not the setup, is measured.
    let prompt_len = if fast { 64 } else { 8 };
    for batch in [1usize, 16] {
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|s| tokens(prompt_len, v, 10 + s as u64))
            .collect();
        let mut states: Vec<SequenceState> = (0..batch).map(|_| model.new_sequence()).collect();
        {
            let mut refs: Vec<&mut SequenceState> = states.iter_mut().collect();
            let slices: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
            model.forward_batch(&mut refs, &slices)?;
        }
        let next = [5u32];
        let step = median_secs(
            || {
                let mut refs: Vec<&mut SequenceState> = states.iter_mut().collect();
                let slices: Vec<&[u32]> = vec![&next[..]; batch];
                model
                    .forward_batch(&mut refs, &slices)
                    .expect("decode step");
            },
            4,
            16,
            Duration::from_secs(3),
        );
        push(
            format!("decode batch {batch}"),
            batch as f64 / step,
            "tokens/s",
        );
    }

    // A backend with device memory: the same batch-16 decode captured, with side streams, and
    // with activations in host memory (every op uploading and reading back), and what one step
    // costs in device traffic; side streams against one stream as a ratio of this run.
    if backend.device().is_some() {
        let mode = |host, captured, side_streams| DecodeMode {
            host,
            captured,
            side_streams,
        };
        let modes = [
            ("device-resident", mode(false, false, false)),
            ("captured", CAPTURED),
            ("captured, side streams", mode(false, true, true)),
            ("host activations", mode(true, false, false)),
        ];
        let mut rates = Vec::new();
        for (name, m) in modes {
            let (rate, traffic) = decode_mode(&model, prompt_len, m)?;
            push(format!("decode batch 16, {name}"), rate, "tokens/s");
            push_traffic(&mut push, name, &traffic);
            rates.push(rate);
        }
        push(
            "  side streams: speedup over one stream".into(),
            rates[2] / rates[1],
            "x",
        );
        crate::placement::run(&model, (cfg, tensors), siblings, prompt_len, &mut push)?;
    }

    // Decode time per token against context (fast backends only: it needs long prefills).
    if fast && cfg_name == "small" {
        for &ctx in &plan.contexts {
            let mut st = model.new_sequence();
            prefill_chunks(&model, &mut st, &tokens(ctx, v, 3), 1024)?;
            let step = median_secs(
                || {
                    model.forward(&mut st, &[7]).expect("decode step");
                },
                4,
                8,
                Duration::from_secs(2),
            );
            push(
                format!("decode ms/token at context {ctx}"),
                step * 1e3,
                "ms/token",
            );
        }
    }
    Ok((out, active_weight_bytes(&model)))
}

/// The rows of one decode mode's mean device traffic per step (`mode` names them): read-backs,
/// KiB each way, submissions, and on a device with graphs how much of a step replays.
pub(crate) fn push_traffic(
    push: &mut crate::placement::Push<'_>,
    mode: &str,
    traffic: &DeviceStats,
) {
    push(
        format!("  {mode}: read-backs/step (mean)"),
        traffic.reads as f64,
        "reads",
    );
    push(
        format!("  {mode}: KiB read back/step (mean)"),
        traffic.read_bytes as f64 / 1024.0,
        "KiB",
    );
    push(
        format!("  {mode}: KiB uploaded/step (mean)"),
        traffic.write_bytes as f64 / 1024.0,
        "KiB",
    );
    push(
        format!("  {mode}: submissions/step (mean)"),
        traffic.submissions as f64,
        "submits",
    );
    // Captured plans on a device with graphs (CUDA): how much of a step replays.
    if traffic.graph_launches > 0 {
        push(
            format!("  {mode}: graph launches/step (mean)"),
            traffic.graph_launches as f64,
            "graphs",
        );
        push(
            format!("  {mode}: kernels in graphs/step (mean)"),
            traffic.graph_kernels as f64,
            "kernels",
        );
        push(
            format!("  {mode}: kernels/step (mean)"),
            traffic.dispatches as f64,
            "kernels",
        );
    }
}

//! Quick throughput check of the cpu backend's products (not a test): GFLOP/s of a prefill-shaped
//! f32 GEMM and GB/s of 1-row GEMVs over quantized weights, next to a rough FMA peak and a
//! streaming-read bandwidth measured in the same run.
//!
//! Also end-to-end prefill of the tiny and small configs, cpu against reference.
//!
//! The products run with f64 sums and again with f32 sums (`backend.cpu_sums`), one after the
//! other, so the two are compared in the same run; the end-to-end prefill uses f64 sums.
//!
//! `cargo run --release -p dsv4-backend-cpu --example bench [threads] [filter]` (filters as
//! labelled, plus `gemv-l2` for L2-resident GEMVs and `gemv-experts` for many small cold ones)

use dsv4_backend_cpu::{CpuBackend, Sums};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::{Numerics, SplitMix64, Tensor};
use dsv4_kernels::{Backend, Linear, WeightFormat};
use dsv4_model::{Model, ModelConfig};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Seconds of one prefill of `tokens` tokens on a fresh sequence.
fn prefill_secs(
    cfg: &ModelConfig,
    weights: &HashMap<String, Tensor>,
    be: Arc<dyn Backend>,
    tokens: usize,
) -> f64 {
    let model = Model::load(cfg.clone(), weights, be, Numerics::default()).expect("model loads");
    let mut g = SplitMix64::new(5);
    let toks: Vec<u32> = (0..tokens)
        .map(|_| 2 + g.below(cfg.vocab_size as u64 - 2) as u32)
        .collect();
    let t = Instant::now();
    model
        .forward(&mut model.new_sequence(), &toks)
        .expect("forward runs");
    t.elapsed().as_secs_f64()
}

/// Prefill timings of one config: cpu at `long` tokens, cpu and reference at `short` tokens.
fn e2e(
    name: &str,
    cfg: ModelConfig,
    cpu: &Arc<dyn Backend>,
    short: usize,
    long: usize,
    with_reference: bool,
) {
    let weights: HashMap<String, Tensor> = dsv4_model::tiny::generate_weights(&cfg, 0)
        .expect("weights generate")
        .into_iter()
        .collect();
    let fast = prefill_secs(&cfg, &weights, cpu.clone(), short);
    let slow = if with_reference {
        prefill_secs(&cfg, &weights, Arc::new(ReferenceBackend), short)
    } else {
        f64::NAN
    };
    // Best of a few runs (more without the reference: that mode is for profiling).
    let runs = if with_reference { 2 } else { 6 };
    let fast_long = (0..runs)
        .map(|_| prefill_secs(&cfg, &weights, cpu.clone(), long))
        .fold(f64::INFINITY, f64::min);
    println!(
        "prefill {name}: {short} tokens cpu {:.1} ms, reference {:.1} ms ({:.0}x); {long} tokens cpu {:.1} ms ({:.0} tok/s)",
        fast * 1e3,
        slow * 1e3,
        slow / fast,
        fast_long * 1e3,
        long as f64 / fast_long
    );
}

fn random_linear(format: WeightFormat, n: usize, k: usize, seed: u64) -> Linear {
    let mut g = SplitMix64::new(seed);
    let mut bytes = |len: usize, f: &mut dyn FnMut(&mut SplitMix64) -> u8| -> Vec<u8> {
        (0..len).map(|_| f(&mut g)).collect()
    };
    let (data, scale) = match format {
        WeightFormat::F32 => (
            bytes(n * k * 4, &mut |g| g.below(256) as u8)
                .chunks(4)
                .flat_map(|_| 0.01f32.to_le_bytes())
                .collect(),
            vec![],
        ),
        WeightFormat::Bf16 => (
            bytes(n * k * 2, &mut |g| (g.below(64) as u8) | 0x3c),
            vec![],
        ),
        WeightFormat::Fp8Block => (
            bytes(n * k, &mut |g| {
                (g.below(0x7E) as u8) | (g.below(2) as u8) << 7
            }),
            bytes(n.div_ceil(128) * k.div_ceil(128), &mut |g| {
                120 + g.below(8) as u8
            }),
        ),
        WeightFormat::Mxfp4 => (
            bytes(n * k / 2, &mut |g| g.below(256) as u8),
            bytes(n * k / 32, &mut |g| 120 + g.below(8) as u8),
        ),
    };
    Linear::new("bench", n, k, format, data, scale).expect("sizes match the format")
}

/// This process's CPU time (user + system, all threads) in seconds, from /proc (Linux; 0
/// elsewhere). Resolution is one clock tick (10 ms), so callers time long loops.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    if f.len() < 13 {
        return 0.0;
    }
    (f[11] + f[12]) / 100.0
}

/// Timing of `f`: the best wall time of one call, and the CPU time per call over a loop of at
/// least half a second divided by `threads` (what an otherwise idle machine would show; the
/// machine these numbers come from is shared).
fn best(threads: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let (mut calls, mut best) = (0, f64::INFINITY);
    let (t0, c0) = (Instant::now(), cpu_secs());
    while calls < 3 || t0.elapsed().as_secs_f64() < 0.5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        calls += 1;
    }
    (best, (cpu_secs() - c0) / calls as f64 / threads as f64)
}

/// Streaming read bandwidth (GB/s) of `threads` threads summing a 512 MiB buffer.
fn read_bandwidth(threads: usize) -> f64 {
    let n = 128 << 20;
    let buf: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let chunk = n / threads;
    let (secs, _) = best(threads, || {
        std::thread::scope(|s| {
            for c in buf.chunks(chunk) {
                s.spawn(move || {
                    let mut acc = [0f32; 16];
                    for ch in c.chunks_exact(16) {
                        for (a, v) in acc.iter_mut().zip(ch) {
                            *a += v;
                        }
                    }
                    std::hint::black_box(acc);
                });
            }
        });
    });
    (n * 4) as f64 / secs / 1e9
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // Optional second argument: only run cases whose label contains it.
    let only = std::env::args().nth(2).unwrap_or_default();
    let be = CpuBackend::new(threads).expect("backend");
    let be32 = CpuBackend::new(threads)
        .expect("backend")
        .with_sums(Sums::F32);
    println!("cpu backend: {} threads, {:?}", be.threads(), be.isa());
    if only.is_empty() {
        println!("streaming read: {:.1} GB/s", read_bandwidth(be.threads()));
    }

    let (m, n, k) = (512, 4096, 4096);
    let mut g = SplitMix64::new(1);
    let x: Vec<f32> = (0..m * k).map(|_| g.uniform_sym(1.0)).collect();
    for fmt in [WeightFormat::F32, WeightFormat::Fp8Block] {
        if !format!("linear {fmt:?}").contains(&only) {
            continue;
        }
        let w = random_linear(fmt, n, k, 2);
        let mut out = vec![0f32; m * n];
        for be in [&be, &be32] {
            let (s, c) = best(be.threads(), || be.linear(&w, &x, m, &mut out));
            let gflops = |t: f64| 2.0 * (m * n * k) as f64 / t / 1e9;
            println!(
                "linear {fmt:?} {m}x{n}x{k}, {} sums: {:.1} ms, {:.1} GFLOP/s (by CPU time per \
                 thread: {:.1})",
                be.sums().name(),
                s * 1e3,
                gflops(s),
                gflops(c)
            );
        }
    }
    for fmt in [
        WeightFormat::Fp8Block,
        WeightFormat::Mxfp4,
        WeightFormat::Bf16,
    ] {
        if !format!("gemv {fmt:?} 1x 16x").contains(&only) {
            continue;
        }
        // Four copies (64 MiB of fp8) cycled through, so the weights come from memory, not L3.
        let ws: Vec<Linear> = (0..4).map(|i| random_linear(fmt, n, k, 3 + i)).collect();
        for rows in [1, 16] {
            if !format!("gemv {fmt:?} {rows}x").contains(&only) {
                continue;
            }
            let mut out = vec![0f32; rows * n];
            for be in [&be, &be32] {
                let mut i = 0;
                let (s, c) = best(be.threads(), || {
                    i = (i + 1) % ws.len();
                    be.linear(&ws[i], &x[..rows * k], rows, &mut out)
                });
                let gbs = |t: f64| ws[0].stored_bytes() as f64 / t / 1e9;
                println!(
                    "gemv {fmt:?} {rows}x{n}x{k}, {} sums: {:.3} ms, {:.1} GB/s of weights (by \
                     CPU time: {:.1})",
                    be.sums().name(),
                    s * 1e3,
                    gbs(s),
                    gbs(c)
                );
            }
        }
    }
    if only == "gemv-experts" {
        // Routed-expert-shaped 1-row products: many small weights (≥ 64 MiB in all), each read
        // once per pass, so every call starts cold like a decode step's experts.
        let (n, k) = (256, 1024);
        for fmt in [WeightFormat::Fp8Block, WeightFormat::Mxfp4] {
            let one = random_linear(fmt, n, k, 3).stored_bytes();
            let ws: Vec<Linear> = (0..(64 << 20) / one)
                .map(|i| random_linear(fmt, n, k, 3 + i as u64))
                .collect();
            let mut out = vec![0f32; n];
            for be in [&be, &be32] {
                let (s, _) = best(be.threads(), || {
                    for w in &ws {
                        be.linear(w, &x[..k], 1, &mut out);
                    }
                });
                let each = s / ws.len() as f64;
                println!(
                    "expert gemv {fmt:?} 1x{n}x{k} ({} weights), {} sums: {:.1} us/call, {:.1} \
                     GB/s of weights",
                    ws.len(),
                    be.sums().name(),
                    each * 1e6,
                    one as f64 / each / 1e9
                );
            }
        }
    }
    if only == "gemv-l2" {
        for fmt in [
            WeightFormat::Fp8Block,
            WeightFormat::Mxfp4,
            WeightFormat::Bf16,
        ] {
            let w = random_linear(fmt, 256, 2048, 3);
            let mut out = vec![0f32; 256];
            for be in [&be, &be32] {
                let (s, _) = best(1, || be.linear(&w, &x[..2048], 1, &mut out));
                println!(
                    "L2-resident gemv {fmt:?}, {} sums: {:.2} G elements/s",
                    be.sums().name(),
                    256.0 * 2048.0 / s / 1e9
                );
            }
        }
    }
    // "prefill" runs both configs, "prefill-cpu" the small one without the reference.
    if only.is_empty() || only.starts_with("prefill") {
        let cpu: Arc<dyn Backend> = Arc::new(be);
        if only.is_empty() || only == "prefill" {
            e2e("tiny", ModelConfig::tiny(), &cpu, 128, 512, true);
        }
        e2e(
            "small",
            ModelConfig::small(),
            &cpu,
            64,
            512,
            !only.ends_with("cpu"),
        );
    }
}

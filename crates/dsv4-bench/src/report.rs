//! The performance targets evaluated on one run, and the human table.

use crate::BenchReport;
use serde::Serialize;
use std::fmt::Write;

/// A target and what this run measured for it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is targeted.
    pub name: String,
    /// The target, in words.
    pub target: String,
    /// The measured value, in words (None when this run lacks the numbers).
    pub measured: Option<String>,
    /// Whether it is met (None when not measured).
    pub met: Option<bool>,
}

fn op(r: &BenchReport, backend: &str, case_prefix: &str) -> Option<(f64, f64)> {
    r.ops
        .iter()
        .find(|o| o.backend == backend && o.case.starts_with(case_prefix) && o.ms.is_some())
        .and_then(|o| Some((o.gflops?, o.gbs?)))
}

fn e2e(r: &BenchReport, backend: &str, config: &str, metric: &str) -> Option<f64> {
    r.e2e
        .iter()
        .find(|e| e.backend == backend && e.config == config && e.metric == metric)
        .map(|e| e.value)
}

/// Evaluate the targets of the fast-CPU issue on `r` (for the `cpu` backend).
pub fn targets(r: &BenchReport) -> Vec<Target> {
    let mut t = Vec::new();
    let mut add = |name: &str, target: &str, m: Option<(String, bool)>| {
        t.push(Target {
            name: name.into(),
            target: target.into(),
            measured: m.as_ref().map(|x| x.0.clone()),
            met: m.map(|x| x.1),
        })
    };
    let peak = r.machine.as_ref();
    add(
        "prefill-shape f32 GEMM (cpu)",
        ">= 70% of measured FMA peak",
        peak.zip(op(r, "cpu", "gemm_f32 prefill 512x4096"))
            .map(|(p, (gf, _))| {
                let f = gf / p.fma_gflops;
                (
                    format!("{gf:.1} GFLOP/s = {:.0}% of {:.1}", 100.0 * f, p.fma_gflops),
                    f >= 0.7,
                )
            }),
    );
    add(
        "decode GEMV over fp8 weights (cpu)",
        ">= 50% of measured read bandwidth",
        peak.zip(op(r, "cpu", "gemv_fp8 decode 4096x4096"))
            .map(|(p, (_, gb))| {
                let f = gb / p.read_gbs;
                (
                    format!("{gb:.1} GB/s = {:.0}% of {:.1}", 100.0 * f, p.read_gbs),
                    f >= 0.5,
                )
            }),
    );
    let metric = r
        .e2e
        .iter()
        .find(|e| e.config == "small" && e.metric.starts_with("prefill"))
        .map(|e| e.metric.clone());
    add(
        "small-config prefill, cpu vs reference",
        ">= 20x faster",
        metric
            .and_then(|m| e2e(r, "cpu", "small", &m).zip(e2e(r, "reference", "small", &m)))
            .map(|(c, re)| {
                let x = c / re;
                (format!("{x:.1}x ({c:.1} vs {re:.2} tokens/s)"), x >= 20.0)
            }),
    );
    let floor = r
        .active_weight_bytes
        .iter()
        .find(|(c, _)| c == "small")
        .map(|x| x.1);
    add(
        "small-config decode at batch 1 (cpu)",
        "within 2x of the floor (active weight bytes / read bandwidth)",
        peak.zip(floor)
            .zip(e2e(r, "cpu", "small", "decode batch 1"))
            .map(|((p, bytes), tps)| {
                let floor_ms = bytes as f64 / (p.read_gbs * 1e9) * 1e3;
                let ms = 1e3 / tps;
                (
                    format!(
                        "{ms:.2} ms/token vs floor {floor_ms:.2} ms ({:.1}x)",
                        ms / floor_ms
                    ),
                    ms <= 2.0 * floor_ms,
                )
            }),
    );
    let ctx: Vec<(usize, f64)> = r
        .e2e
        .iter()
        .filter(|e| e.backend == "cpu" && e.config == "small")
        .filter_map(|e| {
            e.metric
                .strip_prefix("decode ms/token at context ")
                .and_then(|c| c.parse().ok())
                .map(|c| (c, e.value))
        })
        .collect();
    add(
        "decode time vs context (cpu, small)",
        "grows sub-linearly (ms ratio < context ratio)",
        (ctx.len() >= 2).then(|| {
            let (c0, m0) = ctx[0];
            let (c1, m1) = ctx[ctx.len() - 1];
            let (mr, cr) = (m1 / m0, c1 as f64 / c0 as f64);
            (format!("{mr:.2}x time for {cr:.0}x context"), mr < cr)
        }),
    );
    t
}

/// A human-readable table of a report.
pub fn render_table(r: &BenchReport) -> String {
    let mut s = String::new();
    if let Some(m) = &r.machine {
        let _ = writeln!(
            s,
            "machine: {} threads, f32 FMA peak {:.1} GFLOP/s ({}; {:.1} on 1 thread; AVX2 {}), read {:.1} GB/s, triad {:.1} GB/s\n",
            m.threads,
            m.fma_gflops,
            m.fma_kernel,
            m.fma_gflops_1t,
            m.fma_gflops_avx2
                .map_or("n/a".to_string(), |g| format!("{g:.1}")),
            m.read_gbs,
            m.triad_gbs
        );
    }
    if !r.ops.is_empty() {
        let _ = writeln!(
            s,
            "{:<10} {:<45} {:>10} {:>10} {:>9}",
            "backend", "op case", "ms", "GFLOP/s", "GB/s"
        );
        for o in &r.ops {
            match (o.ms, o.gflops, o.gbs) {
                (Some(ms), Some(gf), Some(gb)) => {
                    let _ = writeln!(
                        s,
                        "{:<10} {:<45} {ms:>10.3} {gf:>10.2} {gb:>9.2}",
                        o.backend, o.case
                    );
                }
                _ => {
                    let _ = writeln!(
                        s,
                        "{:<10} {:<45} skipped: {}",
                        o.backend,
                        o.case,
                        o.skipped.as_deref().unwrap_or("")
                    );
                }
            }
        }
        s.push('\n');
    }
    if !r.e2e.is_empty() {
        let _ = writeln!(
            s,
            "{:<10} {:<6} {:<36} {:>12}",
            "backend", "config", "end to end", "value"
        );
        for e in &r.e2e {
            let _ = writeln!(
                s,
                "{:<10} {:<6} {:<36} {:>12.2} {}",
                e.backend, e.config, e.metric, e.value, e.unit
            );
        }
        s.push('\n');
    }
    for sv in &r.serving {
        let spec = &sv.spec;
        let _ = write!(
            s,
            "serving: {} prompt + {} generated tokens per request",
            spec.prompt_len, spec.max_tokens
        );
        if spec.shared_prefix > 0 {
            let on = if sv.config.in_batch_prefix_caching {
                "on"
            } else {
                "off"
            };
            let _ = write!(
                s,
                ", the first {} shared; in-batch prefix caching {on}",
                spec.shared_prefix
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<10} {:>11} {:>9} {:>12} {:>13} {:>12} {:>14}",
            "backend",
            "concurrency",
            "requests",
            "output tok/s",
            "mean TTFT ms",
            "mean TPOT ms",
            "cached tokens"
        );
        for l in &sv.levels {
            let _ = writeln!(
                s,
                "{:<10} {:>11} {:>9} {:>12.1} {:>13.1} {:>12.2} {:>14}",
                sv.backend,
                l.concurrency,
                l.completed,
                l.output_throughput,
                l.mean_ttft_ms,
                l.mean_tpot_ms,
                l.cached_tokens
            );
        }
        s.push('\n');
    }
    if !r.sampling.is_empty() {
        let _ = writeln!(
            s,
            "{:<48} {:>10} {:>10}",
            "token choice (per request, 129,280 logits)", "ms/token", "x greedy"
        );
        for c in &r.sampling {
            let _ = writeln!(s, "{:<48} {:>10.3} {:>10.1}", c.case, c.ms, c.vs_greedy);
        }
        s.push('\n');
    }
    let _ = writeln!(s, "targets (cpu backend with {} sums):", r.cpu_sums);
    for t in &r.targets {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
        let _ = writeln!(
            s,
            "  {:<42} {:<58} {:<8} {}",
            t.name,
            t.target,
            verdict,
            t.measured.as_deref().unwrap_or("-")
        );
    }
    s
}

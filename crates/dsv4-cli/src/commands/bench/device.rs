//! The device section of `dsv4 bench` for the CUDA backends: the device's own limits (copy
//! bandwidth, FMA and mma rates), the linear kernels timed on resident operands, the
//! attention-side kernels, as fractions of those limits, and a MoE layer with the routing on
//! the device against host-built groups (dsv4_backend_cuda::bench).

use dsv4_backend_cuda::bench::{DecodeSuggestion, DeviceBenchReport, MARGIN};
use dsv4_kernels::BackendOptions;
use serde::Serialize;

/// One CUDA backend's device measurements.
#[derive(Debug, Serialize)]
pub struct DeviceSection {
    /// Registry name (cuda-sm120 or cuda-emu).
    pub backend: String,
    /// What was measured.
    #[serde(flatten)]
    pub report: DeviceBenchReport,
}

/// Measure every CUDA backend among `backends`.
pub fn measure(backends: &[String], opts: &BackendOptions) -> anyhow::Result<Vec<DeviceSection>> {
    let mut out = Vec::new();
    for name in backends
        .iter()
        .filter(|b| [dsv4_backend_cuda::NAME, dsv4_backend_cuda::EMU_NAME].contains(&b.as_str()))
    {
        eprintln!(
            "measuring the {name} device (copy bandwidth, FMA and mma rates, linear kernels)…"
        );
        let backend = dsv4_backend_cuda::open_backend(name, opts)?;
        let report = dsv4_backend_cuda::bench::run(&backend)
            .map_err(|e| anyhow::anyhow!("{name} device bench: {e}"))?;
        out.push(DeviceSection {
            backend: name.clone(),
            report,
        });
    }
    Ok(out)
}

/// The device sections as Markdown tables.
pub fn render(sections: &[DeviceSection]) -> String {
    let mut s = String::new();
    for d in sections {
        let p = &d.report.peaks;
        let opt =
            |v: Option<f64>| v.map_or("not measured".to_string(), |v| format!("{v:.1} TFLOP/s"));
        s.push_str(&format!("\n### Device: {} on {}\n\n", d.backend, p.device));
        if p.emulated {
            s.push_str("(CPU emulator: these numbers only show that the path runs.)\n\n");
        }
        s.push_str("| device limit (same run) | value |\n|---|---|\n");
        s.push_str(&format!(
            "| copy bandwidth (read + write) | {:.1} GB/s |\n",
            p.copy_gbs
        ));
        s.push_str(&format!(
            "| SIMT f32 FMA | {:.2} TFLOP/s |\n",
            p.fma_f32_tflops
        ));
        s.push_str(&format!(
            "| SIMT f64 FMA | {:.2} TFLOP/s |\n",
            p.fma_f64_tflops
        ));
        s.push_str(&format!("| mma.sync bf16 | {} |\n", opt(p.mma_bf16_tflops)));
        s.push_str(&format!(
            "| mma.sync fp8 (e4m3) | {} |\n\n",
            opt(p.mma_fp8_tflops)
        ));
        s.push_str(
            "| case | kernels | ms (graph) | weight GB/s | of copy bandwidth | ms launched one by one | of copy bandwidth | TFLOP/s | of matrix rate | weight copies |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for t in &d.report.linear {
            // Without graph replays both columns are the launched timing.
            let graph = if t.graphed { "" } else { " (no graph)" };
            s.push_str(&format!(
                "| {} | {} | {:.4}{graph} | {:.1} | {:.0}% | {:.4} | {:.0}% | {:.2} | {} | {} |\n",
                t.case,
                t.shape
                    .as_ref()
                    .map_or(t.path.name().to_string(), |sh| format!(
                        "{} {sh}",
                        t.path.name()
                    )),
                t.seconds * 1e3,
                t.weight_gbs,
                t.of_copy_bandwidth * 100.0,
                t.launched_seconds * 1e3,
                t.launched_of_copy_bandwidth * 100.0,
                t.tflops,
                t.of_matrix_rate
                    .map_or("n/a".to_string(), |f| format!("{:.0}%", f * 100.0)),
                t.copies
            ));
        }
        if !d.report.decode_shapes.is_empty() {
            s.push_str(
                "\n| decode case | one-row kernel shape (cols a warp, warps a block) | ms (graph) | of copy bandwidth | speed over the backend's shape |\n\
                 |---|---|---:|---:|---:|\n",
            );
            for t in &d.report.decode_shapes {
                let mark = if t.selected { " (the backend's)" } else { "" };
                s.push_str(&format!(
                    "| {} | {}{mark} | {:.4} | {:.0}% | {:.2}x |\n",
                    t.case,
                    t.shape,
                    t.seconds * 1e3,
                    t.of_copy_bandwidth * 100.0,
                    t.speedup
                ));
            }
        }
        let sums = if p.f64_sums { "f64" } else { "f32" };
        if let Some(sg) = &d.report.decode_suggestion {
            s.push_str(&suggestion_line(sg, sums));
        }
        s.push_str(&format!(
            "\n| attention-side case ({sums} sums) | ms | 10^12 multiply-adds/s | of the {sums} FMA rate |\n\
             |---|---:|---:|---:|\n"
        ));
        for k in &d.report.kernels {
            s.push_str(&format!(
                "| {} | {:.4} | {:.3} | {:.0}% |\n",
                k.case,
                k.seconds * 1e3,
                k.tera_multiplies,
                k.of_fma_rate * 100.0
            ));
        }
        let r = &d.report.routing;
        s.push_str(&format!(
            "\n| MoE layer (device work only) | routing on the device, ms | of which routes, ms | host-built groups, ms | ratio |\n\
             |---|---:|---:|---:|---:|\n\
             | {} | {:.4} | {:.4} | {:.4} | {:.2}x |\n",
            r.case,
            r.device_seconds * 1e3,
            r.route_seconds * 1e3,
            r.host_grouped_seconds * 1e3,
            r.ratio
        ));
    }
    s
}

/// The decode shapes the bench suggests pinning with `sums` ("f64"/"f32"), and why, as a
/// markdown paragraph.
fn suggestion_line(sg: &DecodeSuggestion, sums: &str) -> String {
    let why: Vec<String> = sg
        .formats
        .iter()
        .map(|f| {
            let each = if f.cases == 1 {
                "its case".to_string()
            } else {
                format!("each of its {} cases", f.cases)
            };
            if f.shape == f.current {
                let closest = f.runner_up.as_ref().map_or(String::new(), |r| {
                    format!(
                        "; the closest, {}, ran its slowest case at {:.2}x",
                        r.shape, r.worst_speedup
                    )
                });
                format!(
                    "{}: {} kept (no other shape ran {each} {MARGIN:.2}x as fast or more{closest})",
                    f.format, f.current
                )
            } else {
                format!(
                    "{}: {}, at least {:.2}x {}'s speed in {each}",
                    f.format, f.shape, f.worst_speedup, f.current
                )
            }
        })
        .collect();
    format!(
        "\nDecode kernel shapes to pin on this device with {sums} sums: \
         `--set backend.cuda_decode={}` ({}).\n",
        sg.cuda_decode,
        why.join("; ")
    )
}

//! Quick throughput check of the cpu backend's products (not a test): GFLOP/s of a prefill-shaped
//! f32 GEMM and GB/s of 1-row GEMVs over quantized weights, next to a rough FMA peak and a
//! streaming-read bandwidth measured in the same run.
//!
//! `cargo run --release -p dsv4-backend-cpu --example bench [threads]`

use dsv4_backend_cpu::CpuBackend;
use dsv4_core::SplitMix64;
use dsv4_kernels::{Backend, Linear, WeightFormat};
use std::time::Instant;

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

/// Best of `reps` timings of `f`, in seconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Streaming read bandwidth (GB/s) of `threads` threads summing a 512 MiB buffer.
fn read_bandwidth(threads: usize) -> f64 {
    let n = 128 << 20;
    let buf: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let chunk = n / threads;
    let secs = best(3, || {
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
    println!("cpu backend: {} threads, {:?}", be.threads(), be.isa());
    if only.is_empty() {
        println!("streaming read: {:.1} GB/s", read_bandwidth(be.threads()));
    }

    let (m, n, k) = (512, 4096, 4096);
    let mut g = SplitMix64::new(1);
    let x: Vec<f32> = (0..m * k).map(|_| g.uniform_sym(1.0)).collect();
    for fmt in [WeightFormat::F32, WeightFormat::Fp8Block] {
        let w = random_linear(fmt, n, k, 2);
        if !format!("linear {fmt:?}").contains(&only) {
            continue;
        }
        let mut out = vec![0f32; m * n];
        let s = best(3, || be.linear(&w, &x, m, &mut out));
        let gflops = 2.0 * (m * n * k) as f64 / s / 1e9;
        println!(
            "linear {fmt:?} {m}x{n}x{k}: {:.1} ms, {gflops:.1} GFLOP/s",
            s * 1e3
        );
    }
    for fmt in [
        WeightFormat::Fp8Block,
        WeightFormat::Mxfp4,
        WeightFormat::Bf16,
    ] {
        let w = random_linear(fmt, n, k, 3);
        for rows in [1, 16] {
            if !format!("gemv {fmt:?} {rows}x").contains(&only) {
                continue;
            }
            let mut out = vec![0f32; rows * n];
            let s = best(20, || be.linear(&w, &x[..rows * k], rows, &mut out));
            let gbs = w.stored_bytes() as f64 / s / 1e9;
            println!(
                "gemv {fmt:?} {rows}x{n}x{k}: {:.3} ms, {gbs:.1} GB/s of weights",
                s * 1e3
            );
        }
    }
}

//! Machine limits measured in the same run as every benchmark: f32 FMA peak and memory bandwidth.
//! Benchmark numbers are reported as fractions of these, never against a datasheet.

use serde::Serialize;
use std::time::Instant;

/// Measured limits of this machine.
#[derive(Debug, Clone, Serialize)]
pub struct MachinePeaks {
    /// Threads used for the measurements.
    pub threads: usize,
    /// f32 FMA throughput with independent accumulator chains, GFLOP/s (2 flops per FMA), with
    /// the widest vector unit the CPU has.
    pub fma_gflops: f64,
    /// The same with 256-bit AVX2 vectors (None when the CPU lacks AVX2+FMA).
    pub fma_gflops_avx2: Option<f64>,
    /// Single-thread FMA throughput, GFLOP/s.
    pub fma_gflops_1t: f64,
    /// Streaming read bandwidth (sum of a large buffer), GB/s.
    pub read_gbs: f64,
    /// Triad `a[i] = b[i] + s·c[i]` bandwidth, GB/s (3 streams counted).
    pub triad_gbs: f64,
    /// Which FMA kernel gave `fma_gflops` ("avx512f", "avx2+fma" or "portable").
    pub fma_kernel: &'static str,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    // 10 independent chains of 8 lanes hide the FMA latency (4–5 cycles × 2 ports).
    let mut acc = [_mm256_set1_ps(0.0); 10];
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm256_fmadd_ps(*v, a, b);
        }
    }
    let mut out = [0f32; 8];
    let mut s = _mm256_set1_ps(0.0);
    for v in acc {
        s = _mm256_add_ps(s, v);
    }
    // SAFETY: out has 8 f32 slots.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
    out.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_avx512(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(0.0); 10];
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    let mut s = _mm512_set1_ps(0.0);
    for v in acc {
        s = _mm512_add_ps(s, v);
    }
    _mm512_reduce_add_ps(s)
}

/// The FMA kernels, widest last.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FmaIsa {
    Portable,
    Avx2,
    Avx512,
}

impl FmaIsa {
    fn name(self) -> &'static str {
        match self {
            FmaIsa::Portable => "portable",
            FmaIsa::Avx2 => "avx2+fma",
            FmaIsa::Avx512 => "avx512f",
        }
    }

    /// FLOPs of one iteration of the kernel.
    fn flops_per_iter(self) -> f64 {
        match self {
            FmaIsa::Portable => 16.0 * 2.0,
            FmaIsa::Avx2 => 10.0 * 8.0 * 2.0,
            FmaIsa::Avx512 => 10.0 * 16.0 * 2.0,
        }
    }
}

fn fma_loop_portable(iters: u64) -> f32 {
    let mut acc = [0f32; 16];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = v.mul_add(0.999_999, 1e-7);
        }
    }
    acc.iter().sum()
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn fma_run(iters: u64, isa: FmaIsa) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the CPU supports the kernel's features (checked by `measure`).
        FmaIsa::Avx512 => return unsafe { fma_loop_avx512(iters) },
        // SAFETY: as above.
        FmaIsa::Avx2 => return unsafe { fma_loop_avx2(iters) },
        FmaIsa::Portable => {}
    }
    let _ = isa;
    fma_loop_portable(iters)
}

/// FMA GFLOP/s with `threads` threads each running the kernel for `iters` iterations.
fn fma_gflops(threads: usize, iters: u64, isa: FmaIsa) -> f64 {
    let t0 = Instant::now();
    let sink: f32 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| s.spawn(move || fma_run(iters, isa)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    });
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    threads as f64 * iters as f64 * isa.flops_per_iter() / secs / 1e9
}

/// Read bandwidth: each thread sums its share of `buf`.
fn read_gbs(buf: &[f32], threads: usize, reps: usize) -> f64 {
    let chunk = buf.len().div_ceil(threads);
    let t0 = Instant::now();
    for _ in 0..reps {
        let total: f32 = std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(chunk)
                .map(|c| {
                    s.spawn(move || {
                        let mut acc = [0f32; 16];
                        for blk in c.chunks_exact(16) {
                            for (a, v) in acc.iter_mut().zip(blk) {
                                *a += v;
                            }
                        }
                        acc.iter().sum::<f32>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        std::hint::black_box(total);
    }
    (buf.len() * 4 * reps) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// Triad bandwidth a = b + s·c over `threads` threads (three streams counted).
fn triad_gbs(a: &mut [f32], b: &[f32], c: &[f32], threads: usize, reps: usize) -> f64 {
    let chunk = a.len().div_ceil(threads);
    let t0 = Instant::now();
    for _ in 0..reps {
        std::thread::scope(|s| {
            for ((ac, bc), cc) in a
                .chunks_mut(chunk)
                .zip(b.chunks(chunk))
                .zip(c.chunks(chunk))
            {
                s.spawn(move || {
                    for ((x, y), z) in ac.iter_mut().zip(bc).zip(cc) {
                        *x = y + 1.5 * z;
                    }
                });
            }
        });
        std::hint::black_box(&a[0]);
    }
    (a.len() * 4 * 3 * reps) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// Measure the machine with `threads` threads (0 = all cores). Takes about two seconds.
pub fn measure(threads: usize) -> MachinePeaks {
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    let avx2 = has_avx2_fma();
    let widest = if has_avx512() {
        FmaIsa::Avx512
    } else if avx2 {
        FmaIsa::Avx2
    } else {
        FmaIsa::Portable
    };
    let iters = if widest == FmaIsa::Portable {
        10_000_000
    } else {
        20_000_000
    };
    // Warm up, then take the best of three (the figure is a ceiling, so the max is the estimate).
    fma_gflops(threads, iters / 10, widest);
    let best = |f: &dyn Fn() -> f64| (0..3).map(|_| f()).fold(0f64, f64::max);
    let fma = best(&|| fma_gflops(threads, iters, widest));
    let fma1 = best(&|| fma_gflops(1, iters, widest));
    let fma_avx2 = match widest {
        FmaIsa::Avx2 => Some(fma),
        FmaIsa::Avx512 if avx2 => Some(best(&|| fma_gflops(threads, iters, FmaIsa::Avx2))),
        _ => None,
    };
    let n = 64 << 20; // 64 Mi f32 = 256 MiB per buffer, far beyond the caches.
    let b: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let c: Vec<f32> = (0..n).map(|i| (i % 5) as f32).collect();
    let mut a = vec![0f32; n];
    let read = best(&|| read_gbs(&b, threads, 2));
    let triad = (0..3)
        .map(|_| triad_gbs(&mut a, &b, &c, threads, 1))
        .fold(0f64, f64::max);
    MachinePeaks {
        threads,
        fma_gflops: fma,
        fma_gflops_avx2: fma_avx2,
        fma_gflops_1t: fma1,
        read_gbs: read,
        triad_gbs: triad,
        fma_kernel: widest.name(),
    }
}

//! Timing the device bench's calls: wall-clock around a batch of launches and one
//! synchronize after a warm-up, the median of several batches; launched one by one from the
//! host, or replayed as one CUDA graph.

use crate::{CudaError, Device};
use std::time::{Duration, Instant};

/// How long a timing keeps the device busy with the timed calls before it measures them on a
/// GPU, so no timing starts at an idle GPU's clock (an H200 idles at 345 MHz, runs at 1980).
/// On the H200 run of 2026-12-04 the GPU was already at its running clock after the bench's
/// uploads (cold and warm timings agreed within 2%); the warm-up keeps that from depending on
/// a GPU's power management.
const WARM_UP: Duration = Duration::from_millis(100);

/// Run `batch` (one batch of calls and a synchronize) until the device has been busy with it
/// for [`WARM_UP`]; once on the emulator.
fn warm_up(
    dev: &Device,
    mut batch: impl FnMut() -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    let emulated = dev.info().emulated;
    let t = Instant::now();
    batch()?;
    while !emulated && t.elapsed() < WARM_UP {
        batch()?;
    }
    Ok(())
}

/// The median over `batches` runs of `batch` of its seconds divided by `calls` (the calls one
/// batch makes): seconds per call.
fn median_per_call(
    batches: usize,
    calls: usize,
    mut batch: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let mut v = Vec::with_capacity(batches.max(1));
    for _ in 0..batches.max(1) {
        let t = Instant::now();
        batch()?;
        v.push(t.elapsed().as_secs_f64() / calls.max(1) as f64);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// Median seconds per call of `f` (which issues one call's launches), over `batches` batches of
/// `per_batch` calls each, after the device has been warmed up with them (`WARM_UP`).
pub fn time_launches(
    dev: &Device,
    per_batch: usize,
    batches: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let mut batch = || -> Result<(), CudaError> {
        for _ in 0..per_batch.max(1) {
            f()?;
        }
        dev.synchronize()
    };
    warm_up(dev, &mut batch)?;
    median_per_call(batches, per_batch, batch)
}

/// A linear case's two timings: each call launched from the host, and the calls replayed back
/// to back as one CUDA graph.
#[derive(Debug, Clone, Copy)]
pub struct CallTimes {
    /// Median seconds per call with each launch issued from the host (`time_op`): the host's
    /// per-launch cost included whenever it exceeds the kernel's time.
    pub launched: f64,
    /// Median seconds per call with the calls replayed as one CUDA graph (`time_graphed`):
    /// the device's time for back-to-back kernels, as a captured plan runs them. None when the
    /// calls did not replay as a graph.
    pub graphed: Option<f64>,
}

/// Median seconds per call of `calls` calls (`f(i)` issues call i's launches), replayed as one
/// CUDA graph `batches` times: the calls are recorded under a graph span (`Device::graphs`),
/// seen once, built into a graph the second time, replayed until the device is warm
/// (`WARM_UP`), then each timed batch is one graph launch and a synchronize. None when the
/// batches did not run as graph launches (a driver that refused to build the graph, or fewer
/// than two launches).
pub(crate) fn time_graphed(
    dev: &Device,
    batches: usize,
    calls: usize,
    mut f: impl FnMut(usize) -> Result<(), CudaError>,
) -> Result<Option<f64>, CudaError> {
    dev.graphs(true)?;
    let timed = graphed_batches(dev, batches, calls, &mut f);
    // The span is closed whatever happened, so the device is left issuing launches directly.
    let closed = dev.graphs(false);
    let seconds = timed?;
    closed?;
    Ok(seconds)
}

fn graphed_batches(
    dev: &Device,
    batches: usize,
    calls: usize,
    f: &mut impl FnMut(usize) -> Result<(), CudaError>,
) -> Result<Option<f64>, CudaError> {
    let calls = calls.max(1);
    let mut batch = || -> Result<(), CudaError> {
        for i in 0..calls {
            f(i)?;
        }
        dev.synchronize()
    };
    // Seen, then built into a graph, then replayed until the device is warm.
    batch()?;
    batch()?;
    warm_up(dev, &mut batch)?;
    let before = dev.graph_stats().graph_launches;
    let seconds = median_per_call(batches, calls, batch)?;
    if dev.graph_stats().graph_launches < before + batches.max(1) as u64 {
        return Ok(None);
    }
    Ok(Some(seconds))
}

/// [`time_launches`] with the op timings' batches: 20 calls each on a GPU, 1 on the emulator.
pub(crate) fn time_op(
    dev: &Device,
    batches: usize,
    f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let per_batch = if dev.info().emulated { 1 } else { 20 };
    time_launches(dev, per_batch, batches, f)
}

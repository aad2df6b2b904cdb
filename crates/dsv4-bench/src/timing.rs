//! Repeat-and-take-the-median timing, with a time budget per case.

use std::time::{Duration, Instant};

/// Run `f` once to warm up, then repeatedly until `budget` is spent (at least `min_reps`, at most
/// `max_reps` runs); return the median seconds of one run.
pub fn median_secs(mut f: impl FnMut(), min_reps: usize, max_reps: usize, budget: Duration) -> f64 {
    f();
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < min_reps || (times.len() < max_reps && start.elapsed() < budget) {
        let t0 = Instant::now();
        f();
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

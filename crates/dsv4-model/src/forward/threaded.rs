//! The threaded executor: one thread per stream, each running its stream's launches in issue
//! order and waiting only for the events a launch names. It is correct only for plans without
//! hazards, so it refuses any plan the verifier does not pass.

use super::ForwardError;
use super::run::Run;
use dsv4_plan::render;
use std::sync::{Condvar, Mutex};

/// Events recorded so far, and the first error of any stream.
struct Shared {
    recorded: Vec<bool>,
    failed: Option<ForwardError>,
}

/// Verify the run's plan, then run it on one thread per stream.
pub(crate) fn run_threaded(run: &Run<'_>) -> Result<(), ForwardError> {
    let plan = run.plan;
    let verdict = dsv4_plan::verify(plan).map_err(|e| ForwardError::Plan {
        message: e.to_string(),
    })?;
    if let Some(f) = verdict.findings.first() {
        return Err(ForwardError::Plan {
            message: format!(
                "the threaded executor runs only plans the verifier passes; this one has {} \
                 finding(s), the first:\n{}",
                verdict.findings.len(),
                render::finding(f)
            ),
        });
    }
    let shared = Mutex::new(Shared {
        recorded: vec![false; plan.events.len()],
        failed: None,
    });
    let cv = Condvar::new();
    let lock = || shared.lock().unwrap_or_else(|e| e.into_inner());
    std::thread::scope(|scope| {
        for stream in 0..plan.streams.len() {
            let (shared_lock, cv) = (&lock, &cv);
            scope.spawn(move || {
                let mine: Vec<usize> = (0..plan.launches.len())
                    .filter(|&i| plan.launches[i].stream.0 as usize == stream)
                    .collect();
                for (k, &i) in mine.iter().enumerate() {
                    let l = &plan.launches[i];
                    let mut g = shared_lock();
                    while g.failed.is_none() && !l.waits.iter().all(|e| g.recorded[e.0 as usize]) {
                        g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                    if g.failed.is_some() {
                        return;
                    }
                    drop(g);
                    let result = run.launch(i, &mine[k + 1..]);
                    let mut g = shared_lock();
                    match result {
                        Ok(()) => l
                            .records
                            .iter()
                            .for_each(|e| g.recorded[e.0 as usize] = true),
                        Err(e) => {
                            g.failed.get_or_insert(e);
                        }
                    }
                    drop(g);
                    cv.notify_all();
                }
                // This thread issued on a device stream: back to the default queue.
                if let Some(st) = run.device_streams() {
                    st.leave();
                }
            });
        }
    });
    match shared
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .failed
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

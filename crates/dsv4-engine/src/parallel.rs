//! Spreading a step's per-row host work — choosing tokens, scoring log-probabilities — over
//! scoped threads. Every item is computed alone, the same way on any thread, so results do
//! not depend on the thread count; at DSV4's 129,280 logits a choice costs up to a few
//! milliseconds, which for a batch of sampled requests would otherwise run back to back on the
//! step thread.

use std::sync::{Mutex, PoisonError};

/// Logits one thread should have to go through before another is worth starting (about
/// 0.1 ms of work, well above the cost of starting a thread).
pub(crate) const LOGITS_PER_THREAD: usize = 1 << 17;

/// Threads for `items` units of work of `logits` logits each: `configured` when non-zero,
/// else one per [`LOGITS_PER_THREAD`] logits, at most the machine's cores; never more than the
/// items, at least one.
pub(crate) fn threads_for(configured: usize, items: usize, logits: usize) -> usize {
    let t = if configured > 0 {
        configured
    } else {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (items.saturating_mul(logits) / LOGITS_PER_THREAD).clamp(1, cores)
    };
    t.min(items).max(1)
}

/// Apply `f` to every item, over `threads` contiguous chunks (the calling thread takes the
/// first; a chunk whose thread cannot be started runs on the calling thread).
pub(crate) fn for_each_mut<T: Send>(items: &mut [T], threads: usize, f: impl Fn(&mut T) + Sync) {
    if threads <= 1 || items.len() <= 1 {
        items.iter_mut().for_each(f);
        return;
    }
    let chunk = items.len().div_ceil(threads);
    let cells: Vec<Mutex<&mut [T]>> = items.chunks_mut(chunk).map(Mutex::new).collect();
    let run = |c: &Mutex<&mut [T]>| {
        let mut c = c.lock().unwrap_or_else(PoisonError::into_inner);
        c.iter_mut().for_each(&f);
    };
    std::thread::scope(|s| {
        let mut inline = vec![&cells[0]];
        for c in &cells[1..] {
            let started = std::thread::Builder::new()
                .name("dsv4-choose".into())
                .spawn_scoped(s, move || run(c));
            if started.is_err() {
                tracing::warn!("could not start a token-choice thread; choosing inline");
                inline.push(c);
            }
        }
        inline.into_iter().for_each(run);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_done_once_in_place_whatever_the_thread_count() {
        for threads in [1, 2, 3, 7, 64] {
            let mut items: Vec<(usize, usize)> = (0..23).map(|i| (i, 0)).collect();
            for_each_mut(&mut items, threads, |(i, out)| *out += *i * 10 + 1);
            assert!(
                items.iter().all(|&(i, out)| out == i * 10 + 1),
                "{threads} threads: {items:?}"
            );
        }
    }

    #[test]
    fn threads_follow_the_work_unless_configured() {
        assert_eq!(threads_for(0, 1, 1 << 20), 1, "one item, one thread");
        assert_eq!(
            threads_for(0, 64, 384),
            1,
            "a tiny vocabulary is not worth a thread"
        );
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(threads_for(0, 64, 129_280), cores.min(63));
        assert_eq!(threads_for(4, 64, 384), 4, "configured");
        assert_eq!(threads_for(4, 3, 384), 3, "never more than the items");
        assert_eq!(threads_for(4, 0, 384), 1);
    }
}

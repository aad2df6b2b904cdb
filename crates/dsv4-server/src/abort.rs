//! Aborting generations by request id (SGLang's `POST /abort_request`): every run in flight is
//! registered under its id and its request's id ([`AbortRegistry::register`]); an abort marks
//! the matching runs and cancels their engine requests, and each such run then ends with the
//! output it had (finish reason `abort`) instead of an error.

use dsv4_engine::{EngineHandle, RequestId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// One registered run.
#[derive(Debug)]
struct Entry {
    /// The run's own id (an output's `meta_info.id`).
    id: String,
    /// Its request's id (all choices of one request share it).
    group: String,
    engine_id: RequestId,
    aborted: Arc<AtomicBool>,
}

/// The runs in flight, by registration number.
#[derive(Debug, Default)]
pub struct AbortRegistry {
    entries: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
}

/// A run's registration: removed when dropped; says whether the run was aborted.
#[derive(Debug)]
pub struct AbortGuard {
    registry: Weak<AbortRegistry>,
    key: u64,
    aborted: Arc<AtomicBool>,
}

impl AbortGuard {
    /// Whether an abort named this run.
    pub fn aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Mark the run aborted (a replayed run whose search an abort stopped).
    pub fn mark_aborted(&self) {
        self.aborted.store(true, Ordering::SeqCst);
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if let Some(r) = self.registry.upgrade() {
            r.lock().remove(&self.key);
        }
    }
}

impl AbortRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register the run of engine request `engine_id`, known as `id`, of the request `group`.
    pub fn register(
        self: &Arc<Self>,
        id: String,
        group: String,
        engine_id: RequestId,
    ) -> AbortGuard {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let aborted = Arc::new(AtomicBool::new(false));
        self.lock().insert(
            key,
            Entry {
                id,
                group,
                engine_id,
                aborted: Arc::clone(&aborted),
            },
        );
        AbortGuard {
            registry: Arc::downgrade(self),
            key,
            aborted,
        }
    }

    /// Abort the runs whose id or request id is `rid` (every run with `None`): mark them and
    /// cancel their engine requests. Returns how many runs were aborted.
    pub fn abort(&self, rid: Option<&str>, engine: &EngineHandle) -> usize {
        let entries = self.lock();
        let mut count = 0;
        for e in entries.values() {
            if rid.is_none_or(|r| e.id == r || e.group == r) {
                e.aborted.store(true, Ordering::SeqCst);
                engine.cancel(e.engine_id);
                count += 1;
            }
        }
        count
    }

    /// Runs aborted that have not ended yet.
    pub fn aborting(&self) -> usize {
        self.lock()
            .values()
            .filter(|e| e.aborted.load(Ordering::SeqCst))
            .count()
    }

    /// Runs registered now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no run is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

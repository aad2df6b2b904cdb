//! Compiled grammars kept for reuse (`server.grammar_cache`): a service that constrains every
//! request with the same JSON schema, tool set or regex compiles it once. Keyed by the whole
//! constraint grammar (thinking mode and tool markers included), so two requests share an
//! entry only when their grammars are the same text. Failures are kept too: a request that
//! repeats a grammar that cannot compile is refused without compiling it again. Grammars whose
//! text is over [`MAX_KEY_BYTES`] are not kept, so the cache holds at most that much text an
//! entry, whatever a request's body carries.
//!
//! A grammar being compiled is in flight: requests with the same grammar that arrive
//! meanwhile wait for that compile's result instead of compiling it again (also with the
//! cache off), so a burst of sessions sharing one new tool set costs one compile, not one a
//! core. When the request leading a compile goes before its compile starts, one of those
//! waiting takes over.

use dsv4_engine::Constraint;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Longest grammar text (schemas and tools included) the cache keeps: a request body may be
/// megabytes, and a kept grammar stays until it is the least recently used.
pub(crate) const MAX_KEY_BYTES: usize = 1 << 20;

/// What compiling a grammar gave.
pub(crate) type Compiled = Result<Constraint, String>;

/// Up to `capacity` compiled grammars; the least recently used goes first.
pub(crate) struct GrammarCache {
    capacity: usize,
    inner: Mutex<Inner>,
    flights: Flights,
}

/// Grammars being compiled, by key: each one's result, once there.
type Flights = Arc<Mutex<HashMap<String, watch::Receiver<Option<Compiled>>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a request finds its grammar.
pub(crate) enum Lookup {
    /// Kept from an earlier compile.
    Hit(Compiled),
    /// Another request is compiling it: wait for [`Follower::result`].
    Follow(Follower),
    /// Nobody has it: compile it and give the result to [`GrammarCache::finish`].
    Lead(Lead),
}

/// A request waiting for another's compile of its grammar.
pub(crate) struct Follower(watch::Receiver<Option<Compiled>>);

impl Follower {
    /// The compile's result; `None` when its leader went without one (look up again).
    pub(crate) async fn result(mut self) -> Option<Compiled> {
        match self.0.wait_for(Option::is_some).await {
            Ok(got) => got.clone(),
            Err(_) => None,
        }
    }
}

/// The right and duty to compile one grammar: [`GrammarCache::finish`] publishes the result;
/// dropped without it, the flight ends and its followers look up again.
pub(crate) struct Lead {
    key: String,
    tx: watch::Sender<Option<Compiled>>,
    flights: Flights,
}

impl Drop for Lead {
    fn drop(&mut self) {
        lock(&self.flights).remove(&self.key);
    }
}

struct Inner {
    /// Key → (last use, result).
    entries: HashMap<String, (u64, Compiled)>,
    clock: u64,
}

impl GrammarCache {
    /// A cache of `capacity` grammars (0 keeps none).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                clock: 0,
            }),
            flights: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// The kept result for `key`, the compile in flight to wait for, or the lead of a new one.
    pub(crate) fn lookup(&self, key: &str) -> Lookup {
        let mut flights = lock(&self.flights);
        // Looked at under the flights lock: `finish` keeps a result before its flight ends,
        // so a grammar is either kept or in flight from the first compile on.
        if let Some(c) = self.get(key) {
            return Lookup::Hit(c);
        }
        if let Some(rx) = flights.get(key) {
            return Lookup::Follow(Follower(rx.clone()));
        }
        let (tx, rx) = watch::channel(None);
        flights.insert(key.to_owned(), rx);
        Lookup::Lead(Lead {
            key: key.to_owned(),
            tx,
            flights: Arc::clone(&self.flights),
        })
    }

    /// Keeps `compiled` for `lead`'s grammar and hands it to the requests waiting for it.
    pub(crate) fn finish(&self, lead: Lead, compiled: Compiled) {
        self.put(lead.key.clone(), compiled.clone());
        lead.tx.send_replace(Some(compiled));
    }

    /// How many grammars are being compiled.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.flights).len()
    }

    /// The result kept for `key`, if any (it becomes the most recently used).
    pub(crate) fn get(&self, key: &str) -> Option<Compiled> {
        if self.capacity == 0 || key.len() > MAX_KEY_BYTES {
            return None;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        inner.entries.get_mut(key).map(|(used, c)| {
            *used = now;
            c.clone()
        })
    }

    /// Keep `compiled` for `key`, dropping the least recently used entry when full.
    pub(crate) fn put(&self, key: String, compiled: Compiled) {
        if self.capacity == 0 || key.len() > MAX_KEY_BYTES {
            return;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        if !inner.entries.contains_key(&key) && inner.entries.len() >= self.capacity {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                inner.entries.remove(&k);
            }
        }
        inner.entries.insert(key, (now, compiled));
    }

    /// How many grammars it holds.
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammars_over_the_key_limit_are_not_kept() {
        let cache = GrammarCache::new(4);
        let small = "s".repeat(MAX_KEY_BYTES);
        let big = "b".repeat(MAX_KEY_BYTES + 1);
        cache.put(small.clone(), Err("small".into()));
        cache.put(big.clone(), Err("big".into()));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get(&small).unwrap().err().unwrap(), "small");
        assert!(cache.get(&big).is_none());
    }
}

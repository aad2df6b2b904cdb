//! Compiled grammars kept for reuse (`server.grammar_cache`): a service that constrains every
//! request with the same JSON schema, tool set or regex compiles it once. Keyed by the whole
//! constraint grammar (thinking mode and tool markers included), so two requests share an
//! entry only when their grammars are the same text. Failures are kept too: a request that
//! repeats a grammar that cannot compile is refused without compiling it again. Grammars whose
//! text is over [`MAX_KEY_BYTES`] are not kept, so the cache holds at most that much text an
//! entry, whatever a request's body carries.

use dsv4_engine::Constraint;
use std::collections::HashMap;
use std::sync::Mutex;

/// Longest grammar text (schemas and tools included) the cache keeps: a request body may be
/// megabytes, and a kept grammar stays until it is the least recently used.
pub(crate) const MAX_KEY_BYTES: usize = 1 << 20;

/// What compiling a grammar gave.
pub(crate) type Compiled = Result<Constraint, String>;

/// Up to `capacity` compiled grammars; the least recently used goes first.
pub(crate) struct GrammarCache {
    capacity: usize,
    inner: Mutex<Inner>,
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
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
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

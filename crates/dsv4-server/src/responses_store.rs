//! Stored responses of `/v1/responses` (`store`, the default): what `previous_response_id`
//! continues and `GET`/`DELETE /v1/responses/{id}` read. In memory, at most
//! `server.responses_store` responses; the oldest goes first. A stored response holds its own
//! turn (the request's input and the answer) and shares its predecessor's, so a long chain
//! costs its text once; a response still reachable from a newer one stays alive with it.

use crate::api::responses_input::ChatMessages;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// One stored response.
#[derive(Debug)]
pub struct Stored {
    /// The response object as answered.
    pub response: Value,
    /// The response it continued, if any.
    pub previous: Option<Arc<Stored>>,
    /// Its own turn: the request's input as chat messages, then the answer's assistant turn.
    pub turn: ChatMessages,
    /// The request's input items as given (a string as one user message), each with an `id`.
    pub input_items: Vec<Value>,
}

impl Stored {
    /// The whole conversation up to and including this response, oldest turn first.
    pub fn conversation(&self) -> ChatMessages {
        let mut chain = vec![self];
        let mut at = self;
        while let Some(prev) = &at.previous {
            chain.push(prev);
            at = prev;
        }
        let mut out = ChatMessages::default();
        for s in chain.into_iter().rev() {
            out.extend(&s.turn);
        }
        out
    }
}

/// The stored responses by id.
#[derive(Debug)]
pub struct ResponseStore {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<String, Arc<Stored>>,
    /// Ids, oldest first (may name deleted ones, skipped on eviction).
    order: VecDeque<String>,
}

impl ResponseStore {
    /// A store of at most `capacity` responses (0: nothing is stored).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Whether responses are stored at all.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// The most responses kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep `stored` as `id`, dropping the oldest past the capacity.
    pub fn insert(&self, id: String, stored: Stored) {
        if !self.enabled() {
            return;
        }
        let mut inner = self.lock();
        inner.order.push_back(id.clone());
        inner.by_id.insert(id, Arc::new(stored));
        while inner.by_id.len() > self.capacity {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            inner.by_id.remove(&old);
        }
        // Deleted ids left in `order` are dropped once they outnumber the live ones.
        if inner.order.len() > 2 * self.capacity {
            let Inner { by_id, order } = &mut *inner;
            order.retain(|id| by_id.contains_key(id));
        }
    }

    /// The response `id`, if it is stored.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.lock().by_id.get(id).cloned()
    }

    /// Forget `id`; whether it was stored.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().by_id.remove(id).is_some()
    }

    /// How many responses are stored.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    /// Whether none is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_chat::pyjson::OrderedJson;

    fn turn(text: &str) -> ChatMessages {
        let mut m = ChatMessages::default();
        m.push(OrderedJson::String(text.into()), "input");
        m
    }

    #[test]
    fn keeps_the_newest_and_chains_conversations() {
        let store = ResponseStore::new(2);
        store.insert(
            "a".into(),
            Stored {
                response: Value::Null,
                previous: None,
                turn: turn("1"),
                input_items: Vec::new(),
            },
        );
        let a = store.get("a").unwrap();
        store.insert(
            "b".into(),
            Stored {
                response: Value::Null,
                previous: Some(a),
                turn: turn("2"),
                input_items: Vec::new(),
            },
        );
        let b = store.get("b").unwrap();
        store.insert(
            "c".into(),
            Stored {
                response: Value::Null,
                previous: Some(b),
                turn: turn("3"),
                input_items: Vec::new(),
            },
        );
        assert!(store.get("a").is_none(), "the oldest is dropped");
        assert_eq!(store.len(), 2);
        let conv = store.get("c").unwrap().conversation();
        let texts: Vec<_> = conv.messages.iter().map(|m| m.as_str().unwrap()).collect();
        assert_eq!(
            texts,
            ["1", "2", "3"],
            "a dropped predecessor still backs its chain"
        );
        assert!(store.remove("b"));
        assert!(!store.remove("b"));
        assert_eq!(store.len(), 1);
        for k in 0..10 {
            store.insert(
                format!("x{k}"),
                Stored {
                    response: Value::Null,
                    previous: None,
                    turn: turn("x"),
                    input_items: Vec::new(),
                },
            );
        }
        assert_eq!(store.len(), 2);
        assert!(store.get("x9").is_some() && store.get("x8").is_some());
        assert!(store.lock().order.len() <= 4);
    }

    #[test]
    fn capacity_zero_stores_nothing() {
        let store = ResponseStore::new(0);
        store.insert(
            "a".into(),
            Stored {
                response: Value::Null,
                previous: None,
                turn: turn("1"),
                input_items: Vec::new(),
            },
        );
        assert!(store.is_empty() && !store.enabled());
    }
}

//! Stored responses of `/v1/responses` (`store`, the default): what `previous_response_id`
//! continues and `GET`/`DELETE /v1/responses/{id}` read. In memory, at most
//! `server.responses_store` responses and `server.responses_store_mib` of their own JSON and
//! text; the oldest goes first. A stored response holds its own turn (the request's input and
//! the answer) and shares its predecessor's, so a long chain costs its text once; a response
//! still reachable from a newer one stays alive with it (a chain's text is bounded by the
//! context it had to fit). Background responses still running are kept apart
//! ([`ResponseStore::start_background`]) until they finish and are stored.

use crate::api::responses::{ContentPart, OutputItem};
use crate::api::responses_input::ChatMessages;
use crate::responses_background::Background;
use crate::responses_disk::{Disk, DiskFile};
use dsv4_chat::pyjson::OrderedJson;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
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
    pub input_items: Arc<Vec<Value>>,
    /// A background response created with `stream`: its events, to replay.
    pub events: Option<Arc<Background>>,
    /// Its file under `server.responses_dir` (the store sets it when it writes one).
    pub file: Option<DiskFile>,
}

impl Stored {
    /// About how many bytes it holds of its own: the response's JSON, its turn's messages, its
    /// input items and its kept events (predecessors not counted).
    pub fn own_bytes(&self) -> usize {
        let turn: usize = self
            .turn
            .messages
            .iter()
            .map(|m| m.to_python_json().len())
            .sum();
        let items: usize = self.input_items.iter().map(|i| i.to_string().len()).sum();
        let response = self.response.to_string().len();
        // The last event, recorded just after the response is stored, repeats the response.
        let events = self
            .events
            .as_ref()
            .map_or(0, |bg| bg.event_bytes() + response);
        response + turn + items + events
    }

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
    max_bytes: usize,
    inner: Mutex<Inner>,
    /// `server.responses_dir`: where they are also written, to survive a restart.
    disk: Option<Arc<Disk>>,
}

impl Drop for ResponseStore {
    fn drop(&mut self) {
        // The server stops: the responses it drops now stay on disk for the next start.
        if let Some(d) = &self.disk {
            d.close();
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Each response with its [`Stored::own_bytes`].
    by_id: HashMap<String, (Arc<Stored>, usize)>,
    /// Ids, oldest first (may name deleted ones, skipped on eviction).
    order: VecDeque<String>,
    /// The sum of the stored responses' own bytes.
    bytes: usize,
    /// Background responses still running, by id.
    running: HashMap<String, Arc<Background>>,
}

/// A response found by id: still running in the background, or stored.
#[derive(Debug, Clone)]
pub enum Found {
    /// A background response not finished yet.
    Running(Arc<Background>),
    /// A finished, stored response.
    Stored(Arc<Stored>),
}

impl ResponseStore {
    /// A store of at most `capacity` responses (0: nothing is stored) holding at most
    /// `max_bytes` of their own.
    pub fn new(capacity: usize, max_bytes: usize) -> Self {
        Self {
            capacity,
            max_bytes,
            inner: Mutex::new(Inner::default()),
            disk: None,
        }
    }

    /// A store as [`Self::new`] that also keeps its responses in `dir` (created if missing),
    /// starting with those a previous run left there ([`crate::responses_disk`]); the files it
    /// could not read back are named in the second value.
    pub fn open(
        capacity: usize,
        max_bytes: usize,
        dir: &Path,
    ) -> std::io::Result<(Self, Vec<String>)> {
        let disk = Disk::open(dir)?;
        let read = disk.read()?;
        let mut store = Self::new(capacity, max_bytes);
        store.disk = Some(disk);
        for (id, stored) in read.listed {
            let size = stored.own_bytes();
            store.keep(id, stored, size);
        }
        Ok((store, read.skipped))
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

    /// Keep `stored` as `id`, dropping the oldest past the capacity or the byte budget. A
    /// response bigger than the whole budget is not kept; returns whether it was.
    pub fn insert(&self, id: String, mut stored: Stored) -> bool {
        let size = stored.own_bytes();
        if !self.enabled() || size > self.max_bytes {
            return false;
        }
        if let Some(disk) = &self.disk
            && disk.save(&id, &stored, true)
        {
            stored.file = Some(disk.file(&id));
        }
        self.keep(id, Arc::new(stored), size);
        true
    }

    /// Hold `stored` (of `size` own bytes) as `id`, dropping the oldest past the limits.
    fn keep(&self, id: String, stored: Arc<Stored>, size: usize) {
        let mut inner = self.lock();
        inner.order.push_back(id.clone());
        inner.bytes += size;
        if let Some((old, replaced)) = inner.by_id.insert(id, (stored, size)) {
            inner.bytes -= replaced;
            self.unlist(&old);
        }
        while inner.by_id.len() > self.capacity || inner.bytes > self.max_bytes {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some((gone, freed)) = inner.by_id.remove(&old) {
                inner.bytes -= freed;
                self.unlist(&gone);
            }
        }
        // Deleted ids left in `order` are dropped once they outnumber the live ones.
        if inner.order.len() > 2 * self.capacity {
            let Inner { by_id, order, .. } = &mut *inner;
            order.retain(|id| by_id.contains_key(id));
        }
    }

    /// `stored` is no longer found by id: a newer response (or a request running) that still
    /// continues it keeps its file, marked unlisted; otherwise its file goes with it.
    fn unlist(&self, stored: &Arc<Stored>) {
        if let (Some(disk), Some(file)) = (&self.disk, &stored.file)
            && Arc::strong_count(stored) > 1
        {
            disk.save(file.id(), stored, false);
        }
    }

    /// The response `id`, if it is stored.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.lock().by_id.get(id).map(|(s, _)| Arc::clone(s))
    }

    /// Forget `id`; whether it was stored.
    pub fn remove(&self, id: &str) -> bool {
        let mut inner = self.lock();
        match inner.by_id.remove(id) {
            Some((gone, freed)) => {
                inner.bytes -= freed;
                self.unlist(&gone);
                true
            }
            None => false,
        }
    }

    /// Hold the background response `id` until it finishes (`end_background`). At most
    /// `capacity` run at once, since each will be stored: past that, `Err` with how many run.
    pub fn start_background(&self, id: String, bg: Arc<Background>) -> Result<(), usize> {
        let mut inner = self.lock();
        if inner.running.len() >= self.capacity {
            return Err(inner.running.len());
        }
        inner.running.insert(id, bg);
        Ok(())
    }

    /// The background response `id` finished (and was stored, if it could be).
    pub fn end_background(&self, id: &str) {
        self.lock().running.remove(id);
        // Its last event is recorded now: write its file again with every event.
        if let (Some(disk), Some(stored)) = (&self.disk, self.get(id))
            && stored.file.is_some()
            && stored.events.as_ref().is_some_and(|bg| bg.keeps_events())
        {
            disk.save(id, &stored, true);
        }
    }

    /// How many background responses run now.
    pub fn running(&self) -> usize {
        self.lock().running.len()
    }

    /// The response `id`: a background one still running, or a stored one.
    pub fn find(&self, id: &str) -> Option<Found> {
        let inner = self.lock();
        if let Some(bg) = inner.running.get(id) {
            return Some(Found::Running(Arc::clone(bg)));
        }
        inner
            .by_id
            .get(id)
            .map(|(s, _)| Found::Stored(Arc::clone(s)))
    }

    /// The stored responses' own bytes.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
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

/// An answer's assistant turn (its output items), as the chat message the stored conversation
/// continues from: the message text, the reasoning, the calls with their `call_id`s.
pub fn assistant_turn(items: &[OutputItem]) -> OrderedJson {
    let (mut content, mut reasoning, mut calls) = (String::new(), None::<String>, Vec::new());
    for item in items {
        match item {
            OutputItem::Message { content: parts, .. } => {
                if let Some(ContentPart::OutputText { text, .. }) = parts.first() {
                    content.push_str(text);
                }
            }
            OutputItem::Reasoning { content: parts, .. } => {
                if let Some(ContentPart::ReasoningText { text }) = parts.first() {
                    reasoning.get_or_insert_default().push_str(text);
                }
            }
            OutputItem::FunctionCall {
                call_id,
                name,
                arguments,
                ..
            } => calls.push(OrderedJson::Object(vec![
                ("id".into(), OrderedJson::String(call_id.clone())),
                ("type".into(), OrderedJson::String("function".into())),
                (
                    "function".into(),
                    OrderedJson::Object(vec![
                        ("name".into(), OrderedJson::String(name.clone())),
                        ("arguments".into(), OrderedJson::String(arguments.clone())),
                    ]),
                ),
            ])),
        }
    }
    let mut fields = vec![
        ("role".to_string(), OrderedJson::String("assistant".into())),
        ("content".to_string(), OrderedJson::String(content)),
    ];
    if let Some(r) = reasoning {
        fields.push(("reasoning_content".into(), OrderedJson::String(r)));
    }
    if !calls.is_empty() {
        fields.push(("tool_calls".into(), OrderedJson::Array(calls)));
    }
    OrderedJson::Object(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored response with no answer object, continuing `previous`, whose turn is `text`.
    fn stored(previous: Option<Arc<Stored>>, text: &str) -> Stored {
        Stored {
            response: Value::Null,
            previous,
            turn: turn(text),
            input_items: Arc::default(),
            events: None,
            file: None,
        }
    }

    fn turn(text: &str) -> ChatMessages {
        let mut m = ChatMessages::default();
        m.push(OrderedJson::String(text.into()), "input");
        m
    }

    #[test]
    fn keeps_the_newest_and_chains_conversations() {
        let store = ResponseStore::new(2, usize::MAX);
        store.insert("a".into(), stored(None, "1"));
        let a = store.get("a").unwrap();
        store.insert("b".into(), stored(Some(a), "2"));
        let b = store.get("b").unwrap();
        store.insert("c".into(), stored(Some(b), "3"));
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
            store.insert(format!("x{k}"), stored(None, "x"));
        }
        assert_eq!(store.len(), 2);
        assert!(store.get("x9").is_some() && store.get("x8").is_some());
        assert!(store.lock().order.len() <= 4);
    }

    #[test]
    fn capacity_zero_stores_nothing() {
        let store = ResponseStore::new(0, usize::MAX);
        store.insert("a".into(), stored(None, "1"));
        assert!(store.is_empty() && !store.enabled());
    }

    #[test]
    fn the_assistant_turn_holds_text_reasoning_and_calls() {
        let text = |t: &str| ContentPart::OutputText {
            text: t.into(),
            annotations: Vec::new(),
            logprobs: None,
        };
        let items = [
            OutputItem::Reasoning {
                id: "rs_1".into(),
                summary: Vec::new(),
                content: vec![ContentPart::ReasoningText {
                    text: "think".into(),
                }],
                status: "completed",
            },
            OutputItem::Message {
                id: "msg_1".into(),
                status: "completed",
                role: "assistant",
                content: vec![text("hi")],
            },
            OutputItem::FunctionCall {
                id: "fc_1".into(),
                call_id: "call_1".into(),
                name: "get".into(),
                arguments: "{\"a\": 1}".into(),
                status: "completed",
            },
        ];
        let turn = assistant_turn(&items);
        assert_eq!(
            turn.to_value(),
            serde_json::json!({"role": "assistant", "content": "hi", "reasoning_content": "think",
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": "get", "arguments": "{\"a\": 1}"}}]})
        );
        let m = dsv4_chat::Message::from_ordered(0, &turn).unwrap();
        assert_eq!(m.tool_calls[0].id.as_deref(), Some("call_1"));
        let plain = assistant_turn(&items[1..2]).to_value();
        assert_eq!(
            plain,
            serde_json::json!({"role": "assistant", "content": "hi"})
        );
    }

    #[test]
    fn the_byte_budget_drops_the_oldest_and_refuses_a_giant() {
        let stored = |text: &str| Stored {
            response: Value::String(text.into()),
            previous: None,
            turn: turn(text),
            input_items: Arc::default(),
            events: None,
            file: None,
        };
        let one = stored(&"a".repeat(100)).own_bytes();
        assert!(one > 200, "the response and the turn both count: {one}");
        let store = ResponseStore::new(100, 2 * one + 10);
        assert!(store.insert("a".into(), stored(&"a".repeat(100))));
        assert!(store.insert("b".into(), stored(&"b".repeat(100))));
        assert_eq!(store.bytes(), 2 * one);
        assert!(store.insert("c".into(), stored(&"c".repeat(100))));
        assert!(store.get("a").is_none(), "over the budget, the oldest goes");
        assert_eq!(store.bytes(), 2 * one);
        assert!(!store.insert("big".into(), stored(&"x".repeat(1000))));
        assert!(store.get("big").is_none() && store.get("b").is_some());
        assert!(store.remove("b"));
        assert_eq!(store.bytes(), one);
    }

    #[test]
    fn background_responses_run_apart_within_the_capacity() {
        let store = ResponseStore::new(1, usize::MAX);
        let bg = |events| {
            Arc::new(Background::new(
                serde_json::json!({"status": "queued"}),
                events,
                Arc::default(),
            ))
        };
        let running = bg(true);
        store
            .start_background("a".into(), Arc::clone(&running))
            .unwrap();
        assert_eq!(store.start_background("b".into(), bg(false)), Err(1));
        assert!(matches!(store.find("a"), Some(Found::Running(_))));
        assert!(store.get("a").is_none(), "not stored while it runs");

        running.record(
            "response.created",
            &serde_json::json!({"sequence_number": 0}),
        );
        let stored = Stored {
            response: Value::String("done".into()),
            previous: None,
            turn: turn("1"),
            input_items: Arc::default(),
            events: Some(Arc::clone(&running)),
            file: None,
        };
        let plain = Stored {
            events: None,
            ..stored_copy(&stored)
        };
        assert_eq!(
            stored.own_bytes(),
            plain.own_bytes() + running.event_bytes() + "\"done\"".len(),
            "kept events count, and the last event repeats the response"
        );
        assert!(store.insert("a".into(), stored));
        store.end_background("a");
        assert!(matches!(store.find("a"), Some(Found::Stored(_))));
        assert_eq!(store.running(), 0);
        store.start_background("b".into(), bg(false)).unwrap();
        assert!(store.find("zzz").is_none());
    }

    fn stored_copy(s: &Stored) -> Stored {
        Stored {
            response: s.response.clone(),
            previous: s.previous.clone(),
            turn: s.turn.clone(),
            input_items: Arc::clone(&s.input_items),
            events: s.events.clone(),
            file: None,
        }
    }
}

//! Stored responses of `/v1/responses` (`store`, the default): what `previous_response_id`
//! continues and `GET`/`DELETE /v1/responses/{id}` read. In memory, at most
//! `server.responses_store` responses; the oldest goes first. A stored response holds its own
//! turn (the request's input and the answer) and shares its predecessor's, so a long chain
//! costs its text once; a response still reachable from a newer one stays alive with it.

use crate::api::responses::{ContentPart, OutputItem};
use crate::api::responses_input::ChatMessages;
use dsv4_chat::pyjson::OrderedJson;
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
}

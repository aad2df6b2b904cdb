//! Background responses of `/v1/responses` (`"background": true`): the request is answered at
//! once with the response `queued` and runs on without its connection. A [`Background`] is
//! what clients see of it meanwhile: its response object as of now (`GET
//! /v1/responses/{id}` polls it; finished items appear as they close), and, when it was created
//! with `"stream": true`, every stream event so far, which `GET /v1/responses/{id}?stream=true
//! &starting_after=N` replays from event `N + 1` and then follows live. A finished background
//! response is stored like any other, its events with it (on disk too, with
//! `server.responses_dir`, written once its last event is recorded).

use serde_json::Value;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// One background response: its latest response object, its events when they are kept, and a
/// signal that wakes whoever waits for a change.
#[derive(Debug)]
pub struct Background {
    inner: Mutex<Inner>,
    /// Bumped on every change.
    version: watch::Sender<u64>,
    /// Whether its events are kept.
    keeps_events: bool,
    /// Its input items as given (`GET /v1/responses/{id}/input_items` while it runs).
    input_items: Arc<Vec<Value>>,
}

#[derive(Debug)]
struct Inner {
    /// The response object as of now.
    response: Value,
    /// The stream events so far, `(type, data)` as sent, indexed by sequence number (none
    /// when not kept: created without `stream`).
    events: Vec<(String, String)>,
    /// The events' bytes.
    bytes: usize,
    /// Whether the response finished (its last event recorded, its response final).
    done: bool,
}

/// Events from some point on, and whether they are the last ones.
#[derive(Debug, Default)]
pub struct EventsFrom {
    /// `(type, data)` of each event.
    pub events: Vec<(String, String)>,
    /// The response finished and no event comes after these.
    pub done: bool,
}

impl Background {
    /// A background response now `response` (queued), keeping its events when `keep_events`.
    pub fn new(response: Value, keep_events: bool, input_items: Arc<Vec<Value>>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                response,
                events: Vec::new(),
                bytes: 0,
                done: false,
            }),
            version: watch::Sender::new(0),
            keeps_events: keep_events,
            input_items,
        }
    }

    /// A finished background response read back from disk: `response`, with its kept
    /// `events` (`(type, data)` in sequence order) to replay.
    pub fn restored(
        response: Value,
        events: Vec<(String, String)>,
        input_items: Arc<Vec<Value>>,
    ) -> Self {
        let bytes = events.iter().map(|(k, d)| k.len() + d.len()).sum();
        Self {
            inner: Mutex::new(Inner {
                response,
                events,
                bytes,
                done: true,
            }),
            version: watch::Sender::new(0),
            keeps_events: true,
            input_items,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Whether its stream events are kept.
    pub fn keeps_events(&self) -> bool {
        self.keeps_events
    }

    /// Record the next event (its sequence number is its index), if events are kept.
    pub fn record(&self, kind: &str, body: &Value) {
        if !self.keeps_events {
            return;
        }
        let data = body.to_string();
        let mut inner = self.lock();
        inner.bytes += kind.len() + data.len();
        inner.events.push((kind.to_string(), data));
        drop(inner);
        self.changed();
    }

    /// Its response object is now `response` (still running).
    pub fn update(&self, response: Value) {
        self.lock().response = response;
        self.changed();
    }

    /// It finished as `response`; no event comes after those recorded.
    pub fn finish(&self, response: Value) {
        let mut inner = self.lock();
        inner.response = response;
        inner.done = true;
        drop(inner);
        self.changed();
    }

    /// Its response object as of now.
    pub fn response(&self) -> Value {
        self.lock().response.clone()
    }

    /// Whether it finished.
    pub fn is_done(&self) -> bool {
        self.lock().done
    }

    /// Its input items.
    pub fn input_items(&self) -> &Arc<Vec<Value>> {
        &self.input_items
    }

    /// The bytes of its kept events.
    pub fn event_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The events from index `start` on (none when events are not kept).
    pub fn events_from(&self, start: usize) -> EventsFrom {
        let inner = self.lock();
        let events = inner.events.get(start..).unwrap_or_default().to_vec();
        EventsFrom {
            events,
            done: inner.done,
        }
    }

    /// A receiver that sees every change after this call.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Wait until it finished.
    pub async fn wait_done(&self) {
        let mut rx = self.subscribe();
        while !self.is_done() {
            // The sender lives as long as `self`, so this cannot fail while we wait.
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn records_replays_and_wakes_waiters() {
        let bg = Arc::new(Background::new(
            json!({"status": "queued"}),
            true,
            Arc::new(Vec::new()),
        ));
        bg.record("response.created", &json!({"sequence_number": 0}));
        bg.record("response.in_progress", &json!({"sequence_number": 1}));
        let from1 = bg.events_from(1);
        assert_eq!(from1.events.len(), 1);
        assert_eq!(from1.events[0].0, "response.in_progress");
        assert!(!from1.done);
        assert!(bg.events_from(5).events.is_empty(), "past the end: nothing");
        assert!(bg.event_bytes() > 0);

        let mut rx = bg.subscribe();
        let waiter = tokio::spawn({
            let bg = Arc::clone(&bg);
            async move {
                bg.wait_done().await;
                bg.response()
            }
        });
        bg.update(json!({"status": "in_progress"}));
        rx.changed().await.unwrap();
        assert_eq!(bg.response()["status"], "in_progress");
        bg.record("response.completed", &json!({"sequence_number": 2}));
        bg.finish(json!({"status": "completed"}));
        assert_eq!(waiter.await.unwrap()["status"], "completed");
        let all = bg.events_from(0);
        assert!(all.done);
        assert_eq!(all.events.len(), 3);
    }

    #[test]
    fn without_events_nothing_is_kept() {
        let bg = Background::new(json!({}), false, Arc::new(Vec::new()));
        bg.record("response.created", &json!({}));
        assert!(!bg.keeps_events());
        assert!(bg.events_from(0).events.is_empty());
        assert_eq!(bg.event_bytes(), 0);
    }
}

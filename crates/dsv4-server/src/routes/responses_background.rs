//! Background responses on the wire: [`start`] answers `"background": true` at once (the
//! response `queued`, or its event stream) and runs the answer in its own task, which no
//! disconnect cancels; [`Follower`] streams a background response's kept events from a
//! sequence number on and follows it live (`GET /v1/responses/{id}?stream=true
//! &starting_after=N`); [`cancel`] (`POST /v1/responses/{id}/cancel`) aborts one and answers
//! it as it ended. See [`crate::responses_background`].

use super::responses_output::{ResponseOutput, ToStore};
use super::{EventSource, json_response, loaded_model, sse_response};
use crate::error::ApiError;
use crate::responses_background::Background;
use crate::responses_store::Found;
use crate::run::Run;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::response::sse::Event as SseEvent;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::watch;

/// Run the response `id` in the background: register it, start its task, and answer the
/// queued response (or, with `stream`, its events as they come).
pub(super) fn start(
    state: &AppState,
    id: String,
    output: ResponseOutput,
    run: Run,
    stored: ToStore,
    stream: bool,
) -> Result<Response, ApiError> {
    let queued = output.snapshot("queued");
    let bg = Arc::new(Background::new(
        queued.clone(),
        stream,
        Arc::clone(&stored.input_items),
    ));
    state
        .responses()
        .start_background(id.clone(), Arc::clone(&bg))
        .map_err(|running| {
            ApiError::too_many_requests(format!(
                "{running} background responses are running, as many as the server keeps \
                 (server.responses_store); wait for one to finish or cancel one (POST \
                 /v1/responses/{{id}}/cancel)"
            ))
            .with_param("background")
            .with_code("too_many_background_responses")
        })?;
    tracing::info!(%id, stream, "background response started");
    let guard = Running {
        state: state.clone(),
        id,
        bg: Arc::clone(&bg),
        _interactive: state.interactive().begin(),
    };
    tokio::spawn(drive(
        guard,
        output.in_background(Arc::clone(&bg)),
        run,
        stored,
    ));
    if stream {
        Ok(sse_response(Follower::new(bg, 0)))
    } else {
        Ok(json_response(&queued))
    }
}

/// A running background response's registration: when its task ends, however it ends, the
/// response is marked finished (failed, if nothing finished it) and leaves the running set.
struct Running {
    state: AppState,
    id: String,
    bg: Arc<Background>,
    /// It counts as an interactive request until its task ends, not only until the POST is
    /// answered, so batch lines do not fill the slots beside it (`server.batch_fill_idle_ms`).
    _interactive: crate::batch::Interactive,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.bg.is_done() {
            let mut r = self.bg.response();
            r["status"] = json!("failed");
            r["error"] = json!({"code": "server_error", "type": "server_error",
                "message": "the background response stopped before it finished"});
            self.bg.finish(r);
            tracing::error!(id = %self.id, "background response stopped before it finished");
        }
        self.state.responses().end_background(&self.id);
    }
}

/// The task of one background response: run it to the end, recording events, updating its
/// polled response as items close, storing it finished.
async fn drive(guard: Running, mut output: ResponseOutput, mut run: Run, stored: ToStore) {
    let bg = &guard.bg;
    output.start();
    bg.update(output.snapshot("in_progress"));
    let mut stored = Some(stored);
    loop {
        let closed = output.closed();
        match run.next().await {
            Ok(mut step) => {
                let finished = step.finished.take();
                output.step(step);
                if let Some(f) = finished {
                    let (_, response) = output.finish(&f, stored.take());
                    tracing::info!(id = %guard.id, status = %response["status"],
                        "background response finished");
                    bg.finish(response);
                    break;
                }
                if output.closed() != closed {
                    bg.update(output.snapshot("in_progress"));
                }
            }
            Err(e) => {
                let (_, response) = output.failed(&e, stored.take());
                tracing::warn!(id = %guard.id, error = %e.message, "background response failed");
                bg.finish(response);
                break;
            }
        }
    }
}

/// A background response's kept events from a sequence number on, then live until it ends
/// (a client that goes away cancels nothing).
pub(super) struct Follower {
    bg: Arc<Background>,
    next: usize,
    rx: watch::Receiver<u64>,
    done: bool,
}

impl Follower {
    /// Follow `bg` from event `next` on.
    pub(super) fn new(bg: Arc<Background>, next: usize) -> Self {
        let rx = bg.subscribe();
        Self {
            bg,
            next,
            rx,
            done: false,
        }
    }
}

impl EventSource for Follower {
    async fn next_events(&mut self) -> Vec<SseEvent> {
        loop {
            let from = self.bg.events_from(self.next);
            if !from.events.is_empty() || from.done {
                self.next += from.events.len();
                self.done = from.done;
                return from
                    .events
                    .into_iter()
                    .map(|(kind, data)| SseEvent::default().event(kind).data(data))
                    .collect();
            }
            if self.rx.changed().await.is_err() {
                self.done = true;
                return Vec::new();
            }
        }
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

/// Stream the events of `found` after event `starting_after` (from the first without it).
pub(super) fn follow(
    id: &str,
    found: Found,
    starting_after: Option<usize>,
) -> Result<Response, ApiError> {
    let bg = match found {
        Found::Running(bg) => Some(bg),
        Found::Stored(s) => s.events.clone(),
    };
    let bg = bg.filter(|bg| bg.keeps_events()).ok_or_else(|| {
        ApiError::bad_param(
            "stream",
            format!(
                "response {id} has no events kept: only a background response created with \
                 \"stream\": true keeps them; GET it without stream"
            ),
        )
    })?;
    let next = starting_after.map_or(0, |n| n + 1);
    Ok(sse_response(Follower::new(bg, next)))
}

/// `POST /v1/responses/{id}/cancel`: abort a background response and answer it as it ended
/// (`cancelled`, with the output it had); one already finished is answered as it is.
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match state.responses().find(&id) {
        Some(Found::Running(bg)) => {
            let loaded = loaded_model(&state)?;
            let aborted = state.aborts().abort(Some(&id), &loaded.engine);
            tracing::info!(%id, aborted, "background response cancelled");
            bg.wait_done().await;
            Ok(json_response(&bg.response()))
        }
        Some(Found::Stored(s)) if s.response["background"] == true => {
            Ok(json_response(&s.response))
        }
        Some(Found::Stored(_)) => Err(ApiError::bad_request(format!(
            "response {id} was not created with \"background\": true; only background responses \
             can be cancelled (abort a running one with POST /abort_request)"
        ))),
        None => Err(super::responses::not_stored(&id)),
    }
}

//! Request ids and the access log. Every answer carries `x-request-id` (vLLM's and OpenAI's
//! header) and `request-id` (Anthropic's): the id the client sent in `x-request-id`, when it is
//! 1 to [`MAX_LEN`] visible ASCII characters, else a fresh one. The handler, and a streamed
//! answer's events, run in a tracing span `request{id=…}`, so every log line of a request
//! (its failure included: [`crate::ApiError`] logs 5xx answers) names the id its client saw.
//! One access line a request goes to target `dsv4::access` at info, once its answer's body is
//! done: method, path, status, the milliseconds until the answer's head and until its end, the
//! body's bytes, and how it ended (`complete`, `client_gone` when the client left before the
//! end of a stream, `error` when the body failed).

use crate::api::common::random_hex;
use crate::state::AppState;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;
use tracing::{Instrument, Span};

/// The header a client may name its request with, and every answer carries.
pub const HEADER: &str = "x-request-id";

/// Anthropic's name for the same id, on every answer too.
pub const ANTHROPIC_HEADER: &str = "request-id";

/// The longest client id taken (a longer one is replaced by a fresh id).
pub const MAX_LEN: usize = 256;

/// Whether a client's id is taken as it is: 1 to [`MAX_LEN`] visible ASCII characters.
pub fn valid(id: &str) -> bool {
    (1..=MAX_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Name the request, run it in its span, log its access line and put the id on the answer.
pub(super) async fn request_id(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let (id, method, path) = {
        // In its own scope: a borrow of the request (not Sync) must not live across an await.
        let sent = req.headers().get(HEADER).and_then(|v| v.to_str().ok());
        let id = match sent {
            Some(s) if valid(s) => s.to_owned(),
            _ => random_hex(state.next_serial()),
        };
        (id, req.method().clone(), req.uri().path().to_owned())
    };
    let span = tracing::info_span!("request", id = %id);
    let started = Instant::now();
    let response = next.run(req).instrument(span.clone()).await;
    let access = Access {
        span,
        method,
        path,
        status: response.status().as_u16(),
        started,
        head_ms: started.elapsed().as_millis() as u64,
    };
    let mut response = response.map(|body| {
        Body::new(Logged {
            body,
            access: Some(access),
            bytes: 0,
        })
    });
    // Valid ids and hex are visible ASCII, which a header value always takes.
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, v.clone());
        response.headers_mut().insert(ANTHROPIC_HEADER, v);
    }
    response
}

/// What a request's access line says, but for how its body ends.
struct Access {
    span: Span,
    method: Method,
    path: String,
    status: u16,
    started: Instant,
    /// Milliseconds until the answer's head.
    head_ms: u64,
}

impl Access {
    /// Write the line: the body sent `bytes` bytes and ended as `outcome`.
    fn log(self, bytes: u64, outcome: &'static str) {
        self.span.in_scope(|| {
            tracing::info!(
                target: "dsv4::access",
                method = %self.method,
                path = %self.path,
                status = self.status,
                head_ms = self.head_ms,
                ms = self.started.elapsed().as_millis() as u64,
                bytes,
                outcome = %outcome,
                "answered"
            );
        });
    }
}

/// An answer's body that writes its request's access line once it is done: at its end, at a
/// failure, or when it is dropped first (its client gone).
struct Logged {
    body: Body,
    /// Taken when the line is written.
    access: Option<Access>,
    bytes: u64,
}

impl Logged {
    fn log(&mut self, outcome: &'static str) {
        if let Some(access) = self.access.take() {
            access.log(self.bytes, outcome);
        }
    }
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                }
                if this.body.is_end_stream() {
                    this.log("complete");
                }
            }
            Poll::Ready(Some(Err(_))) => this.log("error"),
            Poll::Ready(None) => this.log("complete"),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        // An empty body may never be polled; any other dropped before its end lost its client.
        let outcome = if self.body.is_end_stream() {
            "complete"
        } else {
            "client_gone"
        };
        self.log(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_taken_when_short_and_visible() {
        assert!(valid("a"));
        assert!(valid("req-8f14e45f-ceea-467f-a8f8-3f3b1b2c9d0e"));
        assert!(valid(&"x".repeat(MAX_LEN)));
        assert!(!valid(""));
        assert!(!valid(&"x".repeat(MAX_LEN + 1)));
        assert!(!valid("two words"));
        assert!(!valid("tab\there"));
        assert!(!valid("é"));
    }
}

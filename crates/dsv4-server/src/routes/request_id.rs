//! Request ids and the access log. Every answer carries `x-request-id` (vLLM's and OpenAI's
//! header) and `request-id` (Anthropic's): the id the client sent in `x-request-id`, when it is
//! 1 to [`MAX_LEN`] visible ASCII characters, else a fresh one. The handler, and a streamed
//! answer's events, run in a tracing span `request{id=…}`, so every log line of a request
//! (its failure included: [`crate::ApiError`] logs 5xx answers) names the id its client saw.
//! One access line a request goes to target `dsv4::access` at info: method, path, status and
//! the milliseconds until the answer's head (a stream's first byte).

use crate::api::common::random_hex;
use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;
use tracing::Instrument;

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
    let mut response = next.run(req).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::info!(
            target: "dsv4::access",
            %method,
            %path,
            status = response.status().as_u16(),
            ms = started.elapsed().as_millis() as u64,
            "answered"
        );
    });
    // Valid ids and hex are visible ASCII, which a header value always takes.
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, v.clone());
        response.headers_mut().insert(ANTHROPIC_HEADER, v);
    }
    response
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

//! The HTTP routes and what they share: [`router`] wires the endpoints, the API-key check
//! (bearer or `x-api-key`) on `/v1/*`, `/invocations`, `/generate`, `/abort_request`, `/tokenize`, `/detokenize`, the cache flush and
//! SGLang's load and info endpoints, request counting, the body-size limit and the
//! JSON 404/405 answers; helpers turn bodies into bytes (413 past the limit), check the model
//! id, and stream server-sent events.

pub mod abort;
pub mod batches;
pub mod cache;
pub mod chat;
mod chat_prompt;
pub mod chat_stream;
pub mod completions;
pub mod files;
pub mod generate;
pub mod info;
pub mod loads;
pub mod message_batches;
pub mod messages;
pub mod messages_output;
mod page;
pub mod request_id;
pub mod responses;
pub mod responses_background;
pub mod responses_envelope;
pub mod responses_output;
pub mod responses_tokens;
pub mod responses_truncation;
pub mod sagemaker;
pub mod server_info;
pub mod tokenize;

use crate::error::ApiError;
use crate::state::AppState;
use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use serde::Serialize;
use std::convert::Infallible;
use std::future::Future;
use tracing::Instrument;

/// The application: every route with its middleware, over `state`.
pub fn router(state: AppState) -> Router {
    let limit = state.cfg().max_request_bytes;
    // An upload may be as large as the files budget, past the request limit.
    let files_limit = state.cfg().files_bytes.max(1);
    let generation = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/messages", post(messages::create))
        .route("/generate", post(generate::generate))
        .route("/invocations", post(sagemaker::invocations))
        .route_layer(middleware::from_fn_with_state(state.clone(), interactive));
    let v1 = Router::new()
        .merge(generation)
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route(
            "/v1/messages/batches",
            post(message_batches::create)
                .get(message_batches::list)
                .layer(DefaultBodyLimit::max(files_limit)),
        )
        .route(
            "/v1/messages/batches/{id}",
            get(message_batches::retrieve).delete(message_batches::delete),
        )
        .route(
            "/v1/messages/batches/{id}/cancel",
            post(message_batches::cancel),
        )
        .route(
            "/v1/messages/batches/{id}/results",
            get(message_batches::results_file),
        )
        .route(
            "/v1/responses/input_tokens",
            post(responses_tokens::input_tokens),
        )
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::list_input_items),
        )
        .route(
            "/v1/responses/{id}/cancel",
            post(responses_background::cancel),
        )
        .route(
            "/v1/files",
            post(files::upload)
                .get(files::list)
                .layer(DefaultBodyLimit::max(files_limit)),
        )
        .route("/v1/files/{id}", get(files::retrieve).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::content))
        .route("/v1/batches", post(batches::create).get(batches::list))
        .route("/v1/batches/{id}", get(batches::retrieve))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
        .route("/abort_request", post(abort::abort_request))
        .route("/v1/models", get(info::models))
        .route("/v1/models/{id}", get(info::model))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/reset_prefix_cache", post(cache::reset_prefix_cache))
        .route("/flush_cache", post(cache::reset_prefix_cache))
        .route("/get_load", get(loads::get_load))
        .route("/v1/loads", get(loads::v1_loads))
        .route("/get_model_info", get(server_info::get_model_info))
        .route("/get_server_info", get(server_info::get_server_info))
        .route("/server_info", get(server_info::get_server_info))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .merge(v1)
        .route("/health", get(info::health))
        .route("/ping", get(info::health).post(info::health))
        .route("/health_generate", get(info::health_generate))
        .route("/version", get(info::version))
        .route("/metrics", get(info::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            request_id::request_id,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The endpoint label of a path (unknown paths share one label).
fn endpoint(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/responses" => "/v1/responses",
        "/v1/messages" => "/v1/messages",
        "/v1/messages/count_tokens" => "/v1/messages/count_tokens",
        "/v1/messages/batches" => "/v1/messages/batches",
        p if p.starts_with("/v1/messages/batches/") && p.ends_with("/cancel") => {
            "/v1/messages/batches/{id}/cancel"
        }
        p if p.starts_with("/v1/messages/batches/") && p.ends_with("/results") => {
            "/v1/messages/batches/{id}/results"
        }
        p if p.starts_with("/v1/messages/batches/") => "/v1/messages/batches/{id}",
        "/invocations" => "/invocations",
        "/ping" => "/ping",
        p if p.starts_with("/v1/responses/") && p.ends_with("/input_items") => {
            "/v1/responses/{id}/input_items"
        }
        p if p.starts_with("/v1/responses/") && p.ends_with("/cancel") => {
            "/v1/responses/{id}/cancel"
        }
        p if p.starts_with("/v1/responses/") => "/v1/responses/{id}",
        "/v1/files" => "/v1/files",
        p if p.starts_with("/v1/files/") && p.ends_with("/content") => "/v1/files/{id}/content",
        p if p.starts_with("/v1/files/") => "/v1/files/{id}",
        "/v1/batches" => "/v1/batches",
        p if p.starts_with("/v1/batches/") && p.ends_with("/cancel") => "/v1/batches/{id}/cancel",
        p if p.starts_with("/v1/batches/") => "/v1/batches/{id}",
        "/generate" => "/generate",
        "/abort_request" => "/abort_request",
        "/v1/models" => "/v1/models",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        "/tokenize" => "/tokenize",
        "/detokenize" => "/detokenize",
        "/reset_prefix_cache" => "/reset_prefix_cache",
        "/flush_cache" => "/flush_cache",
        "/health" => "/health",
        "/health_generate" => "/health_generate",
        "/version" => "/version",
        "/metrics" => "/metrics",
        _ => "other",
    }
}

/// Count every answer by endpoint and status.
async fn count(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let label = endpoint(req.uri().path());
    let response = next.run(req).await;
    state.stats().http(label, response.status().as_u16());
    response
}

/// Count a generation request that is not a batch line as interactive until its answer's
/// body is dropped (sent, or its client gone): batch lines fill idle running slots only while
/// there is none (`server.batch_fill_idle_ms`).
async fn interactive(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.extensions().get::<crate::batch::BatchLine>().is_some() {
        return next.run(req).await;
    }
    let guard = state.interactive().begin();
    next.run(req).await.map(|body| {
        Body::new(Counted {
            body,
            _guard: guard,
        })
    })
}

/// An answer's body that counts its interactive request until it is dropped.
struct Counted {
    body: Body,
    _guard: crate::batch::Interactive,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Refuse `/v1/*`, `/generate`, `/abort_request`, `/tokenize`, `/detokenize`, cache-flush and
/// SGLang load and info requests without the configured bearer key.
async fn require_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = state.cfg().api_key.as_deref() else {
        return next.run(req).await;
    };
    // Anthropic's clients send the key as `x-api-key`, and read its errors in their shape.
    let anthropic = req.uri().path().starts_with("/v1/messages");
    let given = {
        // In its own scope: a borrow of the request (not Sync) must not live across an await.
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        header(axum::http::header::AUTHORIZATION.as_str())
            .and_then(|v| v.strip_prefix("Bearer ").map(str::to_owned))
            .or_else(|| header("x-api-key"))
    };
    let refused = match given.as_deref() {
        Some(g) if constant_time_eq(g.trim().as_bytes(), key.as_bytes()) => {
            return next.run(req).await;
        }
        Some(_) => ApiError::unauthorized("the API key is not valid for this server"),
        None => ApiError::unauthorized(
            "this server needs an API key: send `Authorization: Bearer KEY` (or `x-api-key: KEY`)",
        ),
    };
    if anthropic {
        messages::error_response(refused)
    } else {
        refused.into_response()
    }
}

/// Compare without leaking where the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route {} {}; this server serves POST /v1/chat/completions, POST /v1/completions, \
         POST /v1/responses, POST /v1/messages, POST /v1/messages/count_tokens, POST and GET \
         /v1/messages/batches, GET and DELETE /v1/messages/batches/{{id}}, POST \
         /v1/messages/batches/{{id}}/cancel, GET /v1/messages/batches/{{id}}/results, GET and \
         DELETE /v1/responses/{{id}}, GET \
         /v1/responses/{{id}}/input_items, POST /v1/responses/{{id}}/cancel, POST and GET \
         /v1/files, GET and DELETE /v1/files/{{id}}, GET /v1/files/{{id}}/content, POST and GET \
         /v1/batches, GET /v1/batches/{{id}}, POST /v1/batches/{{id}}/cancel, GET /v1/models, \
         POST /generate, POST /abort_request, \
         POST /tokenize, POST /detokenize, \
         POST /reset_prefix_cache, POST /invocations, GET /health, GET /ping, GET \
         /health_generate, GET /version and GET /metrics",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::method_not_allowed(format!(
        "{} is not allowed on {}",
        req.method(),
        req.uri().path()
    ))
}

/// The body, or 413 past `server.max_request_bytes`.
pub(crate) fn body_bytes(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(state.cfg().max_request_bytes)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {}", r.body_text()))
        }
    })
}

/// 404 unless `model` is the served model's id.
pub(crate) fn check_model(state: &AppState, model: &str) -> Result<(), ApiError> {
    let served = &state.cfg().model_id;
    if model == served {
        return Ok(());
    }
    Err(ApiError::not_found(format!(
        "the model `{model}` does not exist; this server serves `{served}` (GET /v1/models)"
    ))
    .with_param("model")
    .with_code("model_not_found"))
}

/// The priority a request runs at (`server.request_priority`): the one it asks for, or the
/// server's own, 0 or [`crate::batch::LINE_PRIORITY`] for a batch `line`; a 400 naming
/// `priority` when the server refuses the field.
pub(crate) fn request_priority(
    state: &AppState,
    asked: Option<i32>,
    line: bool,
) -> Result<Option<i32>, ApiError> {
    use crate::config::RequestPriority;
    let own = if line { crate::batch::LINE_PRIORITY } else { 0 };
    match (state.cfg().request_priority, asked) {
        (RequestPriority::Refuse, Some(_)) => Err(ApiError::bad_param(
            "priority",
            "this server does not take request priorities (server.request_priority = \
             \"refuse\"); leave `priority` out",
        )),
        (RequestPriority::Use, Some(p)) => Ok(Some(p)),
        _ => Ok(Some(own)),
    }
}

/// How the engine admits a request: past `scheduler.max_queued_requests` waiting it is
/// refused with a 503 `queue_full` (the engine decides, making room by priority), except the
/// request of a batch `line`, which always queues (its batch bounds its own lines in flight)
/// and yields (it pauses past the batches' share while interactive requests come,
/// `server.batch_fill_idle_ms`).
pub(crate) fn admission(state: &AppState, line: bool) -> crate::api::common::Admission {
    let queue_limit = match state.cfg().max_queued_requests {
        0 => None,
        _ if line => None,
        n => Some(n),
    };
    crate::api::common::Admission {
        queue_limit,
        yields: line,
    }
}

/// The loaded model, or 503 while it loads.
pub(crate) fn loaded_model(
    state: &AppState,
) -> Result<std::sync::Arc<crate::state::Loaded>, ApiError> {
    state
        .loaded()
        .ok_or_else(|| ApiError::unavailable("the model is still loading; retry shortly"))
}

/// 200 with `body` as JSON.
pub(crate) fn json_response<T: Serialize>(body: &T) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// The `data: {"error": ...}` event that ends a stream that failed after it started (logged
/// as an answer's error is).
pub(crate) fn error_event(e: &ApiError) -> SseEvent {
    e.log();
    SseEvent::default().data(e.body().to_string())
}

/// Server-sent events that name their type (an `event:` line) and carry their JSON body, as
/// the Responses and Messages APIs stream them.
pub(crate) fn typed_events(events: Vec<(&'static str, serde_json::Value)>) -> Vec<SseEvent> {
    events
        .into_iter()
        .map(|(kind, body)| SseEvent::default().event(kind).data(body.to_string()))
        .collect()
}

/// A streamed answer: yields events until it is done.
pub(crate) trait EventSource: Send + 'static {
    /// The next events (possibly several).
    fn next_events(&mut self) -> impl Future<Output = Vec<SseEvent>> + Send;
    /// Whether the last event was produced.
    fn is_done(&self) -> bool;
}

/// Stream `src` as server-sent events (dropping the response, e.g. when the client
/// disconnects, drops `src` and so cancels its request). Its events are made in the request's
/// span (see [`request_id`]), after the handler has returned.
pub(crate) fn sse_response(src: impl EventSource) -> Response {
    let span = tracing::Span::current();
    let stream = futures_util::stream::unfold(src, move |mut src| {
        let span = span.clone();
        async move {
            if src.is_done() {
                return None;
            }
            let events = src.next_events().instrument(span).await;
            Some((
                futures_util::stream::iter(events.into_iter().map(Ok::<_, Infallible>)),
                src,
            ))
        }
    })
    .flatten();
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

//! Errors: [`ApiError`], what a request gets back (an OpenAI-style error object with an HTTP
//! status), and [`ServerError`], why the server could not start or stopped.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use dsv4_chat::ParseError;
use dsv4_engine::EngineError;

/// An error answered to a client: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's error `type` (e.g. `invalid_request_error`).
    pub kind: &'static str,
    /// What was wrong and what to do.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (e.g. `context_length_exceeded`).
    pub code: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400: the request is invalid.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn bad_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::bad_request(message).with_param(param)
    }

    /// 401: a missing or wrong API key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
            .with_code("invalid_api_key")
    }

    /// 404: no such route or model.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    /// 405: the route exists with another method.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            message,
        )
    }

    /// 413: the body is larger than `server.max_request_bytes`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the request body is larger than {limit} bytes (server.max_request_bytes); send \
                 a smaller request or raise the limit"
            ),
        )
        .with_code("request_too_large")
    }

    /// 429: the server holds as much of this kind of work as it keeps; retry later.
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
    }

    /// 503: the server cannot take requests now (loading, draining, engine stopped).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        )
    }

    /// 500: the engine failed while running the request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 500: the model's output broke the DSV4 completion grammar (strict DSML parsing); the
    /// code is the parser's error class, `hint` what could help.
    pub fn model_output(e: &ParseError, hint: &str) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "model_output_error",
            format!(
                "the model's output is not a valid DSV4 completion ({} at byte {}): {}; nothing \
                 of it is returned as content ({hint})",
                e.class, e.offset, e.message
            ),
        )
        .with_code(e.class.as_str())
    }

    /// The same error naming `param`.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// The same error with a code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// The JSON error object.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::BadRequest(_) | EngineError::TooLarge { .. } => {
                ApiError::bad_request(e.to_string())
            }
            EngineError::Stopped => ApiError::unavailable(
                "the engine has stopped; the server is shutting down or failed (see its log)",
            ),
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl ApiError {
    /// Log this answer, in the request's span: a failure of the server (5xx but 503, which
    /// says it is busy or loading) as an error, any other at debug.
    pub fn log(&self) {
        let status = self.status.as_u16();
        if self.status.is_server_error() && self.status != StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(status, kind = self.kind, message = %self.message, "request failed");
        } else {
            tracing::debug!(status, kind = self.kind, message = %self.message, "request refused");
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.log();
        let retry = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if retry || self.status == StatusCode::TOO_MANY_REQUESTS {
            // Busy, not wrong: the official clients wait this long before they retry.
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
        }
        // The official clients retry 5xx answers unless told not to; a model-output or engine
        // error would only repeat.
        if self.status.is_server_error() && !retry {
            response
                .headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("false"));
        }
        response
    }
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listening socket could not be opened.
    #[error(
        "cannot listen on {addr}: {source}; pick another server.port (0 picks a free one) or \
         server.host"
    )]
    Bind {
        /// host:port asked for.
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("the HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The tokenizer's vocabulary cannot be used for streaming or constrained decoding.
    #[error("tokenizer vocabulary: {0}")]
    Vocab(String),
    /// The grammar engine could not be set up over the vocabulary.
    #[error("constrained decoding setup: {0}")]
    Grammar(String),
    /// The engine could not start.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A server option has a value the server cannot run with.
    #[error("server option `{option}`: {message}")]
    Config {
        /// The option (profile key).
        option: &'static str,
        /// What is wrong and what would be accepted.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A log sink the test reads back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `f` logs at debug and up (on this thread).
    fn logged(f: impl FnOnce()) -> String {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn server_failures_are_logged_as_errors_and_refusals_at_debug() {
        let out = logged(|| drop(ApiError::internal("the engine stopped").into_response()));
        assert!(
            out.contains("ERROR")
                && out.contains("the engine stopped")
                && out.contains("status=500"),
            "{out}"
        );
        let out = logged(|| drop(ApiError::bad_param("n", "too many choices").into_response()));
        assert!(
            out.contains("DEBUG") && out.contains("too many choices"),
            "{out}"
        );
        assert!(!out.contains("ERROR"), "{out}");
        // Busy or loading is not a failure.
        let out = logged(|| drop(ApiError::unavailable("the model is loading").into_response()));
        assert!(!out.contains("ERROR"), "{out}");
    }
}

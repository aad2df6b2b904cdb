//! dsv4-server: the OpenAI-compatible HTTP server (axum, tokio) in front of a
//! [`dsv4_engine`] engine.
//!
//! - Routes ([`routes`]): `POST /v1/chat/completions` (DSV4 prompt encoding, tools,
//!   `tool_choice`, thinking mode, SSE streaming, strict DSML parsing of every answer),
//!   `POST /v1/completions`, OpenAI's Responses API (`/v1/responses`, with stored responses in
//!   [`responses_store`] and background ones in [`responses_background`]), OpenAI's Files and
//!   Batch APIs (`/v1/files`, `/v1/batches`), SGLang's `POST /generate` and `POST
//!   /abort_request` ([`abort`]),
//!   `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus).
//! - Constrained decoding ([`grammar`]): `tool_choice` required/named and `response_format`
//!   become llguidance grammars over the tokenizer's vocabulary ([`vocab`]), enforced by the
//!   engine's per-request token constraint; [`thinking_budget`] wraps it to end reasoning
//!   after a budget of tokens.
//! - Output ([`output`]): per-request decoding of token bytes with stop strings and the
//!   streaming DSML parser; [`run`] drives one request's choices, [`state`] holds what handlers share
//!   (with the step-loop stall watch behind `/health`), [`metrics`] renders Prometheus text.
//! - [`batch`]: OpenAI Batch API files run through the routes in process (`dsv4 run-batch`);
//!   [`files`] and [`batches`] hold the Files and Batch APIs' files and background batches.
//! - [`Server`]: bind (port 0 picks one), serve, drain on shutdown.
//!
//! Bad input is answered with a 4xx OpenAI error object ([`ApiError`]); no request can panic
//! the server.

pub mod abort;
pub mod api;
pub mod batch;
pub mod batches;
pub mod beam;
pub mod config;
pub mod error;
pub mod files;
pub mod files_disk;
pub mod grammar;
pub mod metrics;
pub mod output;
pub mod responses_background;
pub mod responses_disk;
pub mod responses_store;
pub mod routes;
pub mod run;
pub mod server;
pub mod state;
pub mod thinking_budget;
pub mod tls;
pub mod vocab;

pub use config::{OutputParsing, RequestPriority, ServerConfig};
pub use error::{ApiError, ServerError};
pub use routes::router;
pub use server::{Server, shutdown_signal};
pub use state::{AppState, Health, Loaded};

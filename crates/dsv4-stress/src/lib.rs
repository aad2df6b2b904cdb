//! dsv4-stress: `dsv4 stress` (a multi-turn agentic workload against any OpenAI-compatible server,
//! with corruption signatures and vLLM `bench serve` metrics) and `dsv4 ab` (interleaved cold-boot
//! A/B runs of two dsv4 configurations, with the statistics the ledger cites).
//!
//! # Running the stress workload from code
//!
//! ```no_run
//! # async fn demo() -> Result<(), dsv4_stress::StressError> {
//! use dsv4_stress::{Oracle, StressOptions, run_stress};
//! let opts = StressOptions {
//!     url: "http://127.0.0.1:8000".into(),
//!     sessions: 64,
//!     concurrency: 16,
//!     turns: 4,
//!     oracle: Some(Oracle::Solo),
//!     ..Default::default()
//! };
//! let report = run_stress(&opts).await?;
//! println!("{}", report.summary());
//! assert_eq!(report.failed_sessions, 0);
//! # Ok(()) }
//! ```
//!
//! The public surface (stable for `dsv4 ab` and other callers):
//! - [`StressOptions`] (all fields have defaults), [`StreamMode`], [`Oracle`],
//!   [`STOP_BEFORE_MARKUP`], [`parse_duration`];
//! - [`run_stress`] → [`StressReport`] or [`StressError`] (bad options, server unreachable or
//!   not ready within `ready_timeout`);
//! - [`StressReport`]: `sessions`, `failed_sessions`, `completed`, `failed`, `signatures` (count
//!   per signature name, every name present), `signature_sessions`, [`Metrics`] flattened into
//!   the JSON top level (vLLM key names), `server` ([`ServerIdentity`]), `options`, `records`
//!   ([`SessionRecord`] with its [`TurnRecord`]s);
//! - [`Signature`] (names via [`Signature::name`]) and the detectors in [`signatures`].

pub mod ab;
pub mod answer;
pub mod chat_answer;
pub mod client;
pub mod error;
pub mod metrics;
pub mod options;
mod progress;
pub mod ready;
pub mod report;
pub mod responses;
mod runner;
pub mod schema;
pub mod signatures;
pub mod stats;
pub mod stream;
pub mod workload;

pub use answer::{Answer, RequestFailure, ToolCall};
pub use error::StressError;
pub use metrics::Metrics;
pub use options::{Api, Oracle, STOP_BEFORE_MARKUP, StreamMode, StressOptions, parse_duration};
pub use report::{ServerIdentity, SessionRecord, StressReport, TurnRecord};
pub use runner::run_stress;
pub use signatures::{Finding, Signature};

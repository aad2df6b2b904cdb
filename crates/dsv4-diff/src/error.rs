//! The error type of the diff library: what stopped a diff from running at all (a case that
//! runs and fails is not an error; it is a `fail` row of the report).

use dsv4_kernels::KernelError;
use dsv4_model::{ForwardError, ModelError};

/// Why a diff could not be run.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A side's backend could not be created (unknown name, not available here).
    #[error("{side} side: {source}")]
    Backend {
        /// "oracle" or "candidate".
        side: &'static str,
        /// What the registry said.
        #[source]
        source: KernelError,
    },
    /// A side's model could not be loaded.
    #[error("{side} side: cannot load the model: {source}")]
    Model {
        /// "oracle" or "candidate".
        side: &'static str,
        /// What the loader said.
        #[source]
        source: ModelError,
    },
    /// A forward call refused its input.
    #[error("{side} side: forward failed: {source}")]
    Forward {
        /// "oracle" or "candidate".
        side: &'static str,
        /// What the forward pass said.
        #[source]
        source: ForwardError,
    },
    /// `-p` is not a valid regular expression.
    #[error("bad case pattern `{pattern}`: {message}")]
    Pattern {
        /// The pattern as given.
        pattern: String,
        /// The regex parser's message.
        message: String,
    },
    /// `-o` named an op that is not in the catalog.
    #[error("unknown op `{name}` (ops: {known})")]
    UnknownOp {
        /// The name as given.
        name: String,
        /// The op names, comma-separated.
        known: String,
    },
    /// The filters selected no case.
    #[error(
        "no op case matches the filters (ops {ops:?}, pattern {pattern:?}); widen the op and pattern filters, or include the full-size cases"
    )]
    NoCases {
        /// The `-o` names.
        ops: Vec<String>,
        /// The `-p` pattern.
        pattern: Option<String>,
    },
    /// An option value that cannot work.
    #[error("{what}: {message}")]
    InvalidOption {
        /// The option.
        what: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
}

//! The error type of dsv4-engine: bad engine configuration, requests the engine cannot serve,
//! and a stopped engine, each saying what to change.

use dsv4_model::ForwardError;

/// Everything the engine refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An engine option has a value the engine cannot run with.
    #[error("engine option `{option}`: {message}")]
    Config {
        /// The option (profile key), e.g. `cache.page_size`.
        option: &'static str,
        /// What is wrong and what would be accepted.
        message: String,
    },
    /// A request was refused before it was queued.
    #[error("request refused: {0}")]
    BadRequest(String),
    /// A request needs more cache than a pool holds even when it runs alone.
    #[error(
        "request of {tokens} tokens (prompt + max_tokens) needs {needed} pages of cache pool \
         `{pool}`, which holds {capacity}; raise cache.max_total_tokens or lower max_tokens"
    )]
    TooLarge {
        /// Prompt plus max_tokens.
        tokens: usize,
        /// The pool that is too small.
        pool: &'static str,
        /// Pages the request needs alone.
        needed: usize,
        /// Pages of the pool.
        capacity: usize,
    },
    /// The engine thread has stopped (shut down, or it failed).
    #[error("the engine has stopped; start a new one")]
    Stopped,
    /// The engine thread could not be started.
    #[error("cannot start the engine thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The forward pass failed.
    #[error("forward pass: {0}")]
    Forward(#[from] ForwardError),
}

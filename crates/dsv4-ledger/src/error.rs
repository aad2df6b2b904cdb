//! The ledger's error type: every message says what was wrong and, where it helps, what to do.

use std::path::PathBuf;

/// Everything that can go wrong reading, writing, verifying or rendering the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A git operation failed.
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    /// A record file does not parse.
    #[error("{path}: not a ledger record: {message}")]
    BadRecord {
        /// The record file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A profile file could not be resolved or edited.
    #[error("profile {profile}: {message}")]
    Profile {
        /// The profile name.
        profile: String,
        /// What went wrong.
        message: String,
    },
    /// The profile's current value is not the stated `from`.
    #[error(
        "profile {profile}: {key} is {actual} (from {origin}), not {expected}; nothing was written"
    )]
    WrongFrom {
        /// The profile name.
        profile: String,
        /// The key.
        key: String,
        /// The value the caller said it had.
        expected: String,
        /// The value it has.
        actual: String,
        /// Where that value comes from.
        origin: String,
    },
    /// The request is malformed (bad `--set`, unknown status, missing evidence, ...).
    #[error("{0}; nothing was written")]
    Invalid(String),
    /// HEAD is detached or unborn.
    #[error("{0}; pass --allow-detached to record anyway; nothing was written")]
    Head(String),
    /// A record id was not found.
    #[error("no ledger record {0} (see `dsv4 ledger log`)")]
    UnknownId(String),
    /// An incident template failed to render.
    #[error("template {name}: {message}")]
    Template {
        /// The template file.
        name: String,
        /// What minijinja said.
        message: String,
    },
}

impl LedgerError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LedgerError::Io {
            path: path.into(),
            source,
        }
    }
}

//! [`StressError`]: why a stress run could not run at all (bad options, no server). Failures of
//! single requests are not errors: they are counted in the report.

/// A stress run that could not start or could not finish its bookkeeping.
#[derive(Debug, thiserror::Error)]
pub enum StressError {
    /// An option has a value the harness cannot use.
    #[error("--{option}: {message}")]
    Options {
        /// The option, spelled as on the command line.
        option: &'static str,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// The server could not be reached or did not answer `GET /v1/models` usefully.
    #[error("server {url}: {message}")]
    Server {
        /// The URL that was tried.
        url: String,
        /// What happened and what to check.
        message: String,
    },
    /// Writing an output file failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

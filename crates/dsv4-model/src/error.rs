//! The error type of dsv4-model: config.json problems, checkpoint problems and I/O, each naming
//! the field, tensor or file involved and saying what to do about it.

use std::path::PathBuf;

use dsv4_core::{CoreError, DType};

/// Everything that can go wrong reading or writing a config or a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Reading or writing a file failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "create", "memory-map", …).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// config.json is not valid JSON, or a field has the wrong JSON type.
    #[error(
        "{origin}: {message}{}; fix the JSON (every field of spec §1 is required)",
        field.as_ref().map(|f| format!(" (near field `{f}`)")).unwrap_or_default()
    )]
    ConfigParse {
        /// Where the JSON came from (a path, or "config JSON").
        origin: String,
        /// The field the parser was at, when it can be told.
        field: Option<String>,
        /// The parser's message (with line and column).
        message: String,
    },

    /// A required config.json field is absent.
    #[error("{origin}: required field `{field}` is missing; add it (see spec §1 for its meaning)")]
    ConfigMissingField {
        /// Where the JSON came from.
        origin: String,
        /// The missing field.
        field: String,
    },

    /// A config.json field has a value dsv4 cannot run, or contradicts another field.
    #[error("config.json field `{field}`: {message}")]
    ConfigInvalid {
        /// The offending field (e.g. `compress_ratios[3]`).
        field: String,
        /// What is wrong and what would be accepted.
        message: String,
    },

    /// The config's sizes together describe a checkpoint too large to count in 64 bits safely.
    #[error(
        "config.json sizes are too large: tensor `{tensor}` of shape {shape:?} takes the \
         checkpoint past 2^50 stored elements (thousands of times any published model); check \
         hidden_size, hc_mult, vocab_size, the head, rank and expert sizes and the layer counts"
    )]
    ConfigTooLarge {
        /// The tensor at which the running total (or its own size) passed the limit.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
    },

    /// `architectures` does not name DeepseekV4ForCausalLM.
    #[error(
        "config.json field `architectures` is {found:?}: this engine runs only \
         \"DeepseekV4ForCausalLM\" checkpoints"
    )]
    UnknownArchitecture {
        /// The architectures the file lists.
        found: Vec<String>,
    },

    /// A tensor the model needs is not in the checkpoint.
    #[error(
        "tensor `{name}` is missing from {location}; the checkpoint is incomplete or for another model"
    )]
    MissingTensor {
        /// The tensor's official name.
        name: String,
        /// The file or directory that was searched.
        location: String,
    },

    /// A tensor has another dtype than the manifest says.
    #[error("tensor `{name}` has dtype {found}, expected {expected} (spec §2)")]
    WrongDType {
        /// The tensor's name.
        name: String,
        /// The dtype the manifest requires.
        expected: DType,
        /// The dtype in the file.
        found: DType,
    },

    /// A tensor has another shape than config.json implies.
    #[error(
        "tensor `{name}` has shape {found:?}, expected {expected:?} from config.json; \
         the checkpoint and config.json disagree"
    )]
    WrongShape {
        /// The tensor's name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },

    /// A safetensors file (or index) is truncated or malformed.
    #[error(
        "{}: corrupt or truncated safetensors data: {reason}; re-download or regenerate the file",
        path.display()
    )]
    CorruptFile {
        /// The file.
        path: PathBuf,
        /// What is inconsistent.
        reason: String,
    },

    /// A safetensors header names a dtype dsv4 does not know.
    #[error(
        "{}: tensor `{tensor}` has dtype `{dtype}`, which dsv4 does not support \
         (known: F32, F16, BF16, F8_E4M3, F8_E8M0, I8, U8, I32, I64)",
        path.display()
    )]
    UnknownDType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype string in the header.
        dtype: String,
    },

    /// A tensor's bytes could not be decoded or built (dtype or size mismatch).
    #[error("tensor `{name}`: {source}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// The core error.
        #[source]
        source: CoreError,
    },

    /// A cache byte layout cannot be built for these sizes and numerics.
    #[error("cache layout for this config: {0}")]
    CacheLayout(#[from] dsv4_core::cache::CacheLayoutError),

    /// A weight's bytes do not fit its format (raised while preparing it for the kernels).
    #[error("{0}")]
    Kernel(#[from] dsv4_kernels::KernelError),

    /// A caller passed something unusable to a writer or helper.
    #[error("invalid argument `{what}`: {message}")]
    InvalidArgument {
        /// The argument or tensor concerned.
        what: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ModelError {
    /// An [`ModelError::Io`] for `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// A [`ModelError::ConfigInvalid`] for `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::ConfigInvalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// A [`ModelError::CorruptFile`] for `path`.
    pub fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::CorruptFile {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

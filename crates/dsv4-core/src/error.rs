//! Errors shared by the core types.

use crate::DType;

/// What went wrong with a tensor or a conversion in dsv4-core.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CoreError {
    /// The byte length does not match shape × dtype size.
    #[error("tensor data is {got} bytes but shape {shape:?} of {dtype} needs {expected} bytes")]
    SizeMismatch {
        /// Shape that was asked for.
        shape: Vec<usize>,
        /// Element type.
        dtype: DType,
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes that were given.
        got: usize,
    },
    /// The operation needs another dtype.
    #[error("expected a tensor of dtype {expected}, found {found}")]
    WrongDType {
        /// What the caller needs.
        expected: String,
        /// What the tensor is.
        found: DType,
    },
    /// A dtype name that dsv4 does not know.
    #[error("unknown dtype `{0}` (known: F32, F16, BF16, F8_E4M3, F8_E8M0, I8, U8, I32, I64)")]
    UnknownDType(String),
}

//! The error type of dsv4-chat.

use std::path::PathBuf;

/// What went wrong while loading or using a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The tokenizer file could not be read.
    #[error("cannot read tokenizer file {path}: {source}")]
    ReadTokenizer {
        /// The file that was asked for.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text is not a valid Hugging Face tokenizer.json.
    #[error("malformed tokenizer.json ({origin}): {reason}")]
    InvalidTokenizer {
        /// Where the JSON came from (a path, or "string").
        origin: String,
        /// What the `tokenizers` parser said.
        reason: String,
    },
    /// A special token every DSV4 tokenizer must have is missing.
    #[error("tokenizer.json ({origin}) has no token `{token}`; a DeepSeek-V4 tokenizer needs it")]
    MissingSpecialToken {
        /// Where the JSON came from.
        origin: String,
        /// The missing token's text.
        token: &'static str,
    },
    /// Encoding failed inside `tokenizers`.
    #[error("cannot encode text: {0}")]
    Encode(String),
    /// Decoding failed inside `tokenizers`.
    #[error("cannot decode token ids: {0}")]
    Decode(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is not in the vocabulary (vocab_size {vocab_size})")]
    UnknownTokenId {
        /// The id that was given.
        id: u32,
        /// The tokenizer's vocabulary size.
        vocab_size: usize,
    },
}

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

/// A tool list that cannot be used: not OpenAI function tools, or an invalid JSON Schema.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The tools text is not JSON.
    #[error("tools are not valid JSON: {0}")]
    Json(String),
    /// The tools value does not have the OpenAI shape.
    #[error(
        "tools[{index}]: {reason}; expected {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": {{...}}}}}}"
    )]
    Shape {
        /// Position in the tools array (0 when the whole value is wrong).
        index: usize,
        /// What was wrong.
        reason: String,
    },
    /// Two tools share a name.
    #[error("tools[{index}]: duplicate tool name `{name}`; tool names must be unique")]
    DuplicateName {
        /// Position of the second tool with that name.
        index: usize,
        /// The repeated name.
        name: String,
    },
    /// A tool's `parameters` is not a valid JSON Schema.
    #[error("tool `{name}`: `parameters` is not a valid JSON Schema: {reason}")]
    InvalidSchema {
        /// The tool's name.
        name: String,
        /// What the validator said.
        reason: String,
    },
}

/// A conversation that cannot be encoded into a DSV4 prompt.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The messages text is not JSON.
    #[error("messages are not valid JSON: {0}")]
    Json(String),
    /// The conversation has no messages.
    #[error("the conversation has no messages; give at least one user message")]
    NoMessages,
    /// A message does not have the OpenAI shape, or uses something DSV4 cannot encode.
    #[error("messages[{index}]: {reason}")]
    Message {
        /// Position in the messages array.
        index: usize,
        /// What was wrong and what is accepted.
        reason: String,
    },
    /// The tools (request-level or on a message) are unusable.
    #[error(transparent)]
    Tools(#[from] ToolError),
    /// Tokenizing the prompt failed.
    #[error(transparent)]
    Tokenizer(#[from] ChatError),
}

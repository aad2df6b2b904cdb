//! `/tokenize` and `/detokenize` bodies (vLLM's extension endpoints): a prompt or chat
//! messages to token ids, and token ids back to text.

use serde::{Deserialize, Serialize};

/// A `/tokenize` request for a text prompt (a body with `messages` is a chat request instead,
/// encoded as `/v1/chat/completions` would encode it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// The served model's id (optional).
    pub model: Option<String>,
    /// The text.
    pub prompt: String,
    /// Prepend BOS unless the text starts with it, as `/v1/completions` does (default true).
    pub add_special_tokens: Option<bool>,
    /// Also return each token's text.
    pub return_token_strs: Option<bool>,
}

/// A `/tokenize` answer.
#[derive(Debug, Serialize)]
pub struct TokenizeResponse {
    /// Tokens in the prompt.
    pub count: usize,
    /// The model's context in tokens.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Each token's text (its bytes as UTF-8, invalid sequences replaced), when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

/// A `/detokenize` request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// The served model's id (optional).
    pub model: Option<String>,
    /// The token ids.
    pub tokens: Vec<u32>,
}

/// A `/detokenize` answer.
#[derive(Debug, Serialize)]
pub struct DetokenizeResponse {
    /// The tokens' text (their bytes as UTF-8, invalid sequences replaced).
    pub prompt: String,
}

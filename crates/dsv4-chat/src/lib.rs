//! dsv4 tokenizer (HF tokenizer.json) and DSV4 chat markers.
//!
//! [`Tokenizer`] wraps a Hugging Face `tokenizers` tokenizer: the checkpoint's `tokenizer.json`,
//! or the embedded byte-level one of the tiny model ([`tiny_tokenizer_json`]). [`markers`] holds
//! the DeepSeek-V4 special-token strings.

pub mod error;
pub mod markers;
pub mod tokenizer;

pub use error::ChatError;
pub use tokenizer::{Tokenizer, tiny_tokenizer_json};

//! dsv4-chat: the tokenizer, the DeepSeek-V4 prompt encoding and the DSML tool-call parser.
//!
//! [`Tokenizer`] wraps a Hugging Face `tokenizers` tokenizer: the checkpoint's `tokenizer.json`,
//! or the embedded byte-level one of the tiny model ([`tiny_tokenizer_json`]). [`markers`] holds
//! the DeepSeek-V4 special-token strings. [`encoding`] turns OpenAI messages and tools into the
//! exact DSV4 prompt; [`dsml`] parses completions (reasoning, content, DSML tool calls) with a
//! strict streaming parser; [`tools`] validates tool-call arguments against JSON Schemas.

pub mod dsml;
pub mod encoding;
pub mod error;
pub mod markers;
pub mod message;
pub mod pyjson;
pub mod tokenizer;
pub mod tools;

pub use dsml::{
    AssistantMessage, DsmlParser, ErrorClass, Event, ParseError, ParserOptions, ToolCall,
    parse_completion, parse_completion_chunked,
};
pub use encoding::{
    Conversation, EncodeOptions, ReasoningEffort, encode_prompt, encode_prompt_ids,
};
pub use error::{ChatError, EncodeError, ToolError};
pub use message::{Message, Role};
pub use tokenizer::{Tokenizer, tiny_tokenizer_json};
pub use tools::ToolSet;

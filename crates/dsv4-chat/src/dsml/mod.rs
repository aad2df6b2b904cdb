//! DSML, DeepSeek's tool-call markup, and the strict streaming parser of completions.
//!
//! Grammar of a completion (thinking mode starts in the reasoning; chat mode in the content):
//!
//! ```text
//! completion := [ "<think>" ] reasoning "</think>" ]? content [ block ] [ WS* EOS ]
//! block      := "<｜DSML｜tool_calls>" ( WS* invoke )+ WS* "</｜DSML｜tool_calls>"
//!             | the same with "function_calls" (DeepSeek-V3.2)
//! invoke     := "<｜DSML｜invoke" WS+ 'name="' NAME '"' WS* ">" ( WS* param )* WS* "</｜DSML｜invoke>"
//! param      := "<｜DSML｜parameter" WS+ 'name="' KEY '"' WS+ 'string="' ("true"|"false") '"' WS* ">"
//!               VALUE "</｜DSML｜parameter>"
//! ```
//!
//! Attributes may come in any order. `string="false"` means VALUE is strict JSON. Up to two
//! newlines right before the block are the encoder's separator and are not content. In free
//! text, markup inside code fences, inline code or double quotes is content; outside them any
//! DSML markup other than a block start, a stray `<think>`/`</think>`, or BOS/User/Assistant
//! tokens are `malformed`. Source: SGLang `encoding_dsv4.py` (`parse_message_from_completion_text`,
//! `parse_tool_calls`) and DeepSeek-V3.2 `encoding_dsv32.py` for the `function_calls` name.

mod arguments;
mod call;
mod error;
mod message;
mod parser;
mod tag;
mod text;

use std::sync::Arc;

use crate::tools::ToolSet;

pub use error::{ErrorClass, ParseError};
pub use message::{AssistantMessage, parse_completion, parse_completion_chunked};
pub use parser::DsmlParser;

/// A complete tool call parsed from the completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Position among the completion's tool calls (0, 1, ...).
    pub index: usize,
    /// The tool's name.
    pub name: String,
    /// The arguments as a JSON object text (OpenAI `function.arguments`).
    pub arguments: String,
}

/// What the parser found in the text fed so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// More reasoning text (thinking mode, before `</think>`).
    Reasoning(String),
    /// More visible content.
    Content(String),
    /// A piece of a tool call as it is written ([`ParserOptions::stream_arguments`]).
    ToolCallPiece(ToolCallPiece),
    /// A tool call, complete and checked (after its pieces, when they were streamed).
    ToolCall(ToolCall),
}

/// A piece of a tool call as the model writes it: its start, then pieces of its arguments
/// text, which concatenate to its [`ToolCall::arguments`]; the checked [`Event::ToolCall`]
/// follows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCallPiece {
    /// The call starts: its [`ToolCall::index`] and its tool.
    Start {
        /// The call's index among the completion's calls.
        index: usize,
        /// The tool's name.
        name: String,
    },
    /// More of the call's arguments text.
    Arguments {
        /// The call's index.
        index: usize,
        /// The next piece.
        text: String,
    },
}

/// How to parse a completion.
#[derive(Debug, Clone, Default)]
pub struct ParserOptions {
    /// The prompt ended with `<think>`: the completion starts with reasoning.
    pub thinking: bool,
    /// The request's tools; when given, calls of other tools are `unknown_tool` and arguments
    /// are validated against each tool's schema. When `None`, any tool name is accepted.
    pub tools: Option<Arc<ToolSet>>,
    /// The content is a structured output whose form a grammar decided (a regex, a JSON
    /// schema, a structural tag): after the reasoning it is taken as written, up to the
    /// end-of-sentence token, with no markup or tool-call block looked for.
    pub verbatim_content: bool,
    /// Stream each tool call as it is written: a [`ToolCallPiece::Start`] when its invoke tag
    /// closes, [`ToolCallPiece::Arguments`] as its parameters are read, then the checked
    /// [`Event::ToolCall`]. Off, a call comes whole once checked.
    pub stream_arguments: bool,
}

#[cfg(test)]
mod tests;

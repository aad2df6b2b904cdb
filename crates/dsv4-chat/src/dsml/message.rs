//! The OpenAI assistant message assembled from parser events, and one-call parsing helpers.

use serde_json::{Value, json};

use super::{DsmlParser, Event, ParseError, ParserOptions, ToolCall};

/// An assistant message: content, reasoning (thinking mode) and tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssistantMessage {
    /// The visible content.
    pub content: String,
    /// The reasoning; `None` in chat mode.
    pub reasoning_content: Option<String>,
    /// The tool calls in order.
    pub tool_calls: Vec<ToolCall>,
}

impl AssistantMessage {
    /// An empty message; `thinking` decides whether it has a (so far empty) reasoning.
    pub fn new(thinking: bool) -> Self {
        Self {
            reasoning_content: thinking.then(String::new),
            ..Self::default()
        }
    }

    /// Adds one event.
    pub fn apply(&mut self, event: Event) {
        match event {
            Event::Reasoning(s) => self
                .reasoning_content
                .get_or_insert_with(String::new)
                .push_str(&s),
            Event::Content(s) => self.content.push_str(&s),
            Event::ToolCall(call) => self.tool_calls.push(call),
            // The checked call that follows carries the whole call.
            Event::ToolCallPiece(_) => {}
        }
    }

    /// The OpenAI message object: `content` is null when empty and there are tool calls,
    /// `tool_calls` is present only when there are some (ids `call_0`, `call_1`, ...).
    pub fn to_openai_json(&self) -> Value {
        let content = if self.content.is_empty() && !self.tool_calls.is_empty() {
            Value::Null
        } else {
            Value::String(self.content.clone())
        };
        let mut msg = json!({
            "role": "assistant",
            "content": content,
            "reasoning_content": self.reasoning_content,
        });
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(|c| {
                    json!({
                        "id": format!("call_{}", c.index),
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    })
                })
                .collect();
            msg["tool_calls"] = Value::Array(calls);
        }
        msg
    }
}

/// Parses a whole completion in one call.
pub fn parse_completion(
    text: &str,
    options: ParserOptions,
) -> Result<AssistantMessage, ParseError> {
    parse_completion_chunked(text.as_bytes(), usize::MAX, options)
}

/// Parses a completion fed through the streaming parser in `chunk`-byte pieces (chunks may
/// split UTF-8 characters); the result is the same for every chunk size.
pub fn parse_completion_chunked(
    bytes: &[u8],
    chunk: usize,
    options: ParserOptions,
) -> Result<AssistantMessage, ParseError> {
    let mut msg = AssistantMessage::new(options.thinking);
    let mut parser = DsmlParser::new(options);
    for piece in bytes.chunks(chunk.max(1)) {
        parser
            .feed_bytes(piece)?
            .into_iter()
            .for_each(|e| msg.apply(e));
    }
    parser.finish()?.into_iter().for_each(|e| msg.apply(e));
    Ok(msg)
}

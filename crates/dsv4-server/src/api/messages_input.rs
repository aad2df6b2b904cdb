//! A Messages API request's `system`, `messages` and `tools`, read keys in order (they shape
//! the prompt), as the chat messages and chat tools that dsv4-chat encodes.
//!
//! - `system`: a string or text blocks (joined with newlines) → the system message.
//! - A user message: its text blocks (joined with newlines) → a user message; each
//!   `tool_result` block → a tool message (its text, or its text blocks joined), in the order
//!   written.
//! - An assistant message: `thinking` blocks → its `reasoning_content`; text blocks → its
//!   content; `tool_use` blocks → its `tool_calls` (the input as JSON arguments);
//!   `redacted_thinking` is dropped (there is nothing to read in it). A thinking block whose
//!   text was omitted (`display: "omitted"`) has its reasoning read from its signature (see
//!   [`super::signature`]).
//! - A last assistant message is a prefill: the answer continues its text (DeepSeek's
//!   `prefix`).
//! - Consecutive messages of one role are one turn, as Anthropic combines them: their blocks
//!   are read as one message's.
//! - `cache_control` and `citations` on any block are ignored: the prefix cache reuses any
//!   earlier prompt without markers.
//!
//! Images, documents and server-tool blocks are refused, naming the block (DSV4 reads text).

use super::responses_input::{ChatMessages, chat_tools, object, str_field, string};
use super::signature;
use crate::error::ApiError;
use dsv4_chat::ToolSet;
use dsv4_chat::pyjson::OrderedJson;
use std::borrow::Cow;
use std::sync::Arc;

/// `system` and `messages` as chat messages; each remembers the field it came from.
pub fn conversation(
    system: Option<&OrderedJson>,
    messages: Option<&OrderedJson>,
) -> Result<ChatMessages, ApiError> {
    let mut chat = ChatMessages::default();
    match system {
        None | Some(OrderedJson::Null) => {}
        Some(s) => {
            let text = text_blocks(s, "system")?;
            chat.push(
                object(vec![("role", string("system")), ("content", string(&text))]),
                "system",
            );
        }
    }
    let items = match messages {
        Some(OrderedJson::Array(items)) if !items.is_empty() => items,
        Some(OrderedJson::Array(_)) => {
            return Err(ApiError::bad_param(
                "messages",
                "`messages` is empty; give at least one user message",
            ));
        }
        _ => {
            return Err(ApiError::bad_param(
                "messages",
                "`messages` must be a list of {\"role\", \"content\"} objects",
            ));
        }
    };
    // Consecutive messages of one role are one turn, as Anthropic combines them; each block
    // keeps the path of the message it came from, for errors.
    let mut turns: Vec<Turn<'_>> = Vec::new();
    for (k, m) in items.iter().enumerate() {
        let at = format!("messages[{k}]");
        if !matches!(m, OrderedJson::Object(_)) {
            return Err(ApiError::bad_param(
                at,
                format!("a message must be an object, not {}", m.type_name()),
            ));
        }
        let user = match str_field(m, "role", &at)? {
            "user" => true,
            "assistant" => false,
            other => {
                return Err(ApiError::bad_param(
                    format!("{at}.role"),
                    format!(
                        "unknown role {other:?}; use user or assistant (the system prompt goes \
                         in `system`)"
                    ),
                ));
            }
        };
        let content = blocks(m.get("content"), &at)?;
        if user && content.is_empty() {
            return Err(ApiError::bad_param(
                format!("{at}.content"),
                "a user message needs at least one block",
            ));
        }
        let placed: Vec<Placed<'_>> = content
            .into_iter()
            .enumerate()
            .map(|(i, b)| Placed {
                at: format!("{at}.content[{i}]"),
                message: at.clone(),
                block: b,
            })
            .collect();
        match turns.last_mut() {
            Some(t) if t.user == user => t.blocks.extend(placed),
            _ => turns.push(Turn {
                user,
                at,
                blocks: placed,
            }),
        }
    }
    let count = turns.len();
    for (k, turn) in turns.into_iter().enumerate() {
        if turn.user {
            push_user(&mut chat, turn.blocks)?;
        } else {
            push_assistant(&mut chat, turn.blocks, &turn.at, k + 1 == count)?;
        }
    }
    Ok(chat)
}

/// A message's content as blocks: a string is one text block.
fn blocks<'a>(content: Option<&'a OrderedJson>, at: &str) -> Result<Vec<Block<'a>>, ApiError> {
    match content {
        Some(OrderedJson::String(s)) => Ok(vec![Block::Text(s)]),
        Some(OrderedJson::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, b)| Block::read(b, &format!("{at}.content[{i}]")))
            .collect(),
        None => Err(ApiError::bad_param(
            format!("{at}.content"),
            "a message needs `content`: a string or a list of blocks",
        )),
        Some(other) => Err(ApiError::bad_param(
            format!("{at}.content"),
            format!(
                "`content` must be a string or a list of blocks, not {}",
                other.type_name()
            ),
        )),
    }
}

/// One content block of a message.
enum Block<'a> {
    Text(&'a str),
    /// Its text, or the reasoning its signature holds when the text was omitted.
    Thinking(Cow<'a, str>),
    RedactedThinking,
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a OrderedJson,
    },
    ToolResult {
        id: &'a str,
        text: String,
    },
}

/// Consecutive messages of one role.
struct Turn<'a> {
    user: bool,
    /// The path of its first message.
    at: String,
    blocks: Vec<Placed<'a>>,
}

/// A block with where it was written.
struct Placed<'a> {
    /// Its path (`messages[k].content[i]`).
    at: String,
    /// Its message's path.
    message: String,
    block: Block<'a>,
}

impl<'a> Block<'a> {
    fn read(b: &'a OrderedJson, at: &str) -> Result<Self, ApiError> {
        if !matches!(b, OrderedJson::Object(_)) {
            return Err(ApiError::bad_param(
                at,
                format!("a content block must be an object, not {}", b.type_name()),
            ));
        }
        Ok(match str_field(b, "type", at)? {
            "text" => Block::Text(str_field(b, "text", at)?),
            "thinking" => Block::Thinking(thinking(b, at)?),
            "redacted_thinking" => Block::RedactedThinking,
            "tool_use" => Block::ToolUse {
                id: str_field(b, "id", at)?,
                name: str_field(b, "name", at)?,
                input: match b.get("input") {
                    Some(input @ OrderedJson::Object(_)) => input,
                    _ => {
                        return Err(ApiError::bad_param(
                            format!("{at}.input"),
                            "a tool_use block's `input` must be an object",
                        ));
                    }
                },
            },
            "tool_result" => Block::ToolResult {
                id: str_field(b, "tool_use_id", at)?,
                text: match b.get("content") {
                    None | Some(OrderedJson::Null) => String::new(),
                    Some(c) => text_blocks(c, &format!("{at}.content"))?,
                },
            },
            kind @ ("image" | "document" | "search_result") => {
                return Err(ApiError::bad_param(
                    format!("{at}.type"),
                    format!("{kind} blocks are not supported: DSV4 reads text only"),
                ));
            }
            other => {
                return Err(ApiError::bad_param(
                    format!("{at}.type"),
                    format!(
                        "unsupported content block type {other:?}; this server reads text, \
                         thinking, redacted_thinking, tool_use and tool_result blocks"
                    ),
                ));
            }
        })
    }
}

/// A thinking block's reasoning: its text, or when that is empty (`display: "omitted"`) what
/// its signature holds.
fn thinking<'a>(b: &'a OrderedJson, at: &str) -> Result<Cow<'a, str>, ApiError> {
    let text = str_field(b, "thinking", at)?;
    if !text.is_empty() {
        return Ok(Cow::Borrowed(text));
    }
    let Some(OrderedJson::String(sig)) = b.get("signature") else {
        return Ok(Cow::Borrowed(text));
    };
    Ok(signature::read(sig, &format!("{at}.signature"))?.map_or(Cow::Borrowed(text), Cow::Owned))
}

/// A string, or a list of text blocks joined with newlines.
fn text_blocks(v: &OrderedJson, at: &str) -> Result<String, ApiError> {
    match v {
        OrderedJson::String(s) => Ok(s.clone()),
        OrderedJson::Array(items) => {
            let mut texts = Vec::with_capacity(items.len());
            for (i, b) in items.iter().enumerate() {
                let at = format!("{at}[{i}]");
                match b.get("type").and_then(OrderedJson::as_str) {
                    Some("text") => texts.push(str_field(b, "text", &at)?),
                    Some(kind @ ("image" | "document" | "search_result")) => {
                        return Err(ApiError::bad_param(
                            format!("{at}.type"),
                            format!("{kind} blocks are not supported: DSV4 reads text only"),
                        ));
                    }
                    _ => {
                        return Err(ApiError::bad_param(
                            at,
                            "expected a text block, {\"type\": \"text\", \"text\"}",
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        other => Err(ApiError::bad_param(
            at,
            format!(
                "must be a string or a list of text blocks, not {}",
                other.type_name()
            ),
        )),
    }
}

/// A user turn: text as user messages, tool results as tool messages, in order; each chat
/// message remembers the message its first block came from.
fn push_user(chat: &mut ChatMessages, blocks: Vec<Placed<'_>>) -> Result<(), ApiError> {
    let mut text: Vec<&str> = Vec::new();
    let mut text_at = String::new();
    let flush = |chat: &mut ChatMessages, text: &mut Vec<&str>, at: &str| {
        if !text.is_empty() {
            let joined = text.join("\n");
            chat.push(
                object(vec![("role", string("user")), ("content", string(&joined))]),
                at,
            );
            text.clear();
        }
    };
    for Placed { at, message, block } in blocks {
        match block {
            Block::Text(t) => {
                if text.is_empty() {
                    text_at = message;
                }
                text.push(t);
            }
            Block::ToolResult { id, text: result } => {
                flush(chat, &mut text, &text_at);
                chat.push(
                    object(vec![
                        ("role", string("tool")),
                        ("tool_call_id", string(id)),
                        ("content", OrderedJson::String(result)),
                    ]),
                    &message,
                );
            }
            Block::Thinking(_) | Block::RedactedThinking | Block::ToolUse { .. } => {
                return Err(ApiError::bad_param(
                    at,
                    "thinking and tool_use blocks belong to assistant messages",
                ));
            }
        }
    }
    flush(chat, &mut text, &text_at);
    Ok(())
}

/// An assistant turn (`at`: its first message): thinking, text and tool calls in one chat
/// message; the last turn of the conversation is a prefill the answer continues.
fn push_assistant(
    chat: &mut ChatMessages,
    blocks: Vec<Placed<'_>>,
    at: &str,
    last: bool,
) -> Result<(), ApiError> {
    let (mut text, mut thinking, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for Placed { at, block, .. } in blocks {
        match block {
            Block::Text(t) => text.push(t),
            Block::Thinking(t) => thinking.push(t),
            Block::RedactedThinking => {}
            Block::ToolUse { id, name, input } => calls.push(object(vec![
                ("id", string(id)),
                ("type", string("function")),
                (
                    "function",
                    object(vec![
                        ("name", string(name)),
                        ("arguments", OrderedJson::String(input.to_python_json())),
                    ]),
                ),
            ])),
            Block::ToolResult { .. } => {
                return Err(ApiError::bad_param(
                    at,
                    "tool_result blocks belong to user messages",
                ));
            }
        }
    }
    let mut fields = vec![
        ("role", string("assistant")),
        ("content", OrderedJson::String(text.join("\n"))),
    ];
    if !thinking.is_empty() {
        fields.push((
            "reasoning_content",
            OrderedJson::String(thinking.join("\n")),
        ));
    }
    if !calls.is_empty() {
        fields.push(("tool_calls", OrderedJson::Array(calls)));
    }
    if last {
        fields.push(("prefix", OrderedJson::Bool(true)));
    }
    chat.push(object(fields), at);
    Ok(())
}

/// The request's client tools as dsv4-chat's tool set: `{"name", "description",
/// "input_schema", "strict"}` each (`type` absent or "custom"). Anthropic-defined and server
/// tools (`bash_…`, `web_search_…`) are refused, naming them.
pub fn tools(tools: &OrderedJson) -> Result<Arc<ToolSet>, ApiError> {
    let OrderedJson::Array(items) = tools else {
        return Err(ApiError::bad_param("tools", "`tools` must be a list"));
    };
    let mut functions = Vec::with_capacity(items.len());
    for (k, tool) in items.iter().enumerate() {
        let at = format!("tools[{k}]");
        let OrderedJson::Object(fields) = tool else {
            return Err(ApiError::bad_param(at, "a tool must be an object"));
        };
        match tool.get("type") {
            None | Some(OrderedJson::Null) => {}
            Some(OrderedJson::String(t)) if t == "custom" => {}
            Some(other) => {
                let shown = other
                    .as_str()
                    .map_or_else(|| other.to_python_json(), String::from);
                return Err(ApiError::bad_param(
                    format!("{at}.type"),
                    format!(
                        "tool type {shown:?} is not supported: this server runs no \
                         Anthropic-defined or server tools; declare a client tool with `name` \
                         and `input_schema`"
                    ),
                ));
            }
        }
        let mut function = vec![
            ("type".to_string(), string("function")),
            ("name".to_string(), string(str_field(tool, "name", &at)?)),
        ];
        for (key, value) in fields {
            match key.as_str() {
                "name" | "type" | "cache_control" | "input_examples" | "eager_input_streaming" => {}
                "description" => function.push(("description".into(), value.clone())),
                "input_schema" => function.push(("parameters".into(), value.clone())),
                "strict" => function.push(("strict".into(), value.clone())),
                "defer_loading" if *value != OrderedJson::Bool(true) => {}
                other => {
                    return Err(ApiError::bad_param(
                        format!("{at}.{other}"),
                        format!(
                            "`{other}` is not supported on a tool; this server reads name, \
                             description, input_schema and strict"
                        ),
                    ));
                }
            }
        }
        if tool.get("input_schema").is_none() {
            return Err(ApiError::bad_param(
                format!("{at}.input_schema"),
                "a tool needs `input_schema`, the JSON schema of its input",
            ));
        }
        functions.push(OrderedJson::Object(function));
    }
    chat_tools(&OrderedJson::Array(functions))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert(system: Option<&str>, messages: &str) -> Result<Vec<String>, ApiError> {
        let system = system.map(|s| OrderedJson::parse(s).unwrap());
        let messages = OrderedJson::parse(messages).unwrap();
        let chat = conversation(system.as_ref(), Some(&messages))?;
        Ok(chat.messages.iter().map(|m| m.to_python_json()).collect())
    }

    #[test]
    fn text_tool_use_and_tool_result_become_chat_messages_in_order() {
        let got = convert(
            Some(r#"[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}}]"#),
            r#"[
              {"role": "user", "content": "Weather in Oslo?"},
              {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Call the tool.", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo", "days": 2}}]},
              {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "-3 C"}]},
                {"type": "text", "text": "And tomorrow?"}]}
            ]"#,
        )
        .unwrap();
        assert_eq!(
            got,
            [
                r#"{"role": "system", "content": "Be brief.\nUse tools."}"#,
                r#"{"role": "user", "content": "Weather in Oslo?"}"#,
                r#"{"role": "assistant", "content": "Checking.", "reasoning_content": "Call the tool.", "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]}"#,
                r#"{"role": "tool", "tool_call_id": "toolu_1", "content": "-3 C"}"#,
                r#"{"role": "user", "content": "And tomorrow?"}"#,
            ]
        );
    }

    #[test]
    fn a_last_assistant_message_is_a_prefill() {
        let got = convert(
            None,
            r#"[{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]"#,
        )
        .unwrap();
        assert_eq!(
            got[1],
            r#"{"role": "assistant", "content": "1, 2,", "prefix": true}"#
        );
    }

    #[test]
    fn consecutive_messages_of_one_role_are_one_turn() {
        let got = convert(
            None,
            r#"[
              {"role": "user", "content": "Weather in Oslo?"},
              {"role": "user", "content": [{"type": "text", "text": "And Paris?"}]},
              {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Oslo"}}]},
              {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_2", "name": "w", "input": {"city": "Paris"}}]},
              {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "-3 C"}]},
              {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "9 C"},
                {"type": "text", "text": "Thanks."}]},
              {"role": "assistant", "content": "Oslo is"},
              {"role": "assistant", "content": [{"type": "text", "text": "colder"}]}
            ]"#,
        )
        .unwrap();
        assert_eq!(
            got,
            [
                r#"{"role": "user", "content": "Weather in Oslo?\nAnd Paris?"}"#,
                r#"{"role": "assistant", "content": "", "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}}, {"id": "toolu_2", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}}]}"#,
                r#"{"role": "tool", "tool_call_id": "toolu_1", "content": "-3 C"}"#,
                r#"{"role": "tool", "tool_call_id": "toolu_2", "content": "9 C"}"#,
                r#"{"role": "user", "content": "Thanks."}"#,
                r#"{"role": "assistant", "content": "Oslo is\ncolder", "prefix": true}"#,
            ]
        );
        // An error in a merged turn names the message it is in.
        let err = convert(
            None,
            r#"[{"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "b"},
                                             {"type": "thinking", "thinking": "c"}]}]"#,
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[1].content[1]"));
    }

    #[test]
    fn bad_blocks_and_roles_are_400s_naming_the_field() {
        let cases = [
            (
                r#"[{"role": "user", "content": [{"type": "image", "source": {}}]}]"#,
                "messages[0].content[0].type",
                "text only",
            ),
            (
                r#"[{"role": "system", "content": "x"}]"#,
                "messages[0].role",
                "`system`",
            ),
            (
                r#"[{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]"#,
                "messages[0].content[0]",
                "assistant messages",
            ),
            (
                r#"[{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "x"}]}]"#,
                "messages[0].content[0].input",
                "object",
            ),
            (r#"[]"#, "messages", "empty"),
            (r#"[{"role": "user"}]"#, "messages[0].content", "needs"),
            (
                r#"[{"role": "user", "content": [{"type": "server_tool_use"}]}]"#,
                "messages[0].content[0].type",
                "tool_result",
            ),
        ];
        for (messages, param, says) in cases {
            let e = convert(None, messages).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{messages}: {e}");
            assert!(e.message.contains(says), "{messages}: {e}");
        }
    }

    #[test]
    fn client_tools_become_chat_tools_and_others_are_refused() {
        let set = tools(
            &OrderedJson::parse(
                r#"[{"name": "get_weather", "description": "Weather", "cache_control": {"type": "ephemeral"},
                     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]"#,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(set.names(), ["get_weather"]);
        for (tool, param) in [
            (
                r#"[{"type": "web_search_20250305", "name": "web_search"}]"#,
                "tools[0].type",
            ),
            (r#"[{"name": "f"}]"#, "tools[0].input_schema"),
            (
                r#"[{"name": "f", "input_schema": {"type": "object"}, "defer_loading": true}]"#,
                "tools[0].defer_loading",
            ),
            (r#"{"name": "f"}"#, "tools"),
        ] {
            let e = tools(&OrderedJson::parse(tool).unwrap()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{tool}: {e}");
        }
    }
}

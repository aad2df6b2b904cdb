//! Chat messages as the OpenAI API sends them, read into the shapes the DSV4 encoder needs.
//!
//! Accepted per message: `role` (system, developer, user, assistant, tool, latest_reminder),
//! `content` (a string, null, or a list of `{"type": "text", "text": ...}` parts, joined with
//! single spaces as SGLang does before encoding), `reasoning_content`, `tool_calls` (each
//! `{"id", "type": "function", "function": {"name", "arguments"}}`, arguments a JSON string or
//! an object), `tool_call_id`, and on system/developer messages `tools` and `response_format`.
//! Other fields (`name`, ...) are ignored. Non-text content parts are an error: DSV4 is text-only.

use std::sync::Arc;

use crate::error::EncodeError;
use crate::pyjson::OrderedJson;
use crate::tools::ToolSet;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The system prompt (rendered without a marker).
    System,
    /// A developer instruction (rendered as a user turn).
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool result (merged into a user turn as a `<tool_result>` block).
    Tool,
    /// A "latest reminder" (rendered after `<｜latest_reminder｜>`).
    LatestReminder,
}

impl Role {
    fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "latest_reminder" => Role::LatestReminder,
            _ => return None,
        })
    }
}

/// The arguments of a tool call in the conversation history.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolArguments {
    /// A JSON object, keys in order.
    Object(Vec<(String, OrderedJson)>),
    /// A string that is not JSON; the reference encoder shows it as one `arguments` parameter.
    Raw(String),
}

/// A tool call made by the assistant earlier in the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryToolCall {
    /// The call id (`tool_call_id` of the matching tool message), if given.
    pub id: Option<String>,
    /// The function name.
    pub name: String,
    /// The arguments.
    pub arguments: ToolArguments,
}

/// One chat message.
#[derive(Debug, Clone)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// The text (null content reads as empty, as SGLang does).
    pub content: String,
    /// The assistant's reasoning, if given.
    pub reasoning_content: Option<String>,
    /// The assistant's tool calls.
    pub tool_calls: Vec<HistoryToolCall>,
    /// For tool messages: the call this result answers.
    pub tool_call_id: Option<String>,
    /// Tools declared on a system or developer message.
    pub tools: Option<Arc<ToolSet>>,
    /// A response format declared on a system or developer message.
    pub response_format: Option<OrderedJson>,
    /// The last message, an assistant's, whose text the answer continues (DeepSeek's
    /// `prefix: true`): rendered without its end-of-sentence token, as the reference encoder
    /// renders a message marked `wo_eos`.
    pub prefix: bool,
}

impl Message {
    /// A message with only a role and text.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            tools: None,
            response_format: None,
            prefix: false,
        }
    }

    /// Reads one OpenAI-format message; `index` is its position, for error messages.
    pub fn from_ordered(index: usize, value: &OrderedJson) -> Result<Self, EncodeError> {
        let err = |reason: String| EncodeError::Message { index, reason };
        if !matches!(value, OrderedJson::Object(_)) {
            return Err(err(format!(
                "a message must be an object, not {}",
                value.type_name()
            )));
        }
        let role_text = value
            .get("role")
            .and_then(OrderedJson::as_str)
            .ok_or_else(|| err("`role` must be a string".into()))?;
        let role = Role::parse(role_text).ok_or_else(|| {
            err(format!(
                "unknown role {role_text:?}; DSV4 knows system, developer, user, assistant, tool, latest_reminder"
            ))
        })?;
        let mut msg = Message::new(role, content_text(value.get("content")).map_err(err)?);
        msg.reasoning_content = optional_string(value, "reasoning_content").map_err(err)?;
        msg.tool_call_id = optional_string(value, "tool_call_id").map_err(err)?;
        if let Some(calls) = value.get("tool_calls") {
            msg.tool_calls = history_calls(calls).map_err(err)?;
            if !msg.tool_calls.is_empty() && role != Role::Assistant {
                return Err(err("only assistant messages carry `tool_calls`".into()));
            }
        }
        if let Some(tools) = value.get("tools").filter(|t| **t != OrderedJson::Null) {
            if !matches!(role, Role::System | Role::Developer) {
                return Err(err("only system or developer messages carry `tools`".into()));
            }
            msg.tools = Some(Arc::new(ToolSet::from_ordered(tools)?));
        }
        if let Some(rf) = value
            .get("response_format")
            .filter(|t| **t != OrderedJson::Null)
        {
            if !matches!(role, Role::System | Role::Developer) {
                return Err(err(
                    "only system or developer messages carry `response_format`".into(),
                ));
            }
            msg.response_format = Some(rf.clone());
        }
        msg.prefix = match value.get("prefix") {
            None | Some(OrderedJson::Null) | Some(OrderedJson::Bool(false)) => false,
            Some(OrderedJson::Bool(true)) if role == Role::Assistant => true,
            Some(OrderedJson::Bool(true)) => {
                return Err(err(
                    "only an assistant message can be a `prefix` the answer continues".into(),
                ));
            }
            Some(other) => {
                return Err(err(format!(
                    "`prefix` must be true or false, not {}",
                    other.type_name()
                )));
            }
        };
        Ok(msg)
    }
}

fn optional_string(value: &OrderedJson, key: &str) -> Result<Option<String>, String> {
    match value.get(key) {
        None | Some(OrderedJson::Null) => Ok(None),
        Some(OrderedJson::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "`{key}` must be a string, not {}",
            other.type_name()
        )),
    }
}

/// The text of a `content` field: a string, null, or a list of text parts joined by spaces.
fn content_text(content: Option<&OrderedJson>) -> Result<String, String> {
    match content {
        None | Some(OrderedJson::Null) => Ok(String::new()),
        Some(OrderedJson::String(s)) => Ok(s.clone()),
        Some(OrderedJson::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (i, part) in parts.iter().enumerate() {
                match part {
                    OrderedJson::String(s) => texts.push(s.as_str()),
                    OrderedJson::Object(_)
                        if part.get("type").and_then(OrderedJson::as_str) == Some("text") =>
                    {
                        let text =
                            part.get("text")
                                .and_then(OrderedJson::as_str)
                                .ok_or_else(|| {
                                    format!("content[{i}]: a text part needs a string `text`")
                                })?;
                        texts.push(text);
                    }
                    _ => {
                        let kind = part.get("type").map(OrderedJson::to_python_json);
                        return Err(format!(
                            "content[{i}]: only text parts can be encoded (DSV4 is text-only), got type {}",
                            kind.unwrap_or_else(|| part.type_name().to_owned())
                        ));
                    }
                }
            }
            Ok(texts.join(" "))
        }
        Some(other) => Err(format!(
            "`content` must be a string, null or a list of text parts, not {}",
            other.type_name()
        )),
    }
}

fn history_calls(calls: &OrderedJson) -> Result<Vec<HistoryToolCall>, String> {
    let items = match calls {
        OrderedJson::Null => return Ok(Vec::new()),
        OrderedJson::Array(items) => items,
        other => {
            return Err(format!(
                "`tool_calls` must be an array, not {}",
                other.type_name()
            ));
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let function = call
                .get("function")
                .ok_or_else(|| format!("tool_calls[{i}]: missing `function`"))?;
            let name = function
                .get("name")
                .and_then(OrderedJson::as_str)
                .ok_or_else(|| format!("tool_calls[{i}]: `function.name` must be a string"))?;
            let arguments = match function.get("arguments") {
                None | Some(OrderedJson::Null) => ToolArguments::Object(Vec::new()),
                Some(OrderedJson::Object(fields)) => ToolArguments::Object(fields.clone()),
                Some(OrderedJson::String(text)) => match OrderedJson::parse(text) {
                    Ok(OrderedJson::Object(fields)) => ToolArguments::Object(fields),
                    Ok(other) => {
                        return Err(format!(
                            "tool_calls[{i}]: `function.arguments` must encode a JSON object, not {}",
                            other.type_name()
                        ));
                    }
                    Err(_) => ToolArguments::Raw(text.clone()),
                },
                Some(other) => {
                    return Err(format!(
                        "tool_calls[{i}]: `function.arguments` must be a JSON string or object, not {}",
                        other.type_name()
                    ));
                }
            };
            let id = call.get("id").and_then(OrderedJson::as_str).map(str::to_owned);
            Ok(HistoryToolCall {
                id,
                name: name.to_owned(),
                arguments,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(text: &str) -> Result<Message, EncodeError> {
        Message::from_ordered(0, &OrderedJson::parse(text).unwrap())
    }

    #[test]
    fn reads_openai_messages() {
        let m = msg(
            r#"{"role":"USER","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
        )
        .unwrap();
        assert_eq!((m.role, m.content.as_str()), (Role::User, "a b"));
        let m = msg(r#"{"role":"assistant","content":null,"tool_calls":[
            {"id":"c1","type":"function","function":{"name":"f","arguments":"{\"b\":1,\"a\":\"x\"}"}},
            {"id":"c2","type":"function","function":{"name":"g","arguments":"not json"}},
            {"type":"function","function":{"name":"h","arguments":{"k":[1]}}}]}"#)
        .unwrap();
        assert_eq!(m.content, "");
        assert_eq!(m.tool_calls.len(), 3);
        assert_eq!(m.tool_calls[0].id.as_deref(), Some("c1"));
        let ToolArguments::Object(fields) = &m.tool_calls[0].arguments else {
            panic!("object arguments expected")
        };
        assert_eq!(fields[0].0, "b", "key order is kept");
        assert_eq!(
            m.tool_calls[1].arguments,
            ToolArguments::Raw("not json".into())
        );
        assert_eq!(m.tool_calls[2].id, None);
    }

    #[test]
    fn rejects_what_dsv4_cannot_encode() {
        for (text, needle) in [
            (r#"[]"#, "must be an object"),
            (r#"{"content":"x"}"#, "`role`"),
            (r#"{"role":"function","content":"x"}"#, "unknown role"),
            (
                r#"{"role":"user","content":[{"type":"image_url","image_url":{}}]}"#,
                "text-only",
            ),
            (r#"{"role":"user","content":5}"#, "`content`"),
            (
                r#"{"role":"user","content":"x","tool_calls":[{"function":{"name":"f"}}]}"#,
                "only assistant",
            ),
            (
                r#"{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}"#,
                "JSON object",
            ),
            (
                r#"{"role":"assistant","tool_calls":[{}]}"#,
                "missing `function`",
            ),
            (r#"{"role":"user","tools":[]}"#, "only system or developer"),
            (r#"{"role":"tool","tool_call_id":3}"#, "`tool_call_id`"),
        ] {
            let err = msg(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}

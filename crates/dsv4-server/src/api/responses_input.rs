//! A Responses API request's `input` items and `tools`, read keys in order (they shape the
//! prompt), as the chat messages and chat tools that dsv4-chat encodes.
//!
//! Items: a string (one user message); messages `{"role", "content"}` (`type` "message" or
//! absent) whose content is a string or `input_text` / `output_text` parts; `function_call`
//! (joins the assistant turn before it, or starts one); `function_call_output` (a tool
//! message); `reasoning` (its `content` text, else its summary, becomes the
//! `reasoning_content` of the assistant turn it starts). Images, files, audio and item
//! references are refused, naming the item.

use super::chat::ToolChoice;
use crate::error::ApiError;
use dsv4_chat::pyjson::OrderedJson;
use dsv4_chat::{
    Conversation, EncodeError, EncodeOptions, Message, Tokenizer, ToolSet, encode_prompt_ids,
};
use serde_json::Value;
use std::sync::Arc;

/// Chat messages, each with the request field it came from (named in errors).
#[derive(Debug, Clone, Default)]
pub struct ChatMessages {
    /// The messages, in OpenAI's chat format.
    pub messages: Vec<OrderedJson>,
    /// Per message: `input[k]`, `instructions` or `previous_response_id`.
    pub origins: Vec<String>,
    /// The last message is an assistant turn started by a reasoning item and nothing else
    /// yet: an assistant message that follows fills its content.
    open_reasoning: bool,
}

/// A JSON string.
pub(crate) fn string(s: &str) -> OrderedJson {
    OrderedJson::String(s.to_owned())
}

/// A JSON object with these fields, in order.
pub(crate) fn object(fields: Vec<(&str, OrderedJson)>) -> OrderedJson {
    OrderedJson::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

fn set(msg: &mut OrderedJson, key: &str, value: OrderedJson) {
    if let OrderedJson::Object(fields) = msg {
        match fields.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => fields.push((key.to_owned(), value)),
        }
    }
}

/// `item[key]` as a string, or a 400 naming `at.key`.
pub(crate) fn str_field<'a>(
    item: &'a OrderedJson,
    key: &str,
    at: &str,
) -> Result<&'a str, ApiError> {
    item.get(key).and_then(OrderedJson::as_str).ok_or_else(|| {
        ApiError::bad_param(format!("{at}.{key}"), format!("`{key}` must be a string"))
    })
}

impl ChatMessages {
    /// As JSON to keep on disk: each message as the Python JSON text the prompt encoder reads,
    /// their origins, and whether a reasoning item left the assistant turn open.
    pub fn to_json(&self) -> serde_json::Value {
        let messages: Vec<String> = self.messages.iter().map(|m| m.to_python_json()).collect();
        serde_json::json!({
            "messages": messages,
            "origins": self.origins,
            "open_reasoning": self.open_reasoning,
        })
    }

    /// Read back what [`Self::to_json`] wrote (None: not that shape).
    pub fn from_json(v: &serde_json::Value) -> Option<Self> {
        let strings = |key: &str| -> Option<Vec<&str>> {
            v.get(key)?.as_array()?.iter().map(|m| m.as_str()).collect()
        };
        let messages = strings("messages")?
            .into_iter()
            .map(|m| OrderedJson::parse(m).ok())
            .collect::<Option<Vec<_>>>()?;
        let origins: Vec<String> = strings("origins")?.into_iter().map(String::from).collect();
        (messages.len() == origins.len()).then_some(())?;
        Some(Self {
            messages,
            origins,
            open_reasoning: v.get("open_reasoning")?.as_bool()?,
        })
    }

    /// Append one message from `origin`.
    pub fn push(&mut self, message: OrderedJson, origin: impl Into<String>) {
        self.messages.push(message);
        self.origins.push(origin.into());
        self.open_reasoning = false;
    }

    /// Append everything of `other` (a stored conversation).
    pub fn extend(&mut self, other: &ChatMessages) {
        self.messages.extend(other.messages.iter().cloned());
        self.origins.extend(other.origins.iter().cloned());
        self.open_reasoning = false;
    }

    /// Append the items of `input` (a string or a list of items).
    pub fn push_input(&mut self, input: &OrderedJson) -> Result<(), ApiError> {
        match input {
            OrderedJson::String(text) => {
                self.push(
                    object(vec![("role", string("user")), ("content", string(text))]),
                    "input",
                );
                Ok(())
            }
            OrderedJson::Array(items) if items.is_empty() => Err(ApiError::bad_param(
                "input",
                "`input` is empty; give a string or at least one item",
            )),
            OrderedJson::Array(items) => items
                .iter()
                .enumerate()
                .try_for_each(|(k, item)| self.push_item(item, &format!("input[{k}]"))),
            other => Err(ApiError::bad_param(
                "input",
                format!(
                    "`input` must be a string or a list of items, not {}",
                    other.type_name()
                ),
            )),
        }
    }

    fn push_item(&mut self, item: &OrderedJson, at: &str) -> Result<(), ApiError> {
        if !matches!(item, OrderedJson::Object(_)) {
            return Err(ApiError::bad_param(
                at,
                format!("an input item must be an object, not {}", item.type_name()),
            ));
        }
        let kind = match item.get("type") {
            None => "message",
            Some(t) => t.as_str().ok_or_else(|| {
                ApiError::bad_param(format!("{at}.type"), "`type` must be a string")
            })?,
        };
        match kind {
            "message" => self.push_message(item, at),
            "function_call" => {
                let call = object(vec![
                    ("id", string(str_field(item, "call_id", at)?)),
                    ("type", string("function")),
                    (
                        "function",
                        object(vec![
                            ("name", string(str_field(item, "name", at)?)),
                            ("arguments", string(str_field(item, "arguments", at)?)),
                        ]),
                    ),
                ]);
                self.push_call(call, at);
                Ok(())
            }
            "function_call_output" => {
                let content = content_text(item.get("output"), &format!("{at}.output"))?;
                self.push(
                    object(vec![
                        ("role", string("tool")),
                        ("tool_call_id", string(str_field(item, "call_id", at)?)),
                        ("content", OrderedJson::String(content)),
                    ]),
                    at,
                );
                Ok(())
            }
            "reasoning" => {
                let text = reasoning_text(item, at)?;
                self.push(
                    object(vec![
                        ("role", string("assistant")),
                        ("content", string("")),
                        ("reasoning_content", OrderedJson::String(text)),
                    ]),
                    at,
                );
                self.open_reasoning = true;
                Ok(())
            }
            "item_reference" => Err(ApiError::bad_param(
                at,
                "item references are not supported; send the item itself, or continue a \
                 stored response with previous_response_id",
            )),
            other => Err(ApiError::bad_param(
                format!("{at}.type"),
                format!(
                    "unsupported input item type {other:?}; this server reads messages, \
                     function_call, function_call_output and reasoning items"
                ),
            )),
        }
    }

    fn push_message(&mut self, item: &OrderedJson, at: &str) -> Result<(), ApiError> {
        let role = str_field(item, "role", at)?;
        if !matches!(role, "user" | "system" | "developer" | "assistant") {
            return Err(ApiError::bad_param(
                format!("{at}.role"),
                format!("unknown role {role:?}; use user, system, developer or assistant"),
            ));
        }
        let content = content_text(item.get("content"), &format!("{at}.content"))?;
        if role == "assistant"
            && self.open_reasoning
            && let Some(last) = self.messages.last_mut()
        {
            set(last, "content", OrderedJson::String(content));
            self.open_reasoning = false;
            return Ok(());
        }
        self.push(
            object(vec![
                ("role", string(role)),
                ("content", OrderedJson::String(content)),
            ]),
            at,
        );
        Ok(())
    }

    /// A call joins the assistant turn just before it, else starts one.
    fn push_call(&mut self, call: OrderedJson, at: &str) {
        let last_is_assistant = self
            .messages
            .last()
            .is_some_and(|m| m.get("role").and_then(OrderedJson::as_str) == Some("assistant"));
        if !last_is_assistant {
            self.push(
                object(vec![("role", string("assistant")), ("content", string(""))]),
                at,
            );
        }
        if let Some(OrderedJson::Object(fields)) = self.messages.last_mut() {
            match fields.iter_mut().find(|(k, _)| k == "tool_calls") {
                Some((_, OrderedJson::Array(calls))) => calls.push(call),
                _ => fields.push(("tool_calls".to_owned(), OrderedJson::Array(vec![call]))),
            }
        }
        self.open_reasoning = false;
    }

    /// These messages as dsv4-chat's conversation, declaring `tools` unless `choice` is none
    /// or there are none, and the ids of its prompt under `opts`; an error names the field its
    /// message came from.
    pub fn encode(
        &self,
        (choice, tools): (&ToolChoice, &Arc<ToolSet>),
        opts: &EncodeOptions,
        tokenizer: &Tokenizer,
    ) -> Result<(Conversation, Vec<u32>), ApiError> {
        let conv = Conversation {
            messages: self.to_messages()?,
            tools: (*choice != ToolChoice::None && !tools.is_empty()).then(|| Arc::clone(tools)),
        };
        let (_, ids) =
            encode_prompt_ids(&conv, opts, tokenizer).map_err(|e| self.encode_error(e))?;
        Ok((conv, ids))
    }

    /// The messages as dsv4-chat reads them; an error names the field its message came from.
    pub fn to_messages(&self) -> Result<Vec<Message>, ApiError> {
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| Message::from_ordered(i, m).map_err(|e| self.encode_error(e)))
            .collect()
    }

    /// An encoding error, naming the field its message came from.
    pub fn encode_error(&self, e: EncodeError) -> ApiError {
        match e {
            EncodeError::Message { index, reason } => {
                let at = self.origins.get(index).map_or("input", String::as_str);
                ApiError::bad_param(at, reason)
            }
            EncodeError::Tools(t) => ApiError::bad_param("tools", t.to_string()),
            EncodeError::NoMessages => {
                ApiError::bad_param("input", "there is no message to answer; give an input")
            }
            EncodeError::Json(j) => ApiError::bad_request(j),
            EncodeError::Tokenizer(t) => ApiError::internal(format!("tokenizing the prompt: {t}")),
        }
    }
}

/// The text of a message's content or a call's output: a string, or text parts
/// (`input_text`, `output_text`, `text`, `refusal`) joined with single spaces as chat's are.
fn content_text(content: Option<&OrderedJson>, at: &str) -> Result<String, ApiError> {
    match content {
        None | Some(OrderedJson::Null) => Ok(String::new()),
        Some(OrderedJson::String(s)) => Ok(s.clone()),
        Some(OrderedJson::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (i, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(OrderedJson::as_str);
                let key = match kind {
                    Some("input_text" | "output_text" | "text") => "text",
                    Some("refusal") => "refusal",
                    Some(other) => {
                        return Err(ApiError::bad_param(
                            format!("{at}[{i}].type"),
                            format!(
                                "only text parts can be encoded (DSV4 is text-only), got {other:?}"
                            ),
                        ));
                    }
                    None => {
                        return Err(ApiError::bad_param(
                            format!("{at}[{i}]"),
                            "a content part must be an object with a string `type`",
                        ));
                    }
                };
                texts.push(str_field(part, key, &format!("{at}[{i}]"))?);
            }
            Ok(texts.join(" "))
        }
        Some(other) => Err(ApiError::bad_param(
            at,
            format!(
                "must be a string or a list of text parts, not {}",
                other.type_name()
            ),
        )),
    }
}

/// A reasoning item's text: its `content` parts, else its `summary` parts, joined.
fn reasoning_text(item: &OrderedJson, at: &str) -> Result<String, ApiError> {
    for key in ["content", "summary"] {
        match item.get(key) {
            None | Some(OrderedJson::Null) => {}
            Some(OrderedJson::Array(parts)) if parts.is_empty() => {}
            Some(OrderedJson::Array(parts)) => {
                let texts = parts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| str_field(p, "text", &format!("{at}.{key}[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                return Ok(texts.join("\n\n"));
            }
            Some(other) => {
                return Err(ApiError::bad_param(
                    format!("{at}.{key}"),
                    format!("must be a list of text parts, not {}", other.type_name()),
                ));
            }
        }
    }
    Ok(String::new())
}

/// `input` as the list of items `GET /v1/responses/{id}/input_items` shows: a string as one
/// user message with an `input_text` part, items as given; each gets an `id` from `new_id`
/// (given the item's type) unless it has one.
pub fn input_items(input: &OrderedJson, mut new_id: impl FnMut(&str) -> String) -> Vec<Value> {
    let items = match input {
        OrderedJson::String(text) => vec![serde_json::json!({
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": text}],
        })],
        OrderedJson::Array(items) => items.iter().map(OrderedJson::to_value).collect(),
        _ => Vec::new(),
    };
    items
        .into_iter()
        .map(|mut item| {
            if let Value::Object(o) = &mut item
                && !o.get("id").is_some_and(Value::is_string)
            {
                let kind = o.get("type").and_then(Value::as_str).unwrap_or("message");
                o.insert("id".into(), Value::String(new_id(kind)));
            }
            item
        })
        .collect()
}

/// The request's function tools as dsv4-chat's tool set. Each is `{"type": "function",
/// "name", "description", "parameters", "strict"}`; other tool types (hosted tools, custom
/// tools) are refused, naming them.
pub fn chat_tools(tools: &OrderedJson) -> Result<Arc<ToolSet>, ApiError> {
    let OrderedJson::Array(items) = tools else {
        return Err(ApiError::bad_param("tools", "`tools` must be a list"));
    };
    let mut chat = Vec::with_capacity(items.len());
    for (k, tool) in items.iter().enumerate() {
        let at = format!("tools[{k}]");
        let OrderedJson::Object(fields) = tool else {
            return Err(ApiError::bad_param(at, "a tool must be an object"));
        };
        match tool.get("type").and_then(OrderedJson::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::bad_param(
                    format!("{at}.type"),
                    format!(
                        "tool type {other:?} is not supported: this server runs no hosted or \
                         custom tools; declare {{\"type\": \"function\", \"name\", \
                         \"parameters\"}}"
                    ),
                ));
            }
            None => {
                return Err(ApiError::bad_param(
                    format!("{at}.type"),
                    "a tool needs `type`: \"function\"",
                ));
            }
        }
        str_field(tool, "name", &at)?;
        let function: Vec<(String, OrderedJson)> = fields
            .iter()
            .filter(|(key, _)| key != "type")
            .cloned()
            .collect();
        chat.push(object(vec![
            ("type", string("function")),
            ("function", OrderedJson::Object(function)),
        ]));
    }
    ToolSet::from_ordered(&OrderedJson::Array(chat))
        .map(Arc::new)
        .map_err(|e| match e {
            dsv4_chat::ToolError::Shape { index, reason } => {
                ApiError::bad_param(format!("tools[{index}]"), reason)
            }
            other => ApiError::bad_param("tools", other.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert(input: &str) -> Result<ChatMessages, ApiError> {
        let mut m = ChatMessages::default();
        m.push_input(&OrderedJson::parse(input).unwrap())?;
        Ok(m)
    }

    fn json(m: &ChatMessages) -> Vec<serde_json::Value> {
        m.messages.iter().map(OrderedJson::to_value).collect()
    }

    #[test]
    fn items_become_chat_turns() {
        let m = convert(
            r#"[
              {"role": "developer", "content": "be brief"},
              {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "weather?"},
                {"type": "input_text", "text": "in Paris"}]},
              {"type": "reasoning", "id": "rs_1", "summary": [],
               "content": [{"type": "reasoning_text", "text": "look it up"}]},
              {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Checking.", "annotations": []}]},
              {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{\"city\": \"Paris\"}"},
              {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
              {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
              {"type": "function_call", "call_id": "c3", "name": "get", "arguments": "{}"}
            ]"#,
        )
        .unwrap();
        let v = json(&m);
        assert_eq!(v.len(), 6, "{v:#?}");
        assert_eq!(v[0]["role"], "developer");
        assert_eq!(v[1]["content"], "weather? in Paris");
        assert_eq!(v[2]["role"], "assistant");
        assert_eq!(v[2]["reasoning_content"], "look it up");
        assert_eq!(v[2]["content"], "Checking.");
        assert_eq!(v[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(v[2]["tool_calls"][0]["id"], "c1");
        assert_eq!(
            v[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\": \"Paris\"}"
        );
        assert_eq!(v[3]["role"], "tool");
        assert_eq!(v[3]["tool_call_id"], "c1");
        assert_eq!(v[4]["content"], "rain");
        assert_eq!(v[5]["role"], "assistant");
        assert_eq!(v[5]["tool_calls"][0]["id"], "c3");
        assert_eq!(
            m.origins,
            [
                "input[0]", "input[1]", "input[2]", "input[6]", "input[7]", "input[8]"
            ]
        );
        assert_eq!(m.to_messages().unwrap().len(), 6);
    }

    #[test]
    fn a_string_is_one_user_message() {
        let m = convert(r#""hello""#).unwrap();
        assert_eq!(
            json(&m),
            [serde_json::json!({"role": "user", "content": "hello"})]
        );
        assert_eq!(m.origins, ["input"]);
    }

    #[test]
    fn bad_items_name_their_field() {
        for (input, param) in [
            (r#"[]"#, "input"),
            (r#"3"#, "input"),
            (r#"["hi"]"#, "input[0]"),
            (r#"[{"role": "robot", "content": "x"}]"#, "input[0].role"),
            (r#"[{"content": "x"}]"#, "input[0].role"),
            (
                r#"[{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]"#,
                "input[0].content[0].type",
            ),
            (
                r#"[{"role": "user", "content": [{"text": "x"}]}]"#,
                "input[0].content[0]",
            ),
            (r#"[{"role": "user", "content": 5}]"#, "input[0].content"),
            (
                r#"[{"type": "function_call", "name": "f", "arguments": "{}"}]"#,
                "input[0].call_id",
            ),
            (
                r#"[{"type": "function_call_output", "call_id": "c", "output": 1}]"#,
                "input[0].output",
            ),
            (
                r#"[{"type": "reasoning", "summary": [{"type": "summary_text"}]}]"#,
                "input[0].summary[0].text",
            ),
            (r#"[{"type": "item_reference", "id": "msg_1"}]"#, "input[0]"),
            (
                r#"[{"type": "web_search_call", "id": "ws"}]"#,
                "input[0].type",
            ),
            (r#"[{"type": 7}]"#, "input[0].type"),
        ] {
            let e = convert(input).expect_err(input);
            assert_eq!(e.param.as_deref(), Some(param), "{input}: {}", e.message);
        }
    }

    #[test]
    fn tools_keep_their_key_order_and_refuse_other_types() {
        let tools = OrderedJson::parse(
            r#"[{"type": "function", "name": "get", "description": "d",
                 "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}},
                 "strict": true}]"#,
        )
        .unwrap();
        let set = chat_tools(&tools).unwrap();
        assert_eq!(set.names(), ["get"]);
        let params = set
            .get("get")
            .unwrap()
            .function()
            .get("parameters")
            .unwrap();
        assert_eq!(
            params.to_python_json(),
            r#"{"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}"#
        );
        for (text, param) in [
            (r#"[{"type": "web_search"}]"#, "tools[0].type"),
            (
                r#"[{"type": "custom", "name": "apply_patch"}]"#,
                "tools[0].type",
            ),
            (r#"[{"name": "f"}]"#, "tools[0].type"),
            (r#"[{"type": "function"}]"#, "tools[0].name"),
            (r#"[3]"#, "tools[0]"),
            (r#"{"type": "function"}"#, "tools"),
        ] {
            let e = chat_tools(&OrderedJson::parse(text).unwrap()).expect_err(text);
            assert_eq!(e.param.as_deref(), Some(param), "{text}: {}", e.message);
        }
    }
}

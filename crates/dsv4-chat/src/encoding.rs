//! The DeepSeek-V4 prompt encoding: OpenAI messages (+ tools, thinking flag, reasoning effort)
//! to the exact prompt text, and to token ids through the [`Tokenizer`].
//!
//! Source: SGLang `python/sglang/srt/entrypoints/openai/encoding_dsv4.py` ("adapted from the
//! DeepSeek-V4 release reference implementation"): `encode_messages`, `render_message`,
//! `merge_tool_messages`, `sort_tool_results_by_call_order`, `_drop_thinking_messages`; and
//! the request preparation in SGLang's `serving_chat.py` for `chat_encoding_spec == "dsv4"`
//! (null content reads as "", an empty system message is inserted when the first message is
//! not a system message, the request's tools are attached to that first message). The rules
//! are re-implemented here, not copied; `docs/chat.md` lists them and the open questions.
//!
//! The pipeline, in order: insert the system message and attach tools; merge `tool` messages
//! into user turns as `<tool_result>` blocks (consecutive user/tool messages become one turn,
//! blocks joined by a blank line); order the tool results of a turn by the preceding
//! assistant's call order; in thinking mode without tools, drop earlier turns' reasoning and
//! earlier developer messages; prepend BOS; render each turn (`render`).

mod render;

use std::sync::Arc;

use crate::error::EncodeError;
use crate::markers::{ASSISTANT, BOS, THINK_END, THINK_START};
use crate::message::{HistoryToolCall, Message, Role};
use crate::pyjson::OrderedJson;
use crate::tokenizer::Tokenizer;
use crate::tools::ToolSet;

pub use render::{REASONING_EFFORT_MAX, render_tools};

/// How hard the model is asked to think (thinking mode only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningEffort {
    /// Accepted by the reference encoder; adds nothing to the prompt.
    High,
    /// Prepends [`REASONING_EFFORT_MAX`] to the prompt.
    Max,
}

impl ReasoningEffort {
    /// The level for an OpenAI `reasoning_effort` value as SGLang maps it: "high" and "max"
    /// are kept, anything else (e.g. the OpenAI default "medium") means no level.
    pub fn from_request(value: &str) -> Option<Self> {
        match value {
            "high" => Some(Self::High),
            "max" => Some(Self::Max),
            _ => None,
        }
    }
}

impl std::str::FromStr for ReasoningEffort {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_request(s).ok_or_else(|| {
            format!("unknown reasoning effort {s:?}; DSV4 knows \"high\" and \"max\"")
        })
    }
}

/// Options of [`encode_prompt`]; the default is chat mode with BOS and dropped old reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Thinking mode (the prompt ends with `<think>`) instead of chat mode (`</think>`).
    pub thinking: bool,
    /// The reasoning effort, if any.
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Drop the reasoning of turns before the last user message (ignored when tools exist).
    pub drop_thinking: bool,
    /// Start the prompt with BOS.
    pub add_bos: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        Self {
            thinking: false,
            reasoning_effort: None,
            drop_thinking: true,
            add_bos: true,
        }
    }
}

/// A conversation to encode: messages and the request's tools.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// The messages in order.
    pub messages: Vec<Message>,
    /// The request-level tools (attached to the first, system, message).
    pub tools: Option<Arc<ToolSet>>,
}

impl Conversation {
    /// Reads a JSON array of messages, or a request object with `messages` (and `tools`).
    pub fn from_json_str(text: &str) -> Result<Self, EncodeError> {
        let value = OrderedJson::parse(text).map_err(|e| EncodeError::Json(e.to_string()))?;
        let (messages, tools) = match &value {
            OrderedJson::Array(_) => (&value, None),
            OrderedJson::Object(_) => {
                let messages = value.get("messages").ok_or_else(|| {
                    EncodeError::Json("an object needs a `messages` array".into())
                })?;
                (
                    messages,
                    value.get("tools").filter(|t| **t != OrderedJson::Null),
                )
            }
            other => {
                return Err(EncodeError::Json(format!(
                    "expected an array of messages or an object with `messages`, not {}",
                    other.type_name()
                )));
            }
        };
        let OrderedJson::Array(items) = messages else {
            return Err(EncodeError::Json("`messages` must be an array".into()));
        };
        let messages = items
            .iter()
            .enumerate()
            .map(|(i, m)| Message::from_ordered(i, m))
            .collect::<Result<Vec<_>, _>>()?;
        let tools = match tools {
            Some(t) => Some(Arc::new(ToolSet::from_ordered(t)?)),
            None => None,
        };
        Ok(Self { messages, tools })
    }
}

/// One content block of a (merged) user turn.
#[derive(Debug, Clone, PartialEq)]
enum Block {
    Text(String),
    ToolResult { id: String, content: String },
}

/// A message after tool messages were merged into user turns.
#[derive(Debug, Clone)]
struct Turn {
    role: Role,
    content: String,
    blocks: Option<Vec<Block>>,
    reasoning: Option<String>,
    tool_calls: Vec<HistoryToolCall>,
    tools: Option<Arc<ToolSet>>,
    response_format: Option<OrderedJson>,
    /// An assistant's text the answer continues: no end-of-sentence token after it.
    prefix: bool,
}

impl Turn {
    fn from_message(m: &Message) -> Self {
        Self {
            role: m.role,
            content: m.content.clone(),
            blocks: None,
            reasoning: m.reasoning_content.clone(),
            tool_calls: m.tool_calls.clone(),
            tools: m.tools.clone(),
            response_format: m.response_format.clone(),
            prefix: m.prefix,
        }
    }

    fn has_tools(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| !t.is_empty())
    }
}

/// The exact DSV4 prompt text of a conversation.
pub fn encode_prompt(conv: &Conversation, opts: &EncodeOptions) -> Result<String, EncodeError> {
    if conv.messages.is_empty() {
        return Err(EncodeError::NoMessages);
    }
    for (index, m) in conv.messages.iter().enumerate() {
        if m.role == Role::Developer && m.content.is_empty() {
            return Err(EncodeError::Message {
                index,
                reason: "a developer message needs non-empty content".into(),
            });
        }
        if m.prefix {
            check_prefix(&conv.messages, index)?;
        }
    }
    let mut messages = conv.messages.clone();
    if messages[0].role != Role::System {
        messages.insert(0, Message::new(Role::System, ""));
    }
    if let Some(tools) = conv.tools.as_ref().filter(|t| !t.is_empty()) {
        messages[0].tools = Some(Arc::clone(tools));
    }
    let mut turns = merge_tool_messages(&messages);
    sort_tool_results_by_call_order(&mut turns);
    let drop_thinking = opts.drop_thinking && !turns.iter().any(Turn::has_tools);
    if opts.thinking && drop_thinking {
        turns = drop_old_thinking(turns);
    }
    let mut prompt = String::new();
    if opts.add_bos {
        prompt.push_str(BOS);
    }
    for index in 0..turns.len() {
        render_turn(&mut prompt, index, &turns, opts, drop_thinking);
    }
    Ok(prompt)
}

/// The prompt text and its token ids (the prompt carries BOS as text; none is added).
pub fn encode_prompt_ids(
    conv: &Conversation,
    opts: &EncodeOptions,
    tokenizer: &Tokenizer,
) -> Result<(String, Vec<u32>), EncodeError> {
    let prompt = encode_prompt(conv, opts)?;
    let ids = tokenizer.encode(&prompt)?;
    Ok((prompt, ids))
}

/// A `prefix` message (see [`Message::prefix`]) must be the last, follow a user, developer or
/// tool message (after which the prompt opens the assistant's turn) and call no tools.
fn check_prefix(messages: &[Message], index: usize) -> Result<(), EncodeError> {
    let bad = |reason: &str| {
        Err(EncodeError::Message {
            index,
            reason: format!("a `prefix` message {reason}"),
        })
    };
    if index + 1 != messages.len() {
        return bad("must be the last message (the answer continues it)");
    }
    if !matches!(
        index.checked_sub(1).map(|i| messages[i].role),
        Some(Role::User | Role::Developer | Role::Tool)
    ) {
        return bad("must follow a user, developer or tool message");
    }
    if !messages[index].tool_calls.is_empty() {
        return bad("cannot carry `tool_calls`; the answer continues its text");
    }
    Ok(())
}

/// Tool messages become `<tool_result>` blocks of a user turn; a user message that follows a
/// merged turn joins it.
fn merge_tool_messages(messages: &[Message]) -> Vec<Turn> {
    let mut merged: Vec<Turn> = Vec::with_capacity(messages.len());
    for m in messages {
        let open_user = merged
            .last_mut()
            .filter(|t| t.role == Role::User && t.blocks.is_some());
        match m.role {
            Role::Tool => {
                let block = Block::ToolResult {
                    id: m.tool_call_id.clone().unwrap_or_default(),
                    content: m.content.clone(),
                };
                match open_user.and_then(|t| t.blocks.as_mut()) {
                    Some(blocks) => blocks.push(block),
                    None => merged.push(Turn {
                        blocks: Some(vec![block]),
                        ..Turn::from_message(&Message::new(Role::User, ""))
                    }),
                }
            }
            Role::User => {
                let block = Block::Text(m.content.clone());
                match open_user.and_then(|t| t.blocks.as_mut()) {
                    Some(blocks) => blocks.push(block),
                    None => merged.push(Turn {
                        blocks: Some(vec![block]),
                        ..Turn::from_message(m)
                    }),
                }
            }
            _ => merged.push(Turn::from_message(m)),
        }
    }
    merged
}

/// Reorders the tool results of each user turn by the call order of the latest assistant
/// message with tool calls (unknown ids sort as position 0; the sort is stable).
fn sort_tool_results_by_call_order(turns: &mut [Turn]) {
    let mut order: Vec<(String, usize)> = Vec::new();
    for turn in turns.iter_mut() {
        if turn.role == Role::Assistant && !turn.tool_calls.is_empty() {
            order.clear();
            for (i, call) in turn.tool_calls.iter().enumerate() {
                if let Some(id) = call.id.as_ref().filter(|id| !id.is_empty()) {
                    order.retain(|(k, _)| k != id);
                    order.push((id.clone(), i));
                }
            }
        } else if let (Role::User, Some(blocks)) = (turn.role, turn.blocks.as_mut()) {
            let position = |b: &Block| match b {
                Block::ToolResult { id, .. } => {
                    order.iter().find(|(k, _)| k == id).map_or(0, |(_, i)| *i)
                }
                Block::Text(_) => 0,
            };
            let is_result = |b: &Block| matches!(b, Block::ToolResult { .. });
            if blocks.iter().filter(|b| is_result(b)).count() > 1 && !order.is_empty() {
                let mut results: Vec<Block> =
                    blocks.iter().filter(|b| is_result(b)).cloned().collect();
                results.sort_by_key(position);
                let mut sorted = results.into_iter();
                for b in blocks.iter_mut().filter(|b| is_result(b)) {
                    if let Some(next) = sorted.next() {
                        *b = next;
                    }
                }
            }
        }
    }
}

/// The index of the last user or developer turn, as the reference's -1-based integer.
fn last_user_index(turns: &[Turn]) -> i64 {
    turns
        .iter()
        .rposition(|t| matches!(t.role, Role::User | Role::Developer))
        .map_or(-1, |i| i as i64)
}

/// Before the last user turn: assistants lose their reasoning, developer turns are dropped.
fn drop_old_thinking(turns: Vec<Turn>) -> Vec<Turn> {
    let last_user = last_user_index(&turns);
    turns
        .into_iter()
        .enumerate()
        .filter_map(|(i, mut t)| {
            let kept_role = matches!(
                t.role,
                Role::User | Role::System | Role::Tool | Role::LatestReminder
            );
            if kept_role || i as i64 >= last_user {
                Some(t)
            } else if t.role == Role::Assistant {
                t.reasoning = None;
                Some(t)
            } else {
                None
            }
        })
        .collect()
}

/// Appends turn `index` and, after a user/developer turn that ends the conversation or is
/// followed by an assistant or reminder turn, the `<｜Assistant｜>` + think transition.
fn render_turn(out: &mut String, index: usize, turns: &[Turn], opts: &EncodeOptions, drop: bool) {
    let turn = &turns[index];
    let last_user = last_user_index(turns);
    let at = index as i64;
    if index == 0 && opts.thinking && opts.reasoning_effort == Some(ReasoningEffort::Max) {
        out.push_str(REASONING_EFFORT_MAX);
    }
    match turn.role {
        Role::System => {
            out.push_str(&turn.content);
            render::push_instructions(out, turn.tools.as_deref(), turn.response_format.as_ref());
        }
        Role::Developer => {
            out.push_str(crate::markers::USER);
            out.push_str(&turn.content);
            render::push_instructions(out, turn.tools.as_deref(), turn.response_format.as_ref());
        }
        Role::User | Role::Tool => {
            out.push_str(crate::markers::USER);
            match &turn.blocks {
                Some(blocks) => render::push_blocks(out, blocks),
                None => out.push_str(&turn.content),
            }
        }
        Role::LatestReminder => {
            out.push_str(crate::markers::LATEST_REMINDER);
            out.push_str(&turn.content);
        }
        Role::Assistant => {
            let show_reasoning = opts.thinking && (!drop || at > last_user);
            render::push_assistant(out, turn, show_reasoning);
        }
    }
    if turns
        .get(index + 1)
        .is_some_and(|next| !matches!(next.role, Role::Assistant | Role::LatestReminder))
    {
        return;
    }
    if matches!(turn.role, Role::User | Role::Developer) {
        out.push_str(ASSISTANT);
        let think = opts.thinking && (!drop || at >= last_user);
        out.push_str(if think { THINK_START } else { THINK_END });
    }
}

#[cfg(test)]
mod tests;

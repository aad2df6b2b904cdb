//! A chat request's DSV4 prompt: its messages and tools encoded by dsv4-chat, thinking or
//! chat mode, a continued final message (`continue_final_message`, `prefix`) checked against
//! `add_generation_prompt`, and `truncate_prompt_tokens`; `/v1/chat/completions` and
//! `/tokenize` run the same encoding.

use crate::api::chat::{ChatRequest, ToolChoice};
use crate::api::common::truncate_prompt;
use crate::error::ApiError;
use crate::state::Loaded;
use dsv4_chat::{Conversation, EncodeError, ToolSet, encode_prompt_ids};
use std::sync::Arc;

/// Map a prompt-encoding error to the field at fault.
fn encode_error(e: EncodeError) -> ApiError {
    match e {
        EncodeError::Tools(t) => ApiError::bad_param("tools", t.to_string()),
        EncodeError::Message { index, .. } => {
            ApiError::bad_param(format!("messages[{index}]"), e.to_string())
        }
        EncodeError::NoMessages => ApiError::bad_param("messages", e.to_string()),
        EncodeError::Json(_) => ApiError::bad_request(e.to_string()),
        EncodeError::Tokenizer(t) => ApiError::internal(format!("tokenizing the prompt: {t}")),
    }
}

/// A chat request's prompt as this route encodes it, and what the rest of the request needs
/// from that encoding.
pub(crate) struct ChatPrompt {
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    /// The tools the request declares.
    pub tools: Arc<ToolSet>,
    /// The checked tool choice.
    pub choice: ToolChoice,
    /// Thinking mode.
    pub thinking: bool,
}

/// Encode `req`'s DSV4 prompt (`body` is its JSON text): its messages, its tools in the system
/// prompt unless `tool_choice` is none, thinking or chat mode; then its last
/// `truncate_prompt_tokens` tokens when asked.
pub(crate) fn chat_prompt(
    loaded: &Loaded,
    req: &ChatRequest,
    body: &[u8],
) -> Result<ChatPrompt, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "`messages` is empty; give at least one user message",
        ));
    }
    let choice = req.tool_choice()?;
    let thinking = req.thinking()?;
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not UTF-8: {e}")))?;
    let mut conv = Conversation::from_json_str(text).map_err(encode_error)?;
    let continues = continue_final_message(req, &mut conv)?;
    let tools = conv.tools.clone().unwrap_or_default();
    if choice == ToolChoice::None {
        conv.tools = None;
    }
    let opts = req.encode_options(thinking);
    let (_, mut ids) = encode_prompt_ids(&conv, &opts, &loaded.tokenizer).map_err(encode_error)?;
    truncate_prompt(&mut ids, req.truncate_prompt_tokens, loaded.context)?;
    Ok(ChatPrompt {
        ids,
        tools,
        choice,
        // The prompt of a continued answer closes any reasoning (thinking mode renders the
        // prefix as `reasoning</think>content`): the answer goes on as content.
        thinking: thinking && !continues,
    })
}

/// Whether the answer continues the last message (a `prefix` message, or
/// `continue_final_message`, which makes the last message one), checking
/// `add_generation_prompt` against it.
fn continue_final_message(req: &ChatRequest, conv: &mut Conversation) -> Result<bool, ApiError> {
    let asked = req.continue_final_message.unwrap_or(false);
    if asked {
        if req.add_generation_prompt == Some(true) {
            return Err(ApiError::bad_param(
                "continue_final_message",
                "`continue_final_message: true` continues the last message, and \
                 `add_generation_prompt: true` opens a new turn after it; send one",
            ));
        }
        match conv.messages.last_mut() {
            Some(m) if m.role == dsv4_chat::Role::Assistant => m.prefix = true,
            _ => {
                return Err(ApiError::bad_param(
                    "continue_final_message",
                    "`continue_final_message: true` needs the last message to be an \
                     assistant's, whose text the answer continues",
                ));
            }
        }
    }
    let continues = conv.messages.last().is_some_and(|m| m.prefix);
    if req.add_generation_prompt == Some(false) && !continues {
        return Err(ApiError::bad_param(
            "add_generation_prompt",
            "`add_generation_prompt: false` is only for continuing the last message \
             (`continue_final_message: true`, or `prefix: true` on it); otherwise the DSV4 \
             prompt always ends where the assistant's answer starts",
        ));
    }
    Ok(continues)
}

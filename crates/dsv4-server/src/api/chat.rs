//! `/v1/chat/completions` bodies: [`ChatRequest`] (unknown fields are refused, naming them) and
//! the response and stream-chunk objects.

use super::common::{Stop, StopReason, StreamOptions, UsageBody};
use super::logprobs::{ChatLogprobs, PromptLogprobs};
use super::sampling::{SamplingFields, prompt_logprobs_count, top_count};
use super::structured::{Fields, ResponseFormat, Shape, StructuredOutputs};
use crate::config::OutputParsing;
use crate::error::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A chat completion request. `messages` and `tools` are read again from the raw body by
/// dsv4-chat (their key order matters to the prompt); here they are only type-checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The served model's id.
    pub model: String,
    /// OpenAI messages (checked and encoded by dsv4-chat).
    pub messages: Vec<Value>,
    /// Function tools.
    pub tools: Option<Vec<Value>>,
    /// "none", "auto", "required", or {"type": "function", "function": {"name": ...}}.
    pub tool_choice: Option<Value>,
    /// Allow several tool calls in one answer (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Stream options.
    pub stream_options: Option<StreamOptions>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k sampling (extension).
    pub top_k: Option<i64>,
    /// Seed.
    pub seed: Option<u64>,
    /// Tokens to generate at most.
    pub max_tokens: Option<u64>,
    /// The newer name of `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Keep the stop string that ended the answer in its text (vLLM's extension; default
    /// false: the text is cut before it).
    pub include_stop_str_in_output: Option<bool>,
    /// SGLang's name for `include_stop_str_in_output` (both given must agree).
    pub no_stop_trim: Option<bool>,
    /// Leave special tokens' text out of a raw answer (SGLang's; with the server's DSV4 parser
    /// on, the answer is parsed from its markup, which never reaches the content either way).
    pub skip_special_tokens: Option<bool>,
    /// SGLang's: false leaves the reasoning (and its `</think>`) at the start of the content
    /// instead of in `reasoning_content` (default true).
    pub separate_reasoning: Option<bool>,
    /// SGLang's: false streams the reasoning in one chunk once it is complete instead of as
    /// it comes (default true).
    pub stream_reasoning: Option<bool>,
    /// SGLang's; only false (dsv4 does not return hidden states).
    pub return_hidden_states: Option<bool>,
    /// Choices, 1 to [`super::common::MAX_N`] (default 1); choice i samples with seed + i.
    pub n: Option<u32>,
    /// {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}.
    pub response_format: Option<ResponseFormat>,
    /// vLLM's structured outputs: `json`, `regex`, `choice`, `grammar` or `json_object`.
    pub structured_outputs: Option<StructuredOutputs>,
    /// A regular expression the whole answer matches (SGLang's extension).
    pub regex: Option<String>,
    /// A grammar the answer follows, GBNF or Lark (SGLang's extension).
    pub ebnf: Option<String>,
    /// "high" or "max" (thinking mode); others add nothing.
    pub reasoning_effort: Option<String>,
    /// In thinking mode, end the reasoning with `</think>` after this many tokens (vLLM's
    /// extension; see [`crate::thinking_budget`]); ignored in chat mode.
    pub thinking_token_budget: Option<u64>,
    /// {"thinking": bool} (or "enable_thinking") selects thinking mode.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Keep tokens at least this fraction as likely as the most likely one (extension).
    pub min_p: Option<f32>,
    /// −2 to 2, per time a token was generated.
    pub frequency_penalty: Option<f32>,
    /// −2 to 2, once per token generated.
    pub presence_penalty: Option<f32>,
    /// Above 0, 1 = off: over prompt and generated tokens (extension).
    pub repetition_penalty: Option<f32>,
    /// Token id (decimal string) → bias from −100 to 100.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// The end-of-sequence token is held back until this many tokens (extension).
    pub min_tokens: Option<u64>,
    /// Keep generating past the end-of-sequence token (extension; its text is left out).
    pub ignore_eos: Option<bool>,
    /// Admission priority: among waiting requests a larger one is admitted first (SGLang's
    /// extension; default 0; batch lines default to -1).
    pub priority: Option<i32>,
    /// How the engine admits it, set by the server: never read from the body.
    #[serde(skip)]
    pub admission: crate::api::common::Admission,
    /// Beam search instead of sampling, with `n` beams (vLLM's extension; default false).
    pub use_beam_search: Option<bool>,
    /// With `use_beam_search`: a hypothesis's log-probability is divided by its generated
    /// length to this power (default 1; vLLM's extension).
    pub length_penalty: Option<f32>,
    /// Token ids that end the answer as the end-of-sequence token does (vLLM's extension).
    pub stop_token_ids: Option<Value>,
    /// Only these token ids may be generated (vLLM's extension).
    pub allowed_token_ids: Option<Value>,
    /// Words never generated (vLLM's extension; see [`crate::api::sampling::bad_words_ids`]).
    pub bad_words: Option<Value>,
    /// Return each generated token's log-probability.
    pub logprobs: Option<bool>,
    /// With `logprobs`: this many most likely alternatives per token (0 to 20).
    pub top_logprobs: Option<u32>,
    /// Return each prompt token's log-probability with this many alternatives (0 to 20;
    /// vLLM's extension), as the answer's `prompt_logprobs`.
    pub prompt_logprobs: Option<u32>,
    /// Keep only the prompt's last k tokens (−1: the model's context), vLLM's extension.
    pub truncate_prompt_tokens: Option<i64>,
    /// Return the token ids of the prompt (`prompt_token_ids`) and of each choice
    /// (`choices[].token_ids`; streams: the prompt's on the first chunk, each chunk's own),
    /// vLLM's extension.
    pub return_token_ids: Option<bool>,
    /// Name the tokens of `logprobs` `token_id:N` instead of by their text (vLLM's extension).
    pub return_tokens_as_token_ids: Option<bool>,
    /// true: the last message, an assistant's, is a prefix the answer continues (vLLM's and
    /// SGLang's name for DeepSeek's `prefix: true` on that message).
    pub continue_final_message: Option<bool>,
    /// vLLM's: `true` (the default) opens the assistant's turn after the last message; `false`
    /// only where the answer continues a prefix message instead.
    pub add_generation_prompt: Option<bool>,
    /// Accepted and ignored (an end-user id for abuse tracking).
    pub user: Option<String>,
    /// Accepted and ignored.
    pub metadata: Option<Value>,
    /// Accepted; must not be true (nothing is stored).
    pub store: Option<bool>,
    /// Accepted and ignored.
    pub service_tier: Option<String>,
}

/// `tool_choice`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model may answer or call tools.
    Auto,
    /// No tool calls (the tools are left out of the prompt).
    None,
    /// At least one tool call, enforced by the grammar.
    Required,
    /// A call of this tool, enforced by the grammar.
    Named(String),
}

impl ChatRequest {
    /// The sampling fields.
    pub fn sampling(&self) -> SamplingFields {
        SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            repetition_penalty: self.repetition_penalty,
            logit_bias: self.logit_bias.clone(),
            min_tokens: self.min_tokens,
            stop_token_ids: self.stop_token_ids.clone(),
            allowed_token_ids: self.allowed_token_ids.clone(),
        }
    }

    /// How the answer is parsed: as the server parses (`server.tool_call_parser`,
    /// `server.reasoning_parser`), with the reasoning left in the content when SGLang's
    /// `separate_reasoning` is false.
    pub fn parsing(&self, server: OutputParsing) -> OutputParsing {
        match (server, self.separate_reasoning) {
            (OutputParsing::Dsv4, Some(false)) => OutputParsing::Dsv4ReasoningInContent,
            (p, _) => p,
        }
    }

    /// Whether special tokens' text is left out (`skip_special_tokens`, default false): only
    /// raw answers show it, so only under `parsing` [`OutputParsing::Raw`].
    pub fn skip_special(&self, parsing: OutputParsing) -> bool {
        parsing == OutputParsing::Raw && self.skip_special_tokens.unwrap_or(false)
    }

    /// The alternatives per token to return (None: no log-probabilities). `top_logprobs`
    /// needs `logprobs: true`, as OpenAI.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (true, top) => top_count("top_logprobs", top.unwrap_or(0)).map(Some),
            (false, None) => Ok(None),
            (false, Some(_)) => Err(ApiError::bad_param(
                "top_logprobs",
                "top_logprobs needs \"logprobs\": true; set it or leave top_logprobs out",
            )),
        }
    }

    /// The alternatives per prompt token of `prompt_logprobs` (None: not asked for; refused
    /// with `stream`, as in vLLM).
    pub fn prompt_logprobs(&self) -> Result<Option<usize>, ApiError> {
        prompt_logprobs_count(self.prompt_logprobs, self.stream.unwrap_or(false))
    }

    /// The prompt encoding this request asks for (`thinking` from [`Self::thinking`]).
    pub fn encode_options(&self, thinking: bool) -> dsv4_chat::EncodeOptions {
        dsv4_chat::EncodeOptions {
            thinking,
            reasoning_effort: self
                .reasoning_effort
                .as_deref()
                .and_then(dsv4_chat::ReasoningEffort::from_request),
            ..Default::default()
        }
    }

    /// Whether thinking mode is asked for (`chat_template_kwargs.thinking` or
    /// `enable_thinking`).
    pub fn thinking(&self) -> Result<bool, ApiError> {
        let Some(kw) = &self.chat_template_kwargs else {
            return Ok(false);
        };
        let mut thinking = false;
        for key in ["thinking", "enable_thinking"] {
            match kw.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::Bool(b)) => thinking |= b,
                Some(other) => {
                    return Err(ApiError::bad_param(
                        format!("chat_template_kwargs.{key}"),
                        format!("`{key}` must be true or false, not {other}"),
                    ));
                }
            }
        }
        Ok(thinking)
    }

    /// The structured output the request asks for, if any (at most one of
    /// `response_format`, `structured_outputs`, `regex` and `ebnf`).
    pub fn structured(&self) -> Result<Option<Shape>, ApiError> {
        Fields {
            response_format: self.response_format.as_ref(),
            structured_outputs: self.structured_outputs.as_ref(),
            regex: self.regex.as_deref(),
            ebnf: self.ebnf.as_deref(),
        }
        .resolve()
    }

    /// The checked tool choice (default: auto with tools, none without).
    pub fn tool_choice(&self) -> Result<ToolChoice, ApiError> {
        let has_tools = self.tools.as_ref().is_some_and(|t| !t.is_empty());
        check_tool_choice(
            self.tool_choice.as_ref(),
            has_tools,
            |o| o.get("function").and_then(|f| f.get("name")),
            r#"{"type": "function", "function": {"name": "TOOL"}}"#,
        )
    }
}

/// Check a `tool_choice`: "none", "auto", "required", or an object of type "function" whose
/// name `name` finds (chat nests it in `function`, the Responses API does not; `shape` spells
/// the object in errors). The default is auto with tools, none without.
pub fn check_tool_choice(
    value: Option<&Value>,
    has_tools: bool,
    name: impl Fn(&serde_json::Map<String, Value>) -> Option<&Value>,
    shape: &str,
) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::bad_param("tool_choice", m);
    let choice = match value {
        None | Some(Value::Null) => {
            return Ok(if has_tools {
                ToolChoice::Auto
            } else {
                ToolChoice::None
            });
        }
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "unknown tool_choice {other:?}; use \"none\", \"auto\", \"required\" or \
                     {shape}"
                )));
            }
        },
        Some(Value::Object(o)) => {
            match (
                o.get("type").and_then(Value::as_str),
                name(o).and_then(Value::as_str),
            ) {
                (Some("function"), Some(name)) => ToolChoice::Named(name.to_string()),
                _ => return Err(bad(format!("a named tool_choice is {shape}"))),
            }
        }
        Some(other) => {
            return Err(bad(format!(
                "tool_choice must be a string or an object, not {other}"
            )));
        }
    };
    if !has_tools && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(bad(
            "tool_choice asks for a tool call but the request declares no `tools`".into(),
        ));
    }
    Ok(choice)
}

/// A tool call in a response (`function.arguments` is a JSON text).
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallBody {
    /// The call id (tool results refer to it).
    pub id: String,
    /// Always "function".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Name and arguments.
    pub function: FunctionBody,
}

/// `tool_calls[].function`.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionBody {
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A tool call's piece in a stream chunk: a call's first piece carries its `id`, `type` and
/// `function.name` (and all its arguments when they are not streamed); later pieces only
/// more `function.arguments`, which the client appends.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallDelta {
    /// Position among the answer's calls.
    pub index: usize,
    /// The call id (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// "function" (first piece only).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name (first piece only) and more arguments.
    pub function: FunctionDelta,
}

/// `tool_calls[].function` of a stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionDelta {
    /// The tool's name (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More of the arguments' JSON text.
    pub arguments: String,
}

impl ToolCallDelta {
    /// The first piece of call `index`: its id, its tool and its arguments so far.
    pub fn first(index: usize, call: ToolCallBody) -> Self {
        Self {
            index,
            id: Some(call.id),
            kind: Some(call.kind),
            function: FunctionDelta {
                name: Some(call.function.name),
                arguments: call.function.arguments,
            },
        }
    }

    /// A later piece of call `index`: more arguments.
    pub fn more(index: usize, arguments: String) -> Self {
        Self {
            index,
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments,
            },
        }
    }
}

/// The assistant message of a non-streamed answer.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantBody {
    /// Always "assistant".
    pub role: &'static str,
    /// The visible answer (null when empty and there are tool calls).
    pub content: Option<String>,
    /// The reasoning (thinking mode only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls, when there are any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallBody>,
}

/// One choice of a non-streamed answer.
#[derive(Debug, Clone, Serialize)]
pub struct ChoiceBody {
    /// The choice's index, 0 to n − 1.
    pub index: usize,
    /// The message.
    pub message: AssistantBody,
    /// "stop", "length" or "tool_calls".
    pub finish_reason: &'static str,
    /// With `logprobs`: one entry per generated token (else null).
    pub logprobs: Option<ChatLogprobs>,
    /// The `stop_token_ids` id or stop string that ended the choice, else null (vLLM's
    /// extension).
    pub stop_reason: Option<StopReason>,
    /// With `return_token_ids`: the generated tokens' ids, ending with the token that ended
    /// the choice when one did (end-of-sequence or a `stop_token_ids` id, which `usage` does
    /// not count); else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// A non-streamed chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    /// "chatcmpl-…".
    pub id: String,
    /// "chat.completion".
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// The `n` choices, in index order.
    pub choices: Vec<ChoiceBody>,
    /// Token counts.
    pub usage: UsageBody,
    /// With `prompt_logprobs`: the prompt's tokens (vLLM's extension); else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
    /// With `return_token_ids`: the encoded prompt's token ids; else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// The delta of one stream chunk.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeltaBody {
    /// "assistant" on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// More content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// More reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls' pieces (a call's first piece, or more of its arguments).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    /// The index of the choice this chunk belongs to.
    pub index: usize,
    /// What is new.
    pub delta: DeltaBody,
    /// Set on the last content chunk.
    pub finish_reason: Option<&'static str>,
    /// With `logprobs` (every chunk but the first): the entries of the tokens consumed since
    /// the previous chunk, possibly none; else null.
    pub logprobs: Option<ChatLogprobs>,
    /// With the `finish_reason`: the `stop_token_ids` id or stop string that ended the choice,
    /// else null; absent before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Option<StopReason>>,
    /// With `return_token_ids` (every chunk but the role chunk): the ids of the tokens
    /// consumed since the previous chunk (see [`ChoiceBody::token_ids`]); else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// One `chat.completion.chunk` event.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    /// Same id on every chunk of a stream.
    pub id: String,
    /// "chat.completion.chunk".
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// One choice (the chunks of several choices interleave), or none on the usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// With `include_usage`: null, then the usage on the last chunk (with
    /// `continuous_usage_stats`, each choice chunk's choice so far).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageBody>>,
    /// With `return_token_ids`, on the stream's first chunk: the encoded prompt's token ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

//! `/v1/responses` bodies (OpenAI's Responses API): [`ResponsesRequest`] (unknown fields are
//! refused, naming them) and the pieces of the `response` object and its stream events. The
//! request's `input` and `tools` are read again, keys in order, by [`super::responses_input`].

use super::chat::{ToolChoice, check_tool_choice};
use super::common::Stop;
use super::sampling::{SamplingFields, top_count};
use super::structured::Shape;
use crate::error::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `include` values accepted. Only `message.output_text.logprobs` changes the answer; the
/// others name outputs of tools this server does not run (or encrypted reasoning, which it
/// never produces: the reasoning text is in the reasoning item's `content`), so they add
/// nothing.
pub const INCLUDE_VALUES: &[&str] = &[
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "web_search_call.action.sources",
    "web_search_call.results",
];

/// A Responses API request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    /// The served model's id.
    pub model: String,
    /// A string (one user message) or a list of input items.
    pub input: Option<Value>,
    /// A system message put before the input (not carried over by `previous_response_id`).
    pub instructions: Option<String>,
    /// Continue the conversation of a stored response: its input and output come first.
    pub previous_response_id: Option<String>,
    /// Admission priority: among waiting requests a larger one is admitted first (SGLang's
    /// extension; default 0; batch lines default to -1).
    pub priority: Option<i32>,
    /// How the engine admits it, set by the server: never read from the body.
    #[serde(skip)]
    pub admission: crate::api::common::Admission,
    /// Function tools, `{"type": "function", "name", "description", "parameters"}`.
    pub tools: Option<Vec<Value>>,
    /// "none", "auto", "required" or {"type": "function", "name": ...}.
    pub tool_choice: Option<Value>,
    /// Allow several tool calls in one answer (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Tokens to generate at most (reasoning included).
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k sampling (extension).
    pub top_k: Option<i64>,
    /// Keep tokens at least this fraction as likely as the most likely one (extension).
    pub min_p: Option<f32>,
    /// Seed (extension).
    pub seed: Option<u64>,
    /// Above 0, 1 = off (extension).
    pub repetition_penalty: Option<f32>,
    /// Stop strings (extension, as chat's: the text is cut before the first one).
    pub stop: Option<Stop>,
    /// With `message.output_text.logprobs` in `include`: this many alternatives per token.
    pub top_logprobs: Option<u32>,
    /// Extra outputs (see [`INCLUDE_VALUES`]).
    pub include: Option<Vec<String>>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Stream options (`include_obfuscation` is accepted; no obfuscation is added).
    pub stream_options: Option<ResponsesStreamOptions>,
    /// `{"effort": ...}`: low, medium, high or xhigh turn thinking mode on.
    pub reasoning: Option<ReasoningConfig>,
    /// `{"format": ...}`: text, json_object or json_schema.
    pub text: Option<TextConfig>,
    /// Keep the response for `previous_response_id` and `GET /v1/responses/{id}` (default
    /// true).
    pub store: Option<bool>,
    /// Up to 16 string pairs, returned with the response.
    pub metadata: Option<serde_json::Map<String, Value>>,
    /// "disabled" (the default: an input over the context is an error) or "auto" (the oldest
    /// turns are dropped until it fits).
    pub truncation: Option<String>,
    /// Answer at once (`queued`) and run on without the connection; poll, stream or cancel
    /// it by id (needs `store`).
    pub background: Option<bool>,
    /// Accepted and ignored (an end-user id).
    pub user: Option<String>,
    /// Accepted and ignored (the prefix cache needs no key).
    pub prompt_cache_key: Option<String>,
    /// Accepted and ignored.
    pub safety_identifier: Option<String>,
    /// Accepted and ignored.
    pub service_tier: Option<String>,
    /// "in-memory" or "24h": accepted; the prefix cache keeps what its budget allows.
    pub prompt_cache_retention: Option<String>,
    /// At least 1; it bounds calls to built-in tools, of which this server has none.
    pub max_tool_calls: Option<u64>,
    /// Refused: conversation objects are not supported (use `previous_response_id`).
    pub conversation: Option<Value>,
    /// Refused: stored prompt templates are not supported (send `instructions` and `input`).
    pub prompt: Option<Value>,
    /// Refused: context compaction is not supported (`truncation: "auto"` drops old turns).
    pub context_management: Option<Value>,
}

/// `stream_options`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesStreamOptions {
    /// Accepted; no obfuscation padding is added.
    pub include_obfuscation: Option<bool>,
}

/// `reasoning`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningConfig {
    /// "none" or "minimal" (chat mode), "low", "medium", "high" or "xhigh" (thinking mode;
    /// "xhigh" asks DSV4 for its maximum effort).
    pub effort: Option<String>,
    /// Accepted; the reasoning is returned as text, never summarized.
    pub summary: Option<String>,
    /// The older name of `summary`.
    #[serde(skip_serializing)]
    pub generate_summary: Option<String>,
}

/// `text`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    /// The output's format.
    pub format: Option<TextFormat>,
    /// "low", "medium" (the default) or "high": echoed; DSV4 has no verbosity setting, so it
    /// does not change the answer.
    pub verbosity: Option<String>,
}

/// `text.format`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TextFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under `schema`.
    JsonSchema {
        /// The schema's name.
        name: String,
        /// What the schema is for.
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        /// The JSON Schema.
        schema: Value,
        /// Always enforced here.
        #[serde(skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

impl ResponsesRequest {
    /// The sampling fields.
    pub fn sampling(&self) -> SamplingFields {
        SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed,
            repetition_penalty: self.repetition_penalty,
            ..Default::default()
        }
    }

    /// The alternatives per token to return with the message's text (None: no
    /// log-probabilities): asked for by `message.output_text.logprobs` in `include` or by
    /// `top_logprobs`.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let included = self.includes("message.output_text.logprobs");
        match (included, self.top_logprobs) {
            (false, None) => Ok(None),
            (_, top) => top_count("top_logprobs", top.unwrap_or(0)).map(Some),
        }
    }

    fn includes(&self, what: &str) -> bool {
        self.include.iter().flatten().any(|i| i == what)
    }

    /// Refuse what this server cannot do, naming the field.
    pub fn check_supported(&self) -> Result<(), ApiError> {
        for (k, value) in self.include.iter().flatten().enumerate() {
            if !INCLUDE_VALUES.contains(&value.as_str()) {
                return Err(ApiError::bad_param(
                    format!("include[{k}]"),
                    format!(
                        "unknown include value {value:?}; accepted: {}",
                        INCLUDE_VALUES.join(", ")
                    ),
                ));
            }
        }
        let refused: [(&str, bool, &str); 3] = [
            (
                "conversation",
                self.conversation.is_some(),
                "conversation objects are not supported; continue a stored response with \
                 previous_response_id, or send the whole conversation as input",
            ),
            (
                "prompt",
                self.prompt.is_some(),
                "stored prompt templates are not supported; send instructions and input",
            ),
            (
                "context_management",
                self.context_management.is_some(),
                "context compaction is not supported; truncation: \"auto\" drops the oldest \
                 turns when a conversation outgrows the context",
            ),
        ];
        if let Some((field, _, why)) = refused.into_iter().find(|(_, given, _)| *given) {
            return Err(ApiError::bad_param(field, why));
        }
        if let Some(r) = self.prompt_cache_retention.as_deref()
            && !matches!(r, "in-memory" | "in_memory" | "24h")
        {
            return Err(ApiError::bad_param(
                "prompt_cache_retention",
                format!("prompt_cache_retention must be \"in-memory\" or \"24h\", not {r:?}"),
            ));
        }
        if self.max_tool_calls == Some(0) {
            return Err(ApiError::bad_param(
                "max_tool_calls",
                "max_tool_calls must be at least 1",
            ));
        }
        if let Some(v) = self.text.as_ref().and_then(|t| t.verbosity.as_deref())
            && !matches!(v, "low" | "medium" | "high")
        {
            return Err(ApiError::bad_param(
                "text.verbosity",
                format!("text.verbosity must be low, medium or high, not {v:?}"),
            ));
        }
        match self.truncation.as_deref() {
            None | Some("disabled" | "auto") => {}
            Some(other) => {
                return Err(ApiError::bad_param(
                    "truncation",
                    format!("truncation must be \"disabled\" or \"auto\", not {other:?}"),
                ));
            }
        }
        crate::api::common::check_metadata(self.metadata.as_ref())
    }

    /// Whether thinking mode is asked for, and the DSV4 reasoning effort.
    pub fn thinking(&self) -> Result<(bool, Option<dsv4_chat::ReasoningEffort>), ApiError> {
        let effort = self.reasoning.as_ref().and_then(|r| r.effort.as_deref());
        match effort {
            None | Some("none") | Some("minimal") => Ok((false, None)),
            Some("low") | Some("medium") => Ok((true, None)),
            Some("high") => Ok((true, Some(dsv4_chat::ReasoningEffort::High))),
            Some("xhigh") => Ok((true, Some(dsv4_chat::ReasoningEffort::Max))),
            Some(other) => Err(ApiError::bad_param(
                "reasoning.effort",
                format!(
                    "unknown reasoning effort {other:?}; use none, minimal, low, medium, high or \
                     xhigh"
                ),
            )),
        }
    }

    /// The checked tool choice (default: auto with tools, none without; hosted-tool and
    /// `allowed_tools` choices are refused).
    pub fn tool_choice(&self) -> Result<ToolChoice, ApiError> {
        let has_tools = self.tools.as_ref().is_some_and(|t| !t.is_empty());
        check_tool_choice(
            self.tool_choice.as_ref(),
            has_tools,
            |o| o.get("name"),
            r#"{"type": "function", "name": "TOOL"}"#,
        )
    }

    /// The JSON schema `text.format` asks the output to follow, if any.
    pub fn structured(&self) -> Option<Shape> {
        let schema = match self.text.as_ref().and_then(|t| t.format.as_ref()) {
            None | Some(TextFormat::Text) => return None,
            Some(TextFormat::JsonObject) => serde_json::json!({"type": "object"}),
            Some(TextFormat::JsonSchema { schema, .. }) => schema.clone(),
        };
        Some(Shape::json(schema, "text.format"))
    }
}

/// One item of a response's `output`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The reasoning (thinking mode), as text.
    Reasoning {
        /// "rs_…".
        id: String,
        /// Always empty: the reasoning is not summarized.
        summary: Vec<Value>,
        /// One `{"type": "reasoning_text", "text"}` part.
        content: Vec<ContentPart>,
        /// "in_progress" while streamed, then "completed".
        status: &'static str,
    },
    /// The visible answer.
    Message {
        /// "msg_…".
        id: String,
        /// "in_progress", "completed" or "incomplete".
        status: &'static str,
        /// Always "assistant".
        role: &'static str,
        /// One `output_text` part.
        content: Vec<ContentPart>,
    },
    /// A checked call of one of the request's tools.
    FunctionCall {
        /// "fc_…".
        id: String,
        /// "call_…": the `call_id` of the `function_call_output` that answers it.
        call_id: String,
        /// The tool's name.
        name: String,
        /// The arguments as JSON text.
        arguments: String,
        /// "in_progress" while streamed, then "completed".
        status: &'static str,
    },
}

impl OutputItem {
    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Reasoning { id, .. }
            | Self::Message { id, .. }
            | Self::FunctionCall { id, .. } => id,
        }
    }
}

/// A content part of an output item.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// The message's text.
    OutputText {
        /// The text.
        text: String,
        /// Always empty.
        annotations: Vec<Value>,
        /// With `message.output_text.logprobs`: one entry per token (chat's shape).
        #[serde(skip_serializing_if = "Option::is_none")]
        logprobs: Option<Vec<super::logprobs::ChatTokenLogprob>>,
    },
    /// The reasoning's text.
    ReasoningText {
        /// The text.
        text: String,
    },
}

/// A response's `usage`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ResponseUsage {
    /// Prompt tokens (the encoded input).
    pub input_tokens: usize,
    /// `{"cached_tokens"}`: reused from the prefix cache.
    pub input_tokens_details: Value,
    /// Generated tokens, reasoning included.
    pub output_tokens: usize,
    /// `{"reasoning_tokens"}`: those up to the end of the reasoning.
    pub output_tokens_details: Value,
    /// Both.
    pub total_tokens: usize,
}

impl ResponseUsage {
    /// From the engine's usage and the count of reasoning tokens.
    pub fn new(u: dsv4_engine::Usage, reasoning_tokens: usize) -> Self {
        Self {
            input_tokens: u.prompt_tokens,
            input_tokens_details: serde_json::json!({"cached_tokens": u.cached_tokens}),
            output_tokens: u.completion_tokens,
            output_tokens_details: serde_json::json!({
                "reasoning_tokens": reasoning_tokens.min(u.completion_tokens)
            }),
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

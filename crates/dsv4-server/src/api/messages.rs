//! `/v1/messages` bodies (Anthropic's Messages API): [`MessagesRequest`] and
//! [`CountTokensRequest`], whose unknown fields are refused, naming them. The `system`,
//! `messages` and `tools` are read again, keys in order, by [`super::messages_input`]. Field
//! names and values are those of the official `anthropic` Python SDK 2.17
//! (`types/message_create_params.py`, `thinking_config_param.py`, `output_config_param.py`,
//! `tool_choice_param.py`).

use super::chat::ToolChoice;
use super::sampling::SamplingFields;
use super::structured::{self, Shape};
use crate::error::ApiError;
use dsv4_chat::ReasoningEffort;
use serde::Deserialize;
use serde_json::Value;

/// A Messages API request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    /// The served model's id.
    pub model: String,
    /// The conversation: `{"role": "user" | "assistant", "content"}` objects.
    pub messages: Value,
    /// Tokens to generate at most (thinking included); required, as Anthropic's.
    pub max_tokens: Option<u64>,
    /// A string or a list of text blocks, put first as the system message.
    pub system: Option<Value>,
    /// Strings that end the answer (cut before the first one; `stop_reason`
    /// `stop_sequence`).
    pub stop_sequences: Option<Vec<String>>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Sampling temperature (Anthropic's range is 0 to 1; this server takes 0 to 2).
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k sampling.
    pub top_k: Option<i64>,
    /// Client tools, `{"name", "description", "input_schema", "strict"}`.
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name"}`.
    pub tool_choice: Option<Value>,
    /// `{"type": "enabled", "budget_tokens"}`, `{"type": "adaptive"}` or
    /// `{"type": "disabled"}`.
    pub thinking: Option<Value>,
    /// `{"effort", "format"}`: DSV4's reasoning effort and a JSON-schema answer.
    pub output_config: Option<Value>,
    /// Accepted and ignored (`{"user_id"}`).
    pub metadata: Option<Value>,
    /// Accepted and ignored: the prefix cache reuses any earlier prompt without markers.
    pub cache_control: Option<Value>,
    /// Accepted and ignored.
    pub service_tier: Option<String>,
    /// Accepted and ignored.
    pub speed: Option<String>,
    /// Accepted and ignored.
    pub inference_geo: Option<String>,
    /// Admission priority (SGLang's extension, as on the other routes).
    pub priority: Option<i32>,
    /// How the engine admits it, set by the server: never read from the body.
    #[serde(skip)]
    pub admission: crate::api::common::Admission,
    /// Refused: no code-execution container.
    pub container: Option<Value>,
    /// Refused: no MCP connector.
    pub mcp_servers: Option<Value>,
    /// Refused: no context editing.
    pub context_management: Option<Value>,
}

/// A `/v1/messages/count_tokens` request: the prompt fields of [`MessagesRequest`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountTokensRequest {
    /// The served model's id.
    pub model: String,
    /// The conversation.
    pub messages: Value,
    /// The system prompt.
    pub system: Option<Value>,
    /// Client tools.
    pub tools: Option<Vec<Value>>,
    /// Checked as on `/v1/messages`; `none` leaves the tools out of the prompt.
    pub tool_choice: Option<Value>,
    /// Thinking mode changes the prompt.
    pub thinking: Option<Value>,
    /// Its effort can change the prompt.
    pub output_config: Option<Value>,
    /// Accepted and ignored.
    pub cache_control: Option<Value>,
    /// Accepted and ignored.
    pub speed: Option<String>,
}

/// A request's `thinking` and `output_config.effort`, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thinking {
    /// Thinking mode.
    pub on: bool,
    /// The most tokens the reasoning may take (`enabled`'s `budget_tokens`).
    pub budget: Option<u64>,
    /// The DSV4 reasoning effort.
    pub effort: Option<ReasoningEffort>,
    /// `display: "omitted"`: thinking blocks carry no text, only a signature that holds it.
    pub omit: bool,
}

/// What shapes a prompt, borrowed from either request.
pub struct PromptFields<'a> {
    /// `tool_choice`.
    pub tool_choice: Option<&'a Value>,
    /// Whether the request declares tools.
    pub has_tools: bool,
    /// `thinking`.
    pub thinking: Option<&'a Value>,
    /// `output_config`.
    pub output_config: Option<&'a Value>,
    /// `max_tokens` (None on count_tokens, which has none).
    pub max_tokens: Option<u64>,
}

impl MessagesRequest {
    /// The fields that shape the prompt.
    pub fn prompt_fields(&self) -> PromptFields<'_> {
        PromptFields::new(
            &self.tool_choice,
            &self.tools,
            &self.thinking,
            &self.output_config,
        )
        .with_max_tokens(self.max_tokens)
    }

    /// 400 for the fields this server refuses, and for a missing `max_tokens`.
    pub fn check_supported(&self) -> Result<u64, ApiError> {
        let refused = [
            (
                "container",
                self.container.is_some(),
                "code-execution containers",
            ),
            ("mcp_servers", self.mcp_servers.is_some(), "MCP servers"),
            (
                "context_management",
                self.context_management.is_some(),
                "context editing",
            ),
        ];
        if let Some((field, _, what)) = refused.iter().find(|(_, set, _)| *set) {
            return Err(ApiError::bad_param(
                *field,
                format!("`{field}` is not supported: this server runs no {what}; leave it out"),
            ));
        }
        self.max_tokens.ok_or_else(|| {
            ApiError::bad_param(
                "max_tokens",
                "`max_tokens` is required (the most tokens to generate, thinking included)",
            )
        })
    }

    /// The sampling fields (the others keep their defaults).
    pub fn sampling(&self) -> SamplingFields {
        SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            ..Default::default()
        }
    }
}

impl CountTokensRequest {
    /// The fields that shape the prompt.
    pub fn prompt_fields(&self) -> PromptFields<'_> {
        PromptFields::new(
            &self.tool_choice,
            &self.tools,
            &self.thinking,
            &self.output_config,
        )
    }
}

impl<'a> PromptFields<'a> {
    /// From a request's `tool_choice`, `tools`, `thinking` and `output_config`.
    fn new(
        tool_choice: &'a Option<Value>,
        tools: &'a Option<Vec<Value>>,
        thinking: &'a Option<Value>,
        output_config: &'a Option<Value>,
    ) -> Self {
        PromptFields {
            tool_choice: tool_choice.as_ref(),
            has_tools: tools.as_ref().is_some_and(|t| !t.is_empty()),
            thinking: thinking.as_ref(),
            output_config: output_config.as_ref(),
            max_tokens: None,
        }
    }

    /// With the request's `max_tokens`, which a thinking budget must be below.
    fn with_max_tokens(self, max_tokens: Option<u64>) -> Self {
        Self { max_tokens, ..self }
    }

    /// The tool choice (default: auto with tools, none without) and whether several calls
    /// may come in one answer (`disable_parallel_tool_use` says not).
    pub fn tool_choice(&self) -> Result<(ToolChoice, bool), ApiError> {
        let Some(v) = self.tool_choice else {
            let choice = if self.has_tools {
                ToolChoice::Auto
            } else {
                ToolChoice::None
            };
            return Ok((choice, true));
        };
        let bad = |m: String| ApiError::bad_param("tool_choice", m);
        let kind = v.get("type").and_then(Value::as_str).ok_or_else(|| {
            bad(
                "`tool_choice` must be an object with a string `type`: auto, any, tool or none"
                    .into(),
            )
        })?;
        let parallel = match v.get("disable_parallel_tool_use") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => !b,
            Some(other) => {
                return Err(ApiError::bad_param(
                    "tool_choice.disable_parallel_tool_use",
                    format!("must be true or false, not {other}"),
                ));
            }
        };
        let choice = match kind {
            "auto" => ToolChoice::Auto,
            "any" => ToolChoice::Required,
            "none" => ToolChoice::None,
            "tool" => match v.get("name").and_then(Value::as_str) {
                Some(name) => ToolChoice::Named(name.to_string()),
                None => {
                    return Err(bad(
                        "`tool_choice` of type tool needs the tool's `name`".into()
                    ));
                }
            },
            other => {
                return Err(bad(format!(
                    "unknown tool_choice type {other:?}; use auto, any, tool or none"
                )));
            }
        };
        if !self.has_tools && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
            return Err(bad(format!(
                "tool_choice {kind:?} needs tools; declare them in `tools`"
            )));
        }
        Ok((choice, parallel))
    }

    /// Whether thinking mode is on (`enabled` or `adaptive`; off by default), its token budget
    /// (`enabled`'s `budget_tokens`, enforced: see [`crate::thinking_budget`]) and the DSV4
    /// reasoning effort `output_config.effort` asks for ("high" as is; "xhigh" and "max" as
    /// DSV4's maximum; "low" and "medium" add nothing). A budget must be below `max_tokens`,
    /// as Anthropic's must (0, which only runs the prompt, takes any). `display` is
    /// "summarized" (the default: the reasoning as written) or "omitted".
    pub fn thinking(&self) -> Result<Thinking, ApiError> {
        let (on, budget) = match self.thinking {
            None | Some(Value::Null) => (false, None),
            Some(v) => match v.get("type").and_then(Value::as_str) {
                Some("enabled") => {
                    let budget = match v.get("budget_tokens").and_then(Value::as_u64) {
                        Some(n) if n >= 1 => n,
                        _ => {
                            return Err(ApiError::bad_param(
                                "thinking.budget_tokens",
                                "thinking of type enabled needs `budget_tokens`, a positive \
                                 integer: the most tokens the reasoning may take",
                            ));
                        }
                    };
                    if let Some(max_tokens) = self.max_tokens.filter(|&m| m > 0)
                        && budget >= max_tokens
                    {
                        return Err(ApiError::bad_param(
                            "thinking.budget_tokens",
                            format!(
                                "`budget_tokens` ({budget}) must be less than `max_tokens` \
                                 ({max_tokens}), which the reasoning counts toward"
                            ),
                        ));
                    }
                    (true, Some(budget))
                }
                Some("adaptive") => (true, None),
                Some("disabled") => (false, None),
                Some(other) => {
                    return Err(ApiError::bad_param(
                        "thinking.type",
                        format!(
                            "thinking type {other:?} is not supported; use enabled, adaptive or \
                             disabled"
                        ),
                    ));
                }
                None => {
                    return Err(ApiError::bad_param(
                        "thinking",
                        "`thinking` must be an object with a string `type`",
                    ));
                }
            },
        };
        let effort = match self.output_config.and_then(|c| c.get("effort")) {
            None | Some(Value::Null) => None,
            Some(Value::String(e)) => match e.as_str() {
                "low" | "medium" => None,
                "high" => Some(ReasoningEffort::High),
                "xhigh" | "max" => Some(ReasoningEffort::Max),
                other => {
                    return Err(ApiError::bad_param(
                        "output_config.effort",
                        format!("unknown effort {other:?}; use low, medium, high, xhigh or max"),
                    ));
                }
            },
            Some(other) => {
                return Err(ApiError::bad_param(
                    "output_config.effort",
                    format!("`effort` must be a string, not {other}"),
                ));
            }
        };
        let omit = match self.thinking.and_then(|t| t.get("display")) {
            None | Some(Value::Null) => false,
            Some(Value::String(d)) if d == "summarized" => false,
            Some(Value::String(d)) if d == "omitted" => true,
            Some(other) => {
                return Err(ApiError::bad_param(
                    "thinking.display",
                    format!("`display` must be \"summarized\" or \"omitted\", not {other}"),
                ));
            }
        };
        Ok(Thinking {
            on,
            budget,
            effort,
            omit,
        })
    }

    /// The JSON schema `output_config.format` asks the answer to follow, if any.
    pub fn structured(&self) -> Result<Option<Shape>, ApiError> {
        let Some(config) = self.output_config else {
            return Ok(None);
        };
        let Value::Object(fields) = config else {
            return Err(ApiError::bad_param(
                "output_config",
                "`output_config` must be an object with `effort` and `format`",
            ));
        };
        if let Some(key) = fields
            .keys()
            .find(|k| !matches!(k.as_str(), "effort" | "format"))
        {
            return Err(ApiError::bad_param(
                format!("output_config.{key}"),
                format!("unknown field `{key}`; output_config takes effort and format"),
            ));
        }
        let format = match fields.get("format") {
            None | Some(Value::Null) => return Ok(None),
            Some(f) => f,
        };
        const AT: &str = "output_config.format";
        if format.get("type").and_then(Value::as_str) != Some("json_schema") {
            return Err(ApiError::bad_param(
                AT,
                "`format` must be {\"type\": \"json_schema\", \"schema\": {...}}",
            ));
        }
        let schema = format
            .get("schema")
            .ok_or_else(|| ApiError::bad_param(AT, "a json_schema format needs its `schema`"))?;
        let schema = structured::schema(schema, &format!("{AT}.schema"))?;
        Ok(Some(Shape::json(schema, AT)))
    }
}

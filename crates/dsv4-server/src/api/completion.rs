//! `/v1/completions` bodies: [`CompletionRequest`] (prompts: texts or token ids) and the
//! response and stream-chunk objects.

use super::common::{Stop, StopReason, StreamOptions, UsageBody};
use super::logprobs::{CompletionLogprobs, PromptLogprobs};
use super::sampling::{SamplingFields, prompt_logprobs_count, top_count};
use super::structured::{Fields, ResponseFormat, Shape, StructuredOutputs};
use crate::error::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// OpenAI's default `max_tokens` for text completions.
pub const DEFAULT_MAX_TOKENS: u64 = 16;

/// A text completion request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// The served model's id.
    pub model: String,
    /// Text, token ids, or a list of texts or of token-id lists (each prompt gets `n`
    /// choices).
    pub prompt: Value,
    /// Tokens to generate at most (default 16, as OpenAI).
    pub max_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k sampling (extension).
    pub top_k: Option<i64>,
    /// Seed.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Keep the stop string that ended the answer in its text (vLLM's extension; default
    /// false: the text is cut before it).
    pub include_stop_str_in_output: Option<bool>,
    /// SGLang's name for `include_stop_str_in_output` (both given must agree).
    pub no_stop_trim: Option<bool>,
    /// SGLang's; only false (dsv4 does not return hidden states).
    pub return_hidden_states: Option<bool>,
    /// Choices, 1 to [`super::common::MAX_N`] (default 1); choice i samples with seed + i.
    pub n: Option<u32>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Stream options.
    pub stream_options: Option<StreamOptions>,
    /// Start each choice's text with the prompt (with `logprobs`, its tokens lead the lists).
    pub echo: Option<bool>,
    /// Return each generated token's log-probability with this many alternatives (0 to 20).
    pub logprobs: Option<u32>,
    /// Return each prompt token's log-probability with this many alternatives (0 to 20;
    /// vLLM's extension), as `choices[].prompt_logprobs`.
    pub prompt_logprobs: Option<u32>,
    /// The text after the hole: each (text) prompt is the text before it, and the completion
    /// fills the middle (DeepSeek's fill-in-the-middle prompt).
    pub suffix: Option<String>,
    /// Not supported (must be 1).
    pub best_of: Option<u32>,
    /// Beam search instead of sampling, with `n` beams (vLLM's extension; default false).
    pub use_beam_search: Option<bool>,
    /// With `use_beam_search`: a hypothesis's log-probability is divided by its generated
    /// length to this power (default 1; vLLM's extension).
    pub length_penalty: Option<f32>,
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
    /// For a prompt that ends with `<think>`: end the reasoning with `</think>` after this
    /// many tokens (vLLM's extension; see [`crate::thinking_budget`]).
    pub thinking_token_budget: Option<u64>,
    /// Admission priority: among waiting requests a larger one is admitted first (SGLang's
    /// extension; default 0; batch lines default to -1).
    pub priority: Option<i32>,
    /// How the engine admits it, set by the server: never read from the body.
    #[serde(skip)]
    pub admission: crate::api::common::Admission,
    /// Token ids that end the answer as the end-of-sequence token does (vLLM's extension).
    pub stop_token_ids: Option<Value>,
    /// Only these token ids may be generated (vLLM's extension).
    pub allowed_token_ids: Option<Value>,
    /// Words never generated (vLLM's extension; see [`crate::api::sampling::bad_words_ids`]).
    pub bad_words: Option<Value>,
    /// Leave special tokens' text out of the generated text (vLLM's extension; default false
    /// here: dsv4 shows them, where vLLM's default is true).
    pub skip_special_tokens: Option<bool>,
    /// Accepted (the byte-level tokenizer adds no spaces between special tokens).
    pub spaces_between_special_tokens: Option<bool>,
    /// Keep only the prompt's last k tokens (−1: the model's context), vLLM's extension.
    pub truncate_prompt_tokens: Option<i64>,
    /// Return the token ids of the prompt (`prompt_token_ids`) and of each choice
    /// (`choices[].token_ids`; streams: the prompt's on the first chunk, each chunk's own),
    /// vLLM's extension.
    pub return_token_ids: Option<bool>,
    /// Name the tokens of `logprobs` `token_id:N` instead of by their text (vLLM's extension).
    pub return_tokens_as_token_ids: Option<bool>,
    /// Accepted and ignored.
    pub user: Option<String>,
    /// {"type": "text" | "json_object" | "json_schema", "json_schema": {...}} (vLLM's
    /// extension on text completions).
    pub response_format: Option<ResponseFormat>,
    /// vLLM's structured outputs: `json`, `regex`, `choice`, `grammar` or `json_object`.
    pub structured_outputs: Option<StructuredOutputs>,
    /// A regular expression the whole text matches (SGLang's extension).
    pub regex: Option<String>,
    /// A grammar the text follows, GBNF or Lark (SGLang's extension).
    pub ebnf: Option<String>,
}

/// The prompt of a completion request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text (BOS is prepended unless it starts with the BOS marker).
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
}

impl CompletionRequest {
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

    /// The alternatives per token to return (None: no log-probabilities).
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        self.logprobs.map(|n| top_count("logprobs", n)).transpose()
    }

    /// The alternatives per prompt token of `prompt_logprobs` (None: not asked for; refused
    /// with `stream`, as in vLLM).
    pub fn prompt_logprobs(&self) -> Result<Option<usize>, ApiError> {
        prompt_logprobs_count(self.prompt_logprobs, self.stream.unwrap_or(false))
    }

    /// The prompts, checked: a text, token ids, or a list of texts or of token-id lists (one
    /// kind per request, 1 to [`MAX_PROMPTS`]).
    pub fn prompts(&self) -> Result<Vec<Prompt>, ApiError> {
        let bad = |m: String| ApiError::bad_param("prompt", m);
        let ids = |v: &[Value]| -> Result<Prompt, ApiError> {
            v.iter()
                .map(|i| i.as_u64().and_then(|i| u32::try_from(i).ok()))
                .collect::<Option<Vec<u32>>>()
                .map(Prompt::Tokens)
                .ok_or_else(|| bad("token ids must be non-negative integers".into()))
        };
        let shape = "a prompt is a string, a list of token ids, or a list of strings or of \
                     token-id lists";
        let prompts = match &self.prompt {
            Value::String(s) => vec![Prompt::Text(s.clone())],
            Value::Array(items) if items.is_empty() => {
                return Err(bad("the prompt list is empty".into()));
            }
            Value::Array(items) if items.iter().all(Value::is_number) => vec![ids(items)?],
            Value::Array(items) if items.iter().all(Value::is_string) => items
                .iter()
                .filter_map(|s| s.as_str().map(|s| Prompt::Text(s.to_string())))
                .collect(),
            Value::Array(items) if items.iter().all(Value::is_array) => items
                .iter()
                .map(|v| match v.as_array() {
                    Some(v) if v.iter().all(Value::is_number) => ids(v),
                    _ => Err(bad(format!("{shape}; one list holds something else"))),
                })
                .collect::<Result<_, _>>()?,
            Value::Array(_) => {
                return Err(bad(format!("{shape}, not a mix of them")));
            }
            _ => return Err(bad(shape.to_string())),
        };
        if prompts.len() > MAX_PROMPTS {
            return Err(bad(format!(
                "at most {MAX_PROMPTS} prompts per request, got {}; split them over requests",
                prompts.len()
            )));
        }
        Ok(prompts)
    }
}

/// Most prompts one completion request may carry.
pub const MAX_PROMPTS: usize = 256;

/// One choice of a completion or a chunk.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// The choice's index: prompt × n + its number among the prompt's n.
    pub index: usize,
    /// The generated text (or its next piece).
    pub text: String,
    /// "stop" or "length" (null until the last chunk).
    pub finish_reason: Option<&'static str>,
    /// With `logprobs`: the tokens of this text (a chunk: those consumed since the previous
    /// chunk); else null.
    pub logprobs: Option<CompletionLogprobs>,
    /// With `prompt_logprobs`: the prompt's tokens (vLLM's extension); else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
    /// The `stop_token_ids` id or stop string that ended the choice, else null (vLLM's
    /// extension; a stream's chunks carry it with their `finish_reason`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Option<StopReason>>,
    /// With `return_token_ids`: the prompt's token ids as run (a stream: on the choice's
    /// first chunk); else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// With `return_token_ids`: the ids of the generated tokens (a chunk: those consumed since
    /// the previous chunk), ending with the token that ended the choice when one did
    /// (end-of-sequence or a `stop_token_ids` id, which `usage` does not count); else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// A completion, or one chunk of a streamed one (`object` "text_completion" either way).
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    /// "cmpl-…".
    pub id: String,
    /// "text_completion".
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// The choices (prompts × n) in index order; a stream chunk has one (the choices' chunks
    /// interleave), its usage chunk none.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (streams, with `include_usage`: null on chunks, the totals on the usage
    /// chunk; with `continuous_usage_stats`, each choice chunk's choice so far).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageBody>>,
}

//! SGLang's native `POST /generate` bodies: [`GenerateRequest`] (a text or token ids, or a
//! batch of them, with SGLang's `sampling_params`) and the answer objects ([`GenerateOutput`]:
//! `text`, `output_ids`, `meta_info`). Unknown fields, top level or in `sampling_params`, are
//! refused naming them.

use super::common::unsupported;
use super::completion::{MAX_PROMPTS, Prompt};
use super::sampling::SamplingFields;
use crate::error::ApiError;
use serde::de::{self, DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// SGLang's default `max_new_tokens`.
pub const DEFAULT_MAX_NEW_TOKENS: u64 = 128;

/// One value for every prompt, or one per prompt (a list; no value is itself a list).
#[derive(Debug, Clone)]
pub enum PerPrompt<T> {
    /// The same for every prompt.
    One(T),
    /// Prompt k's at position k.
    Each(Vec<T>),
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for PerPrompt<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Parsed by hand so that an error in a value (an unknown sampling parameter) is told
        // as it is, with the value's place in a list.
        match Value::deserialize(d)? {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(k, v)| {
                    serde_json::from_value(v).map_err(|e| de::Error::custom(format!("[{k}]: {e}")))
                })
                .collect::<Result<_, _>>()
                .map(Self::Each),
            v => serde_json::from_value(v)
                .map(Self::One)
                .map_err(de::Error::custom),
        }
    }
}

/// SGLang's `token_ids_logprob`: one list of token ids for every prompt, or one list (or
/// null) per prompt.
#[derive(Debug, Clone)]
pub enum TokenIdLists {
    /// The same ids for every prompt.
    One(Vec<u32>),
    /// Prompt k's at position k (None: none for it).
    Each(Vec<Option<Vec<u32>>>),
}

impl<'de> Deserialize<'de> for TokenIdLists {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A list of lists (or nulls) is one per prompt; any other list is one for all.
        let v = Value::deserialize(d)?;
        let per_prompt = v.as_array().is_some_and(|items| {
            !items.is_empty() && items.iter().all(|i| i.is_array() || i.is_null())
        });
        let expect = "a list of token ids, or a list of such lists (one per prompt)";
        if per_prompt {
            serde_json::from_value(v)
                .map(Self::Each)
                .map_err(|e| de::Error::custom(format!("{expect}: {e}")))
        } else {
            serde_json::from_value(v)
                .map(Self::One)
                .map_err(|e| de::Error::custom(format!("{expect}: {e}")))
        }
    }
}

impl TokenIdLists {
    /// The ids for each of `n` prompts (None: none asked for that prompt).
    pub fn spread(&self, n: usize) -> Result<Vec<Option<Vec<u32>>>, ApiError> {
        match self {
            Self::One(ids) => Ok(vec![Some(ids.clone()); n]),
            Self::Each(v) => PerPrompt::Each(v.clone()).spread(n, "token_ids_logprob"),
        }
    }
}

impl<T: Clone> PerPrompt<T> {
    /// The value for each of `n` prompts (`field` names the request field in errors).
    pub fn spread(&self, n: usize, field: &str) -> Result<Vec<T>, ApiError> {
        match self {
            Self::One(v) => Ok(vec![v.clone(); n]),
            Self::Each(v) if v.len() == n => Ok(v.clone()),
            Self::Each(v) => Err(ApiError::bad_param(
                field,
                format!(
                    "`{field}` is a list of {} values but the request has {n} prompts; give one \
                     value for all or one per prompt",
                    v.len()
                ),
            )),
        }
    }
}

/// A `/generate` request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    /// The served model's id, or null (SGLang's router sends it; another id is a 404).
    pub model: Option<String>,
    /// A text, or a batch of texts (used as given: no BOS is added, no chat template).
    pub text: Option<Value>,
    /// Token ids, or a batch of token-id lists (instead of `text`).
    pub input_ids: Option<Value>,
    /// The sampling parameters, for all prompts or one per prompt.
    pub sampling_params: Option<PerPrompt<GenerateSampling>>,
    /// The request id shown as `meta_info.id` (default: a fresh one).
    pub rid: Option<PerPrompt<String>>,
    /// Return log-probabilities of the output (and, from `logprob_start_len`, of the input).
    pub return_logprob: Option<PerPrompt<bool>>,
    /// With `return_logprob`: the first prompt position whose log-probability is returned
    /// (default −1: the output's only).
    pub logprob_start_len: Option<PerPrompt<i64>>,
    /// With `return_logprob`: the most likely alternatives per position (0 to 20).
    pub top_logprobs_num: Option<PerPrompt<u32>>,
    /// With `return_logprob`: token ids whose log-probabilities are returned at every position
    /// (one list for all prompts, or a list of lists, one per prompt).
    pub token_ids_logprob: Option<TokenIdLists>,
    /// Put each token's text in the log-probability entries (else null).
    pub return_text_in_logprobs: Option<bool>,
    /// Stream server-sent events, each with the output so far.
    pub stream: Option<bool>,
    /// Accepted and ignored (requests are always logged the same way).
    pub log_metrics: Option<bool>,
    /// Accepted and ignored: dsv4 never logs prompts or outputs (SGLang's `no_logs`).
    pub no_logs: Option<bool>,
    /// SGLang's; only false (dsv4 does not return hidden states).
    pub return_hidden_states: Option<bool>,
    /// SGLang's; only false (no background generation on `/generate`).
    pub background: Option<bool>,
    /// SGLang's; only false (the output is text).
    pub return_bytes: Option<bool>,
    /// SGLang's; only false (no per-token entropy).
    pub return_entropy: Option<bool>,
    /// Admission priority: among waiting requests a larger one is admitted first (SGLang's
    /// extension; default 0; batch lines default to -1).
    pub priority: Option<i32>,
    /// How the engine admits it, set by the server: never read from the body.
    #[serde(skip)]
    pub admission: crate::api::common::Admission,
}

/// SGLang's `sampling_params`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateSampling {
    /// Tokens to generate at most (default 128; 0 only runs the prompt).
    pub max_new_tokens: Option<u64>,
    /// The end-of-sequence and stop tokens are held back until this many tokens.
    pub min_new_tokens: Option<u64>,
    /// Stop strings: one or a list.
    pub stop: Option<super::common::Stop>,
    /// Token ids that end the output as the end-of-sequence token does.
    pub stop_token_ids: Option<Value>,
    /// 0 to 2; 0 is greedy (default 1).
    pub temperature: Option<f32>,
    /// (0, 1] (default 1).
    pub top_p: Option<f32>,
    /// −1 or 0: all tokens; else the k most likely.
    pub top_k: Option<i64>,
    /// 0 to 1 (default 0).
    pub min_p: Option<f32>,
    /// −2 to 2.
    pub frequency_penalty: Option<f32>,
    /// −2 to 2.
    pub presence_penalty: Option<f32>,
    /// Above 0 (1 = off).
    pub repetition_penalty: Option<f32>,
    /// Token id (decimal string) → bias from −100 to 100.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// The seed of the request's random stream (default: a fresh one).
    pub sampling_seed: Option<u64>,
    /// Keep generating past the end-of-sequence token.
    pub ignore_eos: Option<bool>,
    /// For a prompt that ends with `<think>`: end the reasoning with `</think>` after this
    /// many tokens (SGLang's; see [`crate::thinking_budget`]).
    pub thinking_budget: Option<u64>,
    /// Outputs per prompt, 1 to 16 (output k of prompt p is at p·n + k).
    pub n: Option<u32>,
    /// Leave special tokens' text out of `text` (default true, as SGLang).
    pub skip_special_tokens: Option<bool>,
    /// Accepted (the tokenizer decodes bytes; there is no space to add).
    pub spaces_between_special_tokens: Option<bool>,
    /// Keep the stop string that ended the output in `text`.
    pub no_stop_trim: Option<bool>,
    /// A JSON schema (as JSON text or an object) the output must follow.
    pub json_schema: Option<Value>,
    /// A regular expression the whole output matches.
    pub regex: Option<String>,
    /// A grammar the output follows: GBNF (xgrammar's EBNF, start rule `root`) or Lark.
    pub ebnf: Option<String>,
    /// A structural tag (as JSON text or an object) the output follows.
    pub structural_tag: Option<Value>,
}

impl GenerateRequest {
    /// Refuse SGLang's switches dsv4 does not do when they are on (SGLang's router sends them
    /// all, off), each a 400 naming it.
    pub fn refuse_unsupported(&self) -> Result<(), ApiError> {
        unsupported("return_hidden_states", self.return_hidden_states, false)?;
        unsupported("background", self.background, false)?;
        unsupported("return_bytes", self.return_bytes, false)?;
        unsupported("return_entropy", self.return_entropy, false)
    }
}

impl GenerateSampling {
    /// The sampling fields shared with the OpenAI endpoints.
    pub fn fields(&self) -> SamplingFields {
        SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.sampling_seed,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            repetition_penalty: self.repetition_penalty,
            logit_bias: self.logit_bias.clone(),
            min_tokens: self.min_new_tokens,
            stop_token_ids: self.stop_token_ids.clone(),
            allowed_token_ids: None,
        }
    }
}

impl GenerateRequest {
    /// The prompts and whether the request is a batch (its answer is then a list).
    pub fn prompts(&self) -> Result<(Vec<Prompt>, bool), ApiError> {
        let ids = |v: &Value, field: &str| -> Result<Vec<u32>, ApiError> {
            v.as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|i| i.as_u64().and_then(|i| u32::try_from(i).ok()))
                        .collect::<Option<Vec<u32>>>()
                })
                .filter(|a| !a.is_empty())
                .ok_or_else(|| {
                    ApiError::bad_param(field, "input_ids is a non-empty list of token ids")
                })
        };
        let (prompts, batch) = match (&self.text, &self.input_ids) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "give either `text` or `input_ids`, not both",
                ));
            }
            (None, None) => {
                return Err(ApiError::bad_request(
                    "the request has no prompt: give `text` or `input_ids`",
                ));
            }
            (Some(Value::String(s)), None) => (vec![Prompt::Text(s.clone())], false),
            (Some(Value::Array(items)), None) if !items.is_empty() => {
                let texts = items
                    .iter()
                    .enumerate()
                    .map(|(k, v)| match v {
                        Value::String(s) => Ok(Prompt::Text(s.clone())),
                        _ => Err(ApiError::bad_param(
                            format!("text[{k}]"),
                            "a batch of texts is a list of strings",
                        )),
                    })
                    .collect::<Result<_, _>>()?;
                (texts, true)
            }
            (Some(_), None) => {
                return Err(ApiError::bad_param(
                    "text",
                    "text is a string or a non-empty list of strings",
                ));
            }
            (None, Some(Value::Array(items)))
                if !items.is_empty() && items.iter().all(Value::is_array) =>
            {
                let lists = items
                    .iter()
                    .enumerate()
                    .map(|(k, v)| ids(v, &format!("input_ids[{k}]")).map(Prompt::Tokens))
                    .collect::<Result<_, _>>()?;
                (lists, true)
            }
            (None, Some(v)) => (vec![Prompt::Tokens(ids(v, "input_ids")?)], false),
        };
        if prompts.len() > MAX_PROMPTS {
            return Err(ApiError::bad_request(format!(
                "at most {MAX_PROMPTS} prompts per request, got {}; split them over requests",
                prompts.len()
            )));
        }
        Ok((prompts, batch))
    }
}

/// `meta_info.finish_reason`: `{"type": "stop", "matched": ID | TEXT}` (the end-of-sequence
/// token, a stop token or a stop string), `{"type": "length", "length": N}` or `{"type":
/// "abort", "message": …}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GenerateFinish {
    /// A token or a stop string ended the output.
    Stop {
        /// The token id or the stop string.
        matched: Value,
    },
    /// `max_new_tokens` ended the output.
    Length {
        /// The limit.
        length: usize,
    },
    /// `/abort_request` ended the output (what it had is kept).
    Abort {
        /// Why.
        message: String,
    },
}

/// A log-probability entry: `[logprob, token_id, text]` (text null unless asked for; logprob
/// null for the sequence's first token).
pub type LogprobEntry = (Option<f32>, u32, Option<String>);

/// `meta_info`.
#[derive(Debug, Clone, Serialize)]
pub struct MetaInfo {
    /// The request id (`rid`, or a fresh one).
    pub id: String,
    /// How the output ended; null while it is going.
    pub finish_reason: Option<GenerateFinish>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (the token that ended the output not counted).
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache (once the output ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<usize>,
    /// Seconds from receipt to the end (once the output ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e_latency: Option<f64>,
    /// With `return_logprob` and `logprob_start_len` ≥ 0: the prompt's tokens from there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_token_logprobs: Option<Vec<LogprobEntry>>,
    /// With `return_logprob`: the output's tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_token_logprobs: Option<Vec<LogprobEntry>>,
    /// With `top_logprobs_num` > 0: the alternatives of each input position (null first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_top_logprobs: Option<Vec<Option<Vec<LogprobEntry>>>>,
    /// With `top_logprobs_num` > 0: the alternatives of each output token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_top_logprobs: Option<Vec<Vec<LogprobEntry>>>,
    /// With `token_ids_logprob`: the asked tokens at each input position (null first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_token_ids_logprobs: Option<Vec<Option<Vec<LogprobEntry>>>>,
    /// With `token_ids_logprob`: the asked tokens at each output position.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_token_ids_logprobs: Option<Vec<Vec<LogprobEntry>>>,
}

/// One output: the whole answer, or (streamed) the output so far.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateOutput {
    /// The text generated (cut at a stop string unless `no_stop_trim`).
    pub text: String,
    /// The generated token ids, ending with the token that ended the output when one did.
    pub output_ids: Vec<u32>,
    /// Counts, finish reason, log-probabilities.
    pub meta_info: MetaInfo,
    /// A batch's stream: the output's place in the batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
}

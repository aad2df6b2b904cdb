//! What chat and text completions share: parsing a body into a request type (malformed JSON
//! and wrong types become 400s that name the field), stop strings, stream options and the
//! usage object (the sampling fields are in [`super::sampling`]).

use crate::error::ApiError;
use dsv4_engine::Usage;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Most stop strings a request may give (OpenAI allows 4; vLLM and SGLang have no limit).
pub const MAX_STOPS: usize = 16;

/// How the engine admits a request, set by the server, never read from its body: the queue
/// limit past which it is refused (`scheduler.max_queued_requests`) and whether it yields
/// (a batch line; [`dsv4_engine::Request::yields`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Admission {
    /// The most requests that may wait before this one is refused.
    pub queue_limit: Option<usize>,
    /// Whether it pauses past the engine's yield cap.
    pub yields: bool,
}

impl Admission {
    /// An engine request admitted so, the rest default (the base of a struct update).
    pub fn request(self) -> dsv4_engine::Request {
        dsv4_engine::Request {
            queue_limit: self.queue_limit,
            yields: self.yields,
            ..Default::default()
        }
    }
}

/// Parse `body` as `T`, naming the field at fault in the error.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = parsed.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let hint = if inner.to_string().starts_with("unknown field `guided_") {
            " (vLLM 0.12 replaced its guided_* fields with `structured_outputs`: `json`, \
             `regex`, `choice`, `grammar`)"
        } else {
            ""
        };
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!(
                "the request body is not valid JSON ({inner}); send one JSON object"
            ))
            .with_code("invalid_json")
        } else if path == "." {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            ApiError::bad_param(&path, format!("invalid value for `{path}`: {inner}{hint}"))
        }
    })?;
    de.end().map_err(|e| {
        ApiError::bad_request(format!(
            "the request body has data after its JSON object ({e}); send exactly one object"
        ))
        .with_code("invalid_json")
    })?;
    Ok(value)
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Up to [`MAX_STOPS`] stop strings.
    Many(Vec<String>),
}

/// Check and flatten `stop`.
pub fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::bad_param(
            "stop",
            format!(
                "at most {MAX_STOPS} stop strings are accepted, got {}",
                stops.len()
            ),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::bad_param(
            "stop",
            "stop strings must not be empty",
        ));
    }
    Ok(stops)
}

/// What ended an answer that stopped (vLLM's `stop_reason`): a `stop_token_ids` id or a stop
/// string; end-of-sequence and length limits have none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum StopReason {
    /// A token of `stop_token_ids`.
    Token(u32),
    /// A stop string.
    Text(String),
}

/// `stream_options` (unknown options are refused, naming them).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with the usage (and `"usage": null` on the others).
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// With `include_usage`: every chunk of a choice carries that choice's usage so far
    /// (vLLM's extension).
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// What a stream reports of its usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamUsage {
    /// A last chunk with the totals (`include_usage`).
    pub last: bool,
    /// Every choice chunk with its choice's usage so far (`continuous_usage_stats`).
    pub every: bool,
}

impl StreamUsage {
    /// The usage reporting `opts` asks for; `continuous_usage_stats` needs `include_usage`
    /// (as in vLLM, where it does nothing without it; here it is refused).
    pub fn new(opts: Option<&StreamOptions>) -> Result<Self, ApiError> {
        let last = opts.and_then(|o| o.include_usage).unwrap_or(false);
        let every = opts.and_then(|o| o.continuous_usage_stats).unwrap_or(false);
        if every && !last {
            return Err(ApiError::bad_param(
                "stream_options.continuous_usage_stats",
                "continuous_usage_stats needs \"include_usage\": true in stream_options",
            ));
        }
        Ok(Self { last, every })
    }
}

/// Refuse an option this server does not implement when it is set to anything but `default`.
pub fn unsupported<T: PartialEq>(name: &str, value: Option<T>, default: T) -> Result<(), ApiError> {
    match value {
        Some(v) if v != default => Err(ApiError::bad_param(
            name,
            format!("`{name}` is not supported by this server; leave it out"),
        )),
        _ => Ok(()),
    }
}

/// Whether the stop string that ended the text stays in it: vLLM's
/// `include_stop_str_in_output` or SGLang's `no_stop_trim`, two names for one switch (default
/// false); a 400 naming `no_stop_trim` when both are given and disagree.
pub fn keep_stop_string(
    include: Option<bool>,
    no_stop_trim: Option<bool>,
) -> Result<bool, ApiError> {
    match (include, no_stop_trim) {
        (Some(a), Some(b)) if a != b => Err(ApiError::bad_param(
            "no_stop_trim",
            "`no_stop_trim` (SGLang's name) and `include_stop_str_in_output` (vLLM's) are one \
             switch and disagree here; send one of them",
        )),
        (a, b) => Ok(a.or(b).unwrap_or(false)),
    }
}

/// Apply `truncate_prompt_tokens` (vLLM's extension) to `prompt`: keep its last `k` tokens
/// (−1: the model's `context`), so a long document's end fits. Returns whether tokens were
/// dropped. 0, values below −1 and values over the context are refused, naming the field.
pub fn truncate_prompt(
    prompt: &mut Vec<u32>,
    keep: Option<i64>,
    context: usize,
) -> Result<bool, ApiError> {
    let bad = |m: String| ApiError::bad_param("truncate_prompt_tokens", m);
    let k = match keep {
        None => return Ok(false),
        Some(-1) => context,
        Some(k) if k >= 1 && k as u64 <= context as u64 => k as usize,
        Some(k) if k >= 1 => {
            return Err(bad(format!(
                "truncate_prompt_tokens ({k}) is over the model's context of {context} tokens"
            )));
        }
        Some(k) => {
            return Err(bad(format!(
                "truncate_prompt_tokens keeps the prompt's last k tokens: k ≥ 1, or −1 for \
                 the model's context; got {k}"
            )));
        }
    };
    if prompt.len() <= k {
        return Ok(false);
    }
    prompt.drain(..prompt.len() - k);
    Ok(true)
}

/// Most choices (`n`) one request may ask for; each choice is its own engine request.
pub const MAX_N: u32 = 16;

/// Check `n` (1 to [`MAX_N`], default 1) and return the number of choices.
pub fn check_n(n: Option<u32>) -> Result<usize, ApiError> {
    match n.unwrap_or(1) {
        n @ 1..=MAX_N => Ok(n as usize),
        n => Err(ApiError::bad_param(
            "n",
            format!("n (the number of choices) must be from 1 to {MAX_N}, got {n}"),
        )),
    }
}

/// The OpenAI usage object.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UsageBody {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
    /// Prompt tokens served from the prefix cache (absent from the usage so far of a choice
    /// still going, which the engine reports at its end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Of the generated tokens, the reasoning's (thinking-mode chat answers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// `usage.completion_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CompletionTokensDetails {
    /// Tokens up to and including the end of the reasoning (`</think>`).
    pub reasoning_tokens: usize,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Prompt tokens reused from the prefix cache.
    pub cached_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(u: Usage) -> Self {
        Self::total(&[u])
    }
}

impl UsageBody {
    /// The usage of a request whose choices ended with `usages` (choice 0 first): the prompt
    /// and its cached tokens counted once (from choice 0, as OpenAI and vLLM), the generated
    /// tokens summed over the choices.
    pub fn total(usages: &[Usage]) -> Self {
        let first = usages.first().copied().unwrap_or_default();
        let completion_tokens = usages.iter().map(|u| u.completion_tokens).sum();
        Self {
            prompt_tokens: first.prompt_tokens,
            completion_tokens,
            total_tokens: first.prompt_tokens + completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: first.cached_tokens,
            }),
            completion_tokens_details: None,
        }
    }

    /// With the answer's reasoning tokens (summed over its choices), when it has any count.
    pub fn with_reasoning(self, reasoning_tokens: Option<usize>) -> Self {
        Self {
            completion_tokens_details: reasoning_tokens
                .map(|reasoning_tokens| CompletionTokensDetails { reasoning_tokens }),
            ..self
        }
    }

    /// The usage so far of a choice still going (`continuous_usage_stats`).
    pub fn so_far(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
            completion_tokens_details: None,
        }
    }
}

impl UsageBody {
    /// The usage of several prompts' choices together (each part from [`Self::total`]).
    pub fn sum(parts: impl IntoIterator<Item = Self>) -> Self {
        let mut out = Self::total(&[]);
        for p in parts {
            out.prompt_tokens += p.prompt_tokens;
            out.completion_tokens += p.completion_tokens;
            out.total_tokens += p.total_tokens;
            if let (Some(o), Some(p)) = (&mut out.prompt_tokens_details, &p.prompt_tokens_details) {
                o.cached_tokens += p.cached_tokens;
            }
        }
        out
    }
}

/// OpenAI's `metadata` (of a response or a batch): at most 16 keys, each with a string value.
pub fn check_metadata(
    metadata: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<(), ApiError> {
    match metadata {
        Some(meta) if meta.len() > 16 || meta.values().any(|v| !v.is_string()) => {
            Err(ApiError::bad_param(
                "metadata",
                "metadata holds at most 16 keys, each with a string value",
            ))
        }
        _ => Ok(()),
    }
}

/// Seconds since the Unix epoch (the `created` field).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A pseudo-random 64-bit number from `serial` and the clock (unique per serial).
pub fn random_u64(serial: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // SplitMix64 finalizer over the mix: unique per serial, unpredictable enough for ids.
    let mut z = nanos ^ serial.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A short pseudo-random hex id from `serial` and the clock.
pub fn random_hex(serial: u64) -> String {
    format!("{:016x}", random_u64(serial))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_from_one_to_max_is_accepted_and_the_rest_refused_naming_n() {
        assert_eq!(check_n(None).unwrap(), 1);
        assert_eq!(check_n(Some(1)).unwrap(), 1);
        assert_eq!(check_n(Some(3)).unwrap(), 3);
        assert_eq!(check_n(Some(MAX_N)).unwrap(), MAX_N as usize);
        for bad in [0, MAX_N + 1, u32::MAX] {
            let e = check_n(Some(bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("n"));
            assert!(
                e.message.contains("from 1 to 16") && e.message.contains(&format!("got {bad}")),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn truncation_keeps_the_prompts_end_and_refuses_what_cannot_be_kept() {
        let mut p: Vec<u32> = (0..10).collect();
        assert!(!truncate_prompt(&mut p, None, 8).unwrap());
        assert!(truncate_prompt(&mut p, Some(4), 8).unwrap());
        assert_eq!(p, [6, 7, 8, 9]);
        assert!(
            !truncate_prompt(&mut p, Some(4), 8).unwrap(),
            "already short enough"
        );
        let mut p: Vec<u32> = (0..10).collect();
        assert!(truncate_prompt(&mut p, Some(-1), 8).unwrap());
        assert_eq!(p, (2..10).collect::<Vec<u32>>());
        for bad in [0, -2, 9, i64::MIN, i64::MAX] {
            let e = truncate_prompt(&mut p, Some(bad), 8).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("truncate_prompt_tokens"), "{bad}");
        }
        assert_eq!(p.len(), 8, "a refusal leaves the prompt alone");
    }

    #[test]
    fn usage_counts_the_prompt_once_and_sums_the_choices() {
        let u = |completion_tokens, cached_tokens| Usage {
            prompt_tokens: 10,
            completion_tokens,
            cached_tokens,
            preemptions: 0,
        };
        let total = UsageBody::total(&[u(3, 0), u(5, 8), u(1, 8)]);
        assert_eq!(total.prompt_tokens, 10);
        assert_eq!(total.completion_tokens, 9);
        assert_eq!(total.total_tokens, 19);
        assert_eq!(total.prompt_tokens_details.unwrap().cached_tokens, 0);
        assert_eq!(UsageBody::from(u(4, 2)), UsageBody::total(&[u(4, 2)]));
    }
}

//! What chat and text completions share: parsing a body into a request type (malformed JSON
//! and wrong types become 400s that name the field), stop strings, stream options and the
//! usage object (the sampling fields are in [`super::sampling`]).

use crate::error::ApiError;
use dsv4_engine::Usage;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Most stop strings a request may give (OpenAI allows 4; vLLM and SGLang have no limit).
pub const MAX_STOPS: usize = 16;

/// Parse `body` as `T`, naming the field at fault in the error.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = parsed.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!(
                "the request body is not valid JSON ({inner}); send one JSON object"
            ))
            .with_code("invalid_json")
        } else if path == "." {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            ApiError::bad_param(&path, format!("invalid value for `{path}`: {inner}"))
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

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage (and `"usage": null` on the others).
    #[serde(default)]
    pub include_usage: Option<bool>,
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

/// Check `n` (only 1 is supported).
pub fn check_n(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(0) => Err(ApiError::bad_param(
            "n",
            "n must be 1 (one choice per request), got 0",
        )),
        Some(n) => Err(ApiError::bad_param(
            "n",
            format!("only n = 1 is supported, got {n}; send {n} requests instead"),
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
    /// Prompt tokens served from the prefix cache.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Prompt tokens reused from the prefix cache.
    pub cached_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(u: Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
        }
    }
}

/// Seconds since the Unix epoch (the `created` field).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A short pseudo-random hex id from `serial` and the clock.
pub fn random_hex(serial: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // SplitMix64 finalizer over the mix: unique per serial, unpredictable enough for ids.
    let mut z = nanos ^ serial.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    format!("{:016x}", z ^ (z >> 31))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_other_than_one_is_refused_with_a_fitting_hint() {
        assert!(check_n(None).is_ok() && check_n(Some(1)).is_ok());
        let e = check_n(Some(3)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        assert!(
            e.message.contains("send 3 requests instead"),
            "{}",
            e.message
        );
        let e = check_n(Some(0)).unwrap_err();
        assert!(
            e.message.contains("n must be 1") && !e.message.contains("send 0"),
            "{}",
            e.message
        );
    }
}

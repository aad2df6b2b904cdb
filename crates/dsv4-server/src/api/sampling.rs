//! The sampling fields both endpoints accept ([`SamplingFields`]) and their checks: each value
//! out of range is a 400 naming its field, before the engine sees the request. Also the
//! per-token log-probability counts (`top_logprobs`, legacy `logprobs`).

use crate::error::ApiError;
use dsv4_chat::Tokenizer;
use dsv4_engine::sampling::{MAX_BAD_WORD_SEQUENCES, MAX_BAD_WORD_TOKENS};
use dsv4_engine::{MAX_TOP_LOGPROBS, SamplingParams};
use serde::Deserialize;
use serde_json::Value;

/// The sampling fields both endpoints accept.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    /// 0 to 2; 0 is greedy (default 1, as OpenAI).
    pub temperature: Option<f32>,
    /// (0, 1] (default 1).
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens; -1 or 0 keeps all (vLLM/SGLang extension).
    pub top_k: Option<i64>,
    /// Keep tokens at least this fraction as likely as the most likely one, 0 to 1 (extension).
    pub min_p: Option<f32>,
    /// Seed of the request's random stream (default: a fresh one per request).
    pub seed: Option<u64>,
    /// −2 to 2: subtracted from a token's logit once per time it was generated.
    pub frequency_penalty: Option<f32>,
    /// −2 to 2: subtracted once from the logit of every token already generated.
    pub presence_penalty: Option<f32>,
    /// Above 0 (1 = off): divides positive (multiplies negative) logits of prompt and
    /// generated tokens (vLLM/SGLang extension).
    pub repetition_penalty: Option<f32>,
    /// Token id (decimal string) → bias from −100 to 100, added to the token's logit.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// The end tokens are held back until this many tokens are generated (extension).
    pub min_tokens: Option<u64>,
    /// Token ids that end the answer as the end-of-sequence token does (vLLM's extension).
    pub stop_token_ids: Option<Value>,
    /// Only these token ids may be generated (vLLM's extension); a non-empty list.
    pub allowed_token_ids: Option<Value>,
}

/// Most ids `stop_token_ids` may name.
pub const MAX_STOP_TOKEN_IDS: usize = 64;

impl SamplingFields {
    /// The engine's sampling options; `fresh_seed` is used when the request gives none. Checks
    /// every range that does not depend on the model or on `max_tokens` (see [`check_fit`]).
    pub fn to_params(&self, fresh_seed: u64) -> Result<SamplingParams, ApiError> {
        let temperature = self.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
            return Err(ApiError::bad_param(
                "temperature",
                format!("temperature must be from 0 to 2 (0 = greedy), got {temperature}"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad_param(
                "top_p",
                format!("top_p must be in (0, 1], got {top_p}"),
            ));
        }
        let top_k = match self.top_k.unwrap_or(0) {
            -1 | 0 => 0,
            k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
            k => {
                return Err(ApiError::bad_param(
                    "top_k",
                    format!("top_k must be -1, 0 (all tokens) or positive, got {k}"),
                ));
            }
        };
        let min_p = self.min_p.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&min_p) {
            return Err(ApiError::bad_param(
                "min_p",
                format!("min_p must be from 0 to 1 (0 = off), got {min_p}"),
            ));
        }
        let mut penalties = [0.0f32; 2];
        for (slot, (name, v)) in penalties.iter_mut().zip([
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ]) {
            *slot = v.unwrap_or(0.0);
            if !(-2.0..=2.0).contains(slot) {
                return Err(ApiError::bad_param(
                    name,
                    format!("{name} must be from -2 to 2 (0 = off), got {slot}"),
                ));
            }
        }
        let repetition_penalty = self.repetition_penalty.unwrap_or(1.0);
        if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
            return Err(ApiError::bad_param(
                "repetition_penalty",
                format!(
                    "repetition_penalty must be a finite number above 0 (1 = off, above 1 \
                     discourages repeats), got {repetition_penalty}"
                ),
            ));
        }
        Ok(SamplingParams {
            temperature,
            top_p,
            top_k,
            min_p,
            seed: self.seed.unwrap_or(fresh_seed),
            presence_penalty: penalties[0],
            frequency_penalty: penalties[1],
            repetition_penalty,
            logit_bias: logit_bias(self.logit_bias.as_ref())?,
            min_tokens: usize::try_from(self.min_tokens.unwrap_or(0)).unwrap_or(usize::MAX),
            stop_token_ids: token_ids(
                "stop_token_ids",
                self.stop_token_ids.as_ref(),
                MAX_STOP_TOKEN_IDS,
            )?,
            allowed_token_ids: allowed_token_ids(self.allowed_token_ids.as_ref())?,
            // Tokenized by the route, which holds the tokenizer (see [`bad_words_ids`]).
            bad_words_ids: Vec::new(),
        })
    }
}

/// Field `field`: a list of at most `max` token ids (null: none).
fn token_ids(field: &str, v: Option<&Value>, max: usize) -> Result<Vec<u32>, ApiError> {
    let bad = |m: String| ApiError::bad_param(field, m);
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(bad(format!("{field} is a list of token ids, got {other}")));
        }
    };
    if items.len() > max {
        return Err(bad(format!("at most {max} {field}, got {}", items.len())));
    }
    items
        .iter()
        .map(|i| {
            i.as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| bad(format!("{field} holds {i}, not a token id")))
        })
        .collect()
}

/// Most `bad_words` a request may give (each makes up to two token sequences).
pub const MAX_BAD_WORDS: usize = MAX_BAD_WORD_SEQUENCES / 2;

/// vLLM's `bad_words` as token sequences for the engine: each word without its leading
/// whitespace, and with one space before it when that spells a different first token in as
/// many tokens (vLLM's rule, so " word" inside a sentence is caught too). At most
/// [`MAX_BAD_WORDS`] words, each non-empty and at most [`MAX_BAD_WORD_TOKENS`] tokens.
pub fn bad_words_ids(words: Option<&Value>, tok: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |m: String| ApiError::bad_param("bad_words", m);
    let words = match words {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) if items.len() <= MAX_BAD_WORDS => items,
        Some(Value::Array(items)) => {
            return Err(bad(format!(
                "at most {MAX_BAD_WORDS} bad_words, got {}",
                items.len()
            )));
        }
        Some(other) => return Err(bad(format!("bad_words is a list of strings, got {other}"))),
    };
    let encode = |text: &str| {
        tok.encode(text)
            .map_err(|e| ApiError::internal(format!("tokenizing bad_words: {e}")))
    };
    let mut ids = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let word = match w.as_str().map(str::trim_start) {
            Some(word) if !word.is_empty() => word,
            _ => {
                return Err(bad(format!(
                    "bad_words[{i}] must be a string with something besides whitespace, got {w}"
                )));
            }
        };
        let plain = encode(word)?;
        if plain.len() > MAX_BAD_WORD_TOKENS {
            return Err(bad(format!(
                "bad_words[{i}] is {} tokens; at most {MAX_BAD_WORD_TOKENS} are accepted",
                plain.len()
            )));
        }
        let spaced = encode(&format!(" {word}"))?;
        let distinct = spaced.len() == plain.len() && spaced.first() != plain.first();
        ids.push(plain);
        if distinct {
            ids.push(spaced);
        }
    }
    Ok(ids)
}

/// `allowed_token_ids`: a non-empty list of token ids (null: any token), sorted and without
/// repeats (each is checked against the vocabulary by [`check_fit`]).
fn allowed_token_ids(v: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let mut ids = token_ids("allowed_token_ids", v, usize::MAX)?;
    if ids.is_empty() && matches!(v, Some(Value::Array(_))) {
        return Err(ApiError::bad_param(
            "allowed_token_ids",
            "allowed_token_ids is empty, so no token could be generated; leave it out to allow \
             any",
        ));
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// `logit_bias` as `(token id, bias)` pairs in id order: keys must be token ids (decimal), each
/// named once, values numbers from −100 to 100.
fn logit_bias(map: Option<&serde_json::Map<String, Value>>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::bad_param("logit_bias", m);
    let mut out = Vec::with_capacity(map.map_or(0, serde_json::Map::len));
    for (key, value) in map.into_iter().flatten() {
        let id: u32 = key.parse().map_err(|_| {
            bad(format!(
                "logit_bias keys are token ids (decimal integers as strings), got {key:?}"
            ))
        })?;
        let bias = value
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                bad(format!(
                    "the logit_bias of token {id} must be a number from -100 to 100, got {value}"
                ))
            })?;
        out.push((id, bias as f32));
    }
    out.sort_unstable_by_key(|&(id, _)| id);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(format!(
            "logit_bias names token {} more than once",
            w[0].0
        )));
    }
    Ok(out)
}

/// What depends on the model and the request's length: every `logit_bias` and
/// `stop_token_ids` id must be below `vocab`, and `min_tokens` must not exceed `max_tokens`.
pub fn check_fit(p: &SamplingParams, vocab: usize, max_tokens: usize) -> Result<(), ApiError> {
    if let Some(&(id, _)) = p.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
        return Err(ApiError::bad_param(
            "logit_bias",
            format!(
                "logit_bias names token {id}, outside the model's vocabulary (ids 0 to {})",
                vocab.saturating_sub(1)
            ),
        ));
    }
    for (field, ids) in [
        ("stop_token_ids", &p.stop_token_ids),
        ("allowed_token_ids", &p.allowed_token_ids),
    ] {
        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::bad_param(
                field,
                format!(
                    "{field} names token {id}, outside the model's vocabulary (ids 0 to {})",
                    vocab.saturating_sub(1)
                ),
            ));
        }
    }
    if p.min_tokens > max_tokens {
        return Err(ApiError::bad_param(
            "min_tokens",
            format!(
                "min_tokens ({}) must not exceed max_tokens ({max_tokens}); lower min_tokens or \
                 raise max_tokens",
                p.min_tokens
            ),
        ));
    }
    Ok(())
}

/// The alternatives per prompt token of vLLM's `prompt_logprobs` (None: not asked for),
/// refused with `stream` as vLLM does.
pub fn prompt_logprobs_count(n: Option<u32>, stream: bool) -> Result<Option<usize>, ApiError> {
    let n = n.map(|n| top_count("prompt_logprobs", n)).transpose()?;
    if n.is_some() && stream {
        return Err(ApiError::bad_param(
            "prompt_logprobs",
            "prompt_logprobs is not available with stream: true (as in vLLM); ask without \
             streaming (on /v1/completions, echo with logprobs streams the prompt's entries)",
        ));
    }
    Ok(n)
}

/// Check a count of alternatives per token (`param`: the field it came from), at most
/// [`MAX_TOP_LOGPROBS`].
pub fn top_count(param: &str, n: u32) -> Result<usize, ApiError> {
    match usize::try_from(n) {
        Ok(n) if n <= MAX_TOP_LOGPROBS => Ok(n),
        _ => Err(ApiError::bad_param(
            param,
            format!("{param} must be from 0 to {MAX_TOP_LOGPROBS}, got {n}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> SamplingFields {
        serde_json::from_value(v).unwrap()
    }

    fn param_of(v: Value) -> Option<String> {
        fields(v).to_params(1).err().and_then(|e| e.param)
    }

    #[test]
    fn every_new_field_reaches_the_engine() {
        let p = fields(json!({
            "min_p": 0.1, "presence_penalty": -1.5, "frequency_penalty": 2,
            "repetition_penalty": 1.3, "logit_bias": {"7": 5, "3": -100.0}, "min_tokens": 4
        }))
        .to_params(9)
        .unwrap();
        assert_eq!(p.min_p, 0.1);
        assert_eq!((p.presence_penalty, p.frequency_penalty), (-1.5, 2.0));
        assert_eq!(p.repetition_penalty, 1.3);
        assert_eq!(p.logit_bias, [(3, -100.0), (7, 5.0)]);
        assert_eq!((p.min_tokens, p.seed), (4, 9));
        assert_eq!(
            fields(json!({})).to_params(1).unwrap(),
            SamplingParams {
                temperature: 1.0,
                seed: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        for (v, param) in [
            (json!({"min_p": 1.5}), "min_p"),
            (json!({"presence_penalty": 3}), "presence_penalty"),
            (json!({"frequency_penalty": -2.5}), "frequency_penalty"),
            (json!({"repetition_penalty": 0}), "repetition_penalty"),
            (json!({"repetition_penalty": -1}), "repetition_penalty"),
            (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
            (json!({"logit_bias": {"-1": 1}}), "logit_bias"),
            (json!({"logit_bias": {"5": 200}}), "logit_bias"),
            (json!({"logit_bias": {"5": "high"}}), "logit_bias"),
            (json!({"logit_bias": {"5": 1, "05": 2}}), "logit_bias"),
        ] {
            assert_eq!(param_of(v.clone()).as_deref(), Some(param), "{v}");
        }
        let p = fields(json!({"logit_bias": {"500": 1}, "min_tokens": 9}))
            .to_params(1)
            .unwrap();
        let e = check_fit(&p, 400, 9).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
        assert!(e.message.contains("399"), "{}", e.message);
        let p = fields(json!({"min_tokens": 9})).to_params(1).unwrap();
        assert!(check_fit(&p, 400, 9).is_ok());
        let e = check_fit(&p, 400, 8).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("min_tokens"));
        assert_eq!(top_count("top_logprobs", 20).unwrap(), 20);
        let e = top_count("logprobs", 21).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"));
    }

    /// The tiny byte tokenizer with two merges, as a real BPE vocabulary has them: "ab" and
    /// "Ġab" (" ab") become single tokens 384 and 385; "cd" stays two bytes.
    fn merging_tokenizer() -> Tokenizer {
        let mut doc: Value =
            serde_json::from_str(&dsv4_chat::tokenizer::tiny_tokenizer_json()).unwrap();
        let model = &mut doc["model"];
        model["vocab"]["ab"] = json!(384);
        model["vocab"]["\u{120}ab"] = json!(385);
        model["merges"] = json!(["a b", "\u{120} ab"]);
        Tokenizer::from_json_str(&doc.to_string()).unwrap()
    }

    #[test]
    fn bad_words_add_the_spaced_spelling_only_when_it_is_as_many_tokens_and_differs() {
        let tok = merging_tokenizer();
        let byte = |b: u8| 128 + u32::from(b);
        assert_eq!(
            tok.encode(" ab").unwrap(),
            [385],
            "the merge is not applied"
        );
        // "ab" is one token, " ab" another single token: both are banned (vLLM's rule).
        let ids = bad_words_ids(Some(&json!(["ab"])), &tok).unwrap();
        assert_eq!(ids, [vec![384], vec![385]]);
        // Leading whitespace is dropped before both spellings are formed.
        assert_eq!(bad_words_ids(Some(&json!(["  ab"])), &tok).unwrap(), ids);
        // " cd" is three tokens against two: only the plain spelling.
        let ids = bad_words_ids(Some(&json!(["cd"])), &tok).unwrap();
        assert_eq!(ids, [vec![byte(b'c'), byte(b'd')]]);
        // "abx" and " abx" are as long, and differ in their first token.
        let ids = bad_words_ids(Some(&json!(["abx"])), &tok).unwrap();
        assert_eq!(ids, [vec![384, byte(b'x')], vec![385, byte(b'x')]]);
    }
}

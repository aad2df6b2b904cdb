//! Per-token log-probabilities as each endpoint shows them: chat's `{"content": [{"token",
//! "logprob", "bytes", "top_logprobs"}]}` ([`ChatLogprobs`]) and the legacy completions object
//! `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}` ([`CompletionLogprobs`]);
//! and vLLM's `prompt_logprobs` ([`PromptLogprobs`]).
//! A token's string is its bytes as lossy UTF-8 (a byte token that is part of a character
//! shows as U+FFFD; `bytes` has the exact bytes). Log-probabilities that are not finite are
//! shown as −9999 (JSON has no infinity; vLLM's convention). With vLLM's
//! `return_tokens_as_token_ids`, the `logprobs` views name tokens `token_id:N` instead
//! ([`TokenNames`]).

use crate::run::GeneratedToken;
use crate::vocab::Vocab;
use dsv4_engine::TokenLogprob;
use serde::Serialize as DeriveSerialize;
use serde::ser::{Serialize, SerializeMap, Serializer};

/// What a log-probability that is not finite is shown as.
pub const LOGPROB_FLOOR: f32 = -9999.0;

/// `lp` as JSON can carry it.
pub fn finite(lp: f32) -> f32 {
    if lp.is_finite() { lp } else { LOGPROB_FLOOR }
}

/// The string of token `id`.
pub fn token_string(vocab: &Vocab, id: u32) -> String {
    String::from_utf8_lossy(vocab.bytes(id)).into_owned()
}

/// How the `logprobs` views name a token: by its text, or as `token_id:N` (vLLM's
/// `return_tokens_as_token_ids`: a token that is part of a character then stays identifiable).
#[derive(Clone, Copy)]
pub struct TokenNames<'a> {
    /// Where the tokens' texts and bytes come from.
    pub vocab: &'a Vocab,
    /// Name tokens `token_id:N`.
    pub as_ids: bool,
}

impl<'a> TokenNames<'a> {
    /// Tokens named by their text.
    pub fn text(vocab: &'a Vocab) -> Self {
        Self {
            vocab,
            as_ids: false,
        }
    }

    /// The name of token `id`.
    pub fn name(&self, id: u32) -> String {
        if self.as_ids {
            format!("token_id:{id}")
        } else {
            token_string(self.vocab, id)
        }
    }
}

/// `choices[].logprobs` of a chat answer or stream chunk.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct ChatLogprobs {
    /// One entry per generated token, in order.
    pub content: Vec<ChatTokenLogprob>,
}

/// One generated token of [`ChatLogprobs`].
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct ChatTokenLogprob {
    /// The token's text (lossy UTF-8).
    pub token: String,
    /// ln p(token) under the model's raw logits.
    #[serde(serialize_with = "shortest_f32")]
    pub logprob: f32,
    /// The token's exact bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens, most likely first (`top_logprobs` of them).
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// One alternative of [`ChatTokenLogprob::top_logprobs`].
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct ChatTopLogprob {
    /// The token's text (lossy UTF-8).
    pub token: String,
    /// ln p(token).
    #[serde(serialize_with = "shortest_f32")]
    pub logprob: f32,
    /// The token's exact bytes.
    pub bytes: Vec<u8>,
}

/// Serialize an f32 as the f64 of its shortest decimal form: the same digits whether written
/// straight to JSON text or kept in a `serde_json::Value` first (which widens an f32 to all
/// the digits of its f64 value, -3.5563888549804688 for -3.5563889).
pub fn shortest_f32<S: serde::Serializer>(x: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(f32_as_f64(*x))
}

/// The f64 nearest to `x`'s shortest decimal form (`x` itself when it is not finite).
pub fn f32_as_f64(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

impl ChatTopLogprob {
    fn new(names: TokenNames, id: u32, logprob: f32) -> Self {
        Self {
            token: names.name(id),
            logprob: finite(logprob),
            bytes: names.vocab.bytes(id).to_vec(),
        }
    }
}

impl ChatLogprobs {
    /// The entries of `tokens`.
    pub fn new(names: TokenNames, tokens: &[GeneratedToken]) -> Self {
        let content = tokens
            .iter()
            .map(|t| {
                let lp = ChatTopLogprob::new(names, t.id, t.logprob.logprob);
                ChatTokenLogprob {
                    token: lp.token,
                    logprob: lp.logprob,
                    bytes: lp.bytes,
                    top_logprobs: t
                        .logprob
                        .top
                        .iter()
                        .map(|&(id, l)| ChatTopLogprob::new(names, id, l))
                        .collect(),
                }
            })
            .collect();
        Self { content }
    }
}

/// `choices[].logprobs` of a text completion (OpenAI's legacy format): parallel lists, one
/// item per token of the text (with `echo`, the prompt's tokens first; the sequence's first
/// token has no log-probability: null).
#[derive(Debug, Clone, Default, PartialEq, DeriveSerialize)]
pub struct CompletionLogprobs {
    /// The tokens' texts (lossy UTF-8).
    pub tokens: Vec<String>,
    /// ln p of each token under the model's raw logits.
    pub token_logprobs: Vec<Option<f32>>,
    /// Each token's most likely alternatives, token text → ln p.
    pub top_logprobs: Vec<Option<TopMap>>,
    /// Byte offset of each token's text in the choice's text (UTF-8 bytes from its start).
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// The lists for `tokens`, whose text starts at byte `*offset` of the choice's text;
    /// `*offset` moves past them (streams carry it from chunk to chunk).
    pub fn new(names: TokenNames, tokens: &[GeneratedToken], offset: &mut usize) -> Self {
        let mut out = Self::default();
        for t in tokens {
            out.push(names, t.id, t.text_len, Some(&t.logprob), offset);
        }
        out
    }

    /// Append token `id`, whose text is `text_len` bytes at `*offset`, with its
    /// log-probability (None: the sequence's first token, which has none).
    pub fn push(
        &mut self,
        names: TokenNames,
        id: u32,
        text_len: usize,
        logprob: Option<&TokenLogprob>,
        offset: &mut usize,
    ) {
        self.tokens.push(names.name(id));
        self.token_logprobs.push(logprob.map(|l| finite(l.logprob)));
        self.top_logprobs.push(logprob.map(|l| {
            TopMap(
                l.top
                    .iter()
                    .map(|&(id, l)| (names.name(id), finite(l)))
                    .collect(),
            )
        }));
        self.text_offset.push(*offset);
        *offset += text_len;
    }

    /// Append `other`'s lists after these.
    pub fn extend(&mut self, other: Self) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}

/// Alternatives as a JSON object, token text → ln p, most likely first; of two tokens with
/// the same text (e.g. two partial characters, both U+FFFD) only the more likely is kept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopMap(pub Vec<(String, f32)>);

impl Serialize for TopMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seen = std::collections::HashSet::new();
        let kept: Vec<&(String, f32)> = self.0.iter().filter(|(k, _)| seen.insert(k)).collect();
        let mut map = s.serialize_map(Some(kept.len()))?;
        for (k, v) in kept {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// vLLM's `prompt_logprobs`: one item per prompt token, null for the first (nothing comes
/// before it), else a map from token id (a decimal string) to [`PromptTokenLogprob`]: the
/// prompt's token first, then the most likely tokens (those not already shown).
pub type PromptLogprobs = Vec<Option<IdMap>>;

/// One entry of a [`PromptLogprobs`] map.
#[derive(Debug, Clone, PartialEq, DeriveSerialize)]
pub struct PromptTokenLogprob {
    /// ln p(token) under the model's raw logits.
    pub logprob: f32,
    /// Its place among all tokens, most likely first (1: the most likely; ties: lower id).
    pub rank: u32,
    /// Its text (lossy UTF-8).
    pub decoded_token: String,
}

/// Token id → entry, serialized as a JSON object in this order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdMap(pub Vec<(u32, PromptTokenLogprob)>);

impl Serialize for IdMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (id, e) in &self.0 {
            map.serialize_entry(&id.to_string(), e)?;
        }
        map.end()
    }
}

/// The [`PromptLogprobs`] of `prompt` from the engine's entries (entry `k` scores prompt token
/// `k + 1`), with `top` alternatives each (the entries may hold more).
pub fn prompt_logprobs(
    vocab: &Vocab,
    prompt: &[u32],
    entries: &[TokenLogprob],
    top: usize,
) -> PromptLogprobs {
    let entry = |id: u32, logprob: f32, rank: u32| PromptTokenLogprob {
        logprob: finite(logprob),
        rank,
        decoded_token: token_string(vocab, id),
    };
    std::iter::once(None)
        .chain(prompt.iter().skip(1).zip(entries).map(|(&id, e)| {
            let mut map = vec![(id, entry(id, e.logprob, e.rank))];
            for (k, &(alt, lp)) in e.top.iter().take(top).enumerate() {
                if alt != id {
                    map.push((alt, entry(alt, lp, k as u32 + 1)));
                }
            }
            Some(IdMap(map))
        }))
        .collect()
}

/// `entries` with at most `top` alternatives each (a request that asked the engine for more
/// for another of its views).
pub fn truncated(entries: &[TokenLogprob], top: usize) -> Vec<TokenLogprob> {
    entries
        .iter()
        .map(|e| TokenLogprob {
            top: e.top.iter().take(top).copied().collect(),
            ..e.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vocab() -> Vocab {
        Vocab::new(&dsv4_chat::Tokenizer::tiny().unwrap(), 400).unwrap()
    }

    fn byte(b: u8) -> u32 {
        128 + u32::from(b)
    }

    fn token(id: u32, logprob: f32, top: Vec<(u32, f32)>) -> GeneratedToken {
        GeneratedToken {
            id,
            text_len: 1,
            logprob: TokenLogprob {
                logprob,
                top,
                rank: 1,
                asked: Vec::new(),
            },
        }
    }

    #[test]
    fn chat_entries_carry_text_bytes_and_alternatives() {
        let v = vocab();
        let tokens = [
            token(
                byte(b'A'),
                -0.25,
                vec![(byte(b'A'), -0.25), (byte(0xC3), -2.0)],
            ),
            token(byte(b'b'), f32::NEG_INFINITY, vec![]),
        ];
        let body = serde_json::to_value(ChatLogprobs::new(TokenNames::text(&v), &tokens)).unwrap();
        assert_eq!(
            body,
            json!({"content": [
                {"token": "A", "logprob": -0.25, "bytes": [65], "top_logprobs": [
                    {"token": "A", "logprob": -0.25, "bytes": [65]},
                    {"token": "\u{FFFD}", "logprob": -2.0, "bytes": [0xC3]}]},
                {"token": "b", "logprob": -9999.0, "bytes": [98], "top_logprobs": []}
            ]})
        );
    }

    #[test]
    fn completion_lists_are_parallel_with_running_offsets() {
        let v = vocab();
        let mut t2 = token(
            byte(0xC3),
            -1.0,
            vec![(byte(0xC3), -1.0), (byte(0xE2), -1.5)],
        );
        t2.text_len = 1;
        let tokens = [
            token(
                byte(b'h'),
                -0.5,
                vec![(byte(b'h'), -0.5), (byte(b'i'), -3.0)],
            ),
            t2,
            token(byte(0xA9), -0.1, vec![]),
        ];
        let mut offset = 4;
        let names = TokenNames::text(&v);
        let lp = CompletionLogprobs::new(names, &tokens[..2], &mut offset);
        assert_eq!(offset, 6);
        let rest = CompletionLogprobs::new(names, &tokens[2..], &mut offset);
        assert_eq!((lp.text_offset, rest.text_offset), (vec![4, 5], vec![6]));
        assert_eq!(
            serde_json::to_value(&lp.top_logprobs).unwrap(),
            json!([{"h": -0.5, "i": -3.0}, {"\u{FFFD}": -1.0}]),
            "the second U+FFFD alternative is dropped"
        );
        assert_eq!(lp.tokens, ["h", "\u{FFFD}"]);
        assert_eq!(rest.token_logprobs, [Some(-0.1)]);
        // Named by id, both partial characters are kept and told apart.
        let ids = TokenNames {
            vocab: &v,
            as_ids: true,
        };
        let lp = CompletionLogprobs::new(ids, &tokens[..2], &mut 0);
        assert_eq!(
            lp.tokens,
            [
                format!("token_id:{}", byte(b'h')),
                format!("token_id:{}", byte(0xC3))
            ]
        );
        assert_eq!(
            serde_json::to_value(&lp.top_logprobs[1]).unwrap(),
            json!({(format!("token_id:{}", byte(0xC3))): -1.0, (format!("token_id:{}", byte(0xE2))): -1.5})
        );
        let chat = serde_json::to_value(ChatLogprobs::new(ids, &tokens[1..2])).unwrap();
        assert_eq!(
            chat["content"][0]["token"],
            format!("token_id:{}", byte(0xC3))
        );
        assert_eq!(
            chat["content"][0]["bytes"],
            json!([0xC3]),
            "bytes stay the token's"
        );
    }
}

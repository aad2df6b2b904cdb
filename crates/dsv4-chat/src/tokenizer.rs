//! The tokenizer: a Hugging Face `tokenizers` tokenizer loaded from tokenizer.json, plus the
//! embedded byte-level tokenizer of the tiny model (ids 0..128 special tokens, 128 + b byte b).
//!
//! The tiny tokenizer.json is a BPE model whose vocabulary is the 128 special tokens and the
//! 256 GPT-2 byte characters, with no merges: every byte is one token, so encode/decode round
//! trips are exact for any text. Special-token text inside the input encodes to its single id.

use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;

use serde_json::{Map, Value, json};

use crate::ChatError;
use crate::markers::{self, TINY_SPECIAL_COUNT};

#[cfg(test)]
mod tests;

/// The character GPT-2's byte-level encoding uses for byte `b` (`bytes_to_unicode`): printable
/// Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in byte order.
fn byte_char(b: u8) -> char {
    let printable = |x: u8| matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    // rank < 256, so 256 + rank is a valid scalar value below the surrogate range.
    char::from_u32(256 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The tiny model's tokenizer.json (vocab 384: 128 special tokens, then the 256 bytes).
pub fn tiny_tokenizer_json() -> String {
    let specials = markers::tiny_special_tokens();
    let mut vocab = Map::new();
    for (id, s) in specials.iter().enumerate() {
        vocab.insert(s.clone(), json!(id));
    }
    for b in 0..=255u8 {
        vocab.insert(
            byte_char(b).to_string(),
            json!(TINY_SPECIAL_COUNT + u32::from(b)),
        );
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(id, s)| {
            json!({
                "id": id, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true
            })
        })
        .collect();
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false
    });
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []
        }
    });
    format!("{doc:#}")
}

/// A loaded tokenizer with the DSV4 BOS and EOS ids resolved.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: u32,
    eos: u32,
    vocab_size: usize,
    special: HashSet<u32>,
}

impl Tokenizer {
    /// Loads a tokenizer.json file (e.g. a checkpoint's).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ChatError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ChatError::ReadTokenizer {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses tokenizer.json text.
    pub fn from_json_str(json: &str) -> Result<Self, ChatError> {
        Self::parse(json, "string")
    }

    /// The embedded byte-level tokenizer of the tiny model.
    pub fn tiny() -> Result<Self, ChatError> {
        Self::parse(&tiny_tokenizer_json(), "embedded tiny tokenizer")
    }

    fn parse(json: &str, origin: &str) -> Result<Self, ChatError> {
        let inner =
            tokenizers::Tokenizer::from_str(json).map_err(|e| ChatError::InvalidTokenizer {
                origin: origin.to_owned(),
                reason: e.to_string(),
            })?;
        let id = |token: &'static str| {
            inner
                .token_to_id(token)
                .ok_or_else(|| ChatError::MissingSpecialToken {
                    origin: origin.to_owned(),
                    token,
                })
        };
        let special = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter_map(|(id, t)| t.special.then_some(id))
            .collect();
        Ok(Self {
            bos: id(markers::BOS)?,
            eos: id(markers::EOS)?,
            vocab_size: inner.get_vocab_size(true),
            special,
            inner,
        })
    }

    /// Token ids of `text` (no BOS is added; special-token text maps to its single id).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ChatError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens included as text; byte sequences that are not valid
    /// UTF-8 decode with U+FFFD replacement characters. Ids outside the vocabulary are an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ChatError> {
        if let Some(&id) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(ChatError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size,
            });
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| ChatError::Decode(e.to_string()))
    }

    /// Number of distinct tokens, added tokens included (384 for the tiny tokenizer).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of a token given by its exact text (a special marker or a vocabulary entry).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary text of token `id`.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special (added, `special: true`) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// The id of [`markers::BOS`].
    pub fn bos_id(&self) -> u32 {
        self.bos
    }

    /// The id of [`markers::EOS`].
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// The wrapped `tokenizers` tokenizer (for streaming decode or constrained decoding).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

//! The model's vocabulary as bytes: what each token id writes into the completion (for
//! streaming text out token by token), and the same table as an llguidance token trie (for
//! grammar-constrained decoding over the tokenizer's vocabulary).
//!
//! Token bytes come from the tokenizer's own tokenizer.json via
//! `llguidance::token_bytes_from_tokenizer_json` (byte-level BPE and byte-fallback
//! vocabularies). Special tokens are their text; in the trie they carry llguidance's special
//! marker byte, so grammar text never matches them and grammars name them by id (`<[ID]>`).
//! Ids the model has beyond the tokenizer are inert special placeholders.

use crate::error::ServerError;
use dsv4_chat::Tokenizer;
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// Token id → bytes, for the whole model vocabulary.
#[derive(Debug)]
pub struct Vocab {
    /// Bytes of each id as written into the text (special tokens: their text).
    text: Vec<Vec<u8>>,
    /// Bytes of each id as the trie sees them (special tokens: marker byte + text).
    trie_bytes: Vec<Vec<u8>>,
    eos: u32,
}

impl Vocab {
    /// The table for `tok`, padded to `model_vocab` ids (the model may have more rows than
    /// the tokenizer has tokens; never fewer).
    pub fn new(tok: &Tokenizer, model_vocab: usize) -> Result<Self, ServerError> {
        let json = serde_json::to_value(tok.inner())
            .map_err(|e| ServerError::Vocab(format!("cannot serialize the tokenizer: {e}")))?;
        let mut trie_bytes = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| ServerError::Vocab(e.to_string()))?;
        if trie_bytes.len() > model_vocab {
            return Err(ServerError::Vocab(format!(
                "the tokenizer has {} tokens but the model only {model_vocab} logits; use the \
                 checkpoint's own tokenizer.json",
                trie_bytes.len()
            )));
        }
        for (id, bytes) in trie_bytes.iter_mut().enumerate() {
            if bytes.is_empty() {
                *bytes = placeholder(id);
            }
        }
        while trie_bytes.len() < model_vocab {
            trie_bytes.push(placeholder(trie_bytes.len()));
        }
        let text = trie_bytes
            .iter()
            .map(|b| match b.split_first() {
                Some((&TokTrie::SPECIAL_TOKEN_MARKER, rest)) => rest.to_vec(),
                _ => b.clone(),
            })
            .collect();
        Ok(Self {
            text,
            trie_bytes,
            eos: tok.eos_id(),
        })
    }

    /// The bytes token `id` adds to the completion (empty for ids outside the vocabulary).
    pub fn bytes(&self, id: u32) -> &[u8] {
        self.text.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// Number of ids (the model's vocabulary size).
    pub fn len(&self) -> usize {
        self.text.len()
    }

    /// Whether the table is empty (never, for a loaded model).
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The llguidance tokenizer environment over this vocabulary.
    pub fn tok_env(&self, tok: Tokenizer) -> TokEnv {
        let info = TokRxInfo::new(self.trie_bytes.len() as u32, self.eos);
        Arc::new(Env {
            trie: TokTrie::from(&info, &self.trie_bytes),
            tok,
        })
    }
}

/// The trie entry of an id with no token of its own: an inert special token.
fn placeholder(id: usize) -> Vec<u8> {
    let mut b = format!(".<[{id}]>").into_bytes();
    b[0] = TokTrie::SPECIAL_TOKEN_MARKER;
    b
}

/// llguidance's view of the tokenizer: the trie, and tokenization through the real tokenizer.
struct Env {
    trie: TokTrie,
    tok: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Text (bytes the grammar forces) as tokens whose trie bytes spell it. The tokenizer
    /// turns the text of a special token (`</think>` in a regex or a JSON enum) into that
    /// token, whose trie bytes carry the special marker: llguidance would then allow a token
    /// the grammar cannot take, and fail when it comes. Such a token is spelled with
    /// ordinary tokens instead (the trie's greedy split).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            // The tokenizer only fails on internal errors; the trie's greedy split is a valid
            // (if not canonical) tokenization.
            let Ok(ids) = self.tok.encode(text) else {
                return self.trie.greedy_tokenize(text.as_bytes());
            };
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if self.trie.is_special_token(id) {
                    out.extend(self.trie.greedy_tokenize(&self.trie.token(id)[1..]));
                } else {
                    out.push(id);
                }
            }
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_chat::markers;

    #[test]
    fn tiny_vocabulary_bytes_and_specials() {
        let tok = Tokenizer::tiny().unwrap();
        let v = Vocab::new(&tok, 400).unwrap();
        assert_eq!(v.len(), 400);
        assert_eq!(v.bytes(128 + u32::from(b'A')), b"A");
        assert_eq!(v.bytes(128 + 0xE2), &[0xE2]);
        let block = tok.token_id(markers::TOOL_CALLS_START).unwrap();
        assert_eq!(v.bytes(block), markers::TOOL_CALLS_START.as_bytes());
        assert_eq!(v.bytes(390), b"<[390]>", "padding ids are placeholders");
        let env = v.tok_env(tok.clone());
        assert!(env.tok_trie().is_special_token(block));
        assert!(!env.tok_trie().is_special_token(128 + u32::from(b'A')));
        assert_eq!(env.tokenize_bytes(b"hi"), tok.encode("hi").unwrap());
        // Special tokens' text is spelled with ordinary tokens, so that the tokens spell it.
        let text = format!("a{}b{}", markers::THINK_END, markers::TOOL_CALLS_START);
        assert!(
            tok.encode(&text).unwrap().contains(&block),
            "the tokenizer finds the marker"
        );
        let ids = env.tokenize_bytes(text.as_bytes());
        assert!(
            ids.iter().all(|&id| !env.tok_trie().is_special_token(id)),
            "{ids:?}"
        );
        let spelled: Vec<u8> = ids.iter().flat_map(|&id| v.bytes(id).to_vec()).collect();
        assert_eq!(spelled, text.as_bytes());
        assert!(Vocab::new(&tok, 100).is_err(), "fewer logits than tokens");
    }
}

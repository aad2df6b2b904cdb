//! What a request is checked against before it is queued: the model's vocabulary and context,
//! sampling options, stop strings, and whether the pools could hold it even alone.

use crate::error::EngineError;
use crate::pool::PoolKind;
use crate::pools::{CacheGeometry, PoolPages};
use crate::request::{MAX_LOGPROB_TOKEN_IDS, MAX_TOP_LOGPROBS, Request};
use crate::sampling;

/// What a request is checked against before it is queued.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The model's vocabulary size.
    pub vocab: usize,
    /// The model's context limit.
    pub max_position: usize,
    /// Cache geometry.
    pub geometry: CacheGeometry,
    /// Pages of each pool.
    pub capacity: PoolPages,
    /// Whether stop strings can be checked (a detokenizer was given).
    pub has_detokenizer: bool,
}

impl Limits {
    /// Refuse a request the engine could never finish, saying why.
    pub fn check(&self, req: &Request) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::BadRequest(m));
        if req.prompt.is_empty() {
            return bad("the prompt is empty; give at least one token (e.g. BOS)".into());
        }
        if let Some((i, t)) = req
            .prompt
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= self.vocab)
        {
            return bad(format!(
                "prompt token {t} at index {i} is outside the vocabulary (size {})",
                self.vocab
            ));
        }
        let total = req.prompt.len().saturating_add(req.max_tokens);
        if total > self.max_position {
            return bad(format!(
                "prompt ({}) + max_tokens ({}) = {total} exceeds the model's context of {} \
                 tokens; shorten the prompt or lower max_tokens",
                req.prompt.len(),
                req.max_tokens,
                self.max_position
            ));
        }
        sampling::validate(&req.sampling).map_err(EngineError::BadRequest)?;
        let sp = &req.sampling;
        let biased: Vec<u32> = sp.logit_bias.iter().map(|&(t, _)| t).collect();
        let bad_words: Vec<u32> = sp.bad_words_ids.iter().flatten().copied().collect();
        for (field, ids) in [
            ("logit_bias", &biased[..]),
            ("stop_token_ids", &sp.stop_token_ids[..]),
            ("allowed_token_ids", &sp.allowed_token_ids[..]),
            ("bad_words_ids", &bad_words[..]),
            ("logprob_token_ids", &req.logprob_token_ids[..]),
        ] {
            if let Some(t) = ids.iter().find(|&&t| t as usize >= self.vocab) {
                return bad(format!(
                    "{field} names token {t}, outside the vocabulary (size {})",
                    self.vocab
                ));
            }
        }
        if req.sampling.min_tokens > req.max_tokens {
            return bad(format!(
                "min_tokens ({}) must not exceed max_tokens ({})",
                req.sampling.min_tokens, req.max_tokens
            ));
        }
        for (field, asked) in [
            ("logprobs", req.logprobs),
            ("prompt_logprobs", req.prompt_logprobs),
        ] {
            if let Some(n) = asked.filter(|&n| n > MAX_TOP_LOGPROBS) {
                return bad(format!(
                    "at most {MAX_TOP_LOGPROBS} alternatives per token can be returned with \
                     {field}, {n} were asked for"
                ));
            }
        }
        let ids = &req.logprob_token_ids;
        if !ids.is_empty() && req.logprobs.is_none() && req.prompt_logprobs.is_none() {
            return bad("logprob_token_ids needs logprobs or prompt_logprobs".into());
        }
        if ids.len() > MAX_LOGPROB_TOKEN_IDS {
            return bad(format!(
                "at most {MAX_LOGPROB_TOKEN_IDS} logprob_token_ids can be asked for, {} were",
                ids.len()
            ));
        }
        if req.stop.iter().any(String::is_empty) {
            return bad("stop strings must not be empty".into());
        }
        if !req.stop.is_empty() && !self.has_detokenizer {
            return bad("stop strings need an engine started with a tokenizer".into());
        }
        let need = self.geometry.pages_for_len(total);
        if let Some(k) = PoolKind::ALL
            .into_iter()
            .find(|k| need[k.index()] > self.capacity[k.index()])
        {
            return Err(EngineError::TooLarge {
                tokens: total,
                pool: k.name(),
                needed: need[k.index()],
                capacity: self.capacity[k.index()],
            });
        }
        Ok(())
    }
}

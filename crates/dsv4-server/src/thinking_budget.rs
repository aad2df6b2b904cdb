//! Thinking budgets: a token constraint that ends a thinking-mode answer's reasoning after a
//! budget of tokens by forcing `</think>` (vLLM's `thinking_token_budget` on chat, Anthropic's
//! `thinking.budget_tokens` on `/v1/messages`). The answer then goes on as content (or tool
//! calls) within `max_tokens`, which the reasoning counts toward.
//!
//! The engine runs one constraint a request, so the budget wraps the request's grammar, if it
//! has one: the grammar masks first, and the budget forces `</think>` only where the grammar
//! allows it. Reasoning tokens are counted until the reasoning closes, by the model (the
//! text `</think>` at the end of what it wrote) or by the budget. The forced end waits for a
//! UTF-8 character to be complete (a byte-level vocabulary can split one over several tokens),
//! for at most [`GRACE`] tokens, so the reasoning never ends in a broken character.
//! [`ReasoningCount`] counts an answer's reasoning tokens the same way, for usage's
//! `reasoning_tokens` (chat and the Responses API).
//! Prior art, read and not copied: vLLM's `ThinkingBudgetStateHolder`, SGLang's thinking budget
//! logit processor and llama.cpp's reasoning-budget sampler force the end tokens the same way.

use crate::error::{ApiError, ServerError};
use crate::vocab::Vocab;
use dsv4_chat::{Tokenizer, markers};
use dsv4_engine::{Constraint, ConstraintState, TokenConstraint};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tokens the forced end may wait, past the budget, for a character to be complete.
pub const GRACE: usize = 8;

/// What budgets need of the served model: the tokens `</think>` is written with and each
/// token's bytes (built once when the model loads).
#[derive(Debug)]
pub struct ThinkEnd {
    /// `</think>`: its special token, or its text's tokens where it is not one.
    tokens: Vec<u32>,
    /// `<think>`, the same way: a raw prompt that ends with it opens the reasoning.
    start: Vec<u32>,
    vocab: Arc<Vocab>,
    /// Answers whose reasoning a budget ended (`dsv4:thinking_budget_cuts_total`).
    cuts: AtomicU64,
}

impl ThinkEnd {
    /// The end of reasoning in `tok`'s vocabulary, whose bytes `vocab` holds.
    pub fn new(tok: &Tokenizer, vocab: Arc<Vocab>) -> Result<Self, ServerError> {
        let marker = |text: &str| {
            let tokens = match tok.token_id(text) {
                Some(id) => vec![id],
                None => tok
                    .encode(text)
                    .map_err(|e| ServerError::Vocab(format!("cannot tokenize {text}: {e}")))?,
            };
            if tokens.is_empty() || tokens.iter().any(|&t| t as usize >= vocab.len()) {
                return Err(ServerError::Vocab(format!(
                    "{text} tokenizes to {tokens:?}, outside the model's {} ids",
                    vocab.len()
                )));
            }
            Ok(tokens)
        };
        Ok(Self {
            tokens: marker(markers::THINK_END)?,
            start: marker(markers::THINK_START)?,
            vocab,
            cuts: AtomicU64::new(0),
        })
    }

    /// Answers whose reasoning a budget ended, since the model loaded.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }

    /// The tokens the forced end is written with.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether a raw prompt (text completions, `/generate`) leaves its answer in reasoning: it
    /// ends with `<think>`, as a thinking-mode DSV4 prompt does.
    pub fn opens(&self, prompt: &[u32]) -> bool {
        prompt.ends_with(&self.start)
    }

    /// A counter of an answer's reasoning tokens; `thinking`: the answer starts in reasoning
    /// (else it counts none).
    pub fn counter(self: &Arc<Self>, thinking: bool) -> ReasoningCount {
        ReasoningCount {
            end: thinking.then(|| Arc::clone(self)),
            seen: 0,
            matched: 0,
            closed_at: None,
        }
    }

    /// The constraint of a request whose answer starts in reasoning (`thinking`) when it has a
    /// `budget`: `inner` (its grammar, if any) with the budget; else `inner` as it was.
    pub fn budgeted(
        self: &Arc<Self>,
        thinking: bool,
        budget: Option<u64>,
        inner: Option<Constraint>,
    ) -> Option<Constraint> {
        match budget {
            Some(b) if thinking => {
                Some(self.constraint(usize::try_from(b).unwrap_or(usize::MAX), inner))
            }
            _ => inner,
        }
    }

    /// A request's constraint: at most `budget` reasoning tokens, then `</think>`, within
    /// `inner` (the request's grammar, if any).
    pub fn constraint(self: &Arc<Self>, budget: usize, inner: Option<Constraint>) -> Constraint {
        Constraint::new(Budget {
            budget,
            end: Arc::clone(self),
            inner,
        })
    }
}

/// The thinking budget a request runs under: its own (`asked`, from the field `field`), else
/// the server's (`server.thinking_token_budget`); none unless the answer starts in reasoning
/// (`thinking`). Beam search follows no budget: one it asks for is a 400 naming `field`, and
/// the server's does not apply to it.
pub fn request_budget(
    (asked, field): (Option<u64>, &str),
    server: Option<u64>,
    thinking: bool,
    beam: bool,
) -> Result<Option<u64>, ApiError> {
    if !thinking {
        return Ok(None);
    }
    match asked {
        Some(_) if beam => Err(ApiError::bad_param(
            field,
            format!(
                "beam search cannot end the reasoning at a budget; leave out {field} or \
                 use_beam_search"
            ),
        )),
        Some(b) => Ok(Some(b)),
        None if beam => Ok(None),
        None => Ok(server),
    }
}

/// Counts one answer's reasoning tokens (usage's `reasoning_tokens`): those up to and
/// including the end of its reasoning, or all of them while it has not ended.
#[derive(Debug, Clone)]
pub struct ReasoningCount {
    /// The end of reasoning, in thinking mode.
    end: Option<Arc<ThinkEnd>>,
    /// Tokens seen.
    seen: usize,
    /// Of the end's tokens, how many the last tokens matched.
    matched: usize,
    /// Tokens up to and including the end, once it came.
    closed_at: Option<usize>,
}

impl ReasoningCount {
    /// Count the answer's next tokens.
    pub fn push(&mut self, ids: &[u32]) {
        let Some(end) = &self.end else { return };
        for &id in ids {
            self.seen += 1;
            if self.closed_at.is_some() {
                continue;
            }
            let tokens = end.tokens();
            self.matched = if id == tokens[self.matched] {
                self.matched + 1
            } else {
                usize::from(id == tokens[0])
            };
            if self.matched == tokens.len() {
                self.closed_at = Some(self.seen);
            }
        }
    }

    /// The reasoning tokens of an answer of `completion_tokens` (None in chat mode).
    pub fn tokens(&self, completion_tokens: usize) -> Option<usize> {
        self.end.as_ref()?;
        Some(
            self.closed_at
                .unwrap_or(completion_tokens)
                .min(completion_tokens),
        )
    }
}

/// The reasoning tokens of an answer's choices together, each given with its generated
/// tokens (None in chat mode).
pub fn reasoning_total<'a>(
    choices: impl IntoIterator<Item = (&'a ReasoningCount, usize)>,
) -> Option<usize> {
    choices
        .into_iter()
        .map(|(count, completion)| count.tokens(completion))
        .reduce(|a, b| Some(a? + b?))
        .flatten()
}

/// The shared part of a budgeted request's constraint.
struct Budget {
    budget: usize,
    end: Arc<ThinkEnd>,
    inner: Option<Constraint>,
}

impl TokenConstraint for Budget {
    fn start(&self) -> Box<dyn ConstraintState> {
        Box::new(BudgetState {
            budget: self.budget,
            end: Arc::clone(&self.end),
            inner: self.inner.as_ref().map(|c| c.0.start()),
            used: 0,
            owed: 0,
            tail: Vec::new(),
            forced: None,
            open: true,
        })
    }
}

/// One request's count of its reasoning.
struct BudgetState {
    budget: usize,
    end: Arc<ThinkEnd>,
    inner: Option<Box<dyn ConstraintState>>,
    /// Reasoning tokens so far (the forced end's not counted).
    used: usize,
    /// Continuation bytes the last character of the reasoning still needs.
    owed: u8,
    /// The reasoning's last bytes, to see the model write `</think>` itself.
    tail: Vec<u8>,
    /// While the end is being forced: how many of its tokens came.
    forced: Option<usize>,
    /// The reasoning has not ended.
    open: bool,
}

impl BudgetState {
    /// Whether the next token must be the end's next one.
    fn must_end(&self) -> bool {
        self.forced.is_some()
            || (self.used >= self.budget
                && (self.owed == 0 || self.used >= self.budget.saturating_add(GRACE)))
    }

    /// Count a reasoning token: its bytes, and whether they close the reasoning.
    fn count(&mut self, token: u32) {
        self.used += 1;
        let bytes = self.end.vocab.bytes(token);
        for &b in bytes {
            self.owed = match b {
                0x80..=0xBF => self.owed.saturating_sub(1),
                0xC0..=0xDF => 1,
                0xE0..=0xEF => 2,
                0xF0..=0xF7 => 3,
                _ => 0,
            };
        }
        let end = markers::THINK_END.as_bytes();
        self.tail.extend_from_slice(bytes);
        if self.tail.ends_with(end) {
            self.open = false;
        }
        let keep = end.len() - 1;
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
    }
}

impl ConstraintState for BudgetState {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        if let Some(inner) = self.inner.as_deref_mut() {
            inner.mask(logits)?;
        }
        if !self.open || !self.must_end() {
            return Ok(());
        }
        let at = self.forced.unwrap_or(0);
        let token = self.end.tokens[at] as usize;
        let Some(&logit) = logits.get(token) else {
            return Err(format!(
                "the logits row has {} entries, too few for token {token}",
                logits.len()
            ));
        };
        if logit == f32::NEG_INFINITY {
            if self.forced.is_none() {
                // The grammar does not take `</think>` here yet: one more reasoning token.
                return Ok(());
            }
            return Err(format!(
                "the grammar refuses the end of the reasoning ({}) after the thinking budget",
                markers::THINK_END
            ));
        }
        logits.fill(f32::NEG_INFINITY);
        logits[token] = logit;
        if self.forced.is_none() {
            self.end.cuts.fetch_add(1, Ordering::Relaxed);
        }
        self.forced = Some(at);
        Ok(())
    }

    fn advance(&mut self, token: u32) -> Result<(), String> {
        if let Some(inner) = self.inner.as_deref_mut() {
            inner.advance(token)?;
        }
        if !self.open {
            return Ok(());
        }
        match self.forced {
            Some(at) => {
                if token != self.end.tokens[at] {
                    return Err(format!(
                        "token {token} came where the thinking budget forced {}",
                        self.end.tokens[at]
                    ));
                }
                if at + 1 == self.end.tokens.len() {
                    self.open = false;
                    self.forced = None;
                } else {
                    self.forced = Some(at + 1);
                }
            }
            None => self.count(token),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

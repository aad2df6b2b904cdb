//! One request inside the engine: its tokens (prompt, then generated), its pooled cache state
//! (absent while queued or after preemption), its sampling state, its event channel, stop
//! conditions and timing.

use crate::request::{
    Event, FinishReason, Finished, Request, RequestId, Timing, TokenEvent, Usage,
};
use crate::sampler::SamplerState;
use crate::sampling;
use dsv4_model::SequenceState;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Turns token ids into text (for stop strings and the final text).
pub trait Detokenizer: Send + Sync {
    /// The text of `ids`.
    fn decode(&self, ids: &[u32]) -> String;
}

impl<F: Fn(&[u32]) -> String + Send + Sync> Detokenizer for F {
    fn decode(&self, ids: &[u32]) -> String {
        self(ids)
    }
}

/// Characters decoded beyond the longest stop string when only the end of the text is
/// decoded: room for a character split at the window's first token (up to three bytes, each
/// a U+FFFD on its own) and for a decoder that trims the first token's leading space.
const STOP_WINDOW_MARGIN: usize = 4;

/// Whether the text of `generated` contains one of `stops` (none empty), decoding only its
/// end. Called after every token, so an occurrence that ended earlier has already ended the
/// request: a new one ends in the last token's text (or at a character that token completes),
/// so it starts at most `longest` characters before that token's text. The window of tokens
/// grows (doubling) until the text before its last token has that many characters plus the
/// margin, and the margin's characters at its start are not searched. A token then costs
/// about the longest stop string, not the whole completion (decoding all of it after every
/// token made long completions with stop strings quadratic on the step loop).
pub(crate) fn stop_in_tail(generated: &[u32], stops: &[String], d: &dyn Detokenizer) -> bool {
    let n = generated.len();
    let longest = stops.iter().map(|s| s.chars().count()).max().unwrap_or(0);
    let before = longest + STOP_WINDOW_MARGIN;
    let mut k = (before + 1).min(n);
    loop {
        if k == n {
            let text = d.decode(generated);
            return stops.iter().any(|s| text.contains(s.as_str()));
        }
        let window = &generated[n - k..];
        if d.decode(&window[..k - 1]).chars().count() >= before {
            let text = d.decode(window);
            let skip = text
                .char_indices()
                .nth(STOP_WINDOW_MARGIN)
                .map_or(text.len(), |(i, _)| i);
            return stops.iter().any(|s| text[skip..].contains(s.as_str()));
        }
        k = (k * 2).min(n);
    }
}

/// A request the engine holds, queued or running.
pub(crate) struct Seq {
    pub id: RequestId,
    pub req: Request,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// The cache state (None while queued, or after preemption).
    pub state: Option<SequenceState>,
    /// Random stream, token constraint and token counts (away on the overlap scheduler's
    /// device thread while a step that samples this request runs).
    pub sampler: SamplerState,
    pub tx: UnboundedSender<Event>,
    pub submitted: Instant,
    pub admitted: Option<Instant>,
    pub first_token: Option<Instant>,
    /// Prompt tokens reused from the prefix cache at the first admission.
    pub cached_tokens: Option<usize>,
    pub preemptions: usize,
    /// Order of the latest admission (the latest admitted is preempted first).
    pub admit_order: u64,
}

/// What happened after a token was appended.
pub(crate) enum AfterToken {
    Continue,
    Finish(FinishReason),
    /// The token constraint failed (the message says why).
    Fail(String),
}

impl Seq {
    /// A queued request.
    pub fn new(id: RequestId, req: Request, tx: UnboundedSender<Event>) -> Self {
        let sampler = SamplerState::new(&req);
        Self {
            id,
            tokens: req.prompt.clone(),
            prompt_len: req.prompt.len(),
            req,
            state: None,
            sampler,
            tx,
            submitted: Instant::now(),
            admitted: None,
            first_token: None,
            cached_tokens: None,
            preemptions: 0,
            admit_order: 0,
        }
    }

    /// Tokens already in the cache state.
    pub fn fed(&self) -> usize {
        self.state.as_ref().map_or(0, |s| s.pos)
    }

    /// Generated tokens so far.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Choose the next token from `row`, send it, and check the stop conditions.
    pub fn take_token(
        &mut self,
        row: &[f32],
        eos: u32,
        detok: Option<&Arc<dyn Detokenizer>>,
    ) -> AfterToken {
        let chosen = self
            .sampler
            .choose(row, &self.req.sampling, (eos, self.req.ignore_eos));
        match chosen {
            Ok(tok) => self.accept_token(tok, row, eos, detok),
            Err(message) => AfterToken::Fail(message),
        }
    }

    /// Record a token chosen by [`SamplerState::choose`] from `row`: end on end-of-sequence,
    /// else append it, send it (with its log-probability when asked), and check the stop
    /// strings and the length limit.
    pub fn accept_token(
        &mut self,
        tok: u32,
        row: &[f32],
        eos: u32,
        detok: Option<&Arc<dyn Detokenizer>>,
    ) -> AfterToken {
        self.first_token.get_or_insert_with(Instant::now);
        if tok == eos && !self.req.ignore_eos {
            return AfterToken::Finish(FinishReason::Eos);
        }
        self.tokens.push(tok);
        let index = self.generated().len() - 1;
        // A closed channel means the client is gone; the engine reaps it before the next step.
        let _ = self.tx.send(Event::Token(TokenEvent {
            token: tok,
            index,
            logits: self.req.return_logits.then(|| row.to_vec()),
            logprob: self
                .req
                .logprobs
                .map(|top| sampling::logprob(row, tok, top)),
        }));
        if let Some(d) = detok.filter(|_| !self.req.stop.is_empty())
            && stop_in_tail(self.generated(), &self.req.stop, d.as_ref())
        {
            return AfterToken::Finish(FinishReason::Stop);
        }
        if self.generated().len() >= self.req.max_tokens {
            return AfterToken::Finish(FinishReason::Length);
        }
        AfterToken::Continue
    }

    /// Free the cache and build the last event, to be sent on the returned channel.
    pub fn finish(
        mut self,
        reason: FinishReason,
        error: Option<String>,
        detok: Option<&Arc<dyn Detokenizer>>,
    ) -> (UnboundedSender<Event>, Finished) {
        self.state = None;
        let text = detok.map(|d| {
            let mut text = d.decode(self.generated());
            if reason == FinishReason::Stop {
                let cut = self
                    .req
                    .stop
                    .iter()
                    .filter_map(|s| text.find(s.as_str()))
                    .min();
                if let Some(at) = cut {
                    text.truncate(at);
                }
            }
            text
        });
        let ms = |t: Instant| t.duration_since(self.submitted).as_secs_f64() * 1e3;
        let now = Instant::now();
        let finished = Finished {
            reason,
            usage: Usage {
                prompt_tokens: self.prompt_len,
                completion_tokens: self.generated().len(),
                cached_tokens: self.cached_tokens.unwrap_or(0),
                preemptions: self.preemptions,
            },
            timing: Timing {
                queue_ms: ms(self.admitted.unwrap_or(now)),
                ttft_ms: self.first_token.map_or(0.0, ms),
                e2e_ms: ms(now),
            },
            text,
            error,
        };
        (self.tx, finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_core::SplitMix64;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Byte pieces of a byte-level vocabulary: ASCII, characters split across tokens, an
    /// empty (special) token, and invalid bytes.
    const PIECES: [&[u8]; 12] = [
        b"a",
        b"b",
        b"ab",
        b" ",
        b"\n",
        b"",
        b"\xc3",
        b"\xa9",
        b"\xef\xbd",
        b"\x9c",
        b"\xff",
        b"ba",
    ];

    /// Decodes as a byte-level tokenizer does, counting the ids it decodes.
    struct ByteLevel(AtomicUsize);

    impl Detokenizer for ByteLevel {
        fn decode(&self, ids: &[u32]) -> String {
            self.0.fetch_add(ids.len(), Ordering::Relaxed);
            let bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&i| PIECES[i as usize].to_vec())
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

    #[test]
    fn the_tail_check_stops_at_the_same_token_as_decoding_everything() {
        let d = ByteLevel(AtomicUsize::new(0));
        let stop_sets: [&[&str]; 5] = [
            &["bab"],
            &["é", "aaaa"],
            &["｜", "b\na"],
            &["a b a", "\u{fffd}b"],
            &["abababababab", " é"],
        ];
        let mut rng = SplitMix64::new(7);
        let mut stopped = 0;
        for round in 0..400 {
            let stops: Vec<String> = stop_sets[round % stop_sets.len()]
                .iter()
                .map(|s| s.to_string())
                .collect();
            let ids: Vec<u32> = (0..120)
                .map(|_| (rng.next_u64() % PIECES.len() as u64) as u32)
                .collect();
            let full = (1..=ids.len()).find(|&n| {
                let text = d.decode(&ids[..n]);
                stops.iter().any(|s| text.contains(s.as_str()))
            });
            let tail = (1..=ids.len()).find(|&n| stop_in_tail(&ids[..n], &stops, &d));
            assert_eq!(tail, full, "round {round}: stops {stops:?}, ids {ids:?}");
            stopped += usize::from(full.is_some());
        }
        assert!(
            stopped > 100,
            "only {stopped} of 400 rounds met a stop string"
        );
    }

    #[test]
    fn checking_stops_after_each_token_decodes_about_the_stop_length_not_the_text() {
        let d = ByteLevel(AtomicUsize::new(0));
        let stops = vec!["zz".to_string()];
        let ids: Vec<u32> = (0..5000).map(|i| i % 5).collect();
        for n in 1..=ids.len() {
            assert!(!stop_in_tail(&ids[..n], &stops, &d));
        }
        // Decoding everything after every token would be 12.5 million ids.
        let decoded = d.0.load(Ordering::Relaxed);
        assert!(
            decoded < 20 * ids.len(),
            "{decoded} ids decoded for 5000 tokens"
        );
    }
}

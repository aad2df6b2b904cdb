use super::*;
use std::sync::Mutex;

/// The tiny vocabulary (byte b is token 128 + b; `</think>` is a special token).
fn tiny() -> (Tokenizer, Arc<ThinkEnd>) {
    let tok = Tokenizer::tiny().unwrap();
    let vocab = Arc::new(Vocab::new(&tok, 400).unwrap());
    let end = Arc::new(ThinkEnd::new(&tok, vocab).unwrap());
    (tok, end)
}

fn byte(b: u8) -> u32 {
    128 + u32::from(b)
}

/// The tokens a masked row leaves.
fn allowed(state: &mut dyn ConstraintState) -> Vec<u32> {
    let mut row = vec![0.5f32; 400];
    state.mask(&mut row).unwrap();
    (0..400u32)
        .filter(|&i| row[i as usize] > f32::NEG_INFINITY)
        .collect()
}

/// Run `tokens` through `state`, as the engine does: mask, then advance past each.
fn feed(state: &mut dyn ConstraintState, tokens: &[u32]) {
    for &t in tokens {
        let left = allowed(state);
        assert!(left.contains(&t), "{t} masked out; allowed {left:?}");
        state.advance(t).unwrap();
    }
}

#[test]
fn the_end_is_the_special_token_where_there_is_one() {
    let (tok, end) = tiny();
    assert_eq!(
        end.tokens(),
        [tok.token_id(markers::THINK_END).unwrap()].as_slice()
    );
}

#[test]
fn reasoning_runs_free_for_the_budget_then_only_the_end_may_come() {
    let (_, end) = tiny();
    let think_end = end.tokens()[0];
    let mut s = end.constraint(3, None).0.start();
    feed(s.as_mut(), &[byte(b'a'), byte(b'b'), byte(b'c')]);
    assert_eq!(end.cuts(), 0);
    assert_eq!(allowed(s.as_mut()), [think_end]);
    s.advance(think_end).unwrap();
    assert_eq!(end.cuts(), 1, "one cut, counted once");
    // Then the answer is free again: the budget is spent once.
    assert_eq!(allowed(s.as_mut()).len(), 400);
    feed(s.as_mut(), &[byte(b'x'); 10]);
    assert_eq!(allowed(s.as_mut()).len(), 400);
}

#[test]
fn a_zero_budget_ends_the_reasoning_at_once() {
    let (_, end) = tiny();
    let mut s = end.constraint(0, None).0.start();
    assert_eq!(allowed(s.as_mut()), end.tokens());
}

#[test]
fn reasoning_the_model_ends_itself_is_not_ended_again() {
    let (_, end) = tiny();
    let think_end = end.tokens()[0];
    let mut s = end.constraint(4, None).0.start();
    feed(s.as_mut(), &[byte(b'a'), think_end, byte(b'b'), byte(b'c')]);
    feed(s.as_mut(), &[byte(b'd'); 8]);
    assert_eq!(allowed(s.as_mut()).len(), 400);

    // The same text written byte by byte ends it too.
    let mut s = end.constraint(12, None).0.start();
    let text: Vec<u32> = b"ok</think>".iter().map(|&b| byte(b)).collect();
    feed(s.as_mut(), &text);
    feed(s.as_mut(), &[byte(b'z'); 8]);
    assert_eq!(allowed(s.as_mut()).len(), 400);
}

#[test]
fn the_end_waits_for_a_split_character_to_be_complete() {
    let (_, end) = tiny();
    // "中" is E4 B8 AD: the budget is spent after its first byte.
    let mut s = end.constraint(1, None).0.start();
    feed(s.as_mut(), &[byte(0xE4)]);
    assert_eq!(allowed(s.as_mut()).len(), 400, "mid-character: no end yet");
    feed(s.as_mut(), &[byte(0xB8)]);
    assert_eq!(allowed(s.as_mut()).len(), 400);
    feed(s.as_mut(), &[byte(0xAD)]);
    assert_eq!(allowed(s.as_mut()), end.tokens());

    // A model that never completes a character is ended after the grace tokens.
    let mut s = end.constraint(2, None).0.start();
    feed(s.as_mut(), &[byte(0xE4); 2 + GRACE - 1]);
    assert_eq!(allowed(s.as_mut()).len(), 400);
    feed(s.as_mut(), &[byte(0xE4)]);
    assert_eq!(allowed(s.as_mut()), end.tokens());
}

/// A grammar stand-in: refuses `refused` while it has seen fewer than `after` tokens, and
/// records what it was advanced past.
struct Inner {
    refused: u32,
    after: usize,
    seen: Arc<Mutex<Vec<u32>>>,
}

impl TokenConstraint for Inner {
    fn start(&self) -> Box<dyn ConstraintState> {
        Box::new(InnerState {
            refused: self.refused,
            after: self.after,
            seen: Arc::clone(&self.seen),
        })
    }
}

struct InnerState {
    refused: u32,
    after: usize,
    seen: Arc<Mutex<Vec<u32>>>,
}

impl ConstraintState for InnerState {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        if self.seen.lock().unwrap().len() < self.after {
            logits[self.refused as usize] = f32::NEG_INFINITY;
        }
        logits[0] = f32::NEG_INFINITY;
        Ok(())
    }

    fn advance(&mut self, token: u32) -> Result<(), String> {
        self.seen.lock().unwrap().push(token);
        Ok(())
    }
}

#[test]
fn a_grammar_masks_first_and_the_end_waits_for_it() {
    let (_, end) = tiny();
    let think_end = end.tokens()[0];
    let seen = Arc::new(Mutex::new(Vec::new()));
    let inner = Constraint::new(Inner {
        refused: think_end,
        after: 3,
        seen: Arc::clone(&seen),
    });
    let mut s = end.constraint(1, Some(inner)).0.start();
    let left = allowed(s.as_mut());
    assert!(!left.contains(&0), "the grammar's mask stands");
    feed(s.as_mut(), &[byte(b'a')]);
    // Budget spent, but the grammar does not take the end yet: reasoning goes on.
    assert!(!allowed(s.as_mut()).contains(&think_end));
    feed(s.as_mut(), &[byte(b'b'), byte(b'c')]);
    assert_eq!(allowed(s.as_mut()), [think_end]);
    s.advance(think_end).unwrap();
    feed(s.as_mut(), &[byte(b'd')]);
    assert_eq!(
        *seen.lock().unwrap(),
        [byte(b'a'), byte(b'b'), byte(b'c'), think_end, byte(b'd')],
        "the grammar is advanced past every token"
    );
}

#[test]
fn an_end_of_several_tokens_is_forced_in_order_and_checked() {
    let tok = Tokenizer::tiny().unwrap();
    let vocab = Arc::new(Vocab::new(&tok, 400).unwrap());
    let tokens: Vec<u32> = markers::THINK_END.bytes().map(byte).collect();
    let end = Arc::new(ThinkEnd {
        tokens: tokens.clone(),
        vocab,
        start: Vec::new(),
        cuts: AtomicU64::new(0),
    });
    let mut s = end.constraint(2, None).0.start();
    feed(s.as_mut(), &[byte(b'a'), byte(b'b')]);
    for &t in &tokens {
        assert_eq!(allowed(s.as_mut()), [t]);
        s.advance(t).unwrap();
    }
    assert_eq!(allowed(s.as_mut()).len(), 400);

    // A token other than the forced one is an error, not silently counted.
    let mut s = end.constraint(0, None).0.start();
    allowed(s.as_mut());
    let err = s.advance(byte(b'q')).unwrap_err();
    assert!(err.contains("forced"), "{err}");
}

#[test]
fn a_grammar_refusing_the_rest_of_a_forced_end_is_an_error() {
    let tok = Tokenizer::tiny().unwrap();
    let vocab = Arc::new(Vocab::new(&tok, 400).unwrap());
    let tokens = vec![byte(b'<'), byte(b'/')];
    let end = Arc::new(ThinkEnd {
        tokens,
        vocab,
        start: Vec::new(),
        cuts: AtomicU64::new(0),
    });
    let inner = Constraint::new(Inner {
        refused: byte(b'/'),
        after: usize::MAX,
        seen: Arc::default(),
    });
    let mut s = end.constraint(0, Some(inner)).0.start();
    assert_eq!(allowed(s.as_mut()), [byte(b'<')]);
    s.advance(byte(b'<')).unwrap();
    let mut row = vec![0.5f32; 400];
    let err = s.mask(&mut row).unwrap_err();
    assert!(err.contains("refuses"), "{err}");
}

#[test]
fn reasoning_counts_up_to_and_including_the_end() {
    let (_, end) = tiny();
    let think_end = end.tokens()[0];
    let mut c = end.counter(true);
    c.push(&[byte(b'a'), byte(b'b')]);
    // Not ended yet: all of it is reasoning.
    assert_eq!(c.tokens(2), Some(2));
    c.push(&[think_end, byte(b'c'), think_end, byte(b'd')]);
    assert_eq!(c.tokens(6), Some(3), "the first end closes it");
    // Chat mode counts none.
    let mut chat = end.counter(false);
    chat.push(&[byte(b'a'), think_end]);
    assert_eq!(chat.tokens(2), None);
    // An end of several tokens, matched across pushes.
    let tok = Tokenizer::tiny().unwrap();
    let vocab = Arc::new(Vocab::new(&tok, 400).unwrap());
    let bytes: Vec<u32> = markers::THINK_END.bytes().map(byte).collect();
    let long = Arc::new(ThinkEnd {
        tokens: bytes.clone(),
        vocab,
        start: Vec::new(),
        cuts: AtomicU64::new(0),
    });
    let mut c = long.counter(true);
    c.push(&[byte(b'<'), byte(b'x')]);
    c.push(&bytes[..3]);
    c.push(&bytes[3..]);
    c.push(&[byte(b'z')]);
    assert_eq!(c.tokens(11), Some(2 + bytes.len()));
    // The choices of an answer together.
    let mut a = end.counter(true);
    a.push(&[byte(b'a'), think_end, byte(b'b')]);
    let mut b = end.counter(true);
    b.push(&[think_end]);
    assert_eq!(reasoning_total([(&a, 3), (&b, 1)]), Some(3));
    assert_eq!(reasoning_total([(&chat, 2), (&chat, 2)]), None);
}

#[test]
fn a_raw_prompt_ending_with_think_opens_the_reasoning() {
    let (tok, end) = tiny();
    let open = tok.token_id(markers::THINK_START).unwrap();
    assert!(end.opens(&[1, 2, open]));
    assert!(!end.opens(&[open, 2]));
    assert!(!end.opens(&[]));
}

#[test]
fn the_request_budget_comes_before_the_servers_and_beam_search_takes_none() {
    let f = "thinking_token_budget";
    assert_eq!(
        request_budget((Some(5), f), Some(9), true, false).unwrap(),
        Some(5)
    );
    assert_eq!(
        request_budget((None, f), Some(9), true, false).unwrap(),
        Some(9)
    );
    assert_eq!(
        request_budget((Some(5), f), Some(9), false, false).unwrap(),
        None
    );
    assert_eq!(
        request_budget((None, f), Some(9), true, true).unwrap(),
        None
    );
    let err = request_budget((Some(5), f), None, true, true).unwrap_err();
    assert_eq!(err.param.as_deref(), Some(f));
}

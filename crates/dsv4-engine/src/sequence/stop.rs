//! Stop strings: whether a request's generated text has reached one, decoding only the end
//! of the text after each token ([`stop_in_tail`]), and the [`Detokenizer`] that turns ids into
//! that text.

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

/// Whether the text of `generated` contains one of `stops` (none empty) that ends after the
/// text of its first `ignored` tokens (those generated before `min_tokens`, whose occurrences
/// are not looked for), decoding only its end. Called after every token from then on, so an
/// occurrence that ended earlier has already ended the request: a new one ends in the last
/// token's text (or at a character that token completes), so it starts at most `longest`
/// characters before that token's text. The window of tokens grows (doubling) until the text
/// before its last token has that many characters plus the margin, and the margin's characters
/// at its start are not searched; a window that would reach into the ignored tokens is the
/// whole text, searched past their text. A token then costs about the longest stop string, not
/// the whole completion (decoding all of it after every token made long completions with stop
/// strings quadratic on the step loop).
pub(crate) fn stop_in_tail(
    generated: &[u32],
    stops: &[String],
    d: &dyn Detokenizer,
    ignored: usize,
) -> bool {
    let n = generated.len();
    let longest = stops.iter().map(|s| s.chars().count()).max().unwrap_or(0);
    let before = longest + STOP_WINDOW_MARGIN;
    let mut k = (before + 1).min(n);
    loop {
        if k == n || n - k < ignored {
            let text = d.decode(generated);
            return first_stop_after(&text, generated, stops, d, ignored).is_some();
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

/// Whether the last of the `generated` tokens ends the request on one of `stops`, as the
/// engine checks after each token: never before `min_tokens` tokens, and an occurrence ending
/// in the text of the tokens before the `min_tokens`-th is not looked for (vLLM). The server's
/// beam search ends its hypotheses with it.
pub fn stop_string_ends(
    generated: &[u32],
    stops: &[String],
    d: &dyn Detokenizer,
    min_tokens: usize,
) -> bool {
    !stops.is_empty()
        && generated.len() >= min_tokens
        && stop_in_tail(generated, stops, d, min_tokens.saturating_sub(1))
}

/// Byte offset in `text`, the text of `generated`, of the first stop string that ends after
/// the text of its first `ignored` tokens.
pub(super) fn first_stop_after(
    text: &str,
    generated: &[u32],
    stops: &[String],
    d: &dyn Detokenizer,
    ignored: usize,
) -> Option<usize> {
    let floor = match ignored.min(generated.len()) {
        0 => 0,
        m => d.decode(&generated[..m]).len(),
    };
    stops
        .iter()
        .filter_map(|s| {
            text.match_indices(s.as_str())
                .map(|(i, _)| i)
                .find(|&i| i + s.len() > floor)
        })
        .min()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use dsv4_core::SplitMix64;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Byte pieces of a byte-level vocabulary: ASCII, characters split across tokens, an
    /// empty (special) token, and invalid bytes.
    pub(crate) const PIECES: [&[u8]; 12] = [
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
    pub(crate) struct ByteLevel(pub(crate) AtomicUsize);

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
            let tail = (1..=ids.len()).find(|&n| stop_in_tail(&ids[..n], &stops, &d, 0));
            assert_eq!(tail, full, "round {round}: stops {stops:?}, ids {ids:?}");
            stopped += usize::from(full.is_some());
            // With the first `ignored` tokens not looked at (min_tokens), checked from the
            // token after them on: the same as searching the whole text past theirs.
            let ignored = 1 + round % 23;
            let full = (ignored + 1..=ids.len()).find(|&n| {
                let text = d.decode(&ids[..n]);
                first_stop_after(&text, &ids[..n], &stops, &d, ignored).is_some()
            });
            let tail =
                (ignored + 1..=ids.len()).find(|&n| stop_in_tail(&ids[..n], &stops, &d, ignored));
            assert_eq!(
                tail, full,
                "round {round}, {ignored} ignored: {stops:?}, {ids:?}"
            );
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
            assert!(!stop_in_tail(&ids[..n], &stops, &d, 0));
        }
        // Decoding everything after every token would be 12.5 million ids.
        let decoded = d.0.load(Ordering::Relaxed);
        assert!(
            decoded < 20 * ids.len(),
            "{decoded} ids decoded for 5000 tokens"
        );
    }
}

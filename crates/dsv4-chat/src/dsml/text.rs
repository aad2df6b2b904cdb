//! Free-text scanning: which markers are live at a position, and the code-fence / quote state
//! that turns markers into plain content.
//!
//! Inside a code fence (a run of three or more backticks toggles it), an inline code span (a
//! run of one or two backticks, outside fences) or a double-quoted span (outside code), DSML
//! markup is content. Inline code and quotes end at a newline; fences do not. A backtick run's
//! length is known only at the next character, so it is resolved there — the state never
//! depends on where chunks were split.

/// Code/quote state of free text (reasoning or content).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TextState {
    fence: bool,
    inline: bool,
    quote: bool,
    ticks: u32,
}

impl TextState {
    /// Applies a finished backtick run; call before looking at any non-backtick character.
    pub fn resolve_ticks(&mut self) {
        if self.ticks >= 3 {
            self.fence = !self.fence;
            self.inline = false;
            self.quote = false;
        } else if self.ticks > 0 && !self.fence {
            self.inline = !self.inline;
        }
        self.ticks = 0;
    }

    /// Accounts for a character taken as text.
    pub fn push(&mut self, c: char) {
        match c {
            '`' => self.ticks = self.ticks.saturating_add(1),
            '\n' => {
                self.inline = false;
                self.quote = false;
            }
            '"' if !self.fence && !self.inline => self.quote = !self.quote,
            _ => {}
        }
    }

    /// Whether markup here is content (inside code or quotes).
    pub fn protected(&self) -> bool {
        self.fence || self.inline || self.quote
    }
}

/// How the markers of a state compare with the text at a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe<A> {
    /// The longest marker that matches in full, with its action.
    Full(usize, A),
    /// The text so far is a proper prefix of a marker: wait for more input.
    Wait,
    /// No marker starts here.
    Miss,
}

/// Compares `rest` with `markers`. A full match loses to a longer marker that could still
/// match once more text arrives, unless the stream is finishing.
pub(crate) fn probe<A: Copy>(rest: &str, markers: &[(&str, A)], finishing: bool) -> Probe<A> {
    let mut best: Option<(usize, A)> = None;
    let mut could_grow = false;
    for &(marker, action) in markers {
        if rest.starts_with(marker) {
            if best.is_none_or(|(len, _)| marker.len() > len) {
                best = Some((marker.len(), action));
            }
        } else if !finishing && rest.len() < marker.len() && marker.starts_with(rest) {
            could_grow = true;
        }
    }
    match best {
        _ if could_grow => Probe::Wait,
        Some((len, action)) => Probe::Full(len, action),
        None => Probe::Miss,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_after(text: &str) -> TextState {
        let mut s = TextState::default();
        for c in text.chars() {
            if c != '`' {
                s.resolve_ticks();
            }
            s.push(c);
        }
        s.resolve_ticks();
        s
    }

    #[test]
    fn fences_inline_code_and_quotes_protect() {
        assert!(state_after("```rust\nlet x = 1;\n").protected());
        assert!(!state_after("```rust\nx\n```\n").protected());
        assert!(state_after("see `code").protected());
        assert!(!state_after("see `code` here").protected());
        assert!(state_after("say \"hi").protected());
        assert!(!state_after("say \"hi\" now").protected());
        assert!(
            !state_after("say \"hi\nnext line").protected(),
            "quotes end at newline"
        );
        assert!(
            state_after("```\n\"\n").protected(),
            "quotes do not matter in fences"
        );
        assert!(
            state_after("``a").protected(),
            "a double backtick opens inline code"
        );
    }

    #[test]
    fn probe_prefers_longer_markers_and_waits_for_them() {
        let markers = [("<a", 1), ("<abc", 2)];
        assert_eq!(probe("<abcd", &markers, false), Probe::Full(4, 2));
        assert_eq!(probe("<ab", &markers, false), Probe::Wait);
        assert_eq!(probe("<ab", &markers, true), Probe::Full(2, 1));
        assert_eq!(probe("<ax", &markers, false), Probe::Full(2, 1));
        assert_eq!(probe("x<a", &markers, false), Probe::Miss);
        assert_eq!(probe("<", &markers, true), Probe::Miss);
    }
}

//! vLLM's `whitespace_pattern` (outlines' whitespace pattern for JSON answers): a regular
//! expression for the whitespace between the tokens of a JSON answer. It is checked here so
//! that every answer under it still parses as JSON: each string it matches must be JSON
//! whitespace (RFC 8259: space, tab, line feed, carriage return). The syntax is Rust's `regex`,
//! which llguidance reads too.

use regex_syntax::hir::{Class, Hir, HirKind};

/// Longest `whitespace_pattern` accepted.
pub const MAX_PATTERN_BYTES: usize = 1024;

/// Whether `c` is JSON whitespace.
fn is_json_ws(c: u32) -> bool {
    matches!(c, 0x20 | 0x09 | 0x0a | 0x0d)
}

/// `pattern` if every string it matches is JSON whitespace; else why not.
pub fn check(pattern: &str) -> Result<(), String> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!(
            "it is {} bytes long; at most {MAX_PATTERN_BYTES} bytes are accepted",
            pattern.len()
        ));
    }
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .map_err(|e| {
            format!(
                "it is not a regular expression: {}",
                one_line(&e.to_string())
            )
        })?;
    only_json_ws(&hir).map_err(|why| {
        format!("{why}; it may match only JSON whitespace, e.g. `[ \\t\\n\\r]*` (not `\\s`)")
    })
}

/// The last line of a multi-line regex-syntax error (the line that says what is wrong).
fn one_line(e: &str) -> String {
    let lines: Vec<&str> = e.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines.last().copied().unwrap_or(e).to_string()
}

/// Err naming something `h` matches that is not JSON whitespace.
fn only_json_ws(h: &Hir) -> Result<(), String> {
    let bad = |c: u32| match char::from_u32(c) {
        Some(ch) => Err(format!("it matches {ch:?}")),
        None => Err(format!("it matches the byte {c:#04x}")),
    };
    match h.kind() {
        HirKind::Empty => Ok(()),
        HirKind::Literal(lit) => match lit.0.iter().find(|b| !is_json_ws(u32::from(**b))) {
            Some(b) => bad(u32::from(*b)),
            None => Ok(()),
        },
        HirKind::Class(class) => {
            let ranges: Vec<(u32, u32)> = match class {
                Class::Unicode(c) => c
                    .ranges()
                    .iter()
                    .map(|r| (u32::from(r.start()), u32::from(r.end())))
                    .collect(),
                Class::Bytes(c) => c
                    .ranges()
                    .iter()
                    .map(|r| (u32::from(r.start()), u32::from(r.end())))
                    .collect(),
            };
            // Lazy, and JSON whitespace has no run longer than two, so this stops within
            // three steps of a range's start.
            let mut members = ranges.into_iter().flat_map(|(a, b)| a..=b);
            members.find(|c| !is_json_ws(*c)).map_or(Ok(()), bad)
        }
        HirKind::Look(look) => Err(format!(
            "it uses the assertion {look:?}, which a whitespace pattern cannot"
        )),
        HirKind::Repetition(r) => only_json_ws(&r.sub),
        HirKind::Capture(c) => only_json_ws(&c.sub),
        HirKind::Concat(hs) | HirKind::Alternation(hs) => hs.iter().try_for_each(only_json_ws),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_of_json_whitespace_only_are_accepted() {
        for p in [
            "",
            "[ ]?",
            " *",
            r"[ \t\n\r]*",
            r"(?:\n  )?",
            r"\x20{0,4}",
            r"(?-u:[\x09\x0a])+",
            r"( |\n)|\r\n",
        ] {
            assert_eq!(check(p), Ok(()), "{p:?}");
        }
    }

    #[test]
    fn patterns_that_match_anything_else_are_refused_saying_what() {
        for (p, says) in [
            (r"\s*", "'\\u{b}'"),
            (r"(?-u:\s)", "'\\u{b}'"),
            ("[ a]*", "'a'"),
            ("x?", "'x'"),
            (r"[\t-\r]", "'\\u{b}'"),
            (r"[^ ]", "'\\0'"),
            (".", "'\\0'"),
            ("^ *", "assertion"),
            (r"\b", "assertion"),
            ("(", "not a regular expression"),
            ("[z-a]", "not a regular expression"),
        ] {
            let e = check(p).unwrap_err();
            assert!(e.contains(says), "{p:?}: {e}");
            assert!(!e.contains('\n'), "{p:?}: one line: {e}");
        }
        let long = " ".repeat(MAX_PATTERN_BYTES + 1);
        assert!(check(&long).unwrap_err().contains("bytes long"));
    }
}

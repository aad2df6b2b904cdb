//! The GBNF lexer: source text to tokens with their 1-based line and column. Whitespace
//! (newlines included) and `#` comments are skipped; string escapes are decoded here.

/// Largest count a repetition `{m,n}` may name (GBNF's, and a structural tag's `repeat`).
pub(crate) const MAX_REPEAT: u32 = 10_000;

/// A character class `[...]` / `[^...]`: inclusive ranges of characters.
#[derive(Debug, Clone)]
pub(super) struct Class {
    /// `[^...]`: matches the characters outside `ranges`.
    pub(super) negated: bool,
    /// Inclusive ranges, in source order (a single character is `(c, c)`).
    pub(super) ranges: Vec<(char, char)>,
}

/// What a token is.
#[derive(Debug, Clone)]
pub(super) enum Tok {
    /// A rule name (definition or reference).
    Name(String),
    /// `::=`.
    Define,
    /// A string literal, decoded.
    Str(String),
    /// A character class.
    Class(Class),
    /// `.`: any one character.
    Any,
    /// `(`.
    LParen,
    /// `)`.
    RParen,
    /// `|`.
    Bar,
    /// `*`, `+` or `?`.
    Op(char),
    /// `{m}`, `{m,}`, `{m,n}` or `{,n}`: at least `.0`, at most `.1` (None: unbounded).
    Repeat(u32, Option<u32>),
}

/// A token and where it starts.
#[derive(Debug, Clone)]
pub(super) struct Token {
    /// The token.
    pub(super) tok: Tok,
    /// 1-based line.
    pub(super) line: usize,
    /// 1-based column, in characters.
    pub(super) col: usize,
}

/// An error message located at `line`, `col`.
pub(super) fn at(line: usize, col: usize, msg: impl std::fmt::Display) -> String {
    format!("line {line}, column {col}: {msg}")
}

/// Whether `c` may start a rule name.
pub(super) fn is_name_start(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `c` may continue a rule name.
pub(super) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// The tokens of `src`.
pub(super) fn lex(src: &str) -> Result<Vec<Token>, String> {
    let mut lx = Lexer {
        chars: src.chars().collect(),
        pos: 0,
        line: 1,
        col: 1,
    };
    let mut out = Vec::new();
    while let Some(c) = lx.peek(0) {
        let (line, col) = (lx.line, lx.col);
        let tok = match c {
            ' ' | '\t' | '\r' | '\n' | '\u{feff}' => {
                lx.bump();
                continue;
            }
            '#' => {
                while lx.peek(0).is_some_and(|c| c != '\n') {
                    lx.bump();
                }
                continue;
            }
            '"' => lx.string()?,
            '[' => lx.class()?,
            '{' => lx.repeat()?,
            ':' if lx.peek(1) == Some(':') && lx.peek(2) == Some('=') => {
                lx.bump_n(3);
                Tok::Define
            }
            '(' => {
                lx.bump();
                let mut i = 0;
                while lx.peek(i).is_some_and(char::is_whitespace) {
                    i += 1;
                }
                if lx.peek(i) == Some('=') {
                    return Err(at(
                        line,
                        col,
                        "lookahead assertions `(= …)` are not supported",
                    ));
                }
                Tok::LParen
            }
            ')' | '|' | '*' | '+' | '?' | '.' => {
                lx.bump();
                match c {
                    ')' => Tok::RParen,
                    '|' => Tok::Bar,
                    '.' => Tok::Any,
                    _ => Tok::Op(c),
                }
            }
            c if is_name_start(c) => {
                let mut len = 0;
                while lx.peek(len).is_some_and(is_name_char) {
                    len += 1;
                }
                // A trailing `.` is the any-character operator, not part of the name.
                while lx.peek(len - 1) == Some('.') {
                    len -= 1;
                }
                Tok::Name((0..len).filter_map(|_| lx.bump()).collect())
            }
            c => return Err(at(line, col, format!("unexpected character {c:?}"))),
        };
        out.push(Token { tok, line, col });
    }
    Ok(out)
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    line: usize,
    col: usize,
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn bump_n(&mut self, n: usize) {
        for _ in 0..n {
            self.bump();
        }
    }

    fn skip_blanks(&mut self) {
        while self.peek(0).is_some_and(|c| c == ' ' || c == '\t') {
            self.bump();
        }
    }

    /// A string literal `"..."` (raw newlines allowed).
    fn string(&mut self) -> Result<Tok, String> {
        let start = at(self.line, self.col, "unterminated string literal");
        self.bump();
        let mut s = String::new();
        loop {
            match self.peek(0) {
                None => return Err(start),
                Some('"') => {
                    self.bump();
                    return Ok(Tok::Str(s));
                }
                Some('\\') => s.push(self.escape()?),
                Some(c) => {
                    self.bump();
                    s.push(c);
                }
            }
        }
    }

    /// A character class `[...]` or `[^...]`.
    fn class(&mut self) -> Result<Tok, String> {
        let (line, col) = (self.line, self.col);
        self.bump();
        let negated = self.peek(0) == Some('^');
        if negated {
            self.bump();
        }
        let mut ranges = Vec::new();
        loop {
            let (l, c) = (self.line, self.col);
            let lo = match self.peek(0) {
                None => return Err(at(line, col, "unterminated character class")),
                Some(']') => break,
                Some('\\') => self.escape()?,
                Some(ch) => {
                    self.bump();
                    ch
                }
            };
            let mut hi = lo;
            if self.peek(0) == Some('-') && self.peek(1).is_some_and(|c| c != ']') {
                self.bump();
                hi = match self.peek(0) {
                    Some('\\') => self.escape()?,
                    _ => self.bump().unwrap_or(lo),
                };
                if hi < lo {
                    return Err(at(
                        l,
                        c,
                        format!("character range {lo:?}-{hi:?} is reversed"),
                    ));
                }
            }
            ranges.push((lo, hi));
        }
        self.bump();
        if ranges.is_empty() && !negated {
            return Err(at(line, col, "empty character class `[]` matches nothing"));
        }
        Ok(Tok::Class(Class { negated, ranges }))
    }

    /// A repetition `{m}`, `{m,}`, `{m,n}` or `{,n}`.
    fn repeat(&mut self) -> Result<Tok, String> {
        let (line, col) = (self.line, self.col);
        let bad = |what: &str| at(line, col, format!("bad repetition: {what}"));
        self.bump();
        self.skip_blanks();
        let min = self.number(line, col)?;
        self.skip_blanks();
        let comma = self.peek(0) == Some(',');
        if comma {
            self.bump();
            self.skip_blanks();
        }
        let max = if comma { self.number(line, col)? } else { min };
        self.skip_blanks();
        if self.bump() != Some('}') {
            return Err(bad("expected `{m}`, `{m,}`, `{m,n}` or `{,n}`"));
        }
        match (min, max) {
            (None, None) => Err(bad("expected `{m}`, `{m,}`, `{m,n}` or `{,n}`")),
            (Some(m), Some(n)) if m > n => Err(bad(&format!(
                "`{{{m},{n}}}` has its minimum above its maximum"
            ))),
            (min, max) => Ok(Tok::Repeat(min.unwrap_or(0), max)),
        }
    }

    /// Decimal digits, if any, as a count up to [`MAX_REPEAT`].
    fn number(&mut self, line: usize, col: usize) -> Result<Option<u32>, String> {
        let mut n: Option<u64> = None;
        while let Some(d) = self.peek(0).and_then(|c| c.to_digit(10)) {
            self.bump();
            n = Some(
                n.unwrap_or(0)
                    .saturating_mul(10)
                    .saturating_add(u64::from(d)),
            );
        }
        match n {
            Some(n) if n > u64::from(MAX_REPEAT) => Err(at(
                line,
                col,
                format!("repetition count {n} is too large (at most {MAX_REPEAT})"),
            )),
            n => Ok(n.and_then(|n| u32::try_from(n).ok())),
        }
    }

    /// The character an escape `\...` (at the cursor) stands for.
    fn escape(&mut self) -> Result<char, String> {
        let (line, col) = (self.line, self.col);
        self.bump();
        let Some(c) = self.bump() else {
            return Err(at(line, col, "unterminated escape"));
        };
        let digits = match c {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            _ => {
                return match c {
                    'n' => Ok('\n'),
                    'r' => Ok('\r'),
                    't' => Ok('\t'),
                    '0' => Ok('\0'),
                    'a' => Ok('\u{7}'),
                    'b' => Ok('\u{8}'),
                    'e' => Ok('\u{1b}'),
                    'f' => Ok('\u{c}'),
                    'v' => Ok('\u{b}'),
                    c if c.is_ascii_punctuation() => Ok(c),
                    c => Err(at(line, col, format!("unknown escape `\\{c}`"))),
                };
            }
        };
        let mut v: u32 = 0;
        for _ in 0..digits {
            let Some(d) = self.peek(0).and_then(|c| c.to_digit(16)) else {
                return Err(at(line, col, format!("`\\{c}` needs {digits} hex digits")));
            };
            self.bump();
            v = v.saturating_mul(16).saturating_add(d);
        }
        char::from_u32(v)
            .ok_or_else(|| at(line, col, format!("U+{v:X} is not a Unicode scalar value")))
    }
}

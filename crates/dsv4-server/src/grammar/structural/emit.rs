//! A structural tag's [`Format`] as llguidance Lark rules (see the parent module for why free
//! text and the string after it are one lexeme).

use super::{Format, Tag};
use crate::grammar::gbnf::MAX_REPEAT;
use crate::grammar::{compact, lark_str};

/// Most characters `any_text`'s `max_chars` may allow.
const MAX_CHARS: u64 = 1_000_000;

/// What follows a format: the end of the output, or the enclosing tag's closing strings.
#[derive(Clone, Copy)]
enum Follow<'a> {
    /// The end of the output.
    End,
    /// One of these strings (the enclosing tag's end).
    Ends(&'a [String]),
    /// Something else: free text cannot be placed here.
    Inner,
}

/// The Lark rules of a structural tag under construction.
pub(crate) struct Emitter<'u> {
    /// Rule and terminal definitions, one a line.
    pub(crate) rules: String,
    /// Sub-grammars (name, Lark text) that `grammar` formats refer to with `@name`.
    pub(crate) grammars: Vec<(String, String)>,
    next: usize,
    /// Turns a `grammar` format's text (GBNF or Lark) into Lark.
    user_lark: &'u dyn Fn(&str) -> Result<String, String>,
}

/// A piece of grammar: its Lark expression, and whether it already ends with the closing
/// string its [`Follow`] named.
struct Piece {
    expr: String,
    closed: bool,
}

impl Piece {
    fn open(expr: String) -> Self {
        Self {
            expr,
            closed: false,
        }
    }
}

impl<'u> Emitter<'u> {
    /// Rules for `format` as the whole answer; the expression of the answer is rule `start_body`.
    /// `user_lark` turns a `grammar` format's text (GBNF or Lark) into Lark.
    pub(crate) fn new(
        format: &Format,
        user_lark: &'u dyn Fn(&str) -> Result<String, String>,
    ) -> Result<Self, String> {
        let mut e = Self {
            rules: String::new(),
            grammars: Vec::new(),
            next: 0,
            user_lark,
        };
        let body = e.emit(format, Follow::End, "format")?;
        e.rules = format!("start_body: {}\n{}", body.expr, e.rules);
        Ok(e)
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}_{}", self.next)
    }

    /// Define rule `name: body`; returns its name.
    fn rule(&mut self, prefix: &str, body: &str) -> String {
        let name = self.fresh(prefix);
        self.rules.push_str(&format!("{name}: {body}\n"));
        name
    }

    fn emit(&mut self, f: &Format, follow: Follow<'_>, at: &str) -> Result<Piece, String> {
        Ok(match f {
            Format::ConstString { value } => {
                if value.is_empty() {
                    Piece::open("\"\"".into())
                } else {
                    Piece::open(lark_str(value))
                }
            }
            Format::JsonSchema {
                json_schema,
                style,
                any_order,
            } => {
                if style.as_deref().is_some_and(|s| s != "json") {
                    return Err(format!(
                        "{at}: style {:?} is not supported; only \"json\"",
                        style.as_deref().unwrap_or_default()
                    ));
                }
                if *any_order == Some(true) {
                    return Err(format!("{at}: any_order true is not supported"));
                }
                if !(json_schema.is_object() || json_schema.is_boolean()) {
                    return Err(format!("{at}: json_schema must be a JSON schema object"));
                }
                Piece::open(format!("%json {}", compact(json_schema.clone())))
            }
            Format::Regex { pattern } => {
                if pattern.is_empty() {
                    return Err(format!("{at}: the regex pattern is empty"));
                }
                let name = self.fresh("RX").to_uppercase();
                self.rules.push_str(&format!(
                    "{name}: /{}/\n",
                    llguidance::regex_to_lark(pattern, "")
                ));
                Piece::open(name)
            }
            Format::Grammar { grammar } => {
                if grammar.trim().is_empty() {
                    return Err(format!("{at}: the grammar is empty"));
                }
                let lark = (self.user_lark)(grammar).map_err(|e| format!("{at}: {e}"))?;
                let name = self.fresh("sub_grammar");
                self.grammars.push((name.clone(), lark));
                Piece::open(format!("@{name}"))
            }
            Format::AnyText {
                excludes,
                max_tokens,
                max_chars,
            } => {
                if max_tokens.is_some() {
                    return Err(format!(
                        "{at}: any_text's max_tokens is not supported (max_chars is)"
                    ));
                }
                let max_chars = match *max_chars {
                    Some(n) if n > MAX_CHARS => {
                        return Err(format!("{at}: max_chars goes up to {MAX_CHARS}"));
                    }
                    n => n,
                };
                self.free_text(excludes, max_chars, follow, at)?
            }
            Format::Sequence { elements } => {
                if elements.is_empty() {
                    return Err(format!("{at}: a sequence needs at least one element"));
                }
                let mut parts = Vec::with_capacity(elements.len());
                let mut closed = false;
                for (i, el) in elements.iter().enumerate() {
                    let last = i + 1 == elements.len();
                    let piece = self.emit(
                        el,
                        if last { follow } else { Follow::Inner },
                        &format!("{at}.elements[{i}]"),
                    )?;
                    closed = piece.closed;
                    parts.push(piece.expr);
                }
                let name = self.rule("seq", &parts.join(" "));
                Piece { expr: name, closed }
            }
            Format::Or { elements } => {
                if elements.is_empty() {
                    return Err(format!("{at}: `or` needs at least one element"));
                }
                let mut pieces = Vec::with_capacity(elements.len());
                for (i, el) in elements.iter().enumerate() {
                    pieces.push(self.emit(el, follow, &format!("{at}.elements[{i}]"))?);
                }
                // Either every alternative ends with the closing string or none does.
                let closed = pieces.iter().any(|p| p.closed);
                let alts: Vec<String> = pieces
                    .into_iter()
                    .map(|p| match (closed && !p.closed, follow) {
                        (true, Follow::Ends(ends)) => format!("{} {}", p.expr, alternatives(ends)),
                        _ => p.expr,
                    })
                    .collect();
                let name = self.rule("or", &alts.join(" | "));
                Piece { expr: name, closed }
            }
            Format::Optional { content } => {
                let inner = self.bounded(content, &format!("{at}.content"))?;
                Piece::open(format!("{inner}?"))
            }
            Format::Plus { content } => {
                let inner = self.bounded(content, &format!("{at}.content"))?;
                Piece::open(format!("{inner}+"))
            }
            Format::Star { content } => {
                let inner = self.bounded(content, &format!("{at}.content"))?;
                Piece::open(format!("{inner}*"))
            }
            Format::Repeat { min, max, content } => {
                if *min > MAX_REPEAT || *max > i64::from(MAX_REPEAT) {
                    return Err(format!(
                        "{at}: repeat counts go up to {MAX_REPEAT} (-1 for no upper limit)"
                    ));
                }
                let inner = self.bounded(content, &format!("{at}.content"))?;
                let expr = match *max {
                    -1 if *min == 0 => format!("{inner}*"),
                    -1 => format!("{inner}{{{min},}}"),
                    m if m >= i64::from(*min) => {
                        if m == 0 {
                            "\"\"".into()
                        } else {
                            format!("{inner}{{{min},{m}}}")
                        }
                    }
                    m => {
                        return Err(format!(
                            "{at}: repeat max {m} must be -1 (no limit) or at least min {min}"
                        ));
                    }
                };
                Piece::open(expr)
            }
            Format::Tag(tag) => Piece::open(self.tag(tag, true, at)?),
            Format::TriggeredTags {
                triggers,
                tags,
                at_least_one,
                stop_after_first,
                excludes,
            } => self.triggered(
                triggers,
                tags,
                (*at_least_one, *stop_after_first),
                excludes,
                follow,
                at,
            )?,
            Format::TagsWithSeparator {
                tags,
                separator,
                at_least_one,
                stop_after_first,
            } => {
                if tags.is_empty() {
                    return Err(format!("{at}: tags_with_separator needs at least one tag"));
                }
                let mut alts = Vec::with_capacity(tags.len());
                for (i, tag) in tags.iter().enumerate() {
                    alts.push(self.tag(tag, true, &format!("{at}.tags[{i}]"))?);
                }
                let one = self.rule("tags", &alts.join(" | "));
                let sep = if separator.is_empty() {
                    String::new()
                } else {
                    lark_str(separator)
                };
                let expr = match (*at_least_one, *stop_after_first) {
                    (true, true) => one,
                    (false, true) => format!("{one}?"),
                    (true, false) => format!("{one} ({sep} {one})*"),
                    (false, false) => format!("({one} ({sep} {one})*)?"),
                };
                Piece::open(self.rule("tag_list", &expr))
            }
        })
    }

    /// A format after which something else comes (inside `optional`, `plus`, `star`,
    /// `repeat`): it may not be free text.
    fn bounded(&mut self, f: &Format, at: &str) -> Result<String, String> {
        let piece = self.emit(f, Follow::Inner, at)?;
        Ok(self.rule("group", &piece.expr))
    }

    /// A tag: `begin` (unless `with_begin` is false: a trigger's lexeme holds it), the
    /// content, the end.
    fn tag(&mut self, tag: &Tag, with_begin: bool, at: &str) -> Result<String, String> {
        let ends = tag.end.list();
        if ends.is_empty() {
            return Err(format!("{at}: end lists no string"));
        }
        if ends.iter().any(String::is_empty) && matches!(*tag.content, Format::AnyText { .. }) {
            return Err(format!("{at}: free text needs a non-empty end"));
        }
        let content = self.emit(&tag.content, Follow::Ends(&ends), &format!("{at}.content"))?;
        let mut parts = Vec::new();
        if with_begin && !tag.begin.is_empty() {
            parts.push(lark_str(&tag.begin));
        }
        parts.push(content.expr);
        if !content.closed {
            parts.push(alternatives(&ends));
        }
        Ok(self.rule("tag", &parts.join(" ")))
    }

    /// Free text without `excludes`, followed by `follow`.
    fn free_text(
        &mut self,
        excludes: &[String],
        max_chars: Option<u64>,
        follow: Follow<'_>,
        at: &str,
    ) -> Result<Piece, String> {
        match follow {
            Follow::End if max_chars == Some(0) => Ok(Piece::open("\"\"".into())),
            Follow::End => {
                let name = self.fresh("TEXT").to_uppercase();
                self.rules.push_str(&format!(
                    "{name}: {}\n",
                    text_without(excludes, true, max_chars)
                ));
                Ok(Piece::open(format!("{name}?")))
            }
            Follow::Ends(ends) if max_chars == Some(0) => Ok(Piece {
                expr: alternatives(ends),
                closed: true,
            }),
            Follow::Ends(ends) => {
                let mut banned = excludes.to_vec();
                banned.extend(ends.iter().cloned());
                let name = self.fresh("TEXT").to_uppercase();
                self.rules.push_str(&format!(
                    "{name}: ({}) {}\n",
                    text_without(&banned, false, max_chars),
                    alternatives(ends)
                ));
                Ok(Piece {
                    expr: name,
                    closed: true,
                })
            }
            Follow::Inner => Err(format!(
                "{at}: free text (any_text, triggered_tags) must be a tag's content or end the \
                 answer, where the string after it is known"
            )),
        }
    }

    fn triggered(
        &mut self,
        triggers: &[String],
        tags: &[Tag],
        (at_least_one, stop_after_first): (bool, bool),
        excludes: &[String],
        follow: Follow<'_>,
        at: &str,
    ) -> Result<Piece, String> {
        if matches!(follow, Follow::Inner) {
            return self.free_text(excludes, None, follow, at);
        }
        if triggers.is_empty() || triggers.iter().any(String::is_empty) {
            return Err(format!("{at}: triggers must list non-empty strings"));
        }
        if tags.is_empty() {
            return Err(format!("{at}: triggered_tags needs at least one tag"));
        }
        let mut banned: Vec<String> = triggers.to_vec();
        banned.extend(excludes.iter().cloned());
        let ends: &[String] = match follow {
            Follow::Ends(ends) => ends,
            _ => &[],
        };
        banned.extend(ends.iter().cloned());
        let free = self.fresh("FREE").to_uppercase();
        self.rules
            .push_str(&format!("{free}: {}\n", text_without(&banned, false, None)));
        // Each tag: free text then its begin (one lexeme), then its content and end.
        let mut after_free = Vec::new();
        let mut direct = Vec::new();
        for (i, tag) in tags.iter().enumerate() {
            let here = format!("{at}.tags[{i}]");
            if !triggers.iter().any(|t| tag.begin.starts_with(t.as_str())) {
                return Err(format!(
                    "{here}: begin {:?} does not start with any of the triggers",
                    tag.begin
                ));
            }
            let body = self.tag(tag, false, &here)?;
            let pre = self.fresh("PRE").to_uppercase();
            self.rules
                .push_str(&format!("{pre}: {free} {}\n", lark_str(&tag.begin)));
            after_free.push(format!("{pre} {body}"));
            direct.push(format!("{} {body}", lark_str(&tag.begin)));
        }
        let segment = self.rule("segment", &after_free.join(" | "));
        let first = self.rule("first_tag", &direct.join(" | "));
        // What ends it: the end of the answer (optional free text), or free text then the
        // enclosing tag's end.
        let (tail, end) = match follow {
            Follow::Ends(ends) => {
                let t = self.fresh("TAIL").to_uppercase();
                self.rules
                    .push_str(&format!("{t}: {free} {}\n", alternatives(ends)));
                (t, alternatives(ends))
            }
            _ => {
                let t = self.fresh("TAIL").to_uppercase();
                self.rules
                    .push_str(&format!("{t}: {}\n", text_without(&banned, true, None)));
                (format!("{t}?"), String::new())
            }
        };
        let expr = match (at_least_one, stop_after_first) {
            (false, false) => format!("{segment}* {tail}"),
            (true, false) => format!("{first} {segment}* {tail}"),
            (false, true) => format!("{segment} {end} | {tail}"),
            (true, true) => format!("{first} {end}"),
        };
        Ok(Piece {
            expr: self.rule("triggered", &expr),
            closed: matches!(follow, Follow::Ends(_)),
        })
    }
}

/// `strings` as a Lark alternative group.
fn alternatives(strings: &[String]) -> String {
    let alts: Vec<String> = strings
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| lark_str(s))
        .collect();
    match alts.len() {
        0 => "\"\"".into(),
        1 => alts[0].clone(),
        _ => format!("({})", alts.join(" | ")),
    }
}

/// A Lark terminal expression for text that contains none of `banned` (`non_empty`: at least
/// one character; `max_chars`: at most that many characters, at least 1).
fn text_without(banned: &[String], non_empty: bool, max_chars: Option<u64>) -> String {
    let any = match (non_empty, max_chars) {
        (false, None) => "/(?s:.*)/".to_string(),
        (true, None) => "/(?s:.+)/".to_string(),
        (non_empty, Some(n)) => format!("/(?s:.{{{},{n}}})/", u8::from(non_empty)),
    };
    let banned: Vec<String> = banned
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| regex_literal(s))
        .collect();
    if banned.is_empty() {
        any
    } else {
        format!("{any} & ~/(?s:.*)({})(?s:.*)/", banned.join("|"))
    }
}

/// `s` as a regular expression matching exactly it: every character that is not ASCII
/// alphanumeric written `\x{HEX}`.
fn regex_literal(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_string()
            } else {
                format!("\\x{{{:x}}}", u32::from(c))
            }
        })
        .collect()
}

//! GBNF (llama.cpp's `grammars/README.md`) and xgrammar's EBNF, translated to llguidance's
//! Lark syntax, so that requests may constrain output with `root ::= ...` grammars.
//!
//! Accepted: rules `name ::= body` (names of letters, digits, `_`, `-`, `.`; newlines are plain
//! whitespace, a rule ends where the next `name ::=` begins); `#` comments; string literals
//! with the escapes `\n \r \t \0 \a \b \e \f \v \xHH \uHHHH \UHHHHHHHH` and `\` before any ASCII
//! punctuation (`\xHH` is the code point U+00HH, as in llama.cpp); classes `[...]`/`[^...]` with
//! ranges and the same escapes; `.` (any character, newline included); groups, `|`, the empty
//! alternative, and the postfix `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}` (counts up to
//! 10000; operators may stack, as in `x*?`). Refused, with the line and column: lookahead
//! assertions `(= ...)`, undefined or twice-defined rules, nesting deeper than 256, anything
//! else unknown. The start rule is `root`.
//!
//! Every rule `name` becomes the Lark rule `g_name` (lowercased, `-` and `.` made `_`, then
//! `_2`, `_3`, ... in definition order when two names map alike, as `Foo` and `foo` do), and
//! `start: g_root` comes first. Classes become regexes that spell every character that is not
//! ASCII alphanumeric as `\x{HEX}`, safe from Rust's class operators (`&&`, `--`, `~~`, `[`)
//! and from Lark's `/`. Groups nested deeper than Lark allows are moved into rules `aux_N`.
//!
//! Semantic difference: llguidance lexes terminals greedily (longest match, no backtracking),
//! while GBNF matches character by character. That matters where one terminal matches a proper
//! prefix of a longer string literal allowed at the same position: with
//! `root ::= ("a" | "ab") "bc"`, greedy lexing of `abc` takes `ab` as one terminal and then
//! fails on `c`, where GBNF matches `a` then `bc`. To keep GBNF's meaning, a multi-character
//! literal is emitted as a sequence of one-character literals whenever some other terminal of
//! the grammar (a literal, a class, `.`) matches one of its proper prefixes (see `split.rs`);
//! all other literals stay whole, so the common case lexes at full speed. Every remaining
//! terminal is then either a whole literal none of whose proper prefixes another terminal
//! matches, or one character long, so greedy lexing never cuts a path GBNF would take.
//!
//! Input comes from requests: no input panics, and since llguidance compiles rules
//! recursively, grammars whose rule references nest too deep for its stack are refused too.

mod lex;
pub(crate) use lex::MAX_REPEAT;
mod split;
#[cfg(test)]
mod tests;

use lex::{Class, Tok, Token, at};
use split::Terminals;
use std::collections::{HashMap, HashSet};

/// Deepest nesting of groups and postfix operators (on one path of the tree) accepted.
const MAX_DEPTH: usize = 256;
/// Deepest group nesting written inside one Lark rule (llguidance's Lark parser stops at 30).
const MAX_LARK_DEPTH: usize = 16;
/// llguidance compiles rules and groups recursively, depth first from `start`; measured with
/// optimized code, a rule level takes about 3 KiB of stack and a group level about 2 KiB.
const RULE_COST: usize = 3;
/// See [`RULE_COST`].
const GROUP_COST: usize = 2;
/// Most stack (in those units, KiB) that compiling the grammar may need: a quarter of the
/// compiler thread's [`super::COMPILE_STACK`], leaving room for unoptimized builds, whose
/// frames are about three times larger.
const MAX_COST: usize = super::COMPILE_STACK / 1024 / 4;

/// Whether `src` is written in GBNF (some rule is defined with `::=`), as opposed to Lark.
///
/// True when some line starts (after optional whitespace) with a rule name followed by optional
/// spaces and `::=`. A Lark line starts with a rule name and `:`, or with `|`, `%`, a comment;
/// `::=` inside a Lark string or regex is never at that position.
pub(crate) fn is_gbnf(src: &str) -> bool {
    src.lines().any(|line| {
        let line = line.trim_start();
        if !line.starts_with(lex::is_name_start) {
            return false;
        }
        let rest = line.trim_start_matches(lex::is_name_char);
        rest.trim_start_matches([' ', '\t']).starts_with("::=")
    })
}

/// `src`, a GBNF grammar whose start rule is `root`, as an llguidance Lark grammar whose start
/// rule is `start`. The error names the line and column and what is wrong (e.g. "line 3,
/// column 10: rule `valu` is not defined").
pub(crate) fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let mut parser = Parser {
        toks: lex::lex(src)?,
        pos: 0,
    };
    let rules = parser.rules()?;
    if rules.is_empty() {
        return Err("the grammar has no rules".into());
    }
    let mut defined: HashMap<&str, &Rule> = HashMap::new();
    for r in &rules {
        if let Some(first) = defined.insert(&r.name, r) {
            let msg = format!(
                "rule `{}` is defined twice (first at line {})",
                r.name, first.line
            );
            return Err(at(r.line, r.col, msg));
        }
    }
    if !defined.contains_key("root") {
        return Err("the grammar has no `root` rule".into());
    }
    let mut terms = Terminals::default();
    for r in &rules {
        for node in r.alts.iter().flatten() {
            visit(node, &mut |n| match n {
                Node::Ref(name, line, col) if !defined.contains_key(name.as_str()) => {
                    Err(at(*line, *col, format!("rule `{name}` is not defined")))
                }
                Node::Lit(s) => {
                    terms.literals.insert(s.clone());
                    Ok(())
                }
                Node::Class(c) => {
                    terms.classes.push(c.clone());
                    Ok(())
                }
                Node::Any => {
                    terms.any = true;
                    Ok(())
                }
                _ => Ok(()),
            })?;
        }
    }
    check_compile_depth(&rules)?;
    let mut emitter = Emitter {
        names: lark_names(&rules),
        split: terms.literals_to_split(),
        aux: Vec::new(),
    };
    let mut out = format!("start: {}\n", emitter.name("root"));
    for r in &rules {
        let body = emitter.alts(&r.alts, 0)?;
        out.push_str(&format!("{}: {body}\n", emitter.name(&r.name)));
    }
    for aux in &emitter.aux {
        out.push_str(aux);
    }
    Ok(out)
}

/// One GBNF rule.
struct Rule {
    name: String,
    line: usize,
    col: usize,
    alts: Vec<Vec<Node>>,
}

/// An element of a rule body.
enum Node {
    /// A string literal (decoded).
    Lit(String),
    Class(Class),
    /// `.`
    Any,
    /// A rule reference, with where it is used.
    Ref(String, usize, usize),
    /// `( alternatives )`
    Group(Vec<Vec<Node>>),
    /// The node repeated at least `.1`, at most `.2` (None: unbounded) times.
    Repeat(Box<Node>, u32, Option<u32>),
}

/// Calls `f` on `node` and everything inside it.
fn visit(node: &Node, f: &mut impl FnMut(&Node) -> Result<(), String>) -> Result<(), String> {
    f(node)?;
    match node {
        Node::Group(alts) => alts.iter().flatten().try_for_each(|n| visit(n, f)),
        Node::Repeat(inner, ..) => visit(inner, f),
        _ => Ok(()),
    }
}

/// A recursive-descent parser over the tokens.
struct Parser {
    toks: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.toks.get(self.pos)
    }

    /// Whether a rule definition `name ::=` starts at the cursor.
    fn at_rule_start(&self) -> bool {
        matches!(self.peek().map(|t| &t.tok), Some(Tok::Name(_)))
            && matches!(
                self.toks.get(self.pos + 1).map(|t| &t.tok),
                Some(Tok::Define)
            )
    }

    /// All the rules, in definition order.
    fn rules(&mut self) -> Result<Vec<Rule>, String> {
        let mut rules = Vec::new();
        while let Some(t) = self.peek() {
            let (line, col) = (t.line, t.col);
            let name = match &t.tok {
                Tok::Name(name) if self.at_rule_start() => name.clone(),
                _ => return Err(at(line, col, "expected a rule definition `name ::= ...`")),
            };
            self.pos += 2;
            let (alts, _) = self.alts(0)?;
            if let Some(t) = self.peek().filter(|t| matches!(t.tok, Tok::RParen)) {
                return Err(at(t.line, t.col, "`)` without a matching `(`"));
            }
            rules.push(Rule {
                name,
                line,
                col,
                alts,
            });
        }
        Ok(rules)
    }

    /// Alternatives separated by `|`, up to `)`, the next rule, or the end, at group depth
    /// `depth`; with the height of their tallest item.
    fn alts(&mut self, depth: usize) -> Result<(Vec<Vec<Node>>, usize), String> {
        let (seq, mut height) = self.seq(depth)?;
        let mut alts = vec![seq];
        while self.peek().is_some_and(|t| matches!(t.tok, Tok::Bar)) {
            self.pos += 1;
            let (seq, h) = self.seq(depth)?;
            alts.push(seq);
            height = height.max(h);
        }
        Ok((alts, height))
    }

    /// Items up to `|`, `)`, the next rule, or the end; with the height of the tallest.
    fn seq(&mut self, depth: usize) -> Result<(Vec<Node>, usize), String> {
        let (mut seq, mut height) = (Vec::new(), 0);
        while let Some(t) = self.peek() {
            if matches!(t.tok, Tok::Bar | Tok::RParen) || self.at_rule_start() {
                break;
            }
            let (node, h) = self.item(depth)?;
            seq.push(node);
            height = height.max(h);
        }
        Ok((seq, height))
    }

    /// An atom and its postfix operators, with its height: groups and repetitions nested in
    /// it, at most [`MAX_DEPTH`] (so that walking the tree cannot overflow the stack).
    fn item(&mut self, depth: usize) -> Result<(Node, usize), String> {
        let Some(t) = self.peek().cloned() else {
            return Err("unexpected end of the grammar".into());
        };
        self.pos += 1;
        let too_deep = |t: &Token| at(t.line, t.col, format!("nested deeper than {MAX_DEPTH}"));
        let (mut node, mut height) = match t.tok {
            Tok::Str(s) => (Node::Lit(s), 0),
            Tok::Class(c) => (Node::Class(c), 0),
            Tok::Any => (Node::Any, 0),
            Tok::Name(name) => (Node::Ref(name, t.line, t.col), 0),
            Tok::LParen => {
                if depth >= MAX_DEPTH {
                    return Err(too_deep(&t));
                }
                let (alts, h) = self.alts(depth + 1)?;
                if !self.peek().is_some_and(|t| matches!(t.tok, Tok::RParen)) {
                    return Err(at(t.line, t.col, "`(` without a matching `)`"));
                }
                self.pos += 1;
                (Node::Group(alts), h + 1)
            }
            Tok::Define => return Err(at(t.line, t.col, "unexpected `::=`")),
            Tok::Op(_) | Tok::Repeat(..) => {
                return Err(at(t.line, t.col, "a repetition must follow an item"));
            }
            Tok::Bar | Tok::RParen => return Err(at(t.line, t.col, "unexpected token")),
        };
        while let Some(t) = self.peek() {
            let (min, max) = match t.tok {
                Tok::Op('*') => (0, None),
                Tok::Op('+') => (1, None),
                Tok::Op(_) => (0, Some(1)),
                Tok::Repeat(min, max) => (min, max),
                _ => break,
            };
            height += 1;
            if height > MAX_DEPTH {
                return Err(too_deep(t));
            }
            self.pos += 1;
            node = Node::Repeat(Box::new(node), min, max);
        }
        Ok((node, height))
    }
}

/// Refuses grammars whose compilation by llguidance would recurse too deep (see
/// [`MAX_COST`]): follows its depth-first walk from `root` over rule references (every rule
/// defined, at most once), adding [`RULE_COST`] per rule and [`GROUP_COST`] per nested group.
fn check_compile_depth(rules: &[Rule]) -> Result<(), String> {
    /// The references in `node` in order: (rule name, group depth, line, column).
    fn refs<'a>(node: &'a Node, depth: usize, out: &mut Vec<(&'a str, usize, usize, usize)>) {
        match node {
            Node::Ref(name, line, col) => out.push((name, depth, *line, *col)),
            Node::Group(alts) => alts.iter().flatten().for_each(|n| refs(n, depth + 1, out)),
            Node::Repeat(inner, ..) => refs(inner, depth + 1, out),
            _ => {}
        }
    }
    let index: HashMap<&str, usize> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    let calls: Vec<Vec<(usize, usize, usize, usize)>> = rules
        .iter()
        .map(|r| {
            let mut out = Vec::new();
            r.alts.iter().flatten().for_each(|n| refs(n, 0, &mut out));
            out.into_iter()
                .filter_map(|(name, d, l, c)| Some((*index.get(name)?, d, l, c)))
                .collect()
        })
        .collect();
    let Some(&root) = index.get("root") else {
        return Ok(());
    };
    let mut seen = vec![false; rules.len()];
    seen[root] = true;
    // (rule, next reference to follow, cost so far)
    let mut stack = vec![(root, 0, RULE_COST)];
    while let Some((rule, next, cost)) = stack.last_mut() {
        let Some(&(callee, depth, line, col)) = calls[*rule].get(*next) else {
            stack.pop();
            continue;
        };
        *next += 1;
        if !std::mem::replace(&mut seen[callee], true) {
            let cost = *cost + depth * GROUP_COST + RULE_COST;
            if cost > MAX_COST {
                let msg = format!(
                    "rule references and groups nest too deeply here for the grammar engine \
                     (about {} levels of rules at most, fewer inside deep groups)",
                    MAX_COST / RULE_COST
                );
                return Err(at(line, col, &msg));
            }
            stack.push((callee, 0, cost));
        }
    }
    Ok(())
}

/// The Lark rule name of every GBNF rule name (see the module doc).
fn lark_names(rules: &[Rule]) -> HashMap<String, String> {
    let to_base = |name: &str| -> String {
        let mapped = name.chars().map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' => c,
            _ => '_',
        });
        format!("g_{}", mapped.collect::<String>())
    };
    let bases: HashSet<String> = rules.iter().map(|r| to_base(&r.name)).collect();
    let mut taken = HashSet::new();
    // The next suffix to try for each base name.
    let mut suffix: HashMap<String, usize> = HashMap::new();
    let mut names = HashMap::new();
    for r in rules {
        let base = to_base(&r.name);
        let mut name = base.clone();
        while taken.contains(&name) || (name != base && bases.contains(&name)) {
            let n = suffix.entry(base.clone()).or_insert(2);
            name = format!("{base}_{n}");
            *n += 1;
        }
        taken.insert(name.clone());
        names.insert(r.name.clone(), name);
    }
    names
}

/// Writes rule bodies in Lark.
struct Emitter {
    names: HashMap<String, String>,
    split: HashSet<String>,
    /// Rules for groups nested too deep to write inline, each a full line.
    aux: Vec<String>,
}

impl Emitter {
    fn name(&self, gbnf: &str) -> String {
        self.names.get(gbnf).cloned().unwrap_or_default()
    }

    /// Alternatives at group depth `depth` of the current Lark rule.
    fn alts(&mut self, alts: &[Vec<Node>], depth: usize) -> Result<String, String> {
        let alts: Result<Vec<String>, String> = alts.iter().map(|s| self.seq(s, depth)).collect();
        Ok(alts?.join(" | "))
    }

    fn seq(&mut self, seq: &[Node], depth: usize) -> Result<String, String> {
        if seq.is_empty() {
            return Ok("\"\"".into());
        }
        let items: Result<Vec<String>, String> = seq.iter().map(|n| self.item(n, depth)).collect();
        Ok(items?.join(" "))
    }

    /// `node` as an element of a sequence.
    fn item(&mut self, node: &Node, depth: usize) -> Result<String, String> {
        match node {
            Node::Lit(s) if self.split.contains(s) => chars(s),
            Node::Group(alts) if alts.len() == 1 => self.seq(&alts[0], depth),
            Node::Group(alts) => self.group(depth, |e, d| e.alts(alts, d)),
            Node::Repeat(_, _, Some(0)) => Ok("\"\"".into()),
            Node::Repeat(inner, 1, Some(1)) => self.item(inner, depth),
            Node::Repeat(inner, min, max) => {
                let op = match (min, max) {
                    (0, None) => "*".to_string(),
                    (1, None) => "+".to_string(),
                    (0, Some(1)) => "?".to_string(),
                    (m, None) => format!("{{{m},}}"),
                    (m, Some(n)) if m == n => format!("{{{m}}}"),
                    (m, Some(n)) => format!("{{{m},{n}}}"),
                };
                Ok(format!("{}{op}", self.atom(inner, depth)?))
            }
            _ => self.atom(node, depth),
        }
    }

    /// `node` as something a postfix operator may follow.
    fn atom(&mut self, node: &Node, depth: usize) -> Result<String, String> {
        match node {
            Node::Lit(s) if self.split.contains(s) => self.group(depth, |_, _| chars(s)),
            Node::Lit(s) => lark_string(s),
            Node::Class(c) => Ok(class_regex(c)),
            Node::Any => Ok("/(?s:.)/".into()),
            Node::Ref(name, ..) => Ok(self.name(name)),
            Node::Group(alts) if alts.len() == 1 && alts[0].len() == 1 => {
                self.atom(&alts[0][0], depth)
            }
            Node::Group(alts) => self.group(depth, |e, d| e.alts(alts, d)),
            Node::Repeat(..) => self.group(depth, |e, d| e.item(node, d)),
        }
    }

    /// `( body )`, or a fresh rule for `body` where that would nest too deep.
    fn group(
        &mut self,
        depth: usize,
        body: impl FnOnce(&mut Self, usize) -> Result<String, String>,
    ) -> Result<String, String> {
        if depth < MAX_LARK_DEPTH {
            return Ok(format!("({})", body(self, depth + 1)?));
        }
        let idx = self.aux.len();
        let name = format!("aux_{idx}");
        self.aux.push(String::new());
        let rule = format!("{name}: {}\n", body(self, 0)?);
        if let Some(slot) = self.aux.get_mut(idx) {
            *slot = rule;
        }
        Ok(name)
    }
}

/// `s` as one-character Lark literals in sequence.
fn chars(s: &str) -> Result<String, String> {
    let chars: Result<Vec<String>, String> = s
        .chars()
        .map(|c| lark_string(c.encode_utf8(&mut [0; 4])))
        .collect();
    Ok(chars?.join(" "))
}

/// `s` as a Lark string literal (see [`super::lark_str`]).
fn lark_string(s: &str) -> Result<String, String> {
    Ok(super::lark_str(s))
}

/// `c` as a Lark regex, every character that is not ASCII alphanumeric written `\x{HEX}`.
fn class_regex(c: &Class) -> String {
    let esc = |ch: char| {
        if ch.is_ascii_alphanumeric() {
            ch.to_string()
        } else {
            format!("\\x{{{:x}}}", u32::from(ch))
        }
    };
    if c.negated && c.ranges.is_empty() {
        return "/(?s:.)/".into();
    }
    let mut rx = String::from(if c.negated { "/[^" } else { "/[" });
    for &(lo, hi) in &c.ranges {
        rx.push_str(&esc(lo));
        if hi != lo {
            rx.push('-');
            rx.push_str(&esc(hi));
        }
    }
    rx.push_str("]/");
    rx
}

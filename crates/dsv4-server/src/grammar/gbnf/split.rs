//! Which string literals must be written one character at a time so that llguidance's greedy
//! lexer keeps GBNF's meaning (see the parent module's doc).

use super::lex::Class;
use std::collections::{BTreeSet, HashMap, HashSet};

/// The terminals of a grammar, for deciding which literals must be split (see the module doc).
#[derive(Default)]
pub(super) struct Terminals {
    /// The string literals.
    pub(super) literals: BTreeSet<String>,
    /// The character classes.
    pub(super) classes: Vec<Class>,
    /// Whether `.` occurs.
    pub(super) any: bool,
}

impl Terminals {
    /// The multi-character literals that some other terminal could cut short.
    pub(super) fn literals_to_split(&self) -> HashSet<String> {
        let multi: Vec<&String> = self
            .literals
            .iter()
            .filter(|s| s.chars().nth(1).is_some())
            .collect();
        let mut split: HashSet<String> = HashSet::new();
        // A literal with another literal as a proper prefix (`literals` is sorted, so the
        // literals that are prefixes of the current one are on the stack).
        let mut stack: Vec<&String> = Vec::new();
        for s in &self.literals {
            while stack.last().is_some_and(|p| !s.starts_with(p.as_str())) {
                stack.pop();
            }
            if stack.last().is_some_and(|p| !p.is_empty()) {
                split.insert(s.clone());
            }
            stack.push(s);
        }
        // One-character terminals: those of classes and `.`, literal and split characters.
        let classes = class_union(&self.classes);
        let in_class = |c: char| {
            let i = classes.partition_point(|&(_, hi)| hi < c);
            self.any || classes.get(i).is_some_and(|&(lo, _)| lo <= c)
        };
        let mut singles: HashSet<char> = self
            .literals
            .iter()
            .filter(|s| s.chars().nth(1).is_none())
            .filter_map(|s| s.chars().next())
            .collect();
        let mut by_first: HashMap<char, Vec<&String>> = HashMap::new();
        let mut queue: Vec<&String> = Vec::new();
        for s in multi {
            let first = s.chars().next().unwrap_or_default();
            if split.contains(s) || in_class(first) || singles.contains(&first) {
                queue.push(s);
            } else {
                by_first.entry(first).or_default().push(s);
            }
        }
        while let Some(s) = queue.pop() {
            split.insert(s.clone());
            for c in s.chars() {
                if singles.insert(c) {
                    queue.extend(by_first.remove(&c).unwrap_or_default());
                }
            }
        }
        split
    }
}

/// The characters matched by any of `classes`, as sorted, disjoint, inclusive ranges.
fn class_union(classes: &[Class]) -> Vec<(char, char)> {
    let mut all = Vec::new();
    for c in classes {
        let mut ranges = c.ranges.clone();
        ranges.sort_unstable();
        if !c.negated {
            all.extend(ranges);
            continue;
        }
        // `next`: the first character above the ranges seen so far (None: past the end).
        let mut next = Some('\0');
        for (lo, hi) in ranges {
            if let Some(n) = next.filter(|&n| n < lo) {
                all.push((n, char_before(lo)));
            }
            next = next.zip(char_after(hi)).map(|(n, a)| n.max(a));
        }
        all.extend(next.map(|n| (n, char::MAX)));
    }
    all.sort_unstable();
    let mut merged: Vec<(char, char)> = Vec::new();
    for (lo, hi) in all {
        match merged.last_mut() {
            Some(last) if Some(lo) <= char_after(last.1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

/// The character after `c` (skipping surrogates), if any.
fn char_after(c: char) -> Option<char> {
    match c {
        '\u{d7ff}' => Some('\u{e000}'),
        c => char::from_u32(u32::from(c) + 1),
    }
}

/// The character before `c` (skipping surrogates); `c` must not be `'\0'`.
fn char_before(c: char) -> char {
    match c {
        '\u{e000}' => '\u{d7ff}',
        c => char::from_u32(u32::from(c).saturating_sub(1)).unwrap_or('\0'),
    }
}

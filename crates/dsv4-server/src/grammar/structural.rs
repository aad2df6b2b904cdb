//! Structural tags (xgrammar's, as vLLM and SGLang take them in `response_format` and
//! `structured_outputs.structural_tag`): a tree of formats — exact strings, JSON under a
//! schema, regular expressions, grammars, free text, sequences, alternatives, repetitions,
//! `begin … end` tags, and free text in which triggers start tags — translated to llguidance
//! Lark rules. The legacy shape (`structures` of `{begin, schema, end}` plus `triggers`) is the
//! same as one `triggered_tags` format.
//!
//! Format reference: xgrammar's docs/structural_tag/structural_tag.md (mlc-ai/xgrammar).
//! Token-level formats (`token`, `exclude_token`, `any_tokens`, `token_triggered_tags`,
//! `token_dispatch`), `dispatch`, `any_text`'s `max_tokens`, non-JSON `style`s and `any_order`
//! are refused.
//!
//! llguidance lexes greedily: a lexeme of free text would run over the string that should end
//! it. So free text is never a lexeme of its own where something follows it: free text and the
//! string after it (a tag's `end`, a triggered tag's `begin`) are one lexeme, whose text part
//! cannot contain that string, the triggers or the excludes. Free text is therefore only
//! allowed where a known string follows it (as a tag's content, possibly through `sequence` and
//! `or`) or at the very end of the output.

use serde::Deserialize;
use serde_json::Value;

/// A structural tag as a request sends it: `format`, or the legacy `structures` and
/// `triggers`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuralTag {
    /// The format the whole answer follows.
    pub format: Option<Format>,
    /// Legacy: the tags triggers start.
    pub structures: Option<Vec<LegacyStructure>>,
    /// Legacy: the strings that start a tag in free text.
    pub triggers: Option<Vec<String>>,
    /// Legacy (SGLang): at least one tag, and no text before the first.
    pub at_least_one: Option<bool>,
}

/// A legacy structure: `begin`, JSON under `schema`, `end`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacyStructure {
    /// The tag's opening string.
    pub begin: String,
    /// The schema of the JSON between (default: any JSON value).
    pub schema: Option<Value>,
    /// The tag's closing string.
    pub end: String,
}

/// One format of the tree.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Format {
    /// Exactly this string.
    ConstString {
        /// The string.
        value: String,
    },
    /// One JSON value under the schema.
    JsonSchema {
        /// The schema.
        json_schema: Value,
        /// Only `json` is supported.
        style: Option<String>,
        /// Only false is supported.
        any_order: Option<bool>,
    },
    /// Text of a grammar (GBNF or Lark).
    Grammar {
        /// The grammar.
        grammar: String,
    },
    /// Text matching a regular expression.
    Regex {
        /// The expression.
        pattern: String,
    },
    /// Free text without the excluded strings.
    AnyText {
        /// Strings the text may not contain.
        #[serde(default)]
        excludes: Vec<String>,
        /// Refused (a token budget, which text-level rules cannot count).
        max_tokens: Option<u64>,
        /// At most this many characters (Unicode scalar values).
        max_chars: Option<u64>,
    },
    /// The elements one after another.
    Sequence {
        /// The elements.
        elements: Vec<Format>,
    },
    /// One of the elements.
    Or {
        /// The alternatives.
        elements: Vec<Format>,
    },
    /// The content or nothing.
    Optional {
        /// The content.
        content: Box<Format>,
    },
    /// The content once or more.
    Plus {
        /// The content.
        content: Box<Format>,
    },
    /// The content any number of times.
    Star {
        /// The content.
        content: Box<Format>,
    },
    /// The content `min` to `max` times (`max` −1: no limit).
    Repeat {
        /// Fewest repetitions.
        min: u32,
        /// Most repetitions, or −1.
        max: i64,
        /// The content.
        content: Box<Format>,
    },
    /// `begin`, the content, `end`.
    Tag(Tag),
    /// Free text in which a trigger starts one of the tags; free text again after it.
    TriggeredTags {
        /// The strings that start a tag (each tag's `begin` starts with one).
        triggers: Vec<String>,
        /// The tags.
        tags: Vec<Tag>,
        /// At least one tag, and no text before the first.
        #[serde(default)]
        at_least_one: bool,
        /// Nothing after the first tag.
        #[serde(default)]
        stop_after_first: bool,
        /// Strings the free text may not contain.
        #[serde(default)]
        excludes: Vec<String>,
    },
    /// Tags separated by `separator`, nothing else.
    TagsWithSeparator {
        /// The tags.
        tags: Vec<Tag>,
        /// Between two tags.
        separator: String,
        /// At least one tag.
        #[serde(default)]
        at_least_one: bool,
        /// At most one tag.
        #[serde(default)]
        stop_after_first: bool,
    },
}

/// A `tag` format.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tag {
    /// "tag" when given (inside `tags` lists).
    #[serde(rename = "type")]
    pub kind: Option<TagKind>,
    /// The opening string.
    pub begin: String,
    /// What comes between.
    pub content: Box<Format>,
    /// The closing string, or any of several.
    pub end: Ends,
}

/// The `type` a tag inside a `tags` list may state.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TagKind {
    /// The only one.
    Tag,
}

/// A tag's closing string, or any of several.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Ends {
    /// One string.
    One(String),
    /// Any of these.
    Many(Vec<String>),
}

impl Ends {
    /// The closing strings.
    pub(crate) fn list(&self) -> Vec<String> {
        match self {
            Ends::One(s) => vec![s.clone()],
            Ends::Many(v) => v.clone(),
        }
    }
}

impl Format {
    /// The bytes of every string in the tree (literals, triggers, excludes, separators,
    /// regexes, grammars; not JSON schemas): what [`super::MAX_GRAMMAR_BYTES`] bounds, since
    /// a grammar's compile time and stack grow with them.
    pub fn text_bytes(&self) -> usize {
        let strings = |v: &[String]| v.iter().map(String::len).sum::<usize>();
        let tags = |v: &[Tag]| v.iter().map(Tag::text_bytes).sum::<usize>();
        match self {
            Format::ConstString { value } => value.len(),
            Format::JsonSchema { .. } => 0,
            Format::Grammar { grammar } => grammar.len(),
            Format::Regex { pattern } => pattern.len(),
            Format::AnyText { excludes, .. } => strings(excludes),
            Format::Sequence { elements } | Format::Or { elements } => {
                elements.iter().map(Format::text_bytes).sum()
            }
            Format::Optional { content }
            | Format::Plus { content }
            | Format::Star { content }
            | Format::Repeat { content, .. } => content.text_bytes(),
            Format::Tag(tag) => tag.text_bytes(),
            Format::TriggeredTags {
                triggers,
                tags: t,
                excludes,
                ..
            } => strings(triggers) + tags(t) + strings(excludes),
            Format::TagsWithSeparator {
                tags: t, separator, ..
            } => tags(t) + separator.len(),
        }
    }
}

impl Tag {
    fn text_bytes(&self) -> usize {
        self.begin.len()
            + self.content.text_bytes()
            + self.end.list().iter().map(String::len).sum::<usize>()
    }
}

impl StructuralTag {
    /// The format it asks for; the error says what is wrong with its shape.
    pub fn resolve(&self) -> Result<Format, String> {
        match (&self.format, &self.structures, &self.triggers) {
            (Some(f), None, None) if self.at_least_one.is_none() => Ok(f.clone()),
            (None, Some(structures), Some(triggers)) => Ok(Format::TriggeredTags {
                triggers: triggers.clone(),
                tags: structures
                    .iter()
                    .map(|s| Tag {
                        kind: None,
                        begin: s.begin.clone(),
                        content: Box::new(Format::JsonSchema {
                            json_schema: s.schema.clone().unwrap_or_else(|| serde_json::json!({})),
                            style: None,
                            any_order: None,
                        }),
                        end: Ends::One(s.end.clone()),
                    })
                    .collect(),
                at_least_one: self.at_least_one.unwrap_or(false),
                stop_after_first: false,
                excludes: Vec::new(),
            }),
            _ => Err(
                "give either `format` or both `structures` and `triggers` (the legacy \
                      shape, with its optional `at_least_one`)"
                    .into(),
            ),
        }
    }
}

mod emit;
#[cfg(test)]
mod tests;

pub(crate) use emit::Emitter;

//! Corruption signatures: the ways a tool-calling answer shows that something upstream of the
//! text went wrong. [`detect`] checks one answer on its own; the comparisons
//! (`stream_mismatch`, `solo_divergence`) and failed requests are classified by the runner.
//!
//! Markup is searched in a normalised copy of the text (full-width bars `｜` and `▁` replaced by
//! `|` and `_`), so `｜DSML｜`, `|DSML|` and mixed spellings all match; streamed answers are
//! checked after their deltas are concatenated, so a marker split across chunks is found.

use crate::answer::{Answer, RequestFailure};
use crate::schema;
use dsv4_chat::markers;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A kind of corruption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signature {
    /// DSML or other tool-call markup in `content`, `reasoning_content` or an argument text.
    MarkupInContent,
    /// Tool or think tags that do not open and close in order.
    UnbalancedTags,
    /// `finish_reason` "stop" while the text carries markup (a tool call leaked as text).
    StopWithMarkup,
    /// Tool-call arguments that are not a JSON object.
    InvalidArgumentsJson,
    /// Tool-call arguments that break the tool's parameter schema.
    SchemaViolation,
    /// A call of a tool the request did not declare.
    UnknownTool,
    /// `tool_choice` forced a call (required / named) and the answer did not make it.
    ToolChoiceViolated,
    /// A special token (`<｜…｜>`, `<|…|>`) in the text.
    SpecialTokenInText,
    /// One unit of text repeated back to back past the threshold.
    RepeatedToken,
    /// No content and no tool calls with `finish_reason` "length".
    EmptyLength,
    /// The streamed and the non-streamed answer to the same request differ.
    StreamMismatch,
    /// The answer differs from the same request replayed alone afterwards.
    SoloDivergence,
    /// The server refused its own model's output (dsv4's `model_output_error`).
    ServerOutputError,
    /// The request failed otherwise (HTTP error, transport error, timeout, unreadable answer).
    RequestError,
}

impl Signature {
    /// Every signature, in report order.
    pub const ALL: [Signature; 14] = [
        Self::MarkupInContent,
        Self::UnbalancedTags,
        Self::StopWithMarkup,
        Self::InvalidArgumentsJson,
        Self::SchemaViolation,
        Self::UnknownTool,
        Self::ToolChoiceViolated,
        Self::SpecialTokenInText,
        Self::RepeatedToken,
        Self::EmptyLength,
        Self::StreamMismatch,
        Self::SoloDivergence,
        Self::ServerOutputError,
        Self::RequestError,
    ];

    /// The snake_case name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::MarkupInContent => "markup_in_content",
            Self::UnbalancedTags => "unbalanced_tags",
            Self::StopWithMarkup => "stop_with_markup",
            Self::InvalidArgumentsJson => "invalid_arguments_json",
            Self::SchemaViolation => "schema_violation",
            Self::UnknownTool => "unknown_tool",
            Self::ToolChoiceViolated => "tool_choice_violated",
            Self::SpecialTokenInText => "special_token_in_text",
            Self::RepeatedToken => "repeated_token",
            Self::EmptyLength => "empty_length",
            Self::StreamMismatch => "stream_mismatch",
            Self::SoloDivergence => "solo_divergence",
            Self::ServerOutputError => "server_output_error",
            Self::RequestError => "request_error",
        }
    }
}

/// One signature found in one turn, with what was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The kind.
    pub signature: Signature,
    /// Where and what (e.g. `content: "<|DSML|invoke" at character 12`).
    pub detail: String,
}

impl Finding {
    fn new(signature: Signature, detail: impl Into<String>) -> Self {
        Self {
            signature,
            detail: detail.into(),
        }
    }
}

/// A tool the request declared: its name and parameter schema.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredTool {
    /// The function name.
    pub name: String,
    /// The `parameters` JSON Schema.
    pub parameters: Value,
}

/// What the request asked for, as far as the detectors need it.
#[derive(Debug, Clone, Copy)]
pub struct Expectation<'a> {
    /// The declared tools.
    pub tools: &'a [DeclaredTool],
    /// `tool_choice` forced some call ("required").
    pub required: bool,
    /// `tool_choice` named this tool.
    pub named: Option<&'a str>,
    /// Threshold of [`Signature::RepeatedToken`].
    pub repeat_threshold: usize,
}

/// Replace full-width bars and `▁` with their ASCII look-alikes.
fn normalise(s: &str) -> String {
    s.replace('｜', "|").replace('▁', "_")
}

/// Tool-call markup (normalised spelling): DSML, the V3 tool markers, tool results, and the
/// `<tool_call>` tags other model families use.
fn markup_markers() -> Vec<String> {
    let mut v: Vec<String> = vec![normalise(markers::DSML)];
    v.extend(markers::LEGACY_TOOL_MARKERS.iter().map(|m| normalise(m)));
    v.extend([
        markers::TOOL_RESULT_START.to_owned(),
        markers::TOOL_RESULT_END.to_owned(),
        "<tool_call>".to_owned(),
        "</tool_call>".to_owned(),
    ]);
    v
}

/// The first tool-call marker in `text`, with its character offset.
pub fn find_markup(text: &str) -> Option<(String, usize)> {
    let norm = normalise(text);
    markup_markers()
        .into_iter()
        .filter_map(|m| norm.find(&m).map(|at| (m, at)))
        .min_by_key(|(_, at)| *at)
        .map(|(m, at)| (m, norm[..at].chars().count()))
}

/// Open/close tag pairs whose balance is checked (normalised spelling; an opening tag that takes
/// attributes is matched by its prefix).
const TAG_PAIRS: [(&str, &str); 8] = [
    ("<|DSML|tool_calls>", "</|DSML|tool_calls>"),
    ("<|DSML|function_calls>", "</|DSML|function_calls>"),
    ("<|DSML|invoke", "</|DSML|invoke>"),
    ("<|DSML|parameter", "</|DSML|parameter>"),
    ("<think>", "</think>"),
    ("<tool_result>", "</tool_result>"),
    ("<tool_call>", "</tool_call>"),
    ("<|tool_calls_begin|>", "<|tool_calls_end|>"),
];

/// The first imbalance among the tag pairs (`TAG_PAIRS`) in `text`: a closing tag with nothing open, or a tag
/// left open at the end.
pub fn find_unbalanced(text: &str) -> Option<String> {
    let norm = normalise(text);
    for (open, close) in TAG_PAIRS {
        let mut depth = 0usize;
        let mut i = 0;
        while i < norm.len() {
            let rest = &norm[i..];
            if rest.starts_with(close) {
                if depth == 0 {
                    return Some(format!("`{close}` with no `{open}` open"));
                }
                depth -= 1;
                i += close.len();
            } else if rest.starts_with(open) {
                depth += 1;
                i += open.len();
            } else {
                i += rest.chars().next().map_or(1, char::len_utf8);
            }
        }
        if depth > 0 {
            return Some(format!("`{open}` opened {depth} time(s) and never closed"));
        }
    }
    None
}

/// The first special token in `text` (`<|NAME|>` after normalisation, NAME without spaces or
/// angle brackets, at most 48 characters) that is not tool markup.
pub fn find_special_token(text: &str) -> Option<(String, usize)> {
    let norm = normalise(text);
    let markup = markup_markers();
    let mut from = 0;
    while let Some(rel) = norm[from..].find("<|") {
        let start = from + rel;
        let body = &norm[start + 2..];
        let end = body
            .char_indices()
            .take(49)
            .find(|(_, c)| *c == '|' || c.is_whitespace() || *c == '<' || *c == '>')
            .map(|(i, _)| i);
        if let Some(end) = end
            && end > 0
            && body[end..].starts_with("|>")
        {
            let token = &norm[start..start + 2 + end + 2];
            if !markup.iter().any(|m| m == token) {
                return Some((token.to_owned(), norm[..start].chars().count()));
            }
        }
        from = start + 2;
    }
    None
}

/// The longest back-to-back repetition of a unit of 1..=16 characters, if it repeats more than
/// `threshold` times: (unit, repetitions, character offset).
pub fn find_repetition(text: &str, threshold: usize) -> Option<(String, usize, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut best: Option<(usize, usize, usize)> = None; // (period, reps, start)
    for p in 1..=16.min(chars.len() / 2) {
        let mut run = 0; // consecutive i with chars[i] == chars[i + p]
        for i in 0..chars.len() - p {
            if chars[i] == chars[i + p] {
                run += 1;
                let reps = run / p + 1;
                if reps > threshold && best.is_none_or(|(_, r, _)| reps > r) {
                    best = Some((p, reps, i + 1 - run));
                }
            } else {
                run = 0;
            }
        }
    }
    best.map(|(p, reps, start)| (chars[start..start + p].iter().collect(), reps, start))
}

/// The signatures of one answer checked on its own.
pub fn detect(answer: &Answer, expect: &Expectation<'_>) -> Vec<Finding> {
    use Signature::*;
    let mut out = Vec::new();
    let mut texts: Vec<(&str, &str)> = vec![("content", answer.content.as_str())];
    if let Some(r) = &answer.reasoning {
        texts.push(("reasoning_content", r.as_str()));
    }
    let mut text_markup = false;
    for (field, text) in &texts {
        if let Some((m, at)) = find_markup(text) {
            text_markup = true;
            out.push(Finding::new(
                MarkupInContent,
                format!("{field}: `{m}` at character {at}"),
            ));
        }
        if let Some(what) = find_unbalanced(text) {
            out.push(Finding::new(UnbalancedTags, format!("{field}: {what}")));
        }
        if let Some((t, at)) = find_special_token(text) {
            out.push(Finding::new(
                SpecialTokenInText,
                format!("{field}: `{t}` at character {at}"),
            ));
        }
        if let Some((unit, reps, at)) = find_repetition(text, expect.repeat_threshold) {
            out.push(Finding::new(
                RepeatedToken,
                format!("{field}: {unit:?} repeated {reps} times from character {at}"),
            ));
        }
    }
    if text_markup && answer.finish_reason.as_deref() == Some("stop") {
        out.push(Finding::new(
            StopWithMarkup,
            "finish_reason \"stop\" with markup in the text",
        ));
    }
    for (i, call) in answer.tool_calls.iter().enumerate() {
        if let Some((m, at)) = find_markup(&call.arguments) {
            out.push(Finding::new(
                MarkupInContent,
                format!("tool call {i} arguments: `{m}` at character {at}"),
            ));
        }
        if let Some(what) = find_unbalanced(&call.arguments) {
            out.push(Finding::new(
                UnbalancedTags,
                format!("tool call {i} arguments: {what}"),
            ));
        }
        let declared = expect.tools.iter().find(|t| t.name == call.name);
        if declared.is_none() {
            out.push(Finding::new(
                UnknownTool,
                format!("tool call {i}: `{}`", call.name),
            ));
        }
        match dsv4_chat::pyjson::parse_value(&call.arguments) {
            Err(e) => out.push(Finding::new(
                InvalidArgumentsJson,
                format!("tool call {i} (`{}`): {e}", call.name),
            )),
            Ok(v) if !v.is_object() => out.push(Finding::new(
                InvalidArgumentsJson,
                format!(
                    "tool call {i} (`{}`): arguments are not a JSON object",
                    call.name
                ),
            )),
            Ok(v) => {
                if let Some(tool) = declared {
                    let broken = schema::violations(&tool.parameters, &v);
                    if !broken.is_empty() {
                        out.push(Finding::new(
                            SchemaViolation,
                            format!("tool call {i} (`{}`): {}", call.name, broken.join("; ")),
                        ));
                    }
                }
            }
        }
        if let Some(named) = expect.named
            && call.name != named
        {
            out.push(Finding::new(
                ToolChoiceViolated,
                format!(
                    "tool_choice named `{named}`, tool call {i} is `{}`",
                    call.name
                ),
            ));
        }
    }
    if (expect.required || expect.named.is_some()) && answer.tool_calls.is_empty() {
        out.push(Finding::new(
            ToolChoiceViolated,
            "tool_choice forced a call; none was made",
        ));
    }
    if answer.finish_reason.as_deref() == Some("length")
        && answer.content.trim().is_empty()
        && answer.tool_calls.is_empty()
        && answer
            .reasoning
            .as_deref()
            .is_none_or(|r| r.trim().is_empty())
    {
        out.push(Finding::new(
            EmptyLength,
            "finish_reason \"length\" with no content",
        ));
    }
    out
}

/// The signature of a request that produced no answer.
pub fn classify_failure(f: &RequestFailure) -> Finding {
    let sig = if f.is_model_output_error() {
        Signature::ServerOutputError
    } else {
        Signature::RequestError
    };
    let status = f.status.map(|s| format!("HTTP {s}: ")).unwrap_or_default();
    Finding::new(sig, format!("{status}{}", f.message))
}

#[cfg(test)]
#[path = "signatures_tests.rs"]
mod tests;

//! The streaming DSML parser: a state machine over the completion text that emits reasoning
//! deltas, content deltas and complete tool calls, holding back only text that could still
//! be the start of a marker (so markers split across any chunk boundary are found).
//!
//! States: reasoning (thinking mode, until `</think>`) → content → a `tool_calls` (or V3.2
//! `function_calls`) block → invoke tag → invoke body → parameter tag → parameter value →
//! ... → after the block → done (after `<｜end▁of▁sentence｜>`). Every decision depends only on
//! the text, never on chunk boundaries; the tests feed every 2- and 3-way split to prove it.

use std::sync::Arc;

use super::arguments::ArgumentStream;
use super::call::{PendingCall, PendingParam};
use super::error::{ErrorClass, ParseError};
use super::tag::{only_name, param_attrs, parse_attrs};
use super::text::{Probe, TextState, probe};
use super::{Event, ParserOptions, ToolCallPiece};
use crate::markers::{
    ASSISTANT, BOS, EOS, FUNCTION_CALLS_END, FUNCTION_CALLS_START, INVOKE_END, INVOKE_START,
    LATEST_REMINDER, PARAMETER_END, PARAMETER_START, THINK_END, THINK_START, TOOL_CALLS_END,
    TOOL_CALLS_START, USER,
};
use crate::tools::ToolSet;

/// Longest accepted opening-tag body (between the tag name and `>`), in bytes.
const MAX_TAG_BYTES: usize = 4096;

/// Which spelling opened the tool-call block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    ToolCalls,
    FunctionCalls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Reasoning,
    Content,
    Block,
    InvokeTag,
    Invoke,
    ParamTag,
    ParamValue,
    AfterBlock,
    Done,
}

/// What a marker does where it is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Eos,
    EndReasoning,
    LeadingThink,
    OpenBlock(BlockKind),
    CloseBlock(BlockKind),
    OpenInvoke,
    CloseInvoke,
    OpenParam,
    CloseParam,
    /// Ends an open construct early; says what came instead.
    Unclosed(&'static str),
    Bad(&'static str),
}

const EOS_WORDS: &str = "the end-of-sentence token";
const DSML_OUTSIDE: &str = "DSML markup outside a tool_calls block";
const SPECIAL_IN_TEXT: &str = "special token in the middle of the text";

/// Markers that matter in free text outside code and quotes (both reasoning and content).
const TEXT_MARKERS: &[(&str, Act)] = &[
    (EOS, Act::Eos),
    (TOOL_CALLS_START, Act::OpenBlock(BlockKind::ToolCalls)),
    (
        FUNCTION_CALLS_START,
        Act::OpenBlock(BlockKind::FunctionCalls),
    ),
    ("<｜DSML｜", Act::Bad(DSML_OUTSIDE)),
    ("</｜DSML｜", Act::Bad(DSML_OUTSIDE)),
    ("｜DSML｜", Act::Bad(DSML_OUTSIDE)),
    (THINK_START, Act::LeadingThink),
    (THINK_END, Act::EndReasoning),
    (BOS, Act::Bad(SPECIAL_IN_TEXT)),
    (USER, Act::Bad(SPECIAL_IN_TEXT)),
    (ASSISTANT, Act::Bad(SPECIAL_IN_TEXT)),
    (LATEST_REMINDER, Act::Bad(SPECIAL_IN_TEXT)),
];
/// Reasoning inside code or quotes: only the end of reasoning and of the sequence count.
const PROTECTED_REASONING_MARKERS: &[(&str, Act)] =
    &[(EOS, Act::Eos), (THINK_END, Act::EndReasoning)];
/// Content inside code or quotes, and verbatim content: only the end of the sequence counts.
const PROTECTED_CONTENT_MARKERS: &[(&str, Act)] = &[(EOS, Act::Eos)];
const BLOCK_MARKERS: &[(&str, Act)] = &[
    (EOS, Act::Unclosed(EOS_WORDS)),
    (INVOKE_START, Act::OpenInvoke),
    (TOOL_CALLS_END, Act::CloseBlock(BlockKind::ToolCalls)),
    (
        FUNCTION_CALLS_END,
        Act::CloseBlock(BlockKind::FunctionCalls),
    ),
];
const INVOKE_MARKERS: &[(&str, Act)] = &[
    (EOS, Act::Unclosed(EOS_WORDS)),
    (PARAMETER_START, Act::OpenParam),
    (INVOKE_END, Act::CloseInvoke),
    (INVOKE_START, Act::Unclosed("a new invoke")),
    (TOOL_CALLS_END, Act::Unclosed("the end of the block")),
    (FUNCTION_CALLS_END, Act::Unclosed("the end of the block")),
];
const TAG_MARKERS: &[(&str, Act)] = &[(EOS, Act::Unclosed(EOS_WORDS))];
const VALUE_MARKERS: &[(&str, Act)] = &[
    (PARAMETER_END, Act::CloseParam),
    (EOS, Act::Unclosed(EOS_WORDS)),
];
const AFTER_BLOCK_MARKERS: &[(&str, Act)] = &[(EOS, Act::Eos)];

/// The strict streaming parser of one completion; create one per request and never share it.
#[derive(Debug)]
pub struct DsmlParser {
    tools: Option<Arc<ToolSet>>,
    /// [`ParserOptions::verbatim_content`].
    verbatim: bool,
    mode: Mode,
    /// Text received but not yet decided (at most a marker prefix between calls).
    pending: String,
    /// Stream offset of `pending[0]`.
    base: usize,
    /// Bytes of an incomplete UTF-8 character from [`DsmlParser::feed_bytes`].
    utf8_tail: Vec<u8>,
    text: TextState,
    /// Newlines at the end of the content, held back: the two before a tool-call block are
    /// the encoder's separator, not content.
    held_newlines: usize,
    block: BlockKind,
    block_start: usize,
    calls_in_block: usize,
    calls_total: usize,
    tag: String,
    tag_quote: bool,
    tag_start: usize,
    call: Option<PendingCall>,
    param: Option<PendingParam>,
    /// The open call's arguments as they are read ([`ParserOptions::stream_arguments`]).
    arguments: Option<ArgumentStream>,
    out: Vec<Event>,
    error: Option<ParseError>,
    finished: bool,
}

impl DsmlParser {
    /// A parser for one completion.
    pub fn new(options: ParserOptions) -> Self {
        Self {
            tools: options.tools,
            verbatim: options.verbatim_content,
            mode: if options.thinking {
                Mode::Reasoning
            } else {
                Mode::Content
            },
            pending: String::new(),
            base: 0,
            utf8_tail: Vec::new(),
            text: TextState::default(),
            held_newlines: 0,
            block: BlockKind::ToolCalls,
            block_start: 0,
            calls_in_block: 0,
            calls_total: 0,
            tag: String::new(),
            tag_quote: false,
            tag_start: 0,
            call: None,
            param: None,
            arguments: options.stream_arguments.then(ArgumentStream::default),
            out: Vec::new(),
            error: None,
            finished: false,
        }
    }

    /// Feeds the next chunk of text; returns the events it completes.
    pub fn feed(&mut self, chunk: &str) -> Result<Vec<Event>, ParseError> {
        self.check_open()?;
        if !self.utf8_tail.is_empty() {
            let at = self.received();
            return self.fail(ParseError::new(
                ErrorClass::Malformed,
                at,
                "text fed while a UTF-8 character from feed_bytes is incomplete",
            ));
        }
        self.pending.push_str(chunk);
        self.run(false)?;
        Ok(std::mem::take(&mut self.out))
    }

    /// Feeds the next chunk of raw bytes; a UTF-8 character split across chunks is buffered,
    /// invalid UTF-8 is a `malformed` error (after the valid text before it was parsed).
    pub fn feed_bytes(&mut self, chunk: &[u8]) -> Result<Vec<Event>, ParseError> {
        self.check_open()?;
        let mut bytes = std::mem::take(&mut self.utf8_tail);
        bytes.extend_from_slice(chunk);
        let (valid, invalid) = match std::str::from_utf8(&bytes) {
            Ok(_) => (bytes.len(), false),
            Err(e) => (e.valid_up_to(), e.error_len().is_some()),
        };
        let (text, tail) = bytes.split_at(valid);
        // `text` is the prefix that was just found to be valid UTF-8.
        self.pending
            .push_str(std::str::from_utf8(text).unwrap_or_default());
        self.run(false)?;
        if invalid {
            let at = self.received();
            return self.fail(ParseError::new(ErrorClass::Malformed, at, "invalid UTF-8"));
        }
        self.utf8_tail = tail.to_vec();
        Ok(std::mem::take(&mut self.out))
    }

    /// Ends the completion: returns the last events, or the error for what is left open.
    pub fn finish(&mut self) -> Result<Vec<Event>, ParseError> {
        self.check_open()?;
        self.run(true)?;
        if !self.utf8_tail.is_empty() {
            let at = self.received() - self.utf8_tail.len();
            return self.fail(ParseError::new(
                ErrorClass::Malformed,
                at,
                "the completion ends inside a UTF-8 character",
            ));
        }
        self.finished = true;
        match self.mode {
            Mode::Reasoning | Mode::AfterBlock | Mode::Done => {}
            Mode::Content => self.flush_newlines(),
            Mode::Block => {
                let at = self.block_start;
                return self.fail(unclosed(at, "the tool_calls block is not closed"));
            }
            Mode::InvokeTag | Mode::Invoke | Mode::ParamTag | Mode::ParamValue => {
                let at = self.call.as_ref().map_or(self.tag_start, |c| c.start);
                return self.fail(unclosed(at, "the invoke is not closed"));
            }
        }
        Ok(std::mem::take(&mut self.out))
    }

    /// Bytes received so far (including undecided and incomplete-character bytes).
    pub fn received(&self) -> usize {
        self.base + self.pending.len() + self.utf8_tail.len()
    }

    fn check_open(&self) -> Result<(), ParseError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.finished {
            return Err(ParseError::new(
                ErrorClass::Malformed,
                self.received(),
                "the parser already finished; use a new parser per completion",
            ));
        }
        Ok(())
    }

    fn fail<T>(&mut self, err: ParseError) -> Result<T, ParseError> {
        self.error = Some(err.clone());
        self.out.clear();
        Err(err)
    }

    /// Consumes as much of `pending` as can be decided; events collect in `out`.
    fn run(&mut self, finishing: bool) -> Result<(), ParseError> {
        let buf = std::mem::take(&mut self.pending);
        let mut pos = 0;
        while pos < buf.len() {
            match self.step(&buf, pos, finishing) {
                Ok(Some(n)) => pos += n,
                Ok(None) => break,
                Err(e) => return self.fail(e),
            }
        }
        self.pending = buf[pos..].to_owned();
        self.base += pos;
        Ok(())
    }

    /// Decides what `buf[pos..]` starts with; `Some(n)`: n bytes were consumed, `None`: wait.
    fn step(&mut self, buf: &str, pos: usize, fin: bool) -> Result<Option<usize>, ParseError> {
        let rest = &buf[pos..];
        let at = self.base + pos;
        let Some(c) = rest.chars().next() else {
            return Ok(None);
        };
        let markers = match self.mode {
            Mode::Reasoning | Mode::Content => {
                if c != '`' {
                    self.text.resolve_ticks();
                }
                match (self.text.protected(), self.mode) {
                    (_, Mode::Content) if self.verbatim => PROTECTED_CONTENT_MARKERS,
                    (false, _) => TEXT_MARKERS,
                    (true, Mode::Reasoning) => PROTECTED_REASONING_MARKERS,
                    (true, _) => PROTECTED_CONTENT_MARKERS,
                }
            }
            Mode::Block => BLOCK_MARKERS,
            Mode::InvokeTag | Mode::ParamTag => TAG_MARKERS,
            Mode::Invoke => INVOKE_MARKERS,
            Mode::ParamValue => VALUE_MARKERS,
            Mode::AfterBlock => AFTER_BLOCK_MARKERS,
            Mode::Done => &[],
        };
        match probe(rest, markers, fin) {
            Probe::Wait => Ok(None),
            Probe::Full(len, act) => {
                self.act(act, at)?;
                Ok(Some(len))
            }
            Probe::Miss => {
                self.take_char(c, at)?;
                Ok(Some(c.len_utf8()))
            }
        }
    }

    /// A character that starts no marker.
    fn take_char(&mut self, c: char, at: usize) -> Result<(), ParseError> {
        match self.mode {
            Mode::Reasoning => {
                self.text.push(c);
                self.push_text(true, c);
            }
            Mode::Content => {
                self.text.push(c);
                if c == '\n' {
                    self.held_newlines += 1;
                } else {
                    self.flush_newlines();
                    self.push_text(false, c);
                }
            }
            Mode::InvokeTag | Mode::ParamTag => {
                if c == '>' && !self.tag_quote {
                    return self.close_tag(at);
                }
                if c == '"' {
                    self.tag_quote = !self.tag_quote;
                }
                self.tag.push(c);
                if self.tag.len() > MAX_TAG_BYTES {
                    return Err(ParseError::new(
                        ErrorClass::Malformed,
                        self.tag_start,
                        format!("tag longer than {MAX_TAG_BYTES} bytes without a closing '>'"),
                    ));
                }
            }
            Mode::ParamValue => {
                if let Some(p) = self.param.as_mut() {
                    p.value.push(c);
                }
                if let Some(a) = self.arguments.as_mut() {
                    let mut piece = String::new();
                    a.value_char(c, &mut piece);
                    self.push_arguments(&piece);
                }
            }
            Mode::Block | Mode::Invoke | Mode::AfterBlock if c.is_whitespace() => {}
            Mode::Block => return Err(bad(at, "unexpected text inside the tool_calls block")),
            Mode::Invoke => return Err(bad(at, "unexpected text inside an invoke")),
            Mode::AfterBlock => return Err(bad(at, "text after the tool_calls block")),
            Mode::Done => return Err(bad(at, "text after the end-of-sentence token")),
        }
        Ok(())
    }

    /// A marker `act` found at stream offset `at`.
    fn act(&mut self, act: Act, at: usize) -> Result<(), ParseError> {
        match act {
            Act::Eos => {
                self.flush_newlines();
                self.mode = Mode::Done;
            }
            Act::EndReasoning if self.mode == Mode::Reasoning => {
                self.mode = Mode::Content;
                self.text = TextState::default();
            }
            Act::EndReasoning => return Err(bad(at, "</think> in the content (after reasoning)")),
            Act::LeadingThink if self.mode == Mode::Reasoning && at == 0 => {}
            Act::LeadingThink => return Err(bad(at, "<think> in the middle of the text")),
            Act::OpenBlock(_) if self.mode == Mode::Reasoning => {
                return Err(bad(
                    at,
                    "tool-call block inside the reasoning (before </think>)",
                ));
            }
            Act::OpenBlock(kind) => {
                let keep = self.held_newlines.saturating_sub(2);
                for _ in 0..keep {
                    self.push_text(false, '\n');
                }
                self.held_newlines = 0;
                self.mode = Mode::Block;
                self.block = kind;
                self.block_start = at;
                self.calls_in_block = 0;
            }
            Act::CloseBlock(kind) if kind != self.block => {
                return Err(bad(
                    at,
                    "the closing tag does not match the block's opening tag",
                ));
            }
            Act::CloseBlock(_) if self.calls_in_block == 0 => {
                return Err(bad(
                    self.block_start,
                    "a tool_calls block without any invoke",
                ));
            }
            Act::CloseBlock(_) => self.mode = Mode::AfterBlock,
            Act::OpenInvoke => self.open_tag(Mode::InvokeTag, at),
            Act::OpenParam => self.open_tag(Mode::ParamTag, at),
            Act::CloseParam => self.close_param()?,
            Act::CloseInvoke => self.close_invoke()?,
            Act::Unclosed(cut) => {
                let (start, what) = match (&self.call, self.mode) {
                    (Some(c), _) => (c.start, "the invoke is not closed"),
                    (None, Mode::InvokeTag) => (self.tag_start, "the invoke tag is not closed"),
                    (None, _) => (self.block_start, "the tool_calls block is not closed"),
                };
                return Err(unclosed(start, format!("{what} before {cut} at byte {at}")));
            }
            Act::Bad(message) => return Err(bad(at, message)),
        }
        Ok(())
    }

    fn open_tag(&mut self, mode: Mode, at: usize) {
        self.mode = mode;
        self.tag.clear();
        self.tag_quote = false;
        self.tag_start = at;
    }

    /// The `>` of an opening tag at stream offset `at`.
    fn close_tag(&mut self, at: usize) -> Result<(), ParseError> {
        let tag_body_at = |offset: usize| self.tag_start + tag_name_len(self.mode) + offset;
        let attrs = parse_attrs(&self.tag).map_err(|(offset, message)| {
            ParseError::new(ErrorClass::Malformed, tag_body_at(offset), message)
        })?;
        if self.mode == Mode::InvokeTag {
            let name = only_name(&attrs, self.tag_start)?;
            if let Some(tools) = self.tools.as_ref().filter(|t| t.get(&name).is_none()) {
                let declared = tools.names().join(", ");
                return Err(ParseError::new(
                    ErrorClass::UnknownTool,
                    self.tag_start,
                    format!("unknown tool `{name}`; the request declares: [{declared}]"),
                ));
            }
            if let Some(a) = self.arguments.as_mut() {
                let first = a.open_invoke();
                let index = self.calls_total;
                let start = ToolCallPiece::Start {
                    index,
                    name: name.clone(),
                };
                self.out.push(Event::ToolCallPiece(start));
                self.push_arguments(first);
            }
            self.call = Some(PendingCall::new(name, self.tag_start));
            self.mode = Mode::Invoke;
        } else {
            let param = param_attrs(&attrs, self.tag_start, tag_body_at)?;
            let call = self
                .call
                .as_ref()
                .ok_or_else(|| bad(self.tag_start, "parameter outside an invoke"))?;
            if call.has_param(&param.0) {
                return Err(ParseError::new(
                    ErrorClass::DuplicateParam,
                    self.tag_start,
                    format!(
                        "parameter `{}` is given twice in the call of `{}`",
                        param.0, call.name
                    ),
                ));
            }
            if let Some(a) = self.arguments.as_mut() {
                let piece = a.open_param(&param.0, param.1);
                self.push_arguments(&piece);
            }
            self.param = Some(PendingParam::new(param.0, param.1, at + 1));
            self.mode = Mode::ParamValue;
        }
        Ok(())
    }

    fn close_param(&mut self) -> Result<(), ParseError> {
        let param = self
            .param
            .take()
            .ok_or_else(|| bad(self.base, "no open parameter"))?;
        let call = self
            .call
            .as_mut()
            .ok_or_else(|| bad(param.value_start, "no open invoke"))?;
        call.push(param)?;
        if let Some(a) = self.arguments.as_mut() {
            let piece = a.close_param();
            self.push_arguments(piece);
        }
        self.mode = Mode::Invoke;
        Ok(())
    }

    fn close_invoke(&mut self) -> Result<(), ParseError> {
        let call = self
            .call
            .take()
            .ok_or_else(|| bad(self.base, "no open invoke"))?;
        let tool_call = call.finish(self.calls_total, self.tools.as_deref())?;
        if let Some(a) = self.arguments.as_ref() {
            let piece = a.close_invoke();
            self.push_arguments(piece);
        }
        self.calls_total += 1;
        self.calls_in_block += 1;
        self.out.push(Event::ToolCall(tool_call));
        self.mode = Mode::Block;
        Ok(())
    }

    fn flush_newlines(&mut self) {
        for _ in 0..std::mem::take(&mut self.held_newlines) {
            self.push_text(false, '\n');
        }
    }

    /// Appends `piece` to the open call's arguments delta.
    fn push_arguments(&mut self, piece: &str) {
        if piece.is_empty() {
            return;
        }
        let index = self.calls_total;
        match self.out.last_mut() {
            Some(Event::ToolCallPiece(ToolCallPiece::Arguments { index: i, text }))
                if *i == index =>
            {
                text.push_str(piece);
            }
            _ => self
                .out
                .push(Event::ToolCallPiece(ToolCallPiece::Arguments {
                    index,
                    text: piece.to_string(),
                })),
        }
    }

    /// Appends `c` to the current reasoning or content delta.
    fn push_text(&mut self, reasoning: bool, c: char) {
        match (self.out.last_mut(), reasoning) {
            (Some(Event::Reasoning(s)), true) | (Some(Event::Content(s)), false) => s.push(c),
            (_, true) => self.out.push(Event::Reasoning(c.to_string())),
            (_, false) => self.out.push(Event::Content(c.to_string())),
        }
    }
}

fn bad(at: usize, message: impl Into<String>) -> ParseError {
    ParseError::new(ErrorClass::Malformed, at, message)
}

fn unclosed(at: usize, message: impl Into<String>) -> ParseError {
    ParseError::new(ErrorClass::UnclosedInvoke, at, message)
}

/// Length of the marker that opened the current tag.
fn tag_name_len(mode: Mode) -> usize {
    if mode == Mode::InvokeTag {
        INVOKE_START.len()
    } else {
        PARAMETER_START.len()
    }
}

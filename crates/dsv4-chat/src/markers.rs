//! DeepSeek-V4 special-token strings and the tiny model's table of 128 special tokens.
//!
//! Where the strings come from: SGLang's `python/sglang/srt/entrypoints/openai/encoding_dsv4.py`
//! ("adapted from the DeepSeek-V4 release reference implementation") for BOS/EOS, `<｜User｜>`,
//! `<｜Assistant｜>`, `<｜latest_reminder｜>`, the task tokens, `<think>`/`</think>`, the `｜DSML｜`
//! tool-call markup and `<tool_result>`; DeepSeek-V3's tokenizer for the padding token, the
//! legacy tool-call markers (`<｜tool▁calls▁begin｜>` …) and the fill-in-the-middle markers;
//! DeepSeek-V3.2's `encoding_dsv32.py` for the `function_calls` block name, which the parser
//! accepts but which is not in the tiny tokenizer's special-token table.
//! The characters are the fullwidth bar ｜ (U+FF5C) and the lower one-eighth block ▁ (U+2581).
//!
//! The DSML tags that carry attributes (`<｜DSML｜invoke name="…">`) are split into a special
//! prefix token (`<｜DSML｜invoke`) and plain text; encoding always prefers the longest marker.

/// Beginning of a sequence (id 0 in every DSV4 tokenizer).
pub const BOS: &str = "<｜begin▁of▁sentence｜>";
/// End of a sequence and of every assistant turn (id 1).
pub const EOS: &str = "<｜end▁of▁sentence｜>";
/// Padding.
pub const PAD: &str = "<｜▁pad▁｜>";
/// Starts a user (or developer) turn.
pub const USER: &str = "<｜User｜>";
/// Starts the assistant's turn.
pub const ASSISTANT: &str = "<｜Assistant｜>";
/// Starts a "latest reminder" message.
pub const LATEST_REMINDER: &str = "<｜latest_reminder｜>";
/// Opens the reasoning part of a thinking-mode answer.
pub const THINK_START: &str = "<think>";
/// Closes the reasoning part (alone, it selects chat mode).
pub const THINK_END: &str = "</think>";
/// The DSML namespace marker used inside tool-call tags.
pub const DSML: &str = "｜DSML｜";
/// Opens a block of tool calls.
pub const TOOL_CALLS_START: &str = "<｜DSML｜tool_calls>";
/// Closes a block of tool calls.
pub const TOOL_CALLS_END: &str = "</｜DSML｜tool_calls>";
/// Opens a block of tool calls in the DeepSeek-V3.2 spelling (accepted by the parser).
pub const FUNCTION_CALLS_START: &str = "<｜DSML｜function_calls>";
/// Closes a V3.2 `function_calls` block.
pub const FUNCTION_CALLS_END: &str = "</｜DSML｜function_calls>";
/// Opens one call; followed by ` name="TOOL">`.
pub const INVOKE_START: &str = "<｜DSML｜invoke";
/// Closes one call.
pub const INVOKE_END: &str = "</｜DSML｜invoke>";
/// Opens one argument; followed by ` name="ARG" string="true|false">`.
pub const PARAMETER_START: &str = "<｜DSML｜parameter";
/// Closes one argument.
pub const PARAMETER_END: &str = "</｜DSML｜parameter>";
/// Opens a tool result inside a user turn.
pub const TOOL_RESULT_START: &str = "<tool_result>";
/// Closes a tool result.
pub const TOOL_RESULT_END: &str = "</tool_result>";
/// Task token: choose an action.
pub const TASK_ACTION: &str = "<｜action｜>";
/// Task token: write a search query.
pub const TASK_QUERY: &str = "<｜query｜>";
/// Task token: judge authority.
pub const TASK_AUTHORITY: &str = "<｜authority｜>";
/// Task token: name the domain.
pub const TASK_DOMAIN: &str = "<｜domain｜>";
/// Task token: write a title.
pub const TASK_TITLE: &str = "<｜title｜>";
/// Task token: read a URL.
pub const TASK_READ_URL: &str = "<｜read_url｜>";
/// Legacy (V3) tool-call markers, kept so their appearance in text is recognisable.
pub const LEGACY_TOOL_MARKERS: [&str; 9] = [
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
];
/// Fill-in-the-middle (DeepSeek's prefix-suffix-middle order: `FIM_BEGIN prefix FIM_HOLE
/// suffix FIM_END`, then the middle is generated): opens the text before the hole.
pub const FIM_BEGIN: &str = "<｜fim▁begin｜>";
/// Fill-in-the-middle: the hole, between the text before it and the text after it.
pub const FIM_HOLE: &str = "<｜fim▁hole｜>";
/// Fill-in-the-middle: ends the text after the hole; the middle follows.
pub const FIM_END: &str = "<｜fim▁end｜>";
/// Fill-in-the-middle markers (V3), in the tiny tokenizer's id order.
pub const FIM_MARKERS: [&str; 3] = [FIM_HOLE, FIM_BEGIN, FIM_END];

/// Number of special tokens in the tiny tokenizer (ids 0..128); bytes follow at 128 + b.
pub const TINY_SPECIAL_COUNT: u32 = 128;

/// The named special tokens in id order (id = index); the tiny tokenizer fills the remaining
/// ids below [`TINY_SPECIAL_COUNT`] with [`reserved`] tokens.
pub fn named_special_tokens() -> Vec<&'static str> {
    let mut v = vec![
        BOS,
        EOS,
        PAD,
        USER,
        ASSISTANT,
        THINK_START,
        THINK_END,
        LATEST_REMINDER,
        DSML,
        TOOL_CALLS_START,
        TOOL_CALLS_END,
        INVOKE_START,
        INVOKE_END,
        PARAMETER_START,
        PARAMETER_END,
        TOOL_RESULT_START,
        TOOL_RESULT_END,
        TASK_ACTION,
        TASK_QUERY,
        TASK_AUTHORITY,
        TASK_DOMAIN,
        TASK_TITLE,
        TASK_READ_URL,
    ];
    v.extend(LEGACY_TOOL_MARKERS);
    v.extend(FIM_MARKERS);
    v
}

/// The reserved special token with id `id`: `<｜reserved_ID｜>`.
pub fn reserved(id: u32) -> String {
    format!("<｜reserved_{id}｜>")
}

/// All [`TINY_SPECIAL_COUNT`] special tokens of the tiny tokenizer, in id order.
pub fn tiny_special_tokens() -> Vec<String> {
    let named = named_special_tokens();
    (0..TINY_SPECIAL_COUNT)
        .map(|id| match named.get(id as usize) {
            Some(s) => (*s).to_owned(),
            None => reserved(id),
        })
        .collect()
}

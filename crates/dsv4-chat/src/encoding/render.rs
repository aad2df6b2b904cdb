//! The DSV4 text templates: the tools section of the system prompt, the response-format
//! section, tool-result blocks, and assistant turns with their DSML tool calls.
//!
//! Template text follows SGLang's `encoding_dsv4.py` (`TOOLS_TEMPLATE`, `REASONING_EFFORT_MAX`,
//! `response_format_template`, `tool_call_template`, `tool_calls_template`,
//! `tool_output_template`, `encode_arguments_to_dsml`) character for character.

use super::{Block, Turn};
use crate::markers::{
    DSML, EOS, INVOKE_END, INVOKE_START, PARAMETER_END, PARAMETER_START, THINK_END, THINK_START,
    TOOL_CALLS_END, TOOL_CALLS_START, TOOL_RESULT_END, TOOL_RESULT_START,
};
use crate::message::{HistoryToolCall, ToolArguments};
use crate::pyjson::OrderedJson;
use crate::tools::ToolSet;

/// The text prepended to the whole prompt in thinking mode with reasoning effort "max".
pub const REASONING_EFFORT_MAX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// The tools section: usage instructions, then one JSON line per tool `function` object
/// (Python `json.dumps` formatting, keys in the order given).
pub fn render_tools(tools: &ToolSet) -> String {
    let schemas: Vec<String> = tools
        .tools()
        .iter()
        .map(|t| t.function().to_python_json())
        .collect();
    let d = DSML;
    let (ts, te) = (THINK_START, THINK_END);
    format!(
        "## Tools\n\n\
You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<{d}tool_calls>\" block like the following:\n\n\
<{d}tool_calls>\n\
<{d}invoke name=\"$TOOL_NAME\">\n\
<{d}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{d}parameter>\n\
...\n\
</{d}invoke>\n\
<{d}invoke name=\"$TOOL_NAME2\">\n\
...\n\
</{d}invoke>\n\
</{d}tool_calls>\n\n\
String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n\
If thinking_mode is enabled (triggered by {ts}), you MUST output your complete reasoning inside {ts}...{te} BEFORE any tool calls or final response.\n\n\
Otherwise, output directly after {te} with tool calls or final response.\n\n\
### Available Tool Schemas\n\n\
{schemas}\n\n\
You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n",
        schemas = schemas.join("\n"),
    )
}

/// Appends the tools and response-format sections of a system or developer turn.
pub(super) fn push_instructions(
    out: &mut String,
    tools: Option<&ToolSet>,
    response_format: Option<&OrderedJson>,
) {
    if let Some(tools) = tools.filter(|t| !t.is_empty()) {
        out.push_str("\n\n");
        out.push_str(&render_tools(tools));
    }
    if let Some(rf) = response_format {
        out.push_str(
            "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n",
        );
        out.push_str(&rf.to_python_json());
    }
}

/// Appends a user turn's blocks, separated by blank lines.
pub(super) fn push_blocks(out: &mut String, blocks: &[Block]) {
    for (i, block) in blocks.iter().enumerate() {
        if i > 0 {
            out.push_str("\n\n");
        }
        match block {
            Block::Text(text) => out.push_str(text),
            Block::ToolResult { content, .. } => {
                out.push_str(TOOL_RESULT_START);
                out.push_str(content);
                out.push_str(TOOL_RESULT_END);
            }
        }
    }
}

/// Appends an assistant turn: `[reasoning</think>]content[\n\n<tool_calls block>]<EOS>`, the
/// EOS left out for a prefix the answer continues.
pub(super) fn push_assistant(out: &mut String, turn: &Turn, show_reasoning: bool) {
    if show_reasoning {
        out.push_str(turn.reasoning.as_deref().unwrap_or(""));
        out.push_str(THINK_END);
    }
    out.push_str(&turn.content);
    if !turn.tool_calls.is_empty() {
        out.push_str("\n\n");
        out.push_str(TOOL_CALLS_START);
        out.push('\n');
        for (i, call) in turn.tool_calls.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            push_invoke(out, call);
        }
        out.push('\n');
        out.push_str(TOOL_CALLS_END);
    }
    if !turn.prefix {
        out.push_str(EOS);
    }
}

/// `<｜DSML｜invoke name="NAME">\n` + one parameter line per argument + `\n</｜DSML｜invoke>`.
fn push_invoke(out: &mut String, call: &HistoryToolCall) {
    out.push_str(INVOKE_START);
    out.push_str(" name=\"");
    out.push_str(&call.name);
    out.push_str("\">\n");
    let raw;
    let fields: &[(String, OrderedJson)] = match &call.arguments {
        ToolArguments::Object(fields) => fields,
        ToolArguments::Raw(text) => {
            raw = [("arguments".to_owned(), OrderedJson::String(text.clone()))];
            &raw
        }
    };
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(PARAMETER_START);
        out.push_str(" name=\"");
        out.push_str(key);
        match value {
            OrderedJson::String(s) => {
                out.push_str("\" string=\"true\">");
                out.push_str(s);
            }
            other => {
                out.push_str("\" string=\"false\">");
                out.push_str(&other.to_python_json());
            }
        }
        out.push_str(PARAMETER_END);
    }
    out.push('\n');
    out.push_str(INVOKE_END);
}

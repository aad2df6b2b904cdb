//! Golden prompts: conversations encoded by hand from the rules of the reference encoder
//! (SGLang `encoding_dsv4.py`), pinned character for character.

use dsv4_chat::{
    Conversation, EncodeOptions, ReasoningEffort, Tokenizer, encode_prompt, encode_prompt_ids,
};

fn encode(json: &str, opts: EncodeOptions) -> String {
    let conv = Conversation::from_json_str(json).expect("conversation parses");
    encode_prompt(&conv, &opts).expect("conversation encodes")
}

fn chat() -> EncodeOptions {
    EncodeOptions::default()
}

fn thinking() -> EncodeOptions {
    EncodeOptions {
        thinking: true,
        ..EncodeOptions::default()
    }
}

const TOOLS_SECTION_HEAD: &str = "## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name=\"$TOOL_NAME\">
<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name=\"$TOOL_NAME2\">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

";

const TOOLS_SECTION_TAIL: &str = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

#[test]
fn single_user_turn_in_chat_mode() {
    let prompt = encode(r#"[{"role": "user", "content": "Hello"}]"#, chat());
    assert_eq!(
        prompt,
        "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜></think>"
    );
}

#[test]
fn thinking_mode_drops_earlier_reasoning() {
    let prompt = encode(
        r#"[{"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
            {"role": "user", "content": "2+2?"}]"#,
        thinking(),
    );
    assert_eq!(
        prompt,
        "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>\
         <｜User｜>2+2?<｜Assistant｜><think>"
    );
    // Without dropping, the earlier turn keeps its reasoning and opens with <think>.
    let kept = encode(
        r#"[{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
            {"role": "user", "content": "2+2?"}]"#,
        EncodeOptions {
            drop_thinking: false,
            ..thinking()
        },
    );
    assert_eq!(
        kept,
        "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>greet</think>Hello!<｜end▁of▁sentence｜>\
         <｜User｜>2+2?<｜Assistant｜><think>"
    );
}

#[test]
fn tools_calls_and_results_in_call_order() {
    let prompt = encode(
        r#"{"tools": [{"type": "function", "function": {"name": "get_weather",
              "description": "Get weather", "parameters": {"type": "object",
              "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
            "messages": [
              {"role": "user", "content": "Weather in Paris and Rome?"},
              {"role": "assistant", "content": "", "reasoning_content": "Two cities.",
               "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                 {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
              {"role": "tool", "tool_call_id": "c2", "content": "18C"},
              {"role": "tool", "tool_call_id": "c1", "content": "21C"}]}"#,
        thinking(),
    );
    let schema = r#"{"name": "get_weather", "description": "Get weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}"#;
    let expected = format!(
        "<｜begin▁of▁sentence｜>\n\n{TOOLS_SECTION_HEAD}{schema}{TOOLS_SECTION_TAIL}\
         <｜User｜>Weather in Paris and Rome?<｜Assistant｜><think>\
         Two cities.</think>\n\n<｜DSML｜tool_calls>\n\
         <｜DSML｜invoke name=\"get_weather\">\n\
         <｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n\
         </｜DSML｜invoke>\n\
         <｜DSML｜invoke name=\"get_weather\">\n\
         <｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n\
         </｜DSML｜invoke>\n\
         </｜DSML｜tool_calls><｜end▁of▁sentence｜>\
         <｜User｜><tool_result>21C</tool_result>\n\n<tool_result>18C</tool_result><｜Assistant｜><think>"
    );
    assert_eq!(prompt, expected);
}

#[test]
fn max_reasoning_effort_prefixes_the_prompt_in_thinking_mode() {
    let json = r#"[{"role": "user", "content": "Prove it."}]"#;
    let max = EncodeOptions {
        reasoning_effort: Some(ReasoningEffort::Max),
        ..thinking()
    };
    assert_eq!(
        encode(json, max),
        "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
         You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, \
         rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
         Explicitly write out your entire deliberation process, documenting every intermediate step, considered \
         alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n\
         <｜User｜>Prove it.<｜Assistant｜><think>"
    );
    let high = EncodeOptions {
        reasoning_effort: Some(ReasoningEffort::High),
        ..thinking()
    };
    assert_eq!(
        encode(json, high),
        "<｜begin▁of▁sentence｜><｜User｜>Prove it.<｜Assistant｜><think>"
    );
    let chat_max = EncodeOptions {
        reasoning_effort: Some(ReasoningEffort::Max),
        ..chat()
    };
    assert_eq!(
        encode(json, chat_max),
        "<｜begin▁of▁sentence｜><｜User｜>Prove it.<｜Assistant｜></think>",
        "effort only applies in thinking mode"
    );
}

#[test]
fn developer_json_arguments_merged_user_and_latest_reminder() {
    let prompt = encode(
        r#"[{"role": "system", "content": "S"},
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function",
              "function": {"name": "calc", "arguments": "{\"x\": 1.5, \"ys\": [1,2], \"opts\": {\"deep\": true}}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "ok"},
            {"role": "user", "content": "thanks"},
            {"role": "latest_reminder", "content": "Today is Monday."}]"#,
        chat(),
    );
    assert_eq!(
        prompt,
        "<｜begin▁of▁sentence｜>S<｜User｜>Be terse.<｜User｜>Q<｜Assistant｜></think>\
         \n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"calc\">\n\
         <｜DSML｜parameter name=\"x\" string=\"false\">1.5</｜DSML｜parameter>\n\
         <｜DSML｜parameter name=\"ys\" string=\"false\">[1, 2]</｜DSML｜parameter>\n\
         <｜DSML｜parameter name=\"opts\" string=\"false\">{\"deep\": true}</｜DSML｜parameter>\n\
         </｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>\
         <｜User｜><tool_result>ok</tool_result>\n\nthanks<｜Assistant｜></think>\
         <｜latest_reminder｜>Today is Monday."
    );
}

#[test]
fn token_ids_come_from_the_tokenizer_without_an_extra_bos() {
    let tok = Tokenizer::tiny().expect("tiny tokenizer");
    let conv = Conversation::from_json_str(r#"[{"role": "user", "content": "Hi"}]"#).unwrap();
    let (prompt, ids) = encode_prompt_ids(&conv, &chat(), &tok).unwrap();
    let user = tok.token_id("<｜User｜>").unwrap();
    let assistant = tok.token_id("<｜Assistant｜>").unwrap();
    let think_end = tok.token_id("</think>").unwrap();
    assert_eq!(
        ids,
        [
            tok.bos_id(),
            user,
            128 + u32::from(b'H'),
            128 + u32::from(b'i'),
            assistant,
            think_end
        ]
    );
    assert_eq!(tok.decode(&ids).unwrap(), prompt);
}

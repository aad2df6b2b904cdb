//! Unit tests of the parser: events, the newline separator, errors and their offsets, and
//! the parser's life cycle.

use std::sync::Arc;

use super::*;
use crate::tools::ToolSet;

fn chat() -> ParserOptions {
    ParserOptions::default()
}

fn thinking() -> ParserOptions {
    ParserOptions {
        thinking: true,
        tools: None,
        verbatim_content: false,
        stream_arguments: false,
    }
}

fn events(text: &str, options: ParserOptions) -> Result<Vec<Event>, ParseError> {
    let mut p = DsmlParser::new(options);
    let mut all = p.feed(text)?;
    all.extend(p.finish()?);
    Ok(all)
}

const CALL: &str = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
    <｜DSML｜parameter name=\"a\" string=\"true\">x \"y\"</｜DSML｜parameter>\n\
    <｜DSML｜parameter name=\"b\" string=\"false\"> [1, {\"c\": null}]\n</｜DSML｜parameter>\n\
    </｜DSML｜invoke>\n</｜DSML｜tool_calls>";

#[test]
fn reasoning_content_and_a_tool_call_in_order() {
    let text = format!("think hard</think>Answer.\n\n{CALL}<｜end▁of▁sentence｜>");
    let ev = events(&text, thinking()).unwrap();
    assert_eq!(
        ev,
        [
            Event::Reasoning("think hard".into()),
            Event::Content("Answer.".into()),
            Event::ToolCall(ToolCall {
                index: 0,
                name: "f".into(),
                arguments: r#"{"a": "x \"y\"", "b": [1, {"c": null}]}"#.into(),
            }),
        ]
    );
}

#[test]
fn only_two_newlines_before_a_block_are_the_separator() {
    let msg = parse_completion(&format!("A\n\n\n{CALL}"), chat()).unwrap();
    assert_eq!(msg.content, "A\n");
    let msg = parse_completion(&format!("{CALL}\n"), chat()).unwrap();
    assert_eq!((msg.content.as_str(), msg.tool_calls.len()), ("", 1));
    let msg = parse_completion("A\n\n<｜end▁of▁sentence｜>", chat()).unwrap();
    assert_eq!(msg.content, "A\n\n", "newlines before EOS are content");
}

#[test]
fn a_leading_think_tag_is_skipped_in_thinking_mode_only() {
    let msg = parse_completion("<think>r</think>c", thinking()).unwrap();
    assert_eq!(
        (msg.reasoning_content.as_deref(), msg.content.as_str()),
        (Some("r"), "c")
    );
    let err = parse_completion("<think>r</think>c", chat()).unwrap_err();
    assert_eq!((err.class, err.offset), (ErrorClass::Malformed, 0));
    let err = parse_completion("r<think></think>", thinking()).unwrap_err();
    assert_eq!((err.class, err.offset), (ErrorClass::Malformed, 1));
}

#[test]
fn truncated_reasoning_is_reasoning_only() {
    let msg = parse_completion("still thinking", thinking()).unwrap();
    assert_eq!(msg.reasoning_content.as_deref(), Some("still thinking"));
    assert_eq!(msg.content, "");
    assert_eq!(msg.to_openai_json()["content"], "");
}

#[test]
fn errors_carry_class_and_offset_of_the_construct() {
    let tools = Arc::new(
        ToolSet::from_json_str(
            r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object",
            "properties":{"a":{"type":"string"},"b":{"type":"array"}},"additionalProperties":false}}}]"#,
        )
        .unwrap(),
    );
    let with_tools = ParserOptions {
        thinking: false,
        tools: Some(tools),
        verbatim_content: false,
        stream_arguments: false,
    };
    assert!(parse_completion(CALL, with_tools.clone()).is_ok());
    let unknown = CALL.replace("name=\"f\"", "name=\"g\"");
    let err = parse_completion(&format!("hi\n\n{unknown}"), with_tools.clone()).unwrap_err();
    let invoke_at = "hi\n\n".len() + "<｜DSML｜tool_calls>\n".len();
    assert_eq!(
        (err.class, err.offset),
        (ErrorClass::UnknownTool, invoke_at)
    );
    let extra = CALL.replace("name=\"b\"", "name=\"z\"");
    let err = parse_completion(&extra, with_tools).unwrap_err();
    assert_eq!(err.class, ErrorClass::SchemaViolation);
    assert_eq!(err.offset, "<｜DSML｜tool_calls>\n".len());
    let err = parse_completion("ok <｜DSML｜invoke name=\"f\">", chat()).unwrap_err();
    assert_eq!((err.class, err.offset), (ErrorClass::Malformed, 3));
}

#[test]
fn a_failed_parser_keeps_failing_and_a_finished_one_refuses_input() {
    let mut p = DsmlParser::new(chat());
    let err = p.feed("a</think>").unwrap_err();
    assert_eq!(p.feed("more").unwrap_err(), err);
    assert_eq!(p.finish().unwrap_err(), err);
    let mut p = DsmlParser::new(chat());
    p.feed("done").unwrap();
    p.finish().unwrap();
    assert_eq!(p.feed("x").unwrap_err().class, ErrorClass::Malformed);
}

#[test]
fn bytes_split_inside_characters_are_buffered() {
    let text = "é🙂<｜end▁of▁sentence｜>";
    let mut p = DsmlParser::new(chat());
    let mut content = String::new();
    for b in text.as_bytes() {
        for e in p.feed_bytes(std::slice::from_ref(b)).unwrap() {
            if let Event::Content(s) = e {
                content.push_str(&s);
            }
        }
    }
    p.finish().unwrap();
    assert_eq!(content, "é🙂");
    let mut p = DsmlParser::new(chat());
    p.feed_bytes(&[b'a', 0xF0, 0x9F]).unwrap();
    let err = p.finish().unwrap_err();
    assert_eq!((err.class, err.offset), (ErrorClass::Malformed, 1));
    let err = parse_completion_chunked(b"ab\xFFcd", 2, chat()).unwrap_err();
    assert_eq!((err.class, err.offset), (ErrorClass::Malformed, 2));
    let mut p = DsmlParser::new(chat());
    p.feed_bytes(&[0xC3]).unwrap();
    assert_eq!(p.feed("x").unwrap_err().class, ErrorClass::Malformed);
}

#[test]
fn the_openai_message_has_string_arguments_and_null_content_for_pure_calls() {
    let msg = parse_completion(CALL, chat()).unwrap();
    let json = msg.to_openai_json();
    assert_eq!(json["content"], serde_json::Value::Null);
    assert_eq!(json["reasoning_content"], serde_json::Value::Null);
    assert_eq!(json["tool_calls"][0]["id"], "call_0");
    assert_eq!(json["tool_calls"][0]["type"], "function");
    let args = json["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    let parsed: serde_json::Value = serde_json::from_str(args).unwrap();
    assert_eq!(
        parsed,
        serde_json::json!({"a": "x \"y\"", "b": [1, {"c": null}]})
    );
    assert_eq!(ErrorClass::from_name("bad_json"), Some(ErrorClass::BadJson));
    assert_eq!(ErrorClass::from_name("nope"), None);
}

fn call_with(value: &str) -> String {
    format!(
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
         <｜DSML｜parameter name=\"n\" string=\"false\">{value}</｜DSML｜parameter>\n\
         </｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
}

fn with_schema(schema: &str) -> ParserOptions {
    let tools = format!(
        r#"[{{"type":"function","function":{{"name":"f","parameters":{{"type":"object",
        "properties":{{"n":{schema}}}}}}}}}]"#
    );
    ParserOptions {
        thinking: false,
        tools: Some(Arc::new(ToolSet::from_json_str(&tools).unwrap())),
        verbatim_content: false,
        stream_arguments: false,
    }
}

#[test]
fn numbers_beyond_a_double_keep_their_digits_and_meet_the_schema_at_its_edge() {
    let long = format!("-{}", "9".repeat(400));
    for value in [
        "1e400",
        "-1E+400",
        "[1.5e999, {\"k\": 2e308}]",
        long.as_str(),
    ] {
        let msg = parse_completion(&call_with(value), chat()).unwrap();
        assert_eq!(msg.tool_calls[0].arguments, format!("{{\"n\": {value}}}"));
    }
    let number = with_schema(r#"{"type":"number"}"#);
    assert!(parse_completion(&call_with("1e400"), number).is_ok());
    for (schema, value) in [
        (r#"{"type":"number","maximum":1e300}"#, "1e400"),
        (r#"{"type":"number","minimum":-1e300}"#, "-1e400"),
        (r#"{"type":"string"}"#, "1e400"),
    ] {
        let err = parse_completion(&call_with(value), with_schema(schema)).unwrap_err();
        assert_eq!(err.class, ErrorClass::SchemaViolation, "{schema} {value}");
    }
}

#[test]
fn only_valid_json_numbers_are_clamped() {
    for value in [
        "01e400", "+1e400", "1.e400", "1e400e1", "1e400 2", "[1e400,]", "\"1e400",
    ] {
        let err = parse_completion(&call_with(value), chat()).unwrap_err();
        assert_eq!(err.class, ErrorClass::BadJson, "{value}");
    }
    let msg = parse_completion(&call_with(r#"["a\"1e400", 1e400]"#), chat()).unwrap();
    assert_eq!(msg.tool_calls[0].arguments, r#"{"n": ["a\"1e400", 1e400]}"#);
    let strings = with_schema(r#"{"type":"array","prefixItems":[{"const":"a\"1e400"}]}"#);
    assert!(parse_completion(&call_with(r#"["a\"1e400", 1e400]"#), strings).is_ok());
}

#[test]
fn verbatim_content_is_taken_as_written_after_the_reasoning() {
    let markup = format!("a</think>b<think> {CALL} <｜User｜>\n\n");
    for thinking in [false, true] {
        let options = ParserOptions {
            thinking,
            tools: None,
            verbatim_content: true,
            stream_arguments: false,
        };
        let text = if thinking {
            format!("why</think>{markup}<｜end▁of▁sentence｜>")
        } else {
            format!("{markup}<｜end▁of▁sentence｜>")
        };
        let msg = parse_completion(&text, options.clone()).unwrap();
        assert_eq!(msg.content, markup, "thinking {thinking}");
        assert!(msg.tool_calls.is_empty());
        assert_eq!(msg.reasoning_content.as_deref(), thinking.then_some("why"));
        for chunk in [1, 2, 3, 7] {
            let chunked = parse_completion_chunked(text.as_bytes(), chunk, options.clone());
            assert_eq!(chunked.unwrap(), msg, "chunks of {chunk}");
        }
        // Nothing may follow the end of the sequence, verbatim or not.
        let err = parse_completion(&format!("{text}x"), options).unwrap_err();
        assert_eq!(err.class, ErrorClass::Malformed);
    }
    // Without the option the same content is markup in the wrong place.
    assert!(parse_completion(&markup, chat()).is_err());
}

#[test]
fn a_streamed_call_that_fails_its_check_errs_after_its_pieces() {
    let options = ParserOptions {
        stream_arguments: true,
        ..chat()
    };
    let mut p = DsmlParser::new(options);
    let (head, tail) = CALL.split_at(CALL.find(" [1").unwrap());
    let sent = p.feed(head).unwrap();
    assert_eq!(
        sent,
        [
            Event::ToolCallPiece(ToolCallPiece::Start {
                index: 0,
                name: "f".into()
            }),
            Event::ToolCallPiece(ToolCallPiece::Arguments {
                index: 0,
                text: r#"{"a": "x \"y\"", "b": "#.into()
            }),
        ]
    );
    // The value turns out not to be strict JSON: the call fails when its parameter closes.
    let err = p.feed(&tail.replace("null", "nil")).unwrap_err();
    assert_eq!(err.class, ErrorClass::BadJson);
}

//! Chunking invariance: every way of splitting a valid completion into 2 and 3 byte chunks
//! (split points anywhere, including inside UTF-8 characters and markers) gives the same
//! events — after joining adjacent deltas of the same kind — as parsing it whole. With
//! `stream_arguments`, each call's streamed pieces make exactly its checked arguments.

use std::sync::Arc;

use dsv4_chat::dsml::ToolCallPiece::{Arguments, Start};
use dsv4_chat::{AssistantMessage, DsmlParser, Event, ParserOptions, ToolSet, parse_completion};

const TOOLS: &str = r#"[{"type":"function","function":{"name":"get_weather","parameters":{
    "type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},
    "required":["city"]}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object"}}}]"#;

fn with_tools(thinking: bool) -> ParserOptions {
    ParserOptions {
        thinking,
        tools: Some(Arc::new(
            ToolSet::from_json_str(TOOLS).expect("tools are valid"),
        )),
        verbatim_content: false,
        stream_arguments: false,
    }
}

/// Valid completions with the events they must produce, kept short: the 3-way splits are
/// quadratic in length.
fn cases() -> Vec<(&'static str, ParserOptions, &'static str)> {
    vec![
        (
            "thinking, content and two calls",
            with_tools(true),
            "Plan: `x`.</think>Sure é.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\
             <｜DSML｜parameter name=\"city\" string=\"true\">Zürich</｜DSML｜parameter>\n\
             <｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n\
             <｜DSML｜invoke name=\"search\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
        ),
        (
            "markup in code and quotes, then a V3.2 block",
            with_tools(false),
            "```\n<｜DSML｜invoke name=\"x\">\n```\nsay \"</think>\" ok\n\n\
             <｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">\n\
             <｜DSML｜parameter name=\"q\" string=\"false\">{\"k\": [1, 2.5]}</｜DSML｜parameter>\n\
             </｜DSML｜invoke>\n</｜DSML｜function_calls>",
        ),
        (
            "plain text with multibyte characters",
            ParserOptions::default(),
            "日本語 🙂 ``<｜User｜>`` done\n\n<｜end▁of▁sentence｜>",
        ),
    ]
}

/// The events of `parts` fed in order, adjacent deltas of one kind joined.
fn run(parts: &[&[u8]], options: &ParserOptions) -> Vec<Event> {
    let mut parser = DsmlParser::new(options.clone());
    let mut out: Vec<Event> = Vec::new();
    let mut add = |events: Vec<Event>| {
        for e in events {
            match (out.last_mut(), e) {
                (Some(Event::Reasoning(a)), Event::Reasoning(b))
                | (Some(Event::Content(a)), Event::Content(b)) => a.push_str(&b),
                (
                    Some(Event::ToolCallPiece(Arguments { index: i, text: a })),
                    Event::ToolCallPiece(Arguments { index: j, text: b }),
                ) if *i == j => a.push_str(&b),
                (_, e) => out.push(e),
            }
        }
    };
    for part in parts {
        add(parser.feed_bytes(part).expect("valid completion"));
    }
    add(parser.finish().expect("valid completion"));
    out
}

#[test]
fn whole_parses_give_the_expected_messages() {
    let (_, opts, text) = &cases()[0];
    let msg = parse_completion(text, opts.clone()).unwrap();
    assert_eq!(msg.reasoning_content.as_deref(), Some("Plan: `x`."));
    assert_eq!(msg.content, "Sure é.");
    assert_eq!(msg.tool_calls.len(), 2);
    assert_eq!(
        msg.tool_calls[0].arguments,
        r#"{"city": "Zürich", "days": 3}"#
    );
    assert_eq!(
        (
            msg.tool_calls[1].name.as_str(),
            msg.tool_calls[1].arguments.as_str()
        ),
        ("search", "{}")
    );

    let (_, opts, text) = &cases()[1];
    let msg = parse_completion(text, opts.clone()).unwrap();
    assert_eq!(
        msg.content,
        "```\n<｜DSML｜invoke name=\"x\">\n```\nsay \"</think>\" ok"
    );
    assert_eq!(msg.tool_calls[0].arguments, r#"{"q": {"k": [1, 2.5]}}"#);

    let (_, opts, text) = &cases()[2];
    let msg = parse_completion(text, opts.clone()).unwrap();
    let expected = AssistantMessage {
        content: "日本語 🙂 ``<｜User｜>`` done\n\n".into(),
        reasoning_content: None,
        tool_calls: vec![],
    };
    assert_eq!(msg, expected);
}

#[test]
fn every_two_way_split_parses_like_the_whole() {
    for (name, opts, text) in cases() {
        let bytes = text.as_bytes();
        let whole = run(&[bytes], &opts);
        for i in 0..=bytes.len() {
            let (a, b) = bytes.split_at(i);
            assert_eq!(run(&[a, b], &opts), whole, "{name}: split at {i}");
        }
    }
}

#[test]
fn every_three_way_split_parses_like_the_whole() {
    for (name, opts, text) in cases() {
        let bytes = text.as_bytes();
        let whole = run(&[bytes], &opts);
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let parts = [&bytes[..i], &bytes[i..j], &bytes[j..]];
                assert_eq!(run(&parts, &opts), whole, "{name}: splits at {i}, {j}");
            }
        }
    }
}

#[test]
fn str_chunks_on_character_boundaries_match_byte_chunks() {
    for (name, opts, text) in cases() {
        let whole = run(&[text.as_bytes()], &opts);
        let mut parser = DsmlParser::new(opts.clone());
        let mut msg = AssistantMessage::new(opts.thinking);
        let mut start = 0;
        for (i, _) in text.char_indices().skip(1).step_by(3) {
            parser
                .feed(&text[start..i])
                .unwrap()
                .into_iter()
                .for_each(|e| msg.apply(e));
            start = i;
        }
        parser
            .feed(&text[start..])
            .unwrap()
            .into_iter()
            .for_each(|e| msg.apply(e));
        parser
            .finish()
            .unwrap()
            .into_iter()
            .for_each(|e| msg.apply(e));
        let mut expected = AssistantMessage::new(opts.thinking);
        whole.into_iter().for_each(|e| expected.apply(e));
        assert_eq!(msg, expected, "{name}");
    }
}

/// Check the streamed calls of `events`: each starts with its tool's name, then pieces that
/// join to the arguments of the checked call that ends it. The events without the pieces.
fn checked_pieces(events: &[Event], name: &str) -> Vec<Event> {
    let mut open: Option<(usize, String, String)> = None;
    let mut rest = Vec::new();
    for e in events {
        match e {
            Event::ToolCallPiece(Start { index, name: tool }) => {
                assert!(open.is_none(), "{name}: a call starts inside another");
                open = Some((*index, tool.clone(), String::new()));
            }
            Event::ToolCallPiece(Arguments { index, text }) => {
                let (i, _, args) = open.as_mut().expect("pieces after a start");
                assert_eq!(i, index, "{name}");
                args.push_str(text);
            }
            Event::ToolCall(call) => {
                let (i, tool, args) = open.take().expect("a streamed call started");
                assert_eq!(
                    (i, &tool, &args),
                    (call.index, &call.name, &call.arguments),
                    "{name}"
                );
                rest.push(e.clone());
            }
            other => rest.push(other.clone()),
        }
    }
    assert!(open.is_none(), "{name}: a call never ended");
    rest
}

#[test]
fn streamed_arguments_make_each_checked_call_however_the_text_is_split() {
    let escapes = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\
        <｜DSML｜parameter name=\"city\" string=\"true\">a \"b\"\\\n🙂</｜DSML｜parameter>\n\
        <｜DSML｜parameter name=\"days\" string=\"false\"> 3 \n</｜DSML｜parameter>\n\
        </｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    let mut all = cases();
    all.push(("escapes and whitespace", with_tools(false), escapes));
    for (name, opts, text) in all {
        let streaming = ParserOptions {
            stream_arguments: true,
            ..opts.clone()
        };
        let bytes = text.as_bytes();
        let whole = run(&[bytes], &streaming);
        assert_eq!(checked_pieces(&whole, name), run(&[bytes], &opts), "{name}");
        for i in 0..=bytes.len() {
            let (a, b) = bytes.split_at(i);
            assert_eq!(run(&[a, b], &streaming), whole, "{name}: split at {i}");
        }
    }
    let msg = parse_completion(escapes, with_tools(false)).unwrap();
    assert_eq!(
        msg.tool_calls[0].arguments,
        "{\"city\": \"a \\\"b\\\"\\\\\\n🙂\", \"days\": 3}"
    );
}

//! Each detector with positive and negative examples, including markers split across chunks.

use super::*;
use crate::answer::ToolCall;
use serde_json::json;

fn tools() -> Vec<DeclaredTool> {
    vec![DeclaredTool {
        name: "read_file".into(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "max_lines": {"type": "integer", "minimum": 1}},
            "required": ["path"],
            "additionalProperties": false
        }),
    }]
}

fn expect(tools: &[DeclaredTool]) -> Expectation<'_> {
    Expectation {
        tools,
        required: false,
        named: None,
        repeat_threshold: 8,
    }
}

fn text(content: &str, finish: &str) -> Answer {
    Answer {
        content: content.into(),
        finish_reason: Some(finish.into()),
        ..Default::default()
    }
}

/// Content assembled from stream deltas, as the client does.
fn chunked(chunks: &[&str], finish: &str) -> Answer {
    text(&chunks.concat(), finish)
}

fn call(name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: "call_1".into(),
        name: name.into(),
        arguments: args.into(),
    }
}

fn kinds(a: &Answer, e: &Expectation<'_>) -> Vec<Signature> {
    let mut v: Vec<Signature> = detect(a, e).into_iter().map(|f| f.signature).collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn clean_answers_have_no_signatures() {
    let t = tools();
    let e = expect(&t);
    for a in [
        text(
            "The file has 3 lines | and a pipe. <b>bold</b> a<|b",
            "stop",
        ),
        text("", "stop"),
        text("ok ok ok ok", "length"),
        Answer {
            tool_calls: vec![call("read_file", r#"{"path": "a.rs", "max_lines": 3}"#)],
            finish_reason: Some("tool_calls".into()),
            ..Default::default()
        },
    ] {
        assert_eq!(detect(&a, &e), vec![], "{a:?}");
    }
}

#[test]
fn markup_in_content_full_width_ascii_mixed_and_split() {
    let t = tools();
    let e = expect(&t);
    for a in [
        text(
            "before <｜DSML｜invoke name=\"x\"> after</｜DSML｜invoke>",
            "length",
        ),
        text("before <|DSML|invoke name=\"x\"></|DSML|invoke>", "length"),
        text("mixed <｜DSML|tool_calls></|DSML｜tool_calls>", "length"),
        chunked(
            &["ok <｜DS", "ML｜invoke name=\"x\">", "</｜DSML｜invoke>"],
            "length",
        ),
        chunked(&["<|DSM", "L|parameter></|DSML|parameter>"], "length"),
        text("<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>", "length"),
        text("<tool_result>x</tool_result>", "length"),
    ] {
        assert!(kinds(&a, &e).contains(&Signature::MarkupInContent), "{a:?}");
    }
    assert!(
        !kinds(&text("DSML is a markup language; ｜ bars ｜", "stop"), &e)
            .contains(&Signature::MarkupInContent)
    );
    let r = Answer {
        reasoning: Some("thinking <|DSML|invoke".into()),
        ..text("", "length")
    };
    assert!(kinds(&r, &e).contains(&Signature::MarkupInContent));
}

#[test]
fn unbalanced_tags_found_and_balanced_pairs_accepted() {
    for bad in [
        "<｜DSML｜invoke name=\"x\">",
        "</｜DSML｜invoke>",
        "<｜DSML｜tool_calls><|DSML|invoke name=\"a\"></|DSML|invoke>",
        "<think> reasoning",
        "</think><think>",
    ] {
        assert!(find_unbalanced(bad).is_some(), "{bad}");
    }
    for good in [
        "",
        "plain",
        "<｜DSML｜tool_calls><｜DSML｜invoke name=\"a\"></|DSML|invoke></｜DSML｜tool_calls>",
        "<think>a</think><think>b</think>",
    ] {
        assert_eq!(find_unbalanced(good), None, "{good}");
    }
    let split = chunked(&["<｜DSML｜inv", "oke name=\"x\">"], "length");
    let t = tools();
    assert!(kinds(&split, &expect(&t)).contains(&Signature::UnbalancedTags));
}

#[test]
fn stop_with_markup_needs_both() {
    let t = tools();
    let e = expect(&t);
    let leaked = text("<|DSML|invoke name=\"read_file\"></|DSML|invoke>", "stop");
    assert!(kinds(&leaked, &e).contains(&Signature::StopWithMarkup));
    let cut = text("<|DSML|invoke name=\"read_file\"></|DSML|invoke>", "length");
    assert!(!kinds(&cut, &e).contains(&Signature::StopWithMarkup));
    assert!(!kinds(&text("clean", "stop"), &e).contains(&Signature::StopWithMarkup));
}

#[test]
fn tool_call_arguments_json_schema_and_names() {
    let t = tools();
    let e = expect(&t);
    let with = |c: ToolCall| Answer {
        tool_calls: vec![c],
        finish_reason: Some("tool_calls".into()),
        ..Default::default()
    };
    let k = |c| kinds(&with(c), &e);
    assert_eq!(
        k(call("read_file", r#"{"path": "a"#)),
        vec![Signature::InvalidArgumentsJson]
    );
    assert_eq!(
        k(call("read_file", "[1, 2]")),
        vec![Signature::InvalidArgumentsJson]
    );
    assert_eq!(k(call("read_file", "{}")), vec![Signature::SchemaViolation]);
    assert_eq!(
        k(call("read_file", r#"{"path": "a", "max_lines": "3"}"#)),
        vec![Signature::SchemaViolation]
    );
    assert_eq!(
        k(call("rm_rf", r#"{"path": "/"}"#)),
        vec![Signature::UnknownTool]
    );
    assert_eq!(k(call("read_file", r#"{"path": "a"}"#)), vec![]);
    // Valid JSON a schema grammar lets through, though beyond a double.
    assert_eq!(
        k(call("read_file", r#"{"path": "a", "max_lines": 1e400}"#)),
        vec![]
    );
    assert_eq!(
        k(call("read_file", r#"{"path": "a", "max_lines": -1e400}"#)),
        vec![Signature::SchemaViolation]
    );
    let leaked = k(call("read_file", r#"{"path": "<|DSML|parameter"}"#));
    assert!(leaked.contains(&Signature::MarkupInContent), "{leaked:?}");
    assert!(leaked.contains(&Signature::UnbalancedTags), "{leaked:?}");
}

#[test]
fn forced_tool_choice_must_be_honoured() {
    let t = tools();
    let mut e = expect(&t);
    e.required = true;
    assert!(kinds(&text("no call", "stop"), &e).contains(&Signature::ToolChoiceViolated));
    e.required = false;
    e.named = Some("search");
    let a = Answer {
        tool_calls: vec![call("read_file", r#"{"path": "a"}"#)],
        ..Default::default()
    };
    assert_eq!(kinds(&a, &e), vec![Signature::ToolChoiceViolated]);
    e.named = Some("read_file");
    assert_eq!(kinds(&a, &e), vec![]);
}

#[test]
fn special_tokens_mid_text() {
    for (s, tok) in [
        ("abc<｜end▁of▁sentence｜>def", "<|end_of_sentence|>"),
        ("x <|im_end|>", "<|im_end|>"),
        ("<｜reserved_77｜>", "<|reserved_77|>"),
        ("a<｜User｜>", "<|User|>"),
    ] {
        assert_eq!(
            find_special_token(s).map(|(t, _)| t),
            Some(tok.to_owned()),
            "{s}"
        );
    }
    let split = chunked(&["abc<｜end▁of", "▁sentence｜>"], "stop");
    let t = tools();
    assert!(kinds(&split, &expect(&t)).contains(&Signature::SpecialTokenInText));
    for s in [
        "a <| b |>",
        "x<|y",
        "<||>",
        "<|DSML|invoke name=\"a\">",
        "<｜tool▁sep｜>",
    ] {
        assert_eq!(find_special_token(s), None, "{s}");
    }
}

#[test]
fn repetition_past_the_threshold_only() {
    assert_eq!(find_repetition(&"a".repeat(8), 8), None);
    let (unit, reps, at) = find_repetition(&format!("xy{}", "a".repeat(9)), 8).unwrap();
    assert_eq!((unit.as_str(), reps, at), ("a", 9, 2));
    let (unit, reps, _) = find_repetition(&"the ".repeat(12), 8).unwrap();
    assert_eq!((unit.as_str(), reps), ("the ", 12));
    assert_eq!(
        find_repetition("the quick brown fox jumps over the lazy dog", 2),
        None
    );
    let t = tools();
    let split = chunked(&["ok", &"!".repeat(5), &"!".repeat(5)], "length");
    assert!(kinds(&split, &expect(&t)).contains(&Signature::RepeatedToken));
}

#[test]
fn empty_length_only_without_anything() {
    let t = tools();
    let e = expect(&t);
    assert_eq!(kinds(&text("", "length"), &e), vec![Signature::EmptyLength]);
    assert_eq!(
        kinds(&text("  \n", "length"), &e),
        vec![Signature::EmptyLength]
    );
    assert_eq!(kinds(&text("", "stop"), &e), vec![]);
    assert_eq!(kinds(&text("some", "length"), &e), vec![]);
    let thinking = Answer {
        reasoning: Some("thought".into()),
        ..text("", "length")
    };
    assert_eq!(kinds(&thinking, &e), vec![]);
}

#[test]
fn failures_split_into_server_output_errors_and_request_errors() {
    let f = |t: Option<&str>| RequestFailure {
        status: Some(500),
        error_type: t.map(str::to_owned),
        message: "boom".into(),
        e2el: 0.1,
    };
    assert_eq!(
        classify_failure(&f(Some("model_output_error"))).signature,
        Signature::ServerOutputError
    );
    assert_eq!(
        classify_failure(&f(Some("server_error"))).signature,
        Signature::RequestError
    );
    assert_eq!(
        classify_failure(&f(None)).signature,
        Signature::RequestError
    );
}

#[test]
fn answers_differ_by_text_calls_and_finish_but_not_ids_or_timing() {
    let a = Answer {
        content: "hello".into(),
        tool_calls: vec![call("read_file", "{}")],
        finish_reason: Some("stop".into()),
        e2el: 1.0,
        ..Default::default()
    };
    let mut b = a.clone();
    b.e2el = 2.0;
    b.tool_calls[0].id = "call_2".into();
    b.stream = true;
    assert_eq!(a.difference(&b), None);
    b.content = "help".into();
    assert!(a.difference(&b).unwrap().contains("character 3"));
    let mut c = a.clone();
    c.tool_calls[0].arguments = "{ }".into();
    assert!(a.difference(&c).unwrap().contains("arguments"));
    let mut d = a.clone();
    d.finish_reason = Some("length".into());
    assert!(a.difference(&d).unwrap().contains("finish_reason"));
    // Log-probabilities are compared bit for bit when both answers carry them.
    let with = |lp: Vec<f64>| Answer {
        logprobs: lp,
        ..a.clone()
    };
    let e = with(vec![-0.5, -1.0]);
    assert_eq!(e.difference(&with(vec![-0.5, -1.0])), None);
    assert_eq!(e.difference(&a), None, "one answer without logprobs");
    let moved = e.difference(&with(vec![-0.5, -1.000_000_1])).unwrap();
    assert!(moved.contains("logprob of token 1"), "{moved}");
    assert!(
        e.difference(&with(vec![-0.5]))
            .unwrap()
            .contains("2 token logprobs vs 1")
    );
    assert!(e.difference(&with(vec![-0.5, f64::NAN])).is_some());
}

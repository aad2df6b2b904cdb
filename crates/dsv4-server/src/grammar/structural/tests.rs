//! Structural tags through the real compiler over the tiny vocabulary (one token per byte):
//! the texts each format allows and refuses, random-logit answers that stay in the format,
//! the request shapes, and the formats refused.

use super::*;
use crate::grammar::tests::{Now, compiler, generate_biased};
use crate::grammar::{GrammarCompiler, Target};
use crate::vocab::Vocab;
use dsv4_chat::{Tokenizer, ToolSet};
use dsv4_engine::Constraint;
use serde_json::json;
use std::sync::Arc;

fn format(v: Value) -> Format {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

fn compile(g: &Arc<GrammarCompiler>, f: &Format) -> Result<Constraint, String> {
    g.constraint_now(Target::Structural(f), &ToolSet::default(), false)
}

/// Whether `c` allows exactly `text`, then the end of the sequence.
fn accepts(c: &Constraint, vocab: &Vocab, text: &str) -> bool {
    let tok = Tokenizer::tiny().unwrap();
    let mut state = c.0.start();
    let allowed = |state: &mut Box<dyn dsv4_engine::ConstraintState>, id: u32| {
        let mut row = vec![0.0f32; vocab.len()];
        state.mask(&mut row).is_ok() && row[id as usize] == 0.0
    };
    for id in tok.encode(text).unwrap() {
        if !allowed(&mut state, id) || state.advance(id).is_err() {
            return false;
        }
    }
    allowed(&mut state, tok.eos_id())
}

/// Asserts that `f` allows every `yes` and none of the `no`.
fn check(f: Value, yes: &[&str], no: &[&str]) {
    let (g, vocab) = compiler();
    let f = format(f);
    let c = compile(&g, &f).unwrap_or_else(|e| panic!("{e}: {f:?}"));
    for t in yes {
        assert!(accepts(&c, &vocab, t), "{t:?} refused by {f:?}");
    }
    for t in no {
        assert!(!accepts(&c, &vocab, t), "{t:?} allowed by {f:?}");
    }
}

fn weather() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
           "required": ["city"], "additionalProperties": false})
}

#[test]
fn triggered_tags_let_free_text_through_and_enforce_every_tag() {
    let tags = json!([
        {"type": "tag", "begin": "<function=get_weather>",
         "content": {"type": "json_schema", "json_schema": weather()}, "end": "</function>"},
        {"begin": "<function=now>", "content": {"type": "json_schema", "json_schema": {"type": "object"}},
         "end": "</function>"}
    ]);
    let w = r#"<function=get_weather>{"city": "Oslo"}</function>"#;
    check(
        json!({"type": "triggered_tags", "triggers": ["<function="], "tags": tags}),
        &[
            "",
            "plain text, no call",
            w,
            &format!("Let me look. {w} Done."),
            &format!("a < b <function {w}{w}"),
            r#"x<function=now>{}</function>y<function=get_weather>{"city": "Paris"}</function>"#,
        ],
        &[
            "<function=",
            "<function=other>{}</function>",
            r#"<function=get_weather>{"city": "Rome"}</function>"#,
            r#"<function=get_weather>{"city": "Oslo"}"#,
            r#"<function=get_weather>{"city": "Oslo"}</fun>"#,
        ],
    );
    // at_least_one: a tag first; stop_after_first: nothing after it.
    check(
        json!({"type": "triggered_tags", "triggers": ["<function="], "tags": tags,
               "at_least_one": true}),
        &[w, &format!("{w} and then {w}")],
        &["", "text first", &format!("text first {w}")],
    );
    check(
        json!({"type": "triggered_tags", "triggers": ["<function="], "tags": tags,
               "stop_after_first": true}),
        &["", "only text", w, &format!("text then {w}")],
        &[&format!("{w} more"), &format!("{w}{w}")],
    );
    check(
        json!({"type": "triggered_tags", "triggers": ["<function="], "tags": tags,
               "excludes": ["FORBIDDEN"]}),
        &["fine", w],
        &["FORBIDDEN", &format!("{w} FORBIDDEN")],
    );
}

#[test]
fn tags_sequences_and_free_text_inside_a_tag() {
    // Free text as a tag's content runs up to the first end string.
    let think = json!({"type": "tag", "begin": "<reason>", "content": {"type": "any_text"},
                       "end": "</reason>"});
    check(
        json!({"type": "sequence", "elements": [
            think,
            {"type": "const_string", "value": "Answer: "},
            {"type": "regex", "pattern": "[0-9]{1,3}"}
        ]}),
        &[
            "<reason></reason>Answer: 7",
            "<reason>a < b, 2 > 1\n</reason>Answer: 42",
        ],
        &[
            "<reason>x</reason></reason>Answer: 7",
            "<reason>x</reason>Answer: ",
            "<reason>x</reason>Answer: 1234",
            "Answer: 7",
        ],
    );
    // Several ends; excludes inside; free text ending the answer.
    check(
        json!({"type": "sequence", "elements": [
            {"type": "tag", "begin": "[", "content": {"type": "any_text", "excludes": ["!"]},
             "end": ["]", ")"]},
            {"type": "any_text"}
        ]}),
        &["[a)", "[a]tail", "[]", "[x] and anything ] ! after"],
        &["[a!]", "(a)", "[a"],
    );
    // max_chars counts characters, not bytes; 0 allows nothing.
    check(
        json!({"type": "sequence", "elements": [
            {"type": "tag", "begin": "<r>", "content": {"type": "any_text", "max_chars": 3},
             "end": "</r>"},
            {"type": "any_text", "max_chars": 2}
        ]}),
        &["<r></r>", "<r>abc</r>", "<r>ééé</r>ab", "<r>a</r>é"],
        &["<r>abcd</r>", "<r>a</r>abc"],
    );
    check(
        json!({"type": "sequence", "elements": [
            {"type": "tag", "begin": "<r>", "content": {"type": "any_text", "max_chars": 0},
             "end": "</r>"},
            {"type": "any_text", "max_chars": 0}
        ]}),
        &["<r></r>"],
        &["<r>a</r>", "<r></r>a"],
    );
    // Triggered tags inside a tag end at the tag's end.
    check(
        json!({"type": "tag", "begin": "<calls>", "end": "</calls>", "content": {
            "type": "triggered_tags", "triggers": ["<f="],
            "tags": [{"begin": "<f=a>", "content": {"type": "regex", "pattern": "[0-9]+"},
                      "end": "</f>"}]}}),
        &[
            "<calls></calls>",
            "<calls>x <f=a>12</f> y</calls>",
            "<calls><f=a>1</f><f=a>2</f></calls>",
        ],
        &[
            "<calls><f=b>1</f></calls>",
            "<calls>x</calls>y",
            "<calls><f=a>x</f></calls>",
        ],
    );
    // A grammar (GBNF) and an `or` whose alternatives end differently.
    check(
        json!({"type": "tag", "begin": "<v>", "end": "</v>", "content": {"type": "or", "elements": [
            {"type": "grammar", "grammar": "root ::= \"yes\" | \"no\""},
            {"type": "any_text", "excludes": ["y"]}
        ]}}),
        &["<v>yes</v>", "<v>no</v>", "<v>not sure</v>", "<v></v>"],
        &["<v>yesno</v>", "<v>only yes</v>"],
    );
}

#[test]
fn repetitions_options_and_separated_tags() {
    let item = json!({"type": "tag", "begin": "<i>", "end": "</i>",
                      "content": {"type": "json_schema", "json_schema": {"type": "integer"}}});
    check(
        json!({"type": "tags_with_separator", "tags": [item], "separator": ","}),
        &["", "<i>1</i>", "<i>1</i>,<i>-20</i>,<i>3</i>"],
        &["<i>1</i><i>2</i>", "<i>1</i>,", "<i>x</i>"],
    );
    check(
        json!({"type": "tags_with_separator", "tags": [item], "separator": ",",
               "at_least_one": true, "stop_after_first": true}),
        &["<i>5</i>"],
        &["", "<i>1</i>,<i>2</i>"],
    );
    let ab = json!({"type": "or", "elements": [{"type": "const_string", "value": "a"},
                                               {"type": "const_string", "value": "b"}]});
    check(
        json!({"type": "sequence", "elements": [
            {"type": "optional", "content": {"type": "const_string", "value": "-"}},
            {"type": "repeat", "min": 2, "max": 3, "content": ab},
            {"type": "star", "content": {"type": "const_string", "value": "!"}},
            {"type": "plus", "content": {"type": "const_string", "value": "."}}
        ]}),
        &["ab.", "-bab!!..", "aaa."],
        &["a.", "abab.", "ab", "--ab."],
    );
    check(
        json!({"type": "repeat", "min": 1, "max": -1, "content": {"type": "const_string", "value": "x"}}),
        &["x", "xxxxxxxx"],
        &[""],
    );
    // The largest count compiles.
    check(
        json!({"type": "repeat", "min": 0, "max": 10_000, "content": {"type": "const_string", "value": "xy"}}),
        &["", "xyxy"],
        &["x"],
    );
}

#[test]
fn answers_from_random_logits_follow_the_legacy_shape() {
    let (g, vocab) = compiler();
    let tag: StructuralTag = serde_json::from_value(json!({
        "structures": [{"begin": "<function=get_weather>", "schema": weather(), "end": "</function>"},
                       {"begin": "<function=now>", "end": "</function>",
                        "schema": {"type": "object", "additionalProperties": false}}],
        "triggers": ["<function="], "at_least_one": true
    }))
    .unwrap();
    let f = tag.resolve().unwrap();
    let eos = Tokenizer::tiny().unwrap().eos_id();
    for thinking in [false, true] {
        let c = g
            .constraint_now(Target::Structural(&f), &ToolSet::default(), thinking)
            .unwrap();
        for seed in 0..6 {
            let bytes = generate_biased(&c, &vocab, seed, 3000, |step, row| {
                if step > 200 {
                    row[eos as usize] += 10.0;
                }
            });
            let text = String::from_utf8(bytes).unwrap();
            let answer = if thinking {
                let end = Tokenizer::tiny()
                    .unwrap()
                    .decode(&[Tokenizer::tiny()
                        .unwrap()
                        .token_id(dsv4_chat::markers::THINK_END)
                        .unwrap()])
                    .unwrap();
                text.split_once(&end).unwrap().1.to_string()
            } else {
                text.clone()
            };
            let rest = answer
                .strip_prefix("<function=")
                .unwrap_or_else(|| panic!("seed {seed}: {answer:?}"));
            let (name, rest) = rest.split_once('>').unwrap();
            // The arguments: the first prefix before a `</function>` that is JSON.
            let args: Value = rest
                .match_indices("</function>")
                .find_map(|(i, _)| serde_json::from_str(&rest[..i]).ok())
                .unwrap_or_else(|| panic!("no JSON then </function>: {answer:?}"));
            match name {
                "get_weather" => {
                    assert!(["Oslo", "Paris"].contains(&args["city"].as_str().unwrap()))
                }
                "now" => {}
                other => panic!("called {other}: {answer:?}"),
            }
        }
    }
}

#[test]
fn request_shapes_parse_and_unsupported_formats_are_named() {
    // The legacy shape is one triggered_tags format; `format` is taken as given.
    let legacy: StructuralTag = serde_json::from_value(json!({
        "structures": [{"begin": "<a>", "schema": {"type": "integer"}, "end": "</a>"}],
        "triggers": ["<a"]
    }))
    .unwrap();
    assert!(
        matches!(legacy.resolve().unwrap(), Format::TriggeredTags { tags, .. } if tags.len() == 1)
    );
    let both: StructuralTag = serde_json::from_value(json!({
        "format": {"type": "any_text"}, "triggers": ["<a"]
    }))
    .unwrap();
    assert!(both.resolve().unwrap_err().contains("either `format`"));
    for (bad, says) in [
        (
            json!({"type": "token", "token": 5}),
            "unknown variant `token`",
        ),
        (
            json!({"type": "dispatch", "rules": []}),
            "unknown variant `dispatch`",
        ),
        (
            json!({"type": "const_string", "value": "a", "extra": 1}),
            "unknown field `extra`",
        ),
        (
            json!({"type": "tag", "begin": {"type": "token"}, "content": {"type": "any_text"}, "end": "x"}),
            "expected a string",
        ),
    ] {
        let e = serde_json::from_value::<Format>(bad.clone())
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    // Formats the grammar cannot express are refused with where they are.
    let (g, _) = compiler();
    for (f, says) in [
        (
            json!({"type": "sequence", "elements": [{"type": "any_text"}, {"type": "const_string", "value": "x"}]}),
            "format.elements[0]: free text",
        ),
        (
            json!({"type": "star", "content": {"type": "any_text"}}),
            "format.content: free text",
        ),
        (
            json!({"type": "triggered_tags", "triggers": ["<f="],
                   "tags": [{"begin": "<g>", "content": {"type": "any_text"}, "end": "</g>"}]}),
            "does not start with any of the triggers",
        ),
        (
            json!({"type": "any_text", "max_tokens": 10}),
            "max_tokens is not supported",
        ),
        (
            json!({"type": "any_text", "max_chars": 2_000_000}),
            "max_chars goes up to",
        ),
        (
            json!({"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}),
            "style \"qwen_xml\"",
        ),
        (
            json!({"type": "repeat", "min": 3, "max": 2, "content": {"type": "const_string", "value": "x"}}),
            "at least min 3",
        ),
        (
            json!({"type": "repeat", "min": 0, "max": 4_000_000_000u64, "content": {"type": "const_string", "value": "x"}}),
            "up to 10000",
        ),
        (
            json!({"type": "tag", "begin": "<a>", "content": {"type": "grammar", "grammar": "root ::= missing"}, "end": "</a>"}),
            "format.content: GBNF",
        ),
        (json!({"type": "regex", "pattern": "(a"}), "regex"),
        (
            // Grammars inside a structural tag count toward the 64 KiB of request grammar.
            json!({"type": "tag", "begin": "<a>", "end": "</a>", "content": {"type": "or", "elements": [
                {"type": "grammar", "grammar": format!("root ::= \"{}\"", "a".repeat(40_000))},
                {"type": "regex", "pattern": "b".repeat(30_000)}
            ]}}),
            "at most 65536 bytes",
        ),
    ] {
        let e = compile(&g, &format(f.clone()))
            .err()
            .unwrap_or_else(|| panic!("{f} compiles"));
        assert!(e.contains(says), "{f}: {e}");
    }
}

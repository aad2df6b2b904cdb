//! Grammars over the tiny vocabulary, driven by random logits (a stand-in for the random tiny
//! model): every completion they allow must parse as a valid DSML block or JSON value.

use super::*;
use crate::vocab::Vocab;
use dsv4_chat::{ParserOptions, parse_completion};
use std::sync::Arc;

fn compiler() -> (GrammarCompiler, Vocab) {
    let tok = Tokenizer::tiny().unwrap();
    let vocab = Vocab::new(&tok, tok.vocab_size()).unwrap();
    let env = vocab.tok_env(tok.clone());
    (GrammarCompiler::new(&env, tok).unwrap(), vocab)
}

const TOOLS: &str = r#"[
  {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {
      "city": {"type": "string", "enum": ["Oslo", "Paris"]},
      "days": {"type": "integer", "minimum": 1, "maximum": 7},
      "note": {"type": "string", "description": "free text"}
    },
    "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
]"#;

/// Sample greedily from seeded random logits under `c` until EOS (or `limit` tokens); the
/// completion's bytes.
fn generate(c: &dsv4_engine::Constraint, vocab: &Vocab, seed: u64, limit: usize) -> Vec<u8> {
    let mut rng = dsv4_core::SplitMix64::new(seed);
    let mut state = c.0.start();
    let mut out = Vec::new();
    let eos = Tokenizer::tiny().unwrap().eos_id();
    for _ in 0..limit {
        let mut row: Vec<f32> = (0..vocab.len()).map(|_| rng.next_f64() as f32).collect();
        state.mask(&mut row).unwrap();
        let tok = dsv4_engine::sampling::argmax(&row);
        assert!(
            row[tok as usize] > f32::NEG_INFINITY,
            "some token is allowed"
        );
        if tok == eos {
            return out;
        }
        state.advance(tok).unwrap();
        out.extend_from_slice(vocab.bytes(tok));
    }
    panic!(
        "no EOS within {limit} tokens: {:?}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn required_tool_calls_always_parse_and_satisfy_the_schemas() {
    let (g, vocab) = compiler();
    let tools = Arc::new(ToolSet::from_json_str(TOOLS).unwrap());
    for (thinking, parallel) in [(false, true), (false, false), (true, true)] {
        let c = g
            .constraint(
                Target::ToolCalls {
                    only: None,
                    parallel,
                },
                &tools,
                thinking,
            )
            .unwrap();
        let mut names = std::collections::BTreeSet::new();
        for seed in 0..12 {
            let text = String::from_utf8(generate(&c, &vocab, seed, 4000)).unwrap();
            let opts = ParserOptions {
                thinking,
                tools: Some(Arc::clone(&tools)),
            };
            let msg = parse_completion(&text, opts).unwrap_or_else(|e| panic!("{e:?} in {text:?}"));
            let calls = &msg.tool_calls;
            assert!(!calls.is_empty(), "{text:?}");
            if !parallel {
                assert_eq!(calls.len(), 1, "{text:?}");
            }
            names.extend(calls.iter().map(|c| c.name.clone()));
            if !thinking {
                assert!(text.starts_with(markers::TOOL_CALLS_START), "{text:?}");
            }
        }
        assert_eq!(
            names.len(),
            2,
            "both tools get called across seeds: {names:?}"
        );
    }
}

#[test]
fn a_named_tool_choice_calls_only_that_tool() {
    let (g, vocab) = compiler();
    let tools = Arc::new(ToolSet::from_json_str(TOOLS).unwrap());
    let c = g
        .constraint(
            Target::ToolCalls {
                only: Some("get_weather"),
                parallel: false,
            },
            &tools,
            false,
        )
        .unwrap();
    for seed in 0..6 {
        let text = String::from_utf8(generate(&c, &vocab, seed, 4000)).unwrap();
        let msg = parse_completion(
            &text,
            ParserOptions {
                thinking: false,
                tools: Some(Arc::clone(&tools)),
            },
        )
        .unwrap();
        let calls = &msg.tool_calls;
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        let args: serde_json::Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert!(
            ["Oslo", "Paris"].contains(&args["city"].as_str().unwrap()),
            "{args}"
        );
    }
}

#[test]
fn json_schema_answers_are_valid_json_of_the_schema() {
    let (g, vocab) = compiler();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 99}},
        "required": ["ok", "n"],
        "additionalProperties": false
    });
    let c = g
        .constraint(Target::Json(&schema), &ToolSet::default(), false)
        .unwrap();
    for seed in 0..8 {
        let text = String::from_utf8(generate(&c, &vocab, seed, 2000)).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(
            v["ok"].is_boolean() && v["n"].as_i64().unwrap() <= 99,
            "{v}"
        );
        assert_eq!(v.as_object().unwrap().len(), 2);
    }
}

#[test]
fn schemas_a_grammar_cannot_follow_are_refused_with_the_reason() {
    let (g, _) = compiler();
    let tools = ToolSet::from_json_str(
        r#"[{"type": "function", "function": {"name": "f", "parameters": {"anyOf": [{"type": "object"}]}}}]"#,
    )
    .unwrap();
    let e = g
        .constraint(
            Target::ToolCalls {
                only: None,
                parallel: true,
            },
            &tools,
            false,
        )
        .err()
        .unwrap();
    assert!(e.contains("anyOf"), "{e}");
    let bad = serde_json::json!({"type": "object", "properties": {"a": {"type": "nonsense"}}});
    assert!(
        g.constraint(Target::Json(&bad), &ToolSet::default(), false)
            .is_err()
    );
}

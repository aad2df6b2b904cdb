//! Grammars over the tiny vocabulary, driven by random logits (a stand-in for the random tiny
//! model): every completion they allow must parse as a valid DSML block or JSON value. How and
//! when grammars are compiled: [`compiling`].

use super::*;
use crate::vocab::Vocab;
use dsv4_chat::{ParserOptions, parse_completion};
use std::sync::Arc;

mod compiling;

pub(crate) fn compiler() -> (Arc<GrammarCompiler>, Vocab) {
    compiler_caching(crate::config::DEFAULT_GRAMMAR_CACHE)
}

/// A compiler over the tiny vocabulary keeping `cached` grammars, and the vocabulary.
fn compiler_caching(cached: usize) -> (Arc<GrammarCompiler>, Vocab) {
    let tok = Tokenizer::tiny().unwrap();
    let vocab = Vocab::new(&tok, tok.vocab_size()).unwrap();
    let env = vocab.tok_env(tok.clone());
    (
        Arc::new(GrammarCompiler::new(&env, tok, cached).unwrap()),
        vocab,
    )
}

/// A single-threaded runtime (timers on) for driving compiles.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// [`GrammarCompiler::constraint`], waited for on a runtime of its own.
pub(crate) trait Now {
    fn constraint_now(
        &self,
        target: Target<'_>,
        tools: &ToolSet,
        thinking: bool,
    ) -> Result<Constraint, String>;
}

impl Now for Arc<GrammarCompiler> {
    fn constraint_now(
        &self,
        target: Target<'_>,
        tools: &ToolSet,
        thinking: bool,
    ) -> Result<Constraint, String> {
        runtime().block_on(self.constraint(target, tools, thinking))
    }
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
pub(crate) fn generate(
    c: &dsv4_engine::Constraint,
    vocab: &Vocab,
    seed: u64,
    limit: usize,
) -> Vec<u8> {
    generate_biased(c, vocab, seed, limit, |_, _| {})
}

/// [`generate`], with `bias(step, row)` applied to each row of random logits before the mask.
pub(crate) fn generate_biased(
    c: &dsv4_engine::Constraint,
    vocab: &Vocab,
    seed: u64,
    limit: usize,
    bias: impl Fn(usize, &mut [f32]),
) -> Vec<u8> {
    let mut rng = dsv4_core::SplitMix64::new(seed);
    let mut state = c.0.start();
    let mut out = Vec::new();
    let eos = Tokenizer::tiny().unwrap().eos_id();
    for step in 0..limit {
        let mut row: Vec<f32> = (0..vocab.len()).map(|_| rng.next_f64() as f32).collect();
        bias(step, &mut row);
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
            .constraint_now(
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
                verbatim_content: false,
                stream_arguments: false,
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
        .constraint_now(
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
                verbatim_content: false,
                stream_arguments: false,
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
        .constraint_now(compact_json(&schema), &ToolSet::default(), false)
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

/// A JSON target: compact, with Python's separators.
fn compact_json(schema: &serde_json::Value) -> Target<'_> {
    Target::Json {
        schema,
        whitespace: None,
    }
}

#[test]
fn a_whitespace_pattern_governs_the_whitespace_between_json_tokens() {
    let (g, vocab) = compiler();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "list": {"type": "array", "items": {"type": "integer"}}},
        "required": ["ok", "list"],
        "additionalProperties": false
    });
    let spaces: Vec<usize> = (0..vocab.len() as u32)
        .filter(|&t| matches!(vocab.bytes(t), b" " | b"\n" | b"\t"))
        .map(|t| t as usize)
        .collect();
    assert_eq!(spaces.len(), 3, "the tiny vocabulary spells each byte");
    // Whitespace is favoured wherever the grammar allows it.
    let favour = |_: usize, row: &mut [f32]| spaces.iter().for_each(|&t| row[t] += 1.0);
    let json = |text: &[u8]| -> serde_json::Value {
        let text = std::str::from_utf8(text).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v["ok"].is_boolean() && v["list"].is_array(), "{v}");
        v
    };
    for (pattern, allowed) in [
        (r"[\n ]{0,2}", &b"\n "[..]),
        (" ?", &b" "[..]),
        ("", &b""[..]),
    ] {
        let target = Target::Json {
            schema: &schema,
            whitespace: Some(pattern),
        };
        let c = g
            .constraint_now(target, &ToolSet::default(), false)
            .unwrap();
        let mut seen = Vec::new();
        for seed in 0..6 {
            let text = generate_biased(&c, &vocab, seed, 4000, favour);
            json(&text);
            let ws: Vec<u8> = text
                .iter()
                .copied()
                .filter(|b| b.is_ascii_whitespace())
                .collect();
            assert!(
                ws.iter().all(|b| allowed.contains(b)),
                "{pattern:?}: {:?}",
                String::from_utf8_lossy(&text)
            );
            // No run longer than the pattern allows.
            let longest = text
                .split(|b| !b.is_ascii_whitespace())
                .map(<[u8]>::len)
                .max()
                .unwrap_or(0);
            assert!(
                longest <= 2,
                "{pattern:?}: {:?}",
                String::from_utf8_lossy(&text)
            );
            seen.extend(ws);
        }
        for b in allowed {
            assert!(
                seen.contains(b),
                "{pattern:?}: {:?} never written",
                *b as char
            );
        }
    }
    // Without a pattern the answer is compact with Python's separators.
    let c = g
        .constraint_now(compact_json(&schema), &ToolSet::default(), false)
        .unwrap();
    let text = generate_biased(&c, &vocab, 0, 4000, favour);
    json(&text);
    let text = String::from_utf8(text).unwrap();
    let python = dsv4_chat::pyjson::OrderedJson::parse(&text)
        .unwrap()
        .to_python_json();
    assert_eq!(text, python, "compact");
}

#[test]
fn schemas_a_grammar_cannot_follow_are_refused_with_the_reason() {
    let (g, _) = compiler();
    let tools = ToolSet::from_json_str(
        r#"[{"type": "function", "function": {"name": "f", "parameters": {"anyOf": [{"type": "object"}]}}}]"#,
    )
    .unwrap();
    let e = g
        .constraint_now(
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
        g.constraint_now(compact_json(&bad), &ToolSet::default(), false)
            .is_err()
    );
}

#[test]
fn regex_choice_and_grammar_answers_stay_in_their_language_also_after_reasoning() {
    let (g, vocab) = compiler();
    let choices = ["alpha".to_string(), "beta".into(), "alphabet".into()];
    let gbnf = "root ::= item (\",\" item){0,2}\nitem ::= [a-c] | \"xy\"";
    let lark = "start: item (\",\" item){0,2}\nitem: /[a-c]/ | \"xy\"";
    let item = "(?:[a-c]|xy)";
    let item_list = format!("{item}(?:,{item}){{0,2}}");
    let cases = [
        (
            Target::Regex("[0-9]{2}-[a-z]{1,3}"),
            "[0-9]{2}-[a-z]{1,3}".to_string(),
        ),
        (Target::Choice(&choices), "alpha|beta|alphabet".to_string()),
        (Target::Grammar(gbnf), item_list.clone()),
        (Target::Grammar(lark), item_list),
    ];
    let think_end = Tokenizer::tiny()
        .unwrap()
        .decode(&[Tokenizer::tiny()
            .unwrap()
            .token_id(markers::THINK_END)
            .unwrap()])
        .unwrap();
    for (target, rx) in cases {
        let whole = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
        for thinking in [false, true] {
            let c = g
                .constraint_now(target, &ToolSet::default(), thinking)
                .unwrap();
            for seed in 0..6 {
                let text = String::from_utf8(generate(&c, &vocab, seed, 3000)).unwrap();
                let answer = if thinking {
                    let (reasoning, answer) = text
                        .split_once(&think_end)
                        .unwrap_or_else(|| panic!("{target:?}: no {think_end}: {text:?}"));
                    assert!(!reasoning.contains('<'), "{reasoning:?}");
                    answer
                } else {
                    &text
                };
                assert!(whole.is_match(answer), "{target:?} seed {seed}: {answer:?}");
            }
        }
    }
}

#[test]
fn request_grammars_that_cannot_compile_are_refused_not_fatal() {
    let (g, _) = compiler();
    for (target, says) in [
        (Target::Regex("(a"), "regex"),
        (Target::Grammar("start: missing"), "missing"),
        (Target::Grammar("root ::= missing"), "missing"),
        (Target::Grammar("start: \"a\"\nstart: \"b\""), "start"),
    ] {
        let e = g
            .constraint_now(target, &ToolSet::default(), false)
            .err()
            .unwrap_or_else(|| panic!("{target:?} compiles"));
        assert!(e.to_lowercase().contains(says), "{target:?}: {e}");
    }
    // A Lark grammar as deep as the size limit allows (a chain of rules, compiled recursively
    // by llguidance) compiles without overflowing the stack.
    let depth = MAX_GRAMMAR_BYTES / 24;
    let chain: String = (0..depth)
        .map(|i| format!("r{i}: \"x\" r{}?\n", i + 1))
        .chain(std::iter::once(format!("r{depth}: \"y\"\n")))
        .collect();
    let lark = format!("start: r0\n{chain}");
    let gbnf = format!("root ::= r0\n{}", chain.replace(':', " ::="));
    for chain in [lark, gbnf] {
        assert!(chain.len() <= MAX_GRAMMAR_BYTES, "{}", chain.len());
        let compiled = g.constraint_now(Target::Grammar(&chain), &ToolSet::default(), false);
        assert!(compiled.is_ok(), "{:?}", compiled.err());
    }
    let long = "a".repeat(MAX_GRAMMAR_BYTES + 1);
    let e = g
        .constraint_now(Target::Regex(&long), &ToolSet::default(), false)
        .err()
        .unwrap();
    assert!(e.contains("at most 65536 bytes"), "{e}");
}

#[test]
fn strict_tools_in_auto_mode_allow_content_or_calls_that_always_parse() {
    let (g, vocab) = compiler();
    // A strict tool, and a non-strict one whose schema no DSML grammar could enforce.
    let tools = r#"[
      {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]},
                       "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "log", "parameters": {"anyOf": [{"type": "object"}]}}}
    ]"#;
    let tools = Arc::new(ToolSet::from_json_str(tools).unwrap());
    for thinking in [false, true] {
        let c = g
            .constraint_now(Target::ContentOrCalls { parallel: true }, &tools, thinking)
            .unwrap();
        let tok = Tokenizer::tiny().unwrap();
        let block = tok.token_id(markers::TOOL_CALLS_START).unwrap() as usize;
        let newline = tok.encode("\n").unwrap()[0] as usize;
        let (mut with_calls, mut content_only, mut both) = (0, 0, 0);
        for seed in 0..16 {
            // Odd seeds: after some content, favour a newline and then the block, so that
            // content followed by calls is exercised (random logits alone rarely get there).
            let text = generate_biased(&c, &vocab, seed, 6000, |step, row| {
                if seed % 2 == 1 && step >= 24 {
                    row[block] += 1.0;
                    row[newline] += 0.3;
                }
            });
            let text = String::from_utf8(text).unwrap();
            let opts = ParserOptions {
                thinking,
                tools: Some(Arc::clone(&tools)),
                verbatim_content: false,
                stream_arguments: false,
            };
            let msg = parse_completion(&text, opts).unwrap_or_else(|e| panic!("{e:?} in {text:?}"));
            if msg.tool_calls.is_empty() {
                content_only += 1;
            } else {
                with_calls += 1;
                both += usize::from(!msg.content.is_empty());
            }
            for call in msg.tool_calls.iter().filter(|c| c.name == "get_weather") {
                let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap();
                assert!(
                    ["Oslo", "Paris"].contains(&args["city"].as_str().unwrap()),
                    "{args}"
                );
                assert!((1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");
            }
        }
        assert!(
            with_calls > 0 && content_only > 0 && both > 0,
            "thinking {thinking}: {with_calls} answers with calls ({both} after content), \
             {content_only} without"
        );
    }
    // A strict tool's schema must be one the grammar can enforce.
    let bad = ToolSet::from_json_str(
        r#"[{"type": "function", "function": {"name": "f", "strict": true,
             "parameters": {"anyOf": [{"type": "object"}]}}}]"#,
    )
    .unwrap();
    let e = g
        .constraint_now(Target::ContentOrCalls { parallel: true }, &bad, false)
        .err()
        .unwrap();
    assert!(e.contains("`f`") && e.contains("anyOf"), "{e}");
}

#[test]
fn text_that_spells_special_tokens_is_written_with_ordinary_tokens() {
    // The tokenizer reads `</think>` and the DSML block start as special tokens; a grammar
    // that forces their text must still be followed (once a 400 grammar_failed).
    let (g, vocab) = compiler();
    let block = dsv4_chat::markers::TOOL_CALLS_START;
    let none = ToolSet::default();
    let regex = format!("a</think>b{}", regex::escape(block));
    let choices = [format!("x{block}"), "</think>".to_string()];
    for target in [Target::Regex(&regex), Target::Choice(&choices)] {
        let c = g.constraint_now(target, &none, false).unwrap();
        for seed in 0..4 {
            let text = String::from_utf8(generate(&c, &vocab, seed, 200)).unwrap();
            let ok = match target {
                Target::Regex(_) => text == format!("a</think>b{block}"),
                _ => choices.contains(&text),
            };
            assert!(ok, "{target:?}: {text:?}");
        }
    }
}

#[test]
fn choices_with_control_characters_compile_and_are_kept_whole() {
    // DEL must be escaped in a Lark literal; llguidance's lexer refuses it raw.
    let (g, vocab) = compiler();
    let choices = ["a\u{7f}b".to_string(), "tab\there".to_string()];
    let c = g
        .constraint_now(Target::Choice(&choices), &ToolSet::default(), false)
        .unwrap();
    for seed in 0..4 {
        let text = String::from_utf8(generate(&c, &vocab, seed, 100)).unwrap();
        assert!(choices.contains(&text), "{text:?}");
    }
}

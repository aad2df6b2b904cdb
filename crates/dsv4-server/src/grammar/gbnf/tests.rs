//! GBNF grammars converted to Lark and run through llguidance over the tiny vocabulary (one
//! token per byte), and the converter's errors.

use super::*;
use crate::vocab::Vocab;
use dsv4_chat::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};

/// A matcher for the Lark grammar `lark`; panics if llguidance refuses it.
fn matcher(lark: &str) -> (Matcher, Tokenizer) {
    let tok = Tokenizer::tiny().unwrap();
    let vocab = Vocab::new(&tok, tok.vocab_size()).unwrap();
    let env = vocab.tok_env(tok.clone());
    let mut factory = ParserFactory::new_simple(&env).unwrap();
    factory.quiet();
    let parser = factory
        .create_parser(TopLevelGrammar::from_lark(lark.to_string()))
        .unwrap_or_else(|e| panic!("llguidance refuses {lark}: {e}"));
    let m = Matcher::new(Ok(parser));
    assert!(m.get_error().is_none(), "{:?} in {lark}", m.get_error());
    (m, tok)
}

/// Whether the GBNF grammar `gbnf` accepts exactly `text`.
fn accepts(gbnf: &str, text: &str) -> bool {
    let lark = gbnf_to_lark(gbnf).unwrap_or_else(|e| panic!("{e} in {gbnf}"));
    let (mut m, tok) = matcher(&lark);
    let ids = tok.encode(text).unwrap();
    m.consume_tokens(&ids).is_ok() && m.is_accepting().unwrap_or(false)
}

/// Asserts that `gbnf` accepts every `yes` and none of the `no`.
fn check(gbnf: &str, yes: &[&str], no: &[&str]) {
    for t in yes {
        assert!(accepts(gbnf, t), "{t:?} rejected by {gbnf}");
    }
    for t in no {
        assert!(!accepts(gbnf, t), "{t:?} accepted by {gbnf}");
    }
}

/// The error of converting `gbnf`.
fn error(gbnf: &str) -> String {
    match gbnf_to_lark(gbnf) {
        Ok(lark) => panic!("{gbnf:?} converted to {lark}"),
        Err(e) => e,
    }
}

/// llama.cpp's grammars/json.gbnf.
const JSON: &str = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;

#[test]
fn json_gbnf() {
    check(
        JSON,
        &[
            r#"{"a": [1, 2.5e3, "x\"y"], "b": null}"#,
            "{}",
            "{\"k\":\n  true}",
            r#"{"u": "\u00e9 é"}"#,
        ],
        &[
            r#"{"a": }"#,
            r#"{"a": 01}"#,
            "[1]",
            r#"{"a": "x"#,
            "{\"a\": \"\x01\"}",
        ],
    );
}

#[test]
fn arithmetic_over_multiline_rules() {
    let g = "root ::= expr\n\
             expr ::= term\n    ((\"+\" | \"-\") term)*\n\
             term ::= factor\n    ((\"*\" | \"/\")\n     factor)*\n\
             factor ::= number\n  | \"(\" expr \")\"\n\
             number ::= [0-9]+\n";
    check(
        g,
        &["1", "1+2*(3-4)/5", "((7))"],
        &["", "1+", "(1", "1)", "1 + 2"],
    );
}

#[test]
fn choice_accepts_exactly_its_words_and_keeps_them_whole() {
    let g = r#"root ::= "yes" | "no""#;
    check(g, &["yes", "no"], &["", "y", "yesno", "maybe", "no "]);
    let lark = gbnf_to_lark(g).unwrap();
    assert_eq!(lark, "start: g_root\ng_root: \"yes\" | \"no\"\n");
}

#[test]
fn repetitions() {
    check(r#"root ::= "a"{2,3}"#, &["aa", "aaa"], &["", "a", "aaaa"]);
    check(r#"root ::= "a"{2}"#, &["aa"], &["a", "aaa"]);
    check(r#"root ::= "a"{2,}"#, &["aa", "aaaaa"], &["", "a"]);
    check(r#"root ::= "a"{,2}"#, &["", "a", "aa"], &["aaa"]);
    check(r#"root ::= "a"{ 0 } "b""#, &["b"], &["ab"]);
    check(
        r#"root ::= x{1,2} [ab]{2}  x ::= "x""#,
        &["xab", "xxba"],
        &["ab", "xxxab", "xa"],
    );
    check(
        r#"root ::= ("ab" | "c"){2,}"#,
        &["abc", "cc", "ababab"],
        &["ab", "aba"],
    );
    check(
        r#"root ::= ("a" "b"?)*? "c"+"#,
        &["c", "aabcc"],
        &["", "bc"],
    );
}

#[test]
fn classes_dot_and_escapes() {
    check(r#"root ::= [^abc]+"#, &["xyz", "é\n"], &["", "xay"]);
    check(
        r#"root ::= "<" . ">""#,
        &["<\n>", "<é>", "<<>"],
        &["<>", "<ab>"],
    );
    check(r#"root ::= [^]"#, &["q"], &["", "qq"]);
    check(
        r#"root ::= "\x41\u00e9\n\t\\\"" [\x41-\x43] [\u00e9] [\n] "\U0001F600""#,
        &["Aé\n\t\\\"Bé\n😀"],
        &["Aé\n\t\\\"Dé\n😀"],
    );
    // Rust-regex class operators and Lark's `/` are plain members in GBNF.
    check(
        r#"root ::= [/&&x^~~[\]\-\-]+ [ab-]"#,
        &["/&x^~[]-a", "&&--~~-"],
        &["a", "/&x^~[]-c", "y-"],
    );
    check(r#"root ::= [-a]"#, &["-", "a"], &["b"]);
    // Control characters and DEL survive in literals.
    check("root ::= \"\\x00\\x7f\\x1b\"", &["\0\u{7f}\u{1b}"], &["\0"]);
}

#[test]
fn comments_and_empty_alternatives() {
    let g = "# leading comment\nroot ::= \"a\" # trailing \"b\"\n  \"c\" | # [x]\n";
    check(g, &["ac", ""], &["abc", "a"]);
    check(r#"root ::= "a" () "b" | "" "#, &["ab", ""], &["a"]);
}

#[test]
fn names_map_without_collisions() {
    let g = r#"
        root ::= my-rule x.y Foo foo a-b a_b R2 r2_2
        my-rule ::= "1"
        x.y ::= "2"
        Foo ::= "3"
        foo ::= "4"
        a-b ::= "5"
        a_b ::= "6"
        R2 ::= "7"
        r2_2 ::= "8"
        r2 ::= "9"
    "#;
    check(g, &["12345678"], &["12335678", "1234567"]);
    let lark = gbnf_to_lark(g).unwrap();
    for rule in [
        "g_foo:", "g_foo_2:", "g_a_b:", "g_a_b_2:", "g_r2:", "g_r2_2:", "g_r2_3:",
    ] {
        assert!(lark.contains(&format!("\n{rule} ")), "{rule} in {lark}");
    }
}

#[test]
fn prefix_literals_keep_gbnf_semantics() {
    check(
        r#"root ::= ("a" | "ab") "bc""#,
        &["abc", "abbc"],
        &["ab", "abcc"],
    );
    check(
        r#"root ::= [a-z]* "end""#,
        &["end", "xend", "endend"],
        &["en"],
    );
    check(
        r#"root ::= ("do" | "done")+ "!""#,
        &["done!", "dodo!", "dodone!"],
        &["don!"],
    );
}

#[test]
fn deep_groups_are_hoisted_into_rules() {
    let depth = 200;
    let mut g = String::from("\"end\"");
    for i in 0..depth {
        g = format!("(\"x{i}\" | {g})");
    }
    let g = format!("root ::= {g}");
    check(&g, &["end", "x0", "x150", "x199"], &["x200", ""]);
    assert!(gbnf_to_lark(&g).unwrap().contains("\naux_0: "));
    let mut g = "\"a\"".to_string();
    for _ in 0..120 {
        g = format!("({g})*");
    }
    check(&format!("root ::= {g}"), &["", "aaa"], &["b"]);
}

#[test]
fn errors_name_the_line_and_column() {
    assert_eq!(error(r#"foo ::= "a""#), "the grammar has no `root` rule");
    assert_eq!(
        error("root ::= \"a\"\n  value\n"),
        "line 2, column 3: rule `value` is not defined"
    );
    assert_eq!(
        error("root ::= x\nx ::= \"a\"\nx ::= \"b\""),
        "line 3, column 1: rule `x` is defined twice (first at line 2)"
    );
    assert_eq!(
        error(r#"root ::= "abc"#),
        "line 1, column 10: unterminated string literal"
    );
    assert!(error("root ::= [abc").starts_with("line 1, column 10: unterminated character class"));
    assert!(error(r#"root ::= ("a""#).contains("column 10: `(` without a matching `)`"));
    assert!(error(r#"root ::= "a")"#).contains("column 13: `)` without a matching `(`"));
    assert!(error(r#"root ::= "a"{3,2}"#).contains("column 13: bad repetition"));
    assert!(error(r#"root ::= "a"{10001}"#).contains("too large"));
    assert!(error(r#"root ::= "a"{}"#).contains("bad repetition"));
    assert!(
        error(r#"root ::= "a" (= "b")"#).contains("lookahead assertions `(= …)` are not supported")
    );
    assert_eq!(
        error(r#"root ::= "a" @"#),
        "line 1, column 14: unexpected character '@'"
    );
    assert!(error(r#"root ::= * "a""#).contains("a repetition must follow an item"));
    assert!(error(r#"root ::= ::= "a""#).contains("unexpected `::=`"));
    assert!(error(r#""a" root ::= "a""#).contains("expected a rule definition"));
    assert!(error(r#"root ::= "\q""#).contains("unknown escape `\\q`"));
    assert!(error(r#"root ::= "\uD800""#).contains("not a Unicode scalar value"));
    assert!(error(r#"root ::= "\x4""#).contains("needs 2 hex digits"));
    assert!(error("root ::= []").contains("empty character class"));
    assert!(error("root ::= [z-a]").contains("reversed"));
    assert_eq!(error(""), "the grammar has no rules");
    assert_eq!(error("  # only a comment\n"), "the grammar has no rules");
}

#[test]
fn pathological_input_is_an_error_not_a_crash() {
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(10_000), ")".repeat(10_000));
    assert!(error(&deep).contains("nested deeper than 256"));
    let open = format!("root ::= {}", "(".repeat(10_000));
    assert!(error(&open).contains("nested deeper than 256"));
    let stacked = format!("root ::= \"a\"{}", "*".repeat(10_000));
    assert!(error(&stacked).contains("nested deeper than 256"));
    let tall = format!("root ::= {}\"a\"{}", "(".repeat(200), ")*****".repeat(200));
    assert!(error(&tall).contains("nested deeper than 256"));
    // Every prefix of a real grammar either converts to Lark that llguidance takes, or fails
    // cleanly.
    let chars: Vec<char> = JSON.chars().collect();
    for n in 0..=chars.len() {
        let src: String = chars[..n].iter().collect();
        if let Ok(lark) = gbnf_to_lark(&src) {
            matcher(&lark);
        }
    }
    for n in 0..chars.len() {
        let src: String = chars[..n].iter().chain(&chars[n + 1..]).collect();
        if let Ok(lark) = gbnf_to_lark(&src) {
            matcher(&lark);
        }
    }
}

#[test]
fn is_gbnf_tells_gbnf_from_lark() {
    assert!(is_gbnf(r#"root ::= "a""#));
    assert!(is_gbnf("# c\n\n  root::=\"a\""));
    assert!(is_gbnf(JSON));
    assert!(is_gbnf("start: x\nmy-rule.v2 ::= \"a\""));
    assert!(!is_gbnf(r#"start: "a ::= b""#));
    assert!(!is_gbnf("start: x\n    | /a ::= b/\nx: \"::=\""));
    assert!(!is_gbnf("start: x\n// y ::= z\n# w ::= v\nx: %json {}"));
    assert!(!is_gbnf(""));
}

/// `root` calling a chain of `n` rules, each through `groups` nested groups.
fn chain(n: usize, groups: usize) -> String {
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        let call = format!(
            "{}\"a\" r{}{}",
            "(".repeat(groups),
            i + 1,
            ")".repeat(groups)
        );
        g.push_str(&format!("r{i} ::= \"b\" | {call}\n"));
    }
    g + &format!("r{n} ::= \"c\"\n")
}

#[test]
fn compile_recursion_is_bounded() {
    // llguidance compiles rules recursively: a long chain of rules would overflow its stack.
    let deep = format!("{}c", "a".repeat(250));
    check(&chain(250, 0), &["b", "aab", &deep], &["a", "ac"]);
    let deep = format!("{}c", "a".repeat(25));
    check(&chain(25, 10), &["b", "aab", &deep], &["a", "ac"]);
    let e = error(&chain(8000, 0));
    assert!(
        e.starts_with("line 5461, column 21:") && e.contains("nest too deeply"),
        "{e}"
    );
    assert!(error(&chain(2000, 10)).contains("nest too deeply"));
}

#[test]
fn only_literals_that_could_be_cut_short_are_split() {
    let split = |lits: &[&str], classes: &str, any: bool| {
        let mut t = split::Terminals {
            any,
            ..Default::default()
        };
        t.literals = lits.iter().map(|s| s.to_string()).collect();
        if let Ok(toks) = lex::lex(classes) {
            for tok in toks {
                if let lex::Tok::Class(c) = tok.tok {
                    t.classes.push(c);
                }
            }
        }
        let mut out: Vec<String> = t.literals_to_split().into_iter().collect();
        out.sort();
        out
    };
    assert_eq!(split(&["yes", "no", "", "n"], "[xz]", false), ["no"]);
    assert_eq!(
        split(&["true", "false", "{"], "[^\"\\\\a-s]", false),
        ["true"]
    );
    assert_eq!(split(&["xy", "ab"], "[^x]", false), ["ab"]);
    assert_eq!(split(&["xy", "é!"], "[^\\x00-\\x7f]", false), ["é!"]);
    assert!(split(&["xy", "é!"], "[^\\x00-\\xff]", false).is_empty());
    assert_eq!(split(&["xy", "ab"], "", true), ["ab", "xy"]);
    // "a" cuts "ab" short; the split "ab" adds "b", which cuts "bc", which adds "c"...
    assert_eq!(
        split(&["a", "ab", "bc", "cd", "xy"], "", false),
        ["ab", "bc", "cd"]
    );
    // "ab" cuts "abc" short; the split "abc" adds the terminal "a", which cuts "ab" short.
    assert_eq!(
        split(&["abc", "ab", "abd", "xy"], "", false),
        ["ab", "abc", "abd"]
    );
}

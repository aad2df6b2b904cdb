//! Structured outputs beyond JSON: a regular expression, a list of choices, or a grammar (GBNF
//! or Lark), however it is spelled (vLLM's `structured_outputs`, SGLang's `regex`/`ebnf`,
//! `/generate`'s sampling parameters), on chat (plain, streamed, thinking), text completions
//! and `/generate`; and the requests that cannot be enforced, refused naming the field.

use crate::common::{TestServer, chat, config, start};
use regex::Regex;
use serde_json::{Value, json};

/// Numbers 0–99 in parentheses, one to four of them, as GBNF.
const TUPLE_GBNF: &str = r#"# a tuple of small numbers
root ::= "(" num ( "," num ){0,3} ")"
num  ::= [0-9] | [1-9] [0-9]
"#;

/// The same language in Lark.
const TUPLE_LARK: &str = r#"start: "(" num ("," num){0,3} ")"
num: /[0-9]/ | /[1-9][0-9]/
"#;

/// The same language as a regular expression.
const TUPLE_RX: &str = r"\((?:[0-9]|[1-9][0-9])(?:,(?:[0-9]|[1-9][0-9])){0,3}\)";

/// A word, a dash and two digits.
const WORD_RX: &str = "[a-z]{3,8}-[0-9]{2}";

/// Whether `text` matches `rx` whole.
fn matches(rx: &str, text: &str) -> bool {
    Regex::new(&format!("^(?:{rx})$")).unwrap().is_match(text)
}

/// A chat answer's content and finish reason, plain or assembled from its stream (both must
/// agree; the stream's is returned).
async fn chat_content(s: &TestServer, body: &Value) -> (String, String) {
    let r = s.send("POST", "/v1/chat/completions", body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    let plain = choice["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = s.send("POST", "/v1/chat/completions", &streamed).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (mut text, mut finish) = (String::new(), String::new());
    for e in r.events().iter().filter(|e| e.is_object()) {
        for c in e["choices"].as_array().unwrap() {
            text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    assert_eq!(text, plain, "the stream spells the answer: {body}");
    assert_eq!(finish, choice["finish_reason"], "{body}");
    (text, finish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_constrains_chat_plain_streamed_and_thinking() {
    let s = start(config()).await;
    let ask = |extra: Value| {
        let mut body = chat(
            "Answer in the asked shape",
            json!({"max_tokens": 64, "stop": []}),
        );
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    // Each language, spelled two ways: the same grammar gives the same greedy answer.
    let spellings = [
        (
            WORD_RX,
            json!({"regex": WORD_RX}),
            json!({"structured_outputs": {"regex": WORD_RX}}),
        ),
        (
            TUPLE_RX,
            json!({"ebnf": TUPLE_GBNF}),
            json!({"structured_outputs": {"grammar": TUPLE_LARK}}),
        ),
        (
            TUPLE_RX,
            json!({"structured_outputs": {"grammar": TUPLE_GBNF}}),
            json!({"regex": TUPLE_RX}),
        ),
        (
            "red|green|blue",
            json!({"structured_outputs": {"choice": ["red", "green", "blue"]}}),
            json!({"regex": "red|green|blue"}),
        ),
    ];
    for (rx, one, other) in spellings {
        let (a, finish) = chat_content(&s, &ask(one.clone())).await;
        assert!(matches(rx, &a), "{one}: {a:?} does not match {rx}");
        assert_eq!(finish, "stop", "{one}: the grammar ends the answer");
        let (b, _) = chat_content(&s, &ask(other.clone())).await;
        assert_eq!(a, b, "{one} and {other} are one language");
    }
    // Sampled answers follow the grammar too, each choice its own way.
    let mut sampled = ask(json!({"ebnf": TUPLE_GBNF, "n": 4, "temperature": 1.0, "seed": 11}));
    sampled["max_tokens"] = json!(64);
    let r = s.send("POST", "/v1/chat/completions", &sampled).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let answers: Vec<String> = r.json()["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap().to_string())
        .collect();
    for a in &answers {
        assert!(matches(TUPLE_RX, a), "{a:?}");
    }
    // JSON with vLLM's whitespace pattern: still JSON of the schema, whitespace only as given.
    let spaced = ask(json!({"structured_outputs": {
        "json": {"type": "object", "properties": {"n": {"type": "array", "items": {"type": "integer"}}},
                 "required": ["n"], "additionalProperties": false},
        "whitespace_pattern": "[ \n]{0,2}"}, "max_tokens": 200}));
    let (a, finish) = chat_content(&s, &spaced).await;
    let v: Value = serde_json::from_str(&a).unwrap_or_else(|e| panic!("{e}: {a:?}"));
    assert!(v["n"].is_array(), "{a:?}");
    assert!(!a.contains(['\t', '\r']), "{a:?}");
    assert_eq!(finish, "stop", "{a:?}");
    // In thinking mode the reasoning is free; the answer after it is constrained.
    let think = ask(json!({
        "structured_outputs": {"choice": ["yes", "no"]},
        "chat_template_kwargs": {"thinking": true},
        "max_tokens": 3000,
    }));
    let r = s.send("POST", "/v1/chat/completions", &think).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let msg = &r.json()["choices"][0]["message"];
    assert!(msg["reasoning_content"].is_string(), "{msg}");
    assert!(
        ["yes", "no"].contains(&msg["content"].as_str().unwrap()),
        "{msg}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_spell_markup_are_content_as_written() {
    // The tokenizer reads these as special tokens; a grammar that asks for their text gets
    // it spelled with ordinary tokens, and the chat answer is that text, not markup to parse.
    let s = start(config()).await;
    let block = "<｜DSML｜tool_calls>";
    let answer = format!("a</think>b{block}<think>");
    let rx = regex::escape(&answer);
    let body = |extra: Value| {
        let mut b = chat("Hi", json!({"max_tokens": 64, "stop": []}));
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let (text, finish) = chat_content(&s, &body(json!({"regex": rx}))).await;
    assert_eq!((text.as_str(), finish.as_str()), (answer.as_str(), "stop"));
    // In thinking mode the reasoning ends at `</think>`; the answer after it is as written.
    let r = s
        .send(
            "POST",
            "/v1/chat/completions",
            &body(json!({
                "structured_outputs": {"choice": [answer]},
                "chat_template_kwargs": {"thinking": true},
                "max_tokens": 3000,
            })),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let msg = &r.json()["choices"][0]["message"];
    assert_eq!(msg["content"], json!(answer), "{msg}");
    assert!(
        msg["tool_calls"].is_null() || msg["tool_calls"] == json!([]),
        "{msg}"
    );
    // Text completions and /generate return it too.
    let r = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": "dsv4-tiny", "prompt": "x", "max_tokens": 64, "regex": rx}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], json!(answer));
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_generate_follow_the_same_grammars() {
    let s = start(config()).await;
    let completion = |extra: Value| {
        let mut body = json!({"model": crate::common::MODEL, "prompt": "The tuple is ",
                              "max_tokens": 64, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let text = |v: &Value, i: usize| v["choices"][i]["text"].as_str().unwrap().to_string();
    let r = s
        .send(
            "POST",
            "/v1/completions",
            &completion(json!({"ebnf": TUPLE_GBNF})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let greedy = text(&v, 0);
    assert!(matches(TUPLE_RX, &greedy), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    // /generate with the same grammar and prompt gives the same text.
    let g = s
        .send(
            "POST",
            "/generate",
            &json!({"text": ["The tuple is ", "The tuple is "], "sampling_params": [
                {"ebnf": TUPLE_GBNF, "max_new_tokens": 64, "temperature": 0},
                {"regex": TUPLE_RX, "max_new_tokens": 64, "temperature": 0},
            ]}),
        )
        .await;
    assert_eq!(g.status, 200, "{}", g.body);
    for out in g.json().as_array().unwrap() {
        assert_eq!(out["text"], greedy.as_str(), "{out}");
        assert_eq!(out["meta_info"]["finish_reason"]["type"], "stop", "{out}");
    }
    // Sampled choices, echo, and JSON through response_format on text completions.
    let r = s
        .send(
            "POST",
            "/v1/completions",
            &completion(
                json!({"structured_outputs": {"choice": ["alpha", "beta", "gamma"]},
                               "n": 3, "temperature": 1.0, "seed": 5, "echo": true}),
            ),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    for i in 0..3 {
        let t = text(&v, i);
        let answer = t
            .strip_prefix("The tuple is ")
            .unwrap_or_else(|| panic!("{v}"));
        assert!(["alpha", "beta", "gamma"].contains(&answer), "{v}");
    }
    let r = s
        .send(
            "POST",
            "/v1/completions",
            &completion(json!({"response_format": {"type": "json_object"}, "max_tokens": 200})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let parsed: Value = serde_json::from_str(&text(&v, 0)).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(parsed.is_object(), "{v}");
    // One compile a distinct grammar: /generate's GBNF is the first request's (a cache hit),
    // its regex is new, then the choice and json_object.
    let m = s.get("/metrics").await.body;
    assert!(
        m.contains("dsv4:grammar_compile_seconds_count 4")
            && m.contains("dsv4:grammar_cache_hits_total 1")
            && m.contains("dsv4:grammar_cache_entries 4"),
        "{}",
        m.lines()
            .filter(|l| l.contains("grammar"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structural_tags_constrain_chat_completions_and_generate() {
    let s = start(config()).await;
    let weather = json!({"type": "object", "additionalProperties": false, "required": ["city"],
                         "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}}});
    // vLLM's legacy shape in response_format, with SGLang's at_least_one: the answer opens
    // with a tag whose JSON follows the schema; free text may follow.
    let legacy = json!({"type": "structural_tag", "triggers": ["<function="], "at_least_one": true,
        "structures": [{"begin": "<function=get_weather>", "schema": weather, "end": "</function>"}]});
    let body = chat(
        "Weather?",
        json!({"response_format": legacy, "max_tokens": 120, "stop": []}),
    );
    let (text, _) = chat_content(&s, &body).await;
    let rest = text
        .strip_prefix("<function=get_weather>")
        .unwrap_or_else(|| panic!("{text:?}"));
    let args: Value = rest
        .match_indices("</function>")
        .find_map(|(i, _)| serde_json::from_str(&rest[..i]).ok())
        .unwrap_or_else(|| panic!("no JSON then </function>: {text:?}"));
    assert!(
        ["Oslo", "Paris"].contains(&args["city"].as_str().unwrap()),
        "{text:?}"
    );
    // xgrammar's `format` shape, as an object in response_format and as JSON text in
    // structured_outputs: the same language gives the same greedy answer, and the regex of
    // that language agrees.
    let format = json!({"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "tags_with_separator", "separator": ",", "at_least_one": true,
         "tags": [{"begin": "<n>", "end": "</n>",
                   "content": {"type": "regex", "pattern": "[0-9]{1,2}"}}]}
    ]});
    let rx = "Answer: <n>[0-9]{1,2}</n>(,<n>[0-9]{1,2}</n>)*";
    let tag = json!({"type": "structural_tag", "format": format});
    let ask = |extra: Value| {
        let mut extra = extra;
        extra["max_tokens"] = json!(64);
        extra["stop"] = json!([]);
        chat("Numbers", extra)
    };
    let (a, finish) = chat_content(&s, &ask(json!({"response_format": tag}))).await;
    assert!(matches(rx, &a), "{a:?}");
    assert_eq!(finish, "stop", "{a:?}");
    let as_text = json!({"structured_outputs": {"structural_tag": tag.to_string()}});
    assert_eq!(chat_content(&s, &ask(as_text)).await.0, a);
    assert_eq!(chat_content(&s, &ask(json!({"regex": rx}))).await.0, a);
    // Text completions and /generate (SGLang's sampling_params.structural_tag) agree.
    let r = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": crate::common::MODEL, "prompt": "List: ", "max_tokens": 64,
                    "temperature": 0, "response_format": tag}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let completion = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(matches(rx, &completion), "{completion:?}");
    let g = s
        .send(
            "POST",
            "/generate",
            &json!({"text": "List: ", "sampling_params": {"structural_tag": tag.to_string(),
                    "max_new_tokens": 64, "temperature": 0}}),
        )
        .await;
    assert_eq!(g.status, 200, "{}", g.body);
    assert_eq!(g.json()["text"], completion.as_str());
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_outputs_that_cannot_be_enforced_are_refused_naming_the_field() {
    let s = start(config()).await;
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]);
    let huge = format!("root ::= \"{}\"", "a".repeat(70_000));
    let chat_cases = [
        (json!({"ebnf": huge}), "ebnf", "at most 65536 bytes"),
        (
            json!({"response_format": {"type": "json_object"}, "regex": "a+"}),
            "regex",
            "`response_format` and `regex`",
        ),
        (
            json!({"structured_outputs": {"choice": ["a"], "grammar": "start: \"a\""}}),
            "structured_outputs.grammar",
            "send only one",
        ),
        (json!({"regex": "(unclosed"}), "regex", "cannot be enforced"),
        (
            json!({"ebnf": "root ::= valu\nvalue ::= \"x\""}),
            "ebnf",
            "valu",
        ),
        (
            json!({"ebnf": "root ::= \"x\" (= \"y\")"}),
            "ebnf",
            "lookahead",
        ),
        (json!({"ebnf": "value ::= \"x\""}), "ebnf", "root"),
        (
            json!({"structured_outputs": {"grammar": "start: missing_rule"}}),
            "structured_outputs.grammar",
            "missing_rule",
        ),
        (
            json!({"structured_outputs": {"choice": []}}),
            "structured_outputs.choice",
            "1 to",
        ),
        (
            json!({"structured_outputs": {}}),
            "structured_outputs",
            "names nothing",
        ),
        (
            json!({"structured_outputs": {"structural_tag": {"type": "tag"}}}),
            "structured_outputs.structural_tag",
            "\"structural_tag\"",
        ),
        (
            json!({"structured_outputs": {"structural_tag": "{\"format\": "}}),
            "structured_outputs.structural_tag",
            "not valid JSON",
        ),
        (
            json!({"response_format": {"type": "structural_tag", "format": {"type": "token", "token": 1}}}),
            "response_format",
            "unknown variant `token`",
        ),
        (
            json!({"response_format": {"type": "structural_tag", "triggers": ["<f="]}}),
            "response_format",
            "either `format`",
        ),
        (
            json!({"response_format": {"type": "structural_tag", "format": {
                "type": "triggered_tags", "triggers": ["<f="],
                "tags": [{"begin": "<g>", "content": {"type": "any_text"}, "end": "</g>"}]}}}),
            "response_format",
            "does not start with any of the triggers",
        ),
        (
            json!({"structured_outputs": {"json": {}, "whitespace_pattern": "\\s*"}}),
            "structured_outputs.whitespace_pattern",
            "only JSON whitespace",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "whitespace_pattern": " *"}}),
            "structured_outputs.whitespace_pattern",
            "applies to a `json` schema",
        ),
        (
            json!({"tools": tools, "tool_choice": "required", "structured_outputs": {"choice": ["a"]}}),
            "structured_outputs.choice",
            "cannot be combined",
        ),
    ];
    for (extra, param, says) in chat_cases {
        let body = chat("Hi", extra.clone());
        let e = s
            .send("POST", "/v1/chat/completions", &body)
            .await
            .error(400);
        assert_eq!(e["param"], param, "{extra}: {e}");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains(says), "{extra}: {m}");
    }
    // A regex too big for the grammar engine's lexer fails after the first token: the
    // request's fault, not the server's.
    let e = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat("Hi", json!({"regex": "(a{1000}){1000}", "max_tokens": 8})),
        )
        .await
        .error(400);
    assert_eq!(e["code"], "grammar_failed", "{e}");
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("too many expressions") && !m.contains('\n'),
        "{m}"
    );
    // vLLM's removed guided_* fields are refused with what replaced them.
    let e = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat("Hi", json!({"guided_choice": ["a"]})),
        )
        .await
        .error(400);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("vLLM 0.12 replaced"),
        "{e}"
    );
    assert_eq!(e["param"], "guided_choice", "{e}");
    // The other endpoints name their own fields.
    let e = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": crate::common::MODEL, "prompt": "a", "regex": "", "max_tokens": 4}),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "regex", "{e}");
    let e = s
        .send(
            "POST",
            "/generate",
            &json!({"text": "a", "sampling_params": {"ebnf": "root ::= [a-"}}),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "sampling_params.ebnf", "{e}");
    // Nothing was started: the server is idle and answers normally.
    let ok = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat("Hi", json!({"max_tokens": 2, "regex": "ok"})),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json()["choices"][0]["message"]["content"], "ok");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_tools_in_auto_mode_keep_answers_parseable() {
    let s = start(config()).await;
    let tool = |strict: bool| {
        json!([{"type": "function", "function": {"name": "get_weather", "strict": strict,
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "enum": ["Oslo", "Paris"]}},
                "required": ["city"], "additionalProperties": false}}}])
    };
    // Greedy "Hi" makes the random tiny model emit markup the strict parser refuses.
    let loose = chat(
        "Hi",
        json!({"tools": tool(false), "max_tokens": 64, "stop": []}),
    );
    let r = s.send("POST", "/v1/chat/completions", &loose).await;
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(
        r.json()["error"]["type"],
        "model_output_error",
        "{}",
        r.body
    );
    // With a strict tool the same request is constrained: content or valid calls, always.
    let mut calls = 0;
    for prompt in [
        "Hi",
        "Weather?",
        "Hello there",
        "Oslo or Paris",
        "Tell me a story",
    ] {
        let strict = chat(
            prompt,
            json!({"tools": tool(true), "max_tokens": 200, "stop": []}),
        );
        let (content, finish) = chat_content(&s, &strict).await;
        let r = s.send("POST", "/v1/chat/completions", &strict).await;
        let msg = &r.json()["choices"][0]["message"];
        for call in msg["tool_calls"].as_array().into_iter().flatten() {
            calls += 1;
            let args: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            assert!(
                ["Oslo", "Paris"].contains(&args["city"].as_str().unwrap()),
                "{msg}"
            );
            assert_eq!(finish, "tool_calls", "{msg}");
        }
        assert!(
            !content.contains("<｜") && !content.contains("</｜"),
            "{content:?}"
        );
    }
    eprintln!("strict auto answers made {calls} calls");
    // The Responses API reads `strict` from its function tools too.
    let body = json!({"model": crate::common::MODEL, "input": "Hi", "temperature": 0,
                      "max_output_tokens": 64,
                      "tools": [{"type": "function", "name": "get_weather", "strict": true,
                                 "parameters": tool(true)[0]["function"]["parameters"]}]});
    let r = s.send("POST", "/v1/responses", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ne!(r.json()["status"], "failed", "{}", r.body);
    // A strict tool whose schema no grammar can enforce is refused up front.
    let bad = json!([{"type": "function", "function": {"name": "f", "strict": true,
        "parameters": {"anyOf": [{"type": "object"}]}}}]);
    let e = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat("Hi", json!({"tools": bad})),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "tools", "{e}");
    s.shutdown().await.unwrap();
}

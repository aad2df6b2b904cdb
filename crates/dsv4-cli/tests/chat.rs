//! End-to-end tests of `dsv4 chat render` and `dsv4 chat parse`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather",
  "description": "Current weather", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
  "required": ["city"]}}}]"#;

const EOS: &str = "<｜end▁of▁sentence｜>";

fn dsv4(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .args(args)
        .env_remove("DSV4_PROFILE")
        .env_remove("DSV4_PROFILE_DIR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the dsv4 binary runs");
    let written = child.stdin.take().expect("stdin is piped").write_all(stdin);
    // A command that refuses its arguments exits without reading stdin: the pipe is then
    // closed under the write, and its exit status and output are what the test checks.
    if let Err(e) = written {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "stdin takes the input"
        );
    }
    child.wait_with_output().expect("dsv4 finishes")
}

fn ok(args: &[&str], stdin: &[u8]) -> String {
    let out = dsv4(args, stdin);
    assert!(
        out.status.success(),
        "dsv4 {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("temp file");
    path.to_str().expect("UTF-8 path").to_owned()
}

fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn render_prints_the_exact_prompt_without_a_trailing_newline() {
    let dir = tempfile::tempdir().unwrap();
    let messages = write(
        dir.path(),
        "m.json",
        r#"[{"role": "user", "content": "Hi"}]"#,
    );
    let out = ok(&["chat", "render", "--messages", &messages], b"");
    assert_eq!(
        out,
        "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>"
    );
}

#[test]
fn render_with_tools_and_thinking() {
    let dir = tempfile::tempdir().unwrap();
    let messages = write(
        dir.path(),
        "m.json",
        r#"[{"role": "user", "content": "Weather in Oslo?"}]"#,
    );
    let tools = write(dir.path(), "t.json", TOOLS);
    let out = ok(
        &[
            "chat",
            "render",
            "--messages",
            &messages,
            "--tools",
            &tools,
            "--thinking",
        ],
        b"",
    );
    assert!(
        out.starts_with("<｜begin▁of▁sentence｜>\n\n## Tools\n\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "\n\n{\"name\": \"get_weather\", \"description\": \"Current weather\", \"parameters\": {\"type\": \"object\", \
             \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}}\n\n"
        ),
        "{out}"
    );
    assert!(
        out.ends_with("tool calls.\n<｜User｜>Weather in Oslo?<｜Assistant｜><think>"),
        "{out}"
    );
    let max = ok(
        &[
            "chat",
            "render",
            "--messages",
            &messages,
            "--thinking",
            "--reasoning-effort",
            "max",
        ],
        b"",
    );
    assert!(
        max.starts_with("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum"),
        "{max}"
    );
}

#[test]
fn render_json_gives_token_ids_of_the_tiny_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let messages = write(
        dir.path(),
        "req.json",
        r#"{"model": "x", "messages": [{"role": "user", "content": "A"}]}"#,
    );
    let v = parse_json(&ok(
        &["chat", "render", "--messages", &messages, "--json"],
        b"",
    ));
    assert_eq!(
        v["prompt"],
        "<｜begin▁of▁sentence｜><｜User｜>A<｜Assistant｜></think>"
    );
    assert_eq!(v["token_ids"], json!([0, 3, 128 + 65, 4, 6]));
}

#[test]
fn render_reports_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "bad.json",
        r#"[{"role": "robot", "content": "x"}]"#,
    );
    let out = dsv4(&["chat", "render", "--messages", &bad], b"");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown role"));
    let good = write(
        dir.path(),
        "m.json",
        r#"[{"role": "user", "content": "x"}]"#,
    );
    let schema =
        r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]"#;
    let tools = write(dir.path(), "t.json", schema);
    let out = dsv4(
        &["chat", "render", "--messages", &good, "--tools", &tools],
        b"",
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid JSON Schema"));
    let out = dsv4(
        &["chat", "render", "--messages", "/nonexistent/m.json"],
        b"",
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read messages file"));
}

const COMPLETION: &str = "Oslo is north.</think>Checking «Oslo».\n\n<｜DSML｜tool_calls>\n\
    <｜DSML｜invoke name=\"get_weather\">\n\
    <｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n\
    <｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n\
    </｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";

#[test]
fn parse_prints_the_openai_assistant_message() {
    let dir = tempfile::tempdir().unwrap();
    let tools = write(dir.path(), "t.json", TOOLS);
    let v = parse_json(&ok(
        &["chat", "parse", "--thinking", "--tools", &tools],
        COMPLETION.as_bytes(),
    ));
    assert_eq!(
        v,
        json!({
            "role": "assistant",
            "content": "Checking «Oslo».",
            "reasoning_content": "Oslo is north.",
            "tool_calls": [{"id": "call_0", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]
        })
    );
}

#[test]
fn parse_in_chunks_gives_the_same_message_even_inside_characters() {
    let whole = ok(&["chat", "parse", "--thinking"], COMPLETION.as_bytes());
    for n in ["1", "2", "3", "5", "64"] {
        let chunked = ok(
            &["chat", "parse", "--thinking", "--chunks", n],
            COMPLETION.as_bytes(),
        );
        assert_eq!(chunked, whole, "--chunks {n}");
    }
    let out = dsv4(&["chat", "parse", "--chunks", "0"], b"x");
    assert!(!out.status.success(), "--chunks 0 is refused");
}

#[test]
fn parse_errors_are_json_on_stdout_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let tools = write(dir.path(), "t.json", TOOLS);
    let dup = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\
        <｜DSML｜parameter name=\"city\" string=\"true\">A</｜DSML｜parameter>\n\
        <｜DSML｜parameter name=\"city\" string=\"true\">B</｜DSML｜parameter>\n\
        </｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    let second_param = dup.match_indices("<｜DSML｜parameter").nth(1).unwrap().0;
    for chunks in ["1", "7"] {
        let out = dsv4(&["chat", "parse", "--chunks", chunks], dup.as_bytes());
        assert_eq!(out.status.code(), Some(1));
        let v = parse_json(&String::from_utf8(out.stdout).unwrap());
        assert_eq!(v["error"]["class"], "duplicate_param");
        assert_eq!(v["error"]["offset"], second_param);
        assert!(v["error"]["message"].as_str().unwrap().contains("city"));
        assert!(v.get("content").is_none(), "nothing leaks as content");
    }
    let unknown = COMPLETION.replace("get_weather", "rm_rf");
    let out = dsv4(
        &["chat", "parse", "--thinking", "--tools", &tools],
        unknown.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(1));
    let v = parse_json(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(v["error"]["class"], "unknown_tool");
    let schema = COMPLETION.replace("string=\"false\">2<", "string=\"true\">two<");
    let out = dsv4(
        &["chat", "parse", "--thinking", "--tools", &tools],
        schema.as_bytes(),
    );
    let v = parse_json(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(v["error"]["class"], "schema_violation");
}

#[test]
fn a_rendered_assistant_turn_parses_back_to_its_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let args = r#"{"city": "Zürich", "days": 3, "opts": {"units": ["C", "F"], "x": 1.5}}"#;
    let messages = json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]}
    ]);
    let path = write(dir.path(), "m.json", &messages.to_string());
    let prompt = ok(&["chat", "render", "--messages", &path], b"");
    let completion = prompt
        .split_once("<｜Assistant｜></think>")
        .expect("the assistant turn follows the transition")
        .1;
    assert!(completion.ends_with(EOS), "{completion}");
    let v = parse_json(&ok(&["chat", "parse"], completion.as_bytes()));
    assert_eq!(v["content"], "Let me look.");
    assert_eq!(v["tool_calls"][0]["function"]["arguments"], args);
}

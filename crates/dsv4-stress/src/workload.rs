//! The seeded workload: which tools each session declares, what each turn asks, whether it
//! streams and how it sets `tool_choice`, and the tool results sent back (synthesised
//! deterministically from the call, so the same call always gets the same result).

use crate::answer::{Answer, ToolCall};
use crate::options::{StreamMode, StressOptions};
use crate::signatures::DeclaredTool;
use dsv4_core::SplitMix64;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A short relative path.
const PATH: &str = "^[a-z0-9_./-]{1,16}$";
/// A few lowercase words.
const WORDS_RE: &str = "^[a-z0-9 ]{1,16}$";
/// A short arithmetic expression.
const EXPR: &str = "^[0-9+*/() .-]{1,16}$";

/// The tools a session may declare: file, search, calculator-like schemas with required and
/// typed arguments (strings, bounded integers, booleans, enums).
pub fn catalog() -> Vec<DeclaredTool> {
    let tool = |name: &str, parameters: Value| DeclaredTool {
        name: name.into(),
        parameters,
    };
    // Strings are bounded by patterns of a few ASCII characters, so a grammar-constrained call
    // of a random-weight model (dsv4's tiny model: one token per byte) ends within a small
    // max_tokens; for real models they are ordinary schema constraints.
    vec![
        tool(
            "read_file",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "pattern": PATH},
                "max_lines": {"type": "integer", "minimum": 1, "maximum": 500}},
              "required": ["path"], "additionalProperties": false}),
        ),
        tool(
            "write_file",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "pattern": PATH},
                "content": {"type": "string", "pattern": WORDS_RE},
                "append": {"type": "boolean"}},
              "required": ["path", "content"], "additionalProperties": false}),
        ),
        tool(
            "search",
            json!({"type": "object", "properties": {
                "query": {"type": "string", "pattern": WORDS_RE},
                "scope": {"type": "string", "enum": ["code", "docs", "all"]},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 20}},
              "required": ["query", "scope"], "additionalProperties": false}),
        ),
        tool(
            "calculator",
            json!({"type": "object", "properties": {
                "expression": {"type": "string", "pattern": EXPR},
                "precision": {"type": "integer", "minimum": 0, "maximum": 12}},
              "required": ["expression"], "additionalProperties": false}),
        ),
        tool(
            "list_dir",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "pattern": PATH},
                "recursive": {"type": "boolean"}},
              "required": ["path", "recursive"], "additionalProperties": false}),
        ),
    ]
}

/// `tool_choice` of one turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// Some call must be made.
    Required,
    /// This tool must be called.
    Named(String),
}

impl ToolChoice {
    /// The request's JSON value.
    pub fn to_json(&self) -> Value {
        match self {
            Self::Auto => json!("auto"),
            Self::Required => json!("required"),
            Self::Named(n) => json!({"type": "function", "function": {"name": n}}),
        }
    }

    /// The short label in records: `auto`, `required`, `named:TOOL`.
    pub fn label(&self) -> String {
        match self {
            Self::Auto => "auto".into(),
            Self::Required => "required".into(),
            Self::Named(n) => format!("named:{n}"),
        }
    }
}

/// The plan of one turn, fixed by the seed before anything is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnPlan {
    /// Stream this turn.
    pub stream: bool,
    /// Its `tool_choice`.
    pub tool_choice: ToolChoice,
    /// The user text added before it (when the previous answer had no tool calls).
    pub user_text: String,
}

/// The plan of one session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPlan {
    /// Session index.
    pub index: usize,
    /// The session's seed.
    pub seed: u64,
    /// The tools it declares.
    pub tools: Vec<DeclaredTool>,
    /// The system prompt.
    pub system: String,
    /// One plan per turn.
    pub turns: Vec<TurnPlan>,
}

/// The system prompt of every session.
const SYSTEM: &str = "You are a coding agent working in a repository. Use the tools to read, \
                      write and list files, to search, and to compute; answer briefly.";

const WORDS: [&str; 48] = [
    "agent", "buffer", "cache", "compile", "config", "decode", "deploy", "error", "event", "file",
    "graph", "index", "kernel", "layer", "ledger", "load", "log", "memory", "metric", "model",
    "module", "offset", "page", "parse", "patch", "plan", "pool", "prefill", "profile", "query",
    "queue", "race", "record", "request", "result", "route", "sample", "schema", "server",
    "session", "stream", "table", "test", "token", "trace", "value", "window", "worker",
];

/// `n` characters (about) of seeded prose.
fn prose(g: &mut SplitMix64, n: usize) -> String {
    let mut s = String::new();
    while s.len() < n {
        if !s.is_empty() {
            s.push(if g.below(9) == 0 { '.' } else { ' ' });
            if s.ends_with('.') {
                s.push(' ');
            }
        }
        s.push_str(WORDS[g.below(WORDS.len() as u64) as usize]);
    }
    s
}

/// The seeded plan of session `index` under `opts` (depends only on the seed, the index and
/// the workload options, never on the server).
pub fn plan_session(opts: &StressOptions, index: usize) -> SessionPlan {
    let mut g = SplitMix64::for_name(opts.seed, &format!("session-{index}"));
    let seed = g.next_u64();
    // Every session shares the system prompt and declares a prefix of the catalog (2 to 5
    // tools), as sessions of one agent application do: the long tool prompt is a prefix the
    // server's prefix cache can share, and what differs starts at the first user message.
    let mut tools = catalog();
    tools.truncate(2 + g.below(4) as usize);
    let system = SYSTEM.to_owned();
    let turns = (0..opts.turns)
        .map(|t| {
            let stream = match opts.stream {
                StreamMode::Always => true,
                StreamMode::Never => false,
                StreamMode::Mixed => g.below(2) == 1,
            };
            let tool_choice = if g.next_f64() < opts.forced_tool_rate {
                if g.below(2) == 0 {
                    ToolChoice::Required
                } else {
                    ToolChoice::Named(tools[g.below(tools.len() as u64) as usize].name.clone())
                }
            } else {
                ToolChoice::Auto
            };
            let len = opts.growth_chars / 2 + g.below(opts.growth_chars as u64 + 1) as usize;
            let user_text = if t == 0 {
                format!("Task {index}: {}", prose(&mut g, len))
            } else {
                format!("Step {}: {}", t + 1, prose(&mut g, len))
            };
            TurnPlan {
                stream,
                tool_choice,
                user_text,
            }
        })
        .collect();
    SessionPlan {
        index,
        seed,
        tools,
        system,
        turns,
    }
}

/// The `tools` array of a request.
pub fn tools_json(tools: &[DeclaredTool], strict: bool) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| {
                let mut function = json!({
                    "name": t.name,
                    "description": format!("the {} tool", t.name.replace('_', " ")),
                    "parameters": t.parameters});
                if strict {
                    function["strict"] = json!(true);
                }
                json!({"type": "function", "function": function})
            })
            .collect(),
    )
}

/// The result text of a call: a pure function of the tool name and its arguments, about
/// `size` characters.
pub fn synthesize_result(call: &ToolCall, size: usize) -> String {
    let digest = Sha256::digest(format!("{}\n{}", call.name, call.arguments).as_bytes());
    let mut g = SplitMix64::new(u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")));
    let args: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
    let arg = |k: &str| {
        args[k]
            .as_str()
            .unwrap_or("?")
            .chars()
            .take(40)
            .collect::<String>()
    };
    match call.name.as_str() {
        "read_file" => {
            let mut s = format!("{} lines of {}:\n", 3 + g.below(20), arg("path"));
            let mut line = 1;
            while s.len() < size {
                s.push_str(&format!("{line}: {}\n", prose(&mut g, 40)));
                line += 1;
            }
            s
        }
        "search" => {
            let mut s = format!("matches for {:?}:\n", arg("query"));
            while s.len() < size {
                let file = WORDS[g.below(WORDS.len() as u64) as usize];
                let line = 1 + g.below(900);
                s.push_str(&format!("src/{file}.rs:{line}: {}\n", prose(&mut g, 30)));
            }
            s
        }
        "calculator" => format!(
            "{} = {}",
            arg("expression"),
            g.below(1_000_000) as f64 / 100.0
        ),
        "write_file" => format!("wrote {} bytes to {}", g.below(4096), arg("path")),
        "list_dir" => {
            let mut s = format!("{}:\n", arg("path"));
            while s.len() < size {
                s.push_str(&format!(
                    "  {}.rs\n",
                    WORDS[g.below(WORDS.len() as u64) as usize]
                ));
            }
            s
        }
        other => format!("error: no tool named {other}"),
    }
}

/// Append an answer (and, for its tool calls, the synthesised results) to the conversation.
pub fn append_answer(messages: &mut Vec<Value>, answer: &Answer, result_size: usize) {
    let calls: Vec<Value> = answer
        .tool_calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    let mut m = json!({"role": "assistant", "content": answer.content});
    if !calls.is_empty() {
        if answer.content.is_empty() {
            m["content"] = Value::Null;
        }
        m["tool_calls"] = Value::Array(calls);
    }
    messages.push(m);
    for c in &answer.tool_calls {
        messages.push(json!({"role": "tool", "tool_call_id": c.id,
                             "content": synthesize_result(c, result_size)}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sessions_other_seed_other_sessions() {
        let o = StressOptions {
            turns: 6,
            ..Default::default()
        };
        let a: Vec<_> = (0..8).map(|i| plan_session(&o, i)).collect();
        let b: Vec<_> = (0..8).map(|i| plan_session(&o, i)).collect();
        assert_eq!(a, b);
        let c: Vec<_> = (0..8)
            .map(|i| {
                plan_session(
                    &StressOptions {
                        seed: 1,
                        ..o.clone()
                    },
                    i,
                )
            })
            .collect();
        assert_ne!(a, c);
        let streams: Vec<bool> = a
            .iter()
            .flat_map(|s| s.turns.iter().map(|t| t.stream))
            .collect();
        assert!(
            streams.contains(&true) && streams.contains(&false),
            "mixed mode mixes"
        );
        let forced = a
            .iter()
            .flat_map(|s| &s.turns)
            .filter(|t| t.tool_choice != ToolChoice::Auto)
            .count();
        assert!(
            forced > 0 && forced < 48,
            "about half the turns force a call: {forced}"
        );
        for s in &a {
            assert!((2..=5).contains(&s.tools.len()));
            for t in &s.turns {
                if let ToolChoice::Named(n) = &t.tool_choice {
                    assert!(s.tools.iter().any(|d| &d.name == n));
                }
            }
        }
    }

    #[test]
    fn stream_modes_and_forced_rate_are_obeyed() {
        let all = StressOptions {
            stream: StreamMode::Always,
            forced_tool_rate: 1.0,
            ..Default::default()
        };
        let p = plan_session(&all, 3);
        assert!(
            p.turns
                .iter()
                .all(|t| t.stream && t.tool_choice != ToolChoice::Auto)
        );
        let none = StressOptions {
            stream: StreamMode::Never,
            forced_tool_rate: 0.0,
            ..Default::default()
        };
        let p = plan_session(&none, 3);
        assert!(
            p.turns
                .iter()
                .all(|t| !t.stream && t.tool_choice == ToolChoice::Auto)
        );
    }

    #[test]
    fn tool_results_are_a_function_of_the_call() {
        let call = |args: &str| ToolCall {
            id: "x".into(),
            name: "read_file".into(),
            arguments: args.into(),
        };
        let a = synthesize_result(&call(r#"{"path": "a.rs"}"#), 300);
        assert_eq!(
            a,
            synthesize_result(
                &ToolCall {
                    id: "y".into(),
                    ..call(r#"{"path": "a.rs"}"#)
                },
                300
            )
        );
        assert_ne!(a, synthesize_result(&call(r#"{"path": "b.rs"}"#), 300));
        assert!(a.len() >= 300 && a.contains("a.rs"));
        for t in catalog() {
            let r = synthesize_result(
                &ToolCall {
                    id: "i".into(),
                    name: t.name,
                    arguments: "{}".into(),
                },
                100,
            );
            assert!(!r.is_empty() && crate::signatures::find_markup(&r).is_none());
        }
    }

    #[test]
    fn answers_with_calls_append_results() {
        let mut m = vec![];
        let a = Answer {
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "calculator".into(),
                arguments: r#"{"expression": "1+1"}"#.into(),
            }],
            ..Default::default()
        };
        append_answer(&mut m, &a, 100);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0]["content"], Value::Null);
        assert_eq!(m[1]["role"], "tool");
        assert_eq!(m[1]["tool_call_id"], "call_1");
    }
}

//! 64 concurrent streaming requests (greedy, or sampled with a seed) each get exactly what the
//! same request gets when sent alone: 24 text completions, 8 SGLang `/generate` requests with
//! their log-probabilities and token ids, 8 Responses API answers with their log-probabilities
//! (4 of them run in the background and streamed from its event log), 16 grammar-constrained
//! tool calls, and 8 text completions sampled under a GBNF grammar or a regex.

use super::common::*;
use serde_json::{Value, json};

/// Up to three numbers of one or two digits in parentheses, as GBNF.
const TUPLE_GBNF: &str = "root ::= \"(\" num (\",\" num){0,2} \")\"\nnum ::= [0-9] | [1-9] [0-9]";
/// The same language as a regular expression.
const TUPLE_RX: &str = r"\((?:[0-9]|[1-9][0-9])(?:,(?:[0-9]|[1-9][0-9])){0,2}\)";

/// The 64 requests: (path, body).
fn requests() -> Vec<(&'static str, Value)> {
    let tools = json!([{"type": "function", "function": {"name": "pick",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris", "Rome"]}}, "required": ["city"]}}}]);
    (0..64)
        .map(|i| {
            if i % 4 == 3 {
                let body = chat(
                    &format!("Request {i}: where to?"),
                    json!({"tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
                           "max_tokens": 200, "stream": true}),
                );
                ("/v1/chat/completions", body)
            } else if i % 8 == 5 {
                let body = json!({"model": MODEL, "input": format!("Story {}: once upon a time {i}", i % 5),
                                  "stream": true, "temperature": 0, "max_output_tokens": 6,
                                  "stop": CLEAN_STOPS, "top_logprobs": 2,
                                  "include": ["message.output_text.logprobs"],
                                  "background": i % 16 == 13});
                ("/v1/responses", body)
            } else if i % 8 == 1 {
                let body = json!({"text": format!("Story {}: once upon a time {i}", i % 5),
                                  "stream": true, "return_logprob": true,
                                  "logprob_start_len": 0, "top_logprobs_num": 2,
                                  "sampling_params": {"max_new_tokens": 6, "temperature": 0}});
                ("/generate", body)
            } else if i % 8 == 6 {
                // Sampled under a grammar: GBNF or a regex, seeded.
                let mut body = json!({"model": MODEL, "prompt": format!("Tuple {i}: "),
                                      "max_tokens": 24, "temperature": 1.0, "seed": i,
                                      "stream": true});
                let (key, grammar) = if i % 16 == 6 {
                    ("ebnf", TUPLE_GBNF)
                } else {
                    ("regex", TUPLE_RX)
                };
                body[key] = json!(grammar);
                ("/v1/completions", body)
            } else {
                // Shared prefixes exercise the prefix cache under load.
                let body = json!({"model": MODEL, "prompt": format!("Story {}: once upon a time {i}", i % 5),
                                  "max_tokens": 6, "temperature": 0, "stream": true,
                                  "stream_options": {"include_usage": true}});
                ("/v1/completions", body)
            }
        })
        .collect()
}

/// What a streamed answer said: text or tool calls, finish reason, usage.
fn outcome(r: &Reply) -> Value {
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    if events[0]["type"] == "response.created" {
        // /v1/responses: the final response (its ids and times left out) and the deltas.
        let end = events.last().unwrap();
        assert!(
            matches!(
                end["type"].as_str(),
                Some("response.completed" | "response.incomplete")
            ),
            "{end}"
        );
        let last = &end["response"];
        let deltas: Vec<Value> = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| json!([e["delta"], e["logprobs"]]))
            .collect();
        let output: Vec<Value> = last["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| json!([o["type"], o["status"], o["content"]]))
            .collect();
        return json!({"status": last["status"], "output": output, "deltas": deltas,
                      "tokens": last["usage"]["output_tokens"]});
    }
    assert_eq!(events.last().unwrap(), "[DONE]", "{}", r.body);
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut finish = Value::Null;
    let mut usage = Value::Null;
    if let Some(last) = events.iter().rfind(|e| e.get("meta_info").is_some()) {
        // /generate: each event carries the output so far.
        let m = &last["meta_info"];
        return json!({"text": last["text"], "ids": last["output_ids"], "finish": m["finish_reason"],
                      "input": m["input_token_logprobs"], "output": m["output_token_logprobs"],
                      "tops": m["output_top_logprobs"]});
    }
    for e in events.iter().filter(|e| e.is_object()) {
        assert!(e.get("error").is_none(), "{e}");
        for c in e["choices"].as_array().unwrap() {
            text.push_str(c["text"].as_str().unwrap_or(""));
            text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
            calls.extend(
                c["delta"]["tool_calls"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
            if !c["finish_reason"].is_null() {
                finish = c["finish_reason"].clone();
            }
        }
        if !e["usage"].is_null() && e.get("usage").is_some() {
            usage = e["usage"].clone();
        }
    }
    let calls: Vec<Value> = joined_calls(&calls)
        .iter()
        .map(|c| c["function"].clone())
        .collect();
    json!({"text": text, "calls": calls, "finish": finish, "usage": usage["completion_tokens"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_streams_equal_their_solo_runs() {
    let s = start(config()).await;
    let reqs = requests();
    let mut solo = Vec::new();
    for (path, body) in &reqs {
        solo.push(outcome(&s.send("POST", path, body).await));
    }
    let started = std::time::Instant::now();
    let tasks: Vec<_> = reqs
        .into_iter()
        .map(|(path, body)| {
            let addr = s.addr;
            tokio::spawn(async move {
                request(addr, "POST", path, &[], body.to_string().as_bytes()).await
            })
        })
        .collect();
    let mut together = Vec::new();
    for t in tasks {
        together.push(outcome(&t.await.unwrap()));
    }
    eprintln!(
        "64 concurrent streams took {:.2} s",
        started.elapsed().as_secs_f64()
    );
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "request {i}: solo vs concurrent");
    }
    assert!(
        together
            .iter()
            .filter(|o| o["calls"].as_array().is_some_and(|c| c.len() == 1))
            .count()
            == 16,
        "every tool request made its call"
    );
    let tuple = regex::Regex::new(&format!("^{TUPLE_RX}$")).unwrap();
    let constrained: Vec<&Value> = together
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 8 == 6)
        .map(|(_, o)| o)
        .collect();
    assert_eq!(constrained.len(), 8);
    for o in constrained {
        let text = o["text"].as_str().unwrap();
        assert!(tuple.is_match(text), "{o}");
        assert_eq!(o["finish"], "stop", "{o}");
    }
    let m = s.state.loaded().unwrap().engine.metrics();
    assert_eq!(m.requests_cancelled, 0);
    s.shutdown().await.unwrap();
}

//! Reading a chat completion's answer: the plain JSON ([`parse_message`]), server-sent events
//! framing ([`next_event`]) and the `chat.completion.chunk` accumulator ([`StreamAccumulator`]),
//! with the OpenAI error body both carry.

use crate::answer::{Answer, ToolCall};
use serde_json::Value;

/// The type and message of an OpenAI error body (or the raw text).
pub(crate) fn error_object(text: &str) -> (Option<String>, String) {
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v["error"].is_object() => {
            let e = &v["error"];
            let ty = e["type"].as_str().map(str::to_owned);
            let code = e["code"]
                .as_str()
                .map(|c| format!(" [{c}]"))
                .unwrap_or_default();
            (ty, format!("{}{code}", e["message"].as_str().unwrap_or("")))
        }
        _ => (None, clip(text)),
    }
}

/// `s` cut to 300 characters, marked with `…` when cut.
pub(crate) fn clip(s: &str) -> String {
    let t: String = s.chars().take(300).collect();
    if t.len() < s.len() { t + "…" } else { t }
}

/// The choice and usage of a non-streamed answer.
pub fn parse_message(v: &Value) -> Result<Answer, String> {
    let choice = v["choices"]
        .get(0)
        .ok_or_else(|| format!("the answer has no choices: {}", clip(&v.to_string())))?;
    let m = &choice["message"];
    let mut tool_calls = Vec::new();
    for c in m["tool_calls"].as_array().into_iter().flatten() {
        tool_calls.push(ToolCall {
            id: c["id"].as_str().unwrap_or("").to_owned(),
            name: c["function"]["name"].as_str().unwrap_or("").to_owned(),
            arguments: json_text(&c["function"]["arguments"]),
        });
    }
    Ok(Answer {
        stream: false,
        content: m["content"].as_str().unwrap_or("").to_owned(),
        reasoning: m["reasoning_content"].as_str().map(str::to_owned),
        tool_calls,
        finish_reason: choice["finish_reason"].as_str().map(str::to_owned),
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64(),
        completion_tokens: v["usage"]["completion_tokens"].as_u64(),
        logprobs: token_logprobs(choice),
        ..Default::default()
    })
}

/// The `logprobs.content[].logprob` values of a choice or chunk choice (empty without them; an
/// entry without a number is NaN, so it never equals anything).
fn token_logprobs(choice: &Value) -> Vec<f64> {
    choice["logprobs"]["content"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["logprob"].as_f64().unwrap_or(f64::NAN))
        .collect()
}

/// Arguments are a JSON text; a server that sends an object instead gets it re-serialised.
fn json_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The data of the next complete SSE event in `buf` and the bytes it used; `data:` lines are
/// joined with newlines, other fields ignored. `Ok(None)` until an event is complete (a
/// character split across reads waits for its next bytes); bytes that are not UTF-8 are an
/// error, since no complete event can follow them.
pub fn next_event(buf: &[u8]) -> Result<Option<(String, usize)>, String> {
    // Events before a bad byte come out first, as they would have had the bytes arrived later.
    let (text, invalid) = match std::str::from_utf8(buf) {
        Ok(text) => (text, None),
        Err(e) => (
            std::str::from_utf8(&buf[..e.valid_up_to()]).expect("valid up to here"),
            e.error_len().map(|_| e.valid_up_to()),
        ),
    };
    let Some((end, sep)) = [("\r\n\r\n", 4), ("\n\n", 2)]
        .iter()
        .filter_map(|(pat, n)| text.find(pat).map(|i| (i, *n)))
        .min()
    else {
        return match invalid {
            None => Ok(None),
            Some(at) => Err(format!(
                "the stream is not UTF-8: invalid byte {:#04x} after {at} bytes of the current \
                 event",
                buf[at]
            )),
        };
    };
    let data: Vec<&str> = text[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    Ok(Some((data.join("\n"), end + sep)))
}

/// What one SSE event contributed.
#[derive(Debug, PartialEq, Eq)]
pub enum Fed {
    /// `[DONE]`.
    Done,
    /// Text, reasoning or a tool call arrived.
    Token,
    /// Role, finish reason, usage, comments.
    Other,
}

/// Assembles `chat.completion.chunk` events into an [`Answer`].
#[derive(Debug, Default)]
pub struct StreamAccumulator {
    /// The answer so far.
    pub answer: Answer,
    calls: Vec<ToolCall>,
}

impl StreamAccumulator {
    /// Take one event's data. An error event is an `Err((type, message))`.
    pub fn feed(&mut self, data: &str) -> Result<Fed, (Option<String>, String)> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(Fed::Other);
        }
        if data == "[DONE]" {
            return Ok(Fed::Done);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            (
                None,
                format!("a stream event is not JSON ({e}): {}", clip(data)),
            )
        })?;
        if v["error"].is_object() {
            let (ty, msg) = error_object(data);
            return Err((ty, format!("error event in the stream: {msg}")));
        }
        if let Some(p) = v["usage"]["prompt_tokens"].as_u64() {
            self.answer.prompt_tokens = Some(p);
        }
        if let Some(c) = v["usage"]["completion_tokens"].as_u64() {
            self.answer.completion_tokens = Some(c);
        }
        let mut token = false;
        for choice in v["choices"].as_array().into_iter().flatten() {
            let d = &choice["delta"];
            if let Some(t) = d["content"].as_str().filter(|t| !t.is_empty()) {
                self.answer.content.push_str(t);
                token = true;
            }
            if let Some(t) = d["reasoning_content"].as_str().filter(|t| !t.is_empty()) {
                self.answer.reasoning.get_or_insert_default().push_str(t);
                token = true;
            }
            for c in d["tool_calls"].as_array().into_iter().flatten() {
                let i = c["index"].as_u64().unwrap_or(self.calls.len() as u64) as usize;
                if i > 1024 {
                    return Err((None, format!("tool call index {i} in the stream")));
                }
                while self.calls.len() <= i {
                    self.calls.push(ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                }
                let call = &mut self.calls[i];
                if let Some(id) = c["id"].as_str() {
                    call.id = id.to_owned();
                }
                if let Some(n) = c["function"]["name"].as_str() {
                    call.name.push_str(n);
                }
                call.arguments
                    .push_str(&json_text(&c["function"]["arguments"]));
                token = true;
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                self.answer.finish_reason = Some(f.to_owned());
            }
            self.answer.logprobs.extend(token_logprobs(choice));
        }
        if token {
            self.answer.chunks += 1;
            Ok(Fed::Token)
        } else {
            Ok(Fed::Other)
        }
    }

    /// The assembled answer (after `[DONE]`).
    pub fn finish(mut self) -> Result<Answer, String> {
        self.answer.stream = true;
        self.answer.tool_calls = self.calls;
        Ok(self.answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_anywhere_assemble_the_same_answer() {
        let events = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"a <｜DS"},"logprobs":{"content":[{"token":"a","logprob":-0.5},{"token":" <｜DS","logprob":-1.25}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"ML｜invoke"},"logprobs":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{\"x\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":": 1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls","logprobs":{"content":[{"token":"x","logprob":-3e-7}]}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4}}"#,
            "[DONE]",
        ];
        let wire: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let bytes = wire.as_bytes();
        for cut in [1, 3, 17, 64] {
            let mut acc = StreamAccumulator::default();
            let mut buf = Vec::new();
            let mut fed = Vec::new();
            for piece in bytes.chunks(cut) {
                buf.extend_from_slice(piece);
                while let Some((ev, used)) = next_event(&buf).unwrap() {
                    buf.drain(..used);
                    fed.push(acc.feed(&ev).unwrap());
                }
            }
            assert_eq!(fed.last(), Some(&Fed::Done));
            assert_eq!(fed.iter().filter(|f| **f == Fed::Token).count(), 4);
            let a = acc.finish().unwrap();
            assert_eq!(a.content, "a <｜DSML｜invoke");
            assert_eq!(a.tool_calls.len(), 1);
            assert_eq!(a.tool_calls[0].arguments, "{\"x\": 1}");
            assert_eq!(a.finish_reason.as_deref(), Some("tool_calls"));
            assert_eq!((a.prompt_tokens, a.completion_tokens), (Some(7), Some(4)));
            assert_eq!(a.logprobs, [-0.5, -1.25, -3e-7], "joined across chunks");
        }
    }

    #[test]
    fn a_split_character_waits_and_bytes_that_are_not_utf8_are_an_error() {
        let wire = "data: {\"x\": \"｜\"}\n\n".as_bytes();
        let bar = wire.iter().position(|&b| b == 0xef).unwrap();
        assert_eq!(next_event(&wire[..bar + 1]), Ok(None));
        let (data, used) = next_event(wire).unwrap().unwrap();
        assert_eq!((data.as_str(), used), ("{\"x\": \"｜\"}", wire.len()));
        let mut bad = wire[..bar].to_vec();
        bad.extend_from_slice(b"\xff\"}\n\ndata: [DONE]\n\n");
        let err = next_event(&bad).unwrap_err();
        assert!(err.contains("not UTF-8") && err.contains("0xff"), "{err}");
        // A complete event before the bad byte still comes out first.
        let mut first = wire.to_vec();
        first.extend_from_slice(&bad);
        assert_eq!(next_event(&first).unwrap().unwrap().1, wire.len());
        assert!(next_event(&first[wire.len()..]).is_err());
    }

    #[test]
    fn error_events_carry_their_type() {
        let mut acc = StreamAccumulator::default();
        let e = acc
            .feed(r#"{"error":{"type":"model_output_error","code":"malformed","message":"bad"}}"#)
            .unwrap_err();
        assert_eq!(e.0.as_deref(), Some("model_output_error"));
        assert!(e.1.contains("bad [malformed]"), "{}", e.1);
        assert!(acc.feed("not json").is_err());
    }

    #[test]
    fn plain_answers_parse() {
        let v: Value = serde_json::from_str(
            r#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{"a":1}}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        )
        .unwrap();
        let a = parse_message(&v).unwrap();
        assert_eq!(a.content, "");
        assert_eq!(a.tool_calls[0].arguments, r#"{"a":1}"#);
        assert!(a.logprobs.is_empty());
        let v = serde_json::json!({"choices": [{"message": {"content": "hi"},
            "logprobs": {"content": [{"token": "h", "logprob": -0.1}, {"token": "i"}]}}]});
        let lp = parse_message(&v).unwrap().logprobs;
        assert_eq!(lp[0], -0.1);
        assert!(
            lp[1].is_nan(),
            "an entry without a number never compares equal"
        );
        assert!(parse_message(&serde_json::json!({"choices": []})).is_err());
    }
}

//! Reading an OpenAI Batch API input file: one [`Item`] per non-empty line, each a request
//! ready to send ([`Call`]) or the reason it cannot be sent, and the refusals that spoil a whole
//! file ([`BatchFileError`]).

use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;

/// The routes a batch line may name (OpenAI's Batch API names these three for text models).
pub const ENDPOINTS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/responses"];

/// The route of a Message Batch's lines (`POST /v1/messages/batches`). Only such a batch's own
/// input file names it; its requests' `model` is checked by the route, request by request, as
/// Anthropic validates each request's `params` on its own.
pub const MESSAGES_ENDPOINT: &str = "/v1/messages";

/// One input line as OpenAI's Batch API defines it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    custom_id: String,
    method: String,
    url: String,
    body: Value,
}

/// A request ready to send: where to and what.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The route, one of [`ENDPOINTS`].
    pub url: String,
    /// The JSON body, as the line gave it.
    pub body: Value,
}

/// One line of the input file.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// 1-based line number in the file.
    pub line: usize,
    /// The line's `custom_id` (`None` when the line is not a JSON object that has one).
    pub custom_id: Option<String>,
    /// The request, or why the line cannot be sent (`code`, `message`).
    pub call: Result<Call, (&'static str, String)>,
}

/// Why a batch file is refused before any request runs.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BatchFileError {
    /// No line has a request.
    #[error("the batch file has no requests (every line is empty)")]
    Empty,
    /// Two lines share a `custom_id`; outputs could not be told apart.
    #[error("custom_id `{id}` is on line {first} and line {again}; each request needs its own")]
    DuplicateId {
        /// The repeated id.
        id: String,
        /// Where it first appears.
        first: usize,
        /// Where it appears again.
        again: usize,
    },
    /// A line's URL is not the batch's endpoint (a `/v1/batches` batch names one).
    #[error(
        "line {line} goes to `{url}`, but the batch's endpoint is `{endpoint}`; every line of a batch goes to its endpoint"
    )]
    WrongEndpoint {
        /// The line.
        line: usize,
        /// Its URL.
        url: String,
        /// The batch's endpoint.
        endpoint: String,
    },
    /// A line asks for a model this run does not serve.
    #[error(
        "line {line} asks for model `{asked}`, but this run serves `{served}`; pass \
         --served-model-name {asked} to answer to that name"
    )]
    WrongModel {
        /// The first line that asks for it.
        line: usize,
        /// The model the line names.
        asked: String,
        /// The served model id.
        served: String,
    },
}

/// Read a batch file: one [`Item`] per non-empty line. Lines that cannot be sent become items
/// with an error; a file that cannot run at all is a [`BatchFileError`]. `served` is the model
/// id each body's `model` (when it has one) must name; `endpoint`, when given, the URL every
/// line must go to.
pub fn parse(
    text: &str,
    served: &str,
    endpoint: Option<&str>,
) -> Result<Vec<Item>, BatchFileError> {
    let mut items = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let item = parse_line(raw, line, endpoint);
        if let Some(id) = &item.custom_id {
            if let Some(&first) = seen.get(id) {
                return Err(BatchFileError::DuplicateId {
                    id: id.clone(),
                    first,
                    again: line,
                });
            }
            seen.insert(id.clone(), line);
        }
        if let (Ok(call), Some(endpoint)) = (&item.call, endpoint)
            && call.url != endpoint
        {
            return Err(BatchFileError::WrongEndpoint {
                line,
                url: call.url.clone(),
                endpoint: endpoint.to_string(),
            });
        }
        if let Ok(call) = &item.call
            && call.url != MESSAGES_ENDPOINT
            && let Some(asked) = call.body.get("model").and_then(Value::as_str)
            && asked != served
        {
            return Err(BatchFileError::WrongModel {
                line,
                asked: asked.to_string(),
                served: served.to_string(),
            });
        }
        items.push(item);
    }
    if items.is_empty() {
        return Err(BatchFileError::Empty);
    }
    Ok(items)
}

/// One line: its `custom_id` as far as it can be read, and the request or why it cannot run.
fn parse_line(raw: &str, line: usize, endpoint: Option<&str>) -> Item {
    let value: Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        Err(e) => {
            return Item {
                line,
                custom_id: None,
                call: Err(("invalid_json", format!("line {line} is not JSON: {e}"))),
            };
        }
    };
    let loose_id = value
        .get("custom_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    match serde_json::from_value::<Line>(value) {
        Ok(l) => Item {
            line,
            custom_id: Some(l.custom_id.clone()),
            call: check(l, line, endpoint),
        },
        Err(e) => Item {
            line,
            custom_id: loose_id,
            call: Err((
                "invalid_request",
                format!(
                    "line {line} is not a batch request ({e}); a line is {{\"custom_id\": ID, \
                     \"method\": \"POST\", \"url\": URL, \"body\": {{…}}}}"
                ),
            )),
        },
    }
}

/// What a line may ask: POST to one of [`ENDPOINTS`] (or to [`MESSAGES_ENDPOINT`] in a Message
/// Batch's file, whose `endpoint` it is) with an object body that neither streams nor runs in
/// the background (a batch writes each answer whole, then exits).
fn check(l: Line, line: usize, endpoint: Option<&str>) -> Result<Call, (&'static str, String)> {
    if l.method != "POST" {
        return Err((
            "invalid_method",
            format!(
                "line {line}: method `{}` is not supported; batch requests are POST",
                l.method
            ),
        ));
    }
    let messages = endpoint == Some(MESSAGES_ENDPOINT) && l.url == MESSAGES_ENDPOINT;
    if !ENDPOINTS.contains(&l.url.as_str()) && !messages {
        return Err((
            "invalid_url",
            format!(
                "line {line}: url `{}` is not supported; a batch request goes to {}",
                l.url,
                ENDPOINTS.join(", ")
            ),
        ));
    }
    let Some(body) = l.body.as_object() else {
        return Err((
            "invalid_request",
            format!("line {line}: `body` must be a JSON object (the request's body)"),
        ));
    };
    for (field, why) in [
        ("stream", "a batch writes each answer whole"),
        ("background", "the batch runner exits when the file is done"),
    ] {
        if body.get(field) == Some(&Value::Bool(true)) {
            return Err((
                "invalid_request",
                format!("line {line}: `{field}: true` is not supported in a batch ({why})"),
            ));
        }
    }
    Ok(Call {
        url: l.url,
        body: l.body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(custom_id: &str, url: &str, body: Value) -> String {
        json!({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).to_string()
    }

    #[test]
    fn lines_become_calls_and_blank_lines_are_skipped() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let text = format!(
            "{}\n\n   \n{}\n",
            line("a", "/v1/chat/completions", body.clone()),
            line("b", "/v1/completions", json!({"prompt": "x"}))
        );
        let items = parse(&text, "m", None).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].line, 1);
        assert_eq!(items[0].custom_id.as_deref(), Some("a"));
        assert_eq!(
            items[0].call,
            Ok(Call {
                url: "/v1/chat/completions".into(),
                body
            })
        );
        assert_eq!(items[1].line, 4);
    }

    #[test]
    fn lines_that_cannot_be_sent_say_why_and_keep_their_place() {
        let text = [
            "{not json".to_string(),
            json!({"custom_id": "m", "method": "GET", "url": "/v1/completions", "body": {}})
                .to_string(),
            line("u", "/v1/embeddings", json!({})),
            line("s", "/v1/completions", json!({"stream": true})),
            line("g", "/v1/responses", json!({"background": true})),
            line("o", "/v1/completions", json!("text")),
            json!({"custom_id": "x", "url": "/v1/completions", "body": {}}).to_string(),
            json!({"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": {}, "extra": 1})
                .to_string(),
            line("ok", "/v1/completions", json!({"stream": false})),
        ]
        .join("\n");
        let items = parse(&text, "m", None).unwrap();
        let codes: Vec<_> = items
            .iter()
            .map(|i| i.call.as_ref().err().map(|e| e.0))
            .collect();
        assert_eq!(
            codes,
            [
                Some("invalid_json"),
                Some("invalid_method"),
                Some("invalid_url"),
                Some("invalid_request"),
                Some("invalid_request"),
                Some("invalid_request"),
                Some("invalid_request"),
                Some("invalid_request"),
                None
            ]
        );
        let message = |k: usize| items[k].call.as_ref().unwrap_err().1.clone();
        assert!(
            message(2).contains("/v1/chat/completions"),
            "{}",
            message(2)
        );
        assert!(message(3).contains("`stream: true`"), "{}", message(3));
        assert!(message(6).contains("method"), "{}", message(6));
        assert!(message(7).contains("extra"), "{}", message(7));
        assert_eq!(items[0].custom_id, None);
        assert_eq!(items[6].custom_id.as_deref(), Some("x"));
    }

    #[test]
    fn files_that_cannot_run_are_refused_whole() {
        assert_eq!(parse("\n  \n", "m", None), Err(BatchFileError::Empty));
        let text = [
            line("a", "/v1/completions", json!({})),
            line("b", "/v1/completions", json!({})),
            line("a", "/v1/completions", json!({})),
        ]
        .join("\n");
        assert_eq!(
            parse(&text, "m", None),
            Err(BatchFileError::DuplicateId {
                id: "a".into(),
                first: 1,
                again: 3
            })
        );
        let text = [
            line("a", "/v1/completions", json!({"model": "m"})),
            line("b", "/v1/completions", json!({"model": "gpt-4o"})),
        ]
        .join("\n");
        let e = parse(&text, "m", None).unwrap_err();
        let other = parse(
            &text.replace("gpt-4o", "m"),
            "m",
            Some("/v1/chat/completions"),
        );
        assert_eq!(
            other,
            Err(BatchFileError::WrongEndpoint {
                line: 1,
                url: "/v1/completions".into(),
                endpoint: "/v1/chat/completions".into()
            })
        );
        assert!(e.to_string().contains("--served-model-name gpt-4o"), "{e}");
    }

    #[test]
    fn only_a_message_batch_file_goes_to_the_messages_route() {
        let text = line(
            "a",
            "/v1/messages",
            json!({"model": "claude-x", "max_tokens": 8}),
        );
        // In an OpenAI batch (or run-batch) file the route is not one a line may name.
        let items = parse(&text, "m", None).unwrap();
        assert_eq!(items[0].call.as_ref().unwrap_err().0, "invalid_url");
        // In a Message Batch's file it is, and another model is the route's to refuse (per
        // request, as Anthropic validates each request's params), not the whole file's.
        let items = parse(&text, "m", Some(MESSAGES_ENDPOINT)).unwrap();
        assert_eq!(items[0].call.as_ref().unwrap().url, MESSAGES_ENDPOINT);
        let chat = line("b", "/v1/chat/completions", json!({}));
        assert!(matches!(
            parse(&chat, "m", Some(MESSAGES_ENDPOINT)),
            Err(BatchFileError::WrongEndpoint { line: 1, .. })
        ));
    }
}

//! The part of a `response` object every answer to one request repeats ([`Envelope`]: its id,
//! its time, the request's settings as OpenAI echoes them) and how it ended ([`End`]).

use crate::api::common::unix_now;
use crate::api::logprobs::f32_as_f64;
use crate::api::responses::{OutputItem, ResponseUsage, ResponsesRequest};
use dsv4_chat::pyjson::OrderedJson;
use serde_json::{Map, Value, json};

/// What every response object of a request repeats: its id, its time, and the request's
/// settings as OpenAI echoes them.
pub(super) struct Envelope {
    pub(super) id: String,
    fields: Map<String, Value>,
}

impl Envelope {
    /// The envelope of response `id` to `req` (`raw`: its body, for the tools as given).
    pub(super) fn new(
        req: &ResponsesRequest,
        id: String,
        created_at: u64,
        store: bool,
        raw: &OrderedJson,
    ) -> Self {
        let tools = raw
            .get("tools")
            .filter(|t| **t != OrderedJson::Null)
            .map_or_else(|| json!([]), OrderedJson::to_value);
        let text = json!({
            "format": req.text.as_ref().and_then(|t| t.format.clone())
                .map_or_else(|| json!({"type": "text"}), |f| json!(f)),
            "verbosity": req.text.as_ref().and_then(|t| t.verbosity.clone())
                .unwrap_or_else(|| "medium".into()),
        });
        let reasoning = req.reasoning.as_ref().map_or_else(
            || json!({"effort": null, "summary": null}),
            |r| json!({"effort": r.effort, "summary": r.summary.clone().or(r.generate_summary.clone())}),
        );
        let fields = json!({
            "id": id,
            "object": "response",
            "created_at": created_at,
            "model": req.model,
            "instructions": req.instructions,
            "previous_response_id": req.previous_response_id,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
            "temperature": f32_as_f64(req.temperature.unwrap_or(1.0)),
            "top_p": f32_as_f64(req.top_p.unwrap_or(1.0)),
            "top_logprobs": req.top_logprobs.unwrap_or(0),
            "tool_choice": req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            "tools": tools,
            "text": text,
            "reasoning": reasoning,
            "store": store,
            "background": req.background.unwrap_or(false),
            "truncation": req.truncation.as_deref().unwrap_or("disabled"),
            "metadata": req.metadata.clone().unwrap_or_default(),
            "user": req.user,
        });
        let Value::Object(fields) = fields else {
            unreachable!("json! of an object literal is an object")
        };
        Self { id, fields }
    }

    /// The response object in `status` with `output` and the rest.
    pub(super) fn response(&self, status: &str, output: &[OutputItem], end: Option<&End>) -> Value {
        let mut r = self.fields.clone();
        r.insert("status".into(), json!(status));
        r.insert("output".into(), json!(output));
        r.insert("error".into(), json!(end.and_then(|e| e.error.clone())));
        r.insert(
            "incomplete_details".into(),
            json!(
                end.and_then(|e| e.incomplete)
                    .map(|reason| json!({"reason": reason}))
            ),
        );
        r.insert("usage".into(), json!(end.and_then(|e| e.usage.clone())));
        let completed = end.is_some() && status == "completed";
        r.insert("completed_at".into(), json!(completed.then(unix_now)));
        Value::Object(r)
    }
}

/// How a response ended.
pub(super) struct End {
    /// Its token counts (none for a failed response).
    pub(super) usage: Option<ResponseUsage>,
    /// `incomplete_details.reason`.
    pub(super) incomplete: Option<&'static str>,
    /// `error`, for a failed response.
    pub(super) error: Option<Value>,
}

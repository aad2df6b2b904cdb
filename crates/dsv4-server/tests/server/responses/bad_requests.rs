//! Bad Responses API requests are refused with the status and the field that is wrong.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_their_field() {
    let s = start(config()).await;
    let w = weather_tool();
    for (extra, status, param) in [
        (json!({"input": []}), 400, "input"),
        (json!({"input": 5}), 400, "input"),
        (
            json!({"input": [{"role": "robot", "content": "x"}]}),
            400,
            "input[0].role",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
            400,
            "input[0].content[0].type",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            400,
            "input[0]",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            400,
            "input[0].call_id",
        ),
        (
            json!({"tools": [{"type": "web_search"}]}),
            400,
            "tools[0].type",
        ),
        (
            json!({"tools": [{"type": "function"}]}),
            400,
            "tools[0].name",
        ),
        (json!({"tools": [w.clone(), w.clone()]}), 400, "tools"),
        (json!({"tool_choice": "required"}), 400, "tool_choice"),
        (
            json!({"tools": [w.clone()], "tool_choice": "sometimes"}),
            400,
            "tool_choice",
        ),
        (
            json!({"tools": [w.clone()], "tool_choice": {"type": "function", "name": "nope"}}),
            400,
            "tool_choice",
        ),
        (
            json!({"tools": [w.clone()], "tool_choice": {"type": "file_search"}}),
            400,
            "tool_choice",
        ),
        (
            json!({"reasoning": {"effort": "extreme"}}),
            400,
            "reasoning.effort",
        ),
        (
            json!({"reasoning": {"effort": "low", "budget": 3}}),
            400,
            "reasoning.budget",
        ),
        (
            json!({"text": {"format": {"type": "yaml"}}}),
            400,
            "text.format.type",
        ),
        (
            json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
                   "tools": [w.clone()], "tool_choice": "required"}),
            400,
            "text.format",
        ),
        (json!({"include": ["everything"]}), 400, "include[0]"),
        (
            json!({"background": true, "store": false}),
            400,
            "background",
        ),
        (json!({"truncation": "middle"}), 400, "truncation"),
        (json!({"conversation": "conv_1"}), 400, "conversation"),
        (json!({"prompt": {"id": "pmpt_1"}}), 400, "prompt"),
        (
            json!({"context_management": [{"type": "compaction"}]}),
            400,
            "context_management",
        ),
        (
            json!({"prompt_cache_retention": "1y"}),
            400,
            "prompt_cache_retention",
        ),
        (json!({"max_tool_calls": 0}), 400, "max_tool_calls"),
        (
            json!({"text": {"verbosity": "loud"}}),
            400,
            "text.verbosity",
        ),
        (json!({"metadata": {"k": 1}}), 400, "metadata"),
        (json!({"max_output_tokens": 0}), 400, "max_output_tokens"),
        (json!({"max_output_tokens": 100000000}), 400, "input"),
        (json!({"top_logprobs": 21}), 400, "top_logprobs"),
        (json!({"temperature": 3}), 400, "temperature"),
        (
            json!({"stream_options": {"include_usage": true}}),
            400,
            "stream_options.include_usage",
        ),
        (json!({"n": 2}), 400, "."),
        (
            json!({"previous_response_id": "resp_nope"}),
            404,
            "previous_response_id",
        ),
        (json!({"model": "gpt-5"}), 404, "model"),
    ] {
        let body = with(
            responses(json!("Hi"), json!({"max_output_tokens": 2})),
            extra.clone(),
        );
        let e = s.send("POST", "/v1/responses", &body).await.error(status);
        if param == "." {
            assert!(
                e["message"].as_str().unwrap().contains("`n`"),
                "{extra}: {e}"
            );
        } else {
            assert_eq!(e["param"], param, "{extra}: {e}");
        }
    }
    // The limit's errors name the Responses field, not chat's.
    for limit in [0, 100_000_000] {
        let body = responses(json!("Hi"), json!({"max_output_tokens": limit}));
        let e = s.send("POST", "/v1/responses", &body).await.error(400);
        let m = e["message"].as_str().unwrap();
        assert!(
            m.contains("max_output_tokens") && !m.contains("max_tokens "),
            "{m}"
        );
    }
    // A body that is not JSON, and one without a model.
    let r = request(s.addr, "POST", "/v1/responses", &[], b"{\"input\": ").await;
    assert_eq!(r.error(400)["code"], "invalid_json");
    s.send("POST", "/v1/responses", &json!({"input": "Hi"}))
        .await
        .error(400);
    s.get("/v1/responses/resp_nope").await.error(404);
    assert_eq!(s.get("/v1/responses").await.status, 405);
    s.shutdown().await.unwrap();
}

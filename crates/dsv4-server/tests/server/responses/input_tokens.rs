//! `POST /v1/responses/input_tokens`: the count is the prompt a response with the same
//! conversation runs (its `usage.input_tokens`) — plain input, instructions and tools,
//! thinking, a stored `previous_response_id` chain — with `model` optional; fields that are
//! not the conversation's, and the Responses API's own refusals, are errors naming the field.
//! Truncation: [`super::truncation`].

use super::*;

/// The count for `fields`, asserting the object's shape.
pub(super) async fn count(s: &TestServer, fields: Value) -> u64 {
    let r = s.send("POST", "/v1/responses/input_tokens", &fields).await;
    assert_eq!(r.status, 200, "{fields}: {}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "response.input_tokens", "{v}");
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    v["input_tokens"].as_u64().unwrap()
}

/// The response to `conversation` (greedy, two tokens): its JSON.
async fn respond(s: &TestServer, conversation: &Value) -> Value {
    let body = with(
        responses(json!("unused"), json!({"max_output_tokens": 2})),
        conversation.clone(),
    );
    let r = s.send("POST", "/v1/responses", &body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_is_the_prompt_a_response_runs() {
    let s = start(config()).await;
    let conversations = [
        json!({"input": "Hello"}),
        json!({"instructions": "Be brief.",
               "input": [{"role": "user", "content": "Weather in Oslo?"}],
               "tools": [weather_tool()], "tool_choice": "auto"}),
        json!({"input": "Think first.", "reasoning": {"effort": "high"}}),
        json!({"input": "Hello", "tools": [weather_tool()], "tool_choice": "none"}),
    ];
    let mut seen = Vec::new();
    for c in &conversations {
        let n = count(&s, with(json!({"model": MODEL}), c.clone())).await;
        let r = respond(&s, c).await;
        assert_eq!(r["usage"]["input_tokens"], n, "{c}: {r}");
        seen.push(n);
    }
    // The instructions and tools, and the thinking prompt, are counted.
    assert!(seen[1] > seen[0] && seen[2] != seen[0], "{seen:?}");
    // `tool_choice: none` leaves the tools out of the prompt, as the response does.
    assert_eq!(seen[3], seen[0], "{seen:?}");

    // A stored chain counts the conversation it continues; `model` may be left out.
    let first = respond(&s, &json!({"input": "Hello"})).await;
    let next = json!({"input": "And then?", "previous_response_id": first["id"]});
    let n = count(&s, next.clone()).await;
    let r = respond(&s, &next).await;
    assert_eq!(r["usage"]["input_tokens"], n, "{r}");
    assert!(n > seen[0], "{n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_counts_name_their_field() {
    let s = start(config()).await;
    for (body, status, param) in [
        (json!({"input": "Hi", "stream": true}), 400, "stream"),
        (
            json!({"input": "Hi", "max_output_tokens": 5}),
            400,
            "max_output_tokens",
        ),
        (json!({"input": "Hi", "temperature": 0}), 400, "temperature"),
        (
            json!({"input": "Hi", "conversation": "conv_1"}),
            400,
            "conversation",
        ),
        (json!({"input": 5}), 400, "input"),
        (
            json!({"input": "Hi", "truncation": "sometimes"}),
            400,
            "truncation",
        ),
        (
            json!({"input": "Hi", "tools": [{"type": "web_search"}]}),
            400,
            "tools[0].type",
        ),
        (json!({"input": "Hi", "model": "gpt-4o"}), 404, "model"),
        (
            json!({"input": "Hi", "previous_response_id": "resp_none"}),
            404,
            "previous_response_id",
        ),
    ] {
        let e = s
            .send("POST", "/v1/responses/input_tokens", &body)
            .await
            .error(status);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    for raw_body in [&b"[1, 2]"[..], b"{\"input\": ", b"not json"] {
        let json = [("content-type", "application/json")];
        let r = request(
            s.addr,
            "POST",
            "/v1/responses/input_tokens",
            &json,
            raw_body,
        )
        .await;
        assert_eq!(r.status, 400, "{}", r.body);
    }
}

//! Stored responses over HTTP: continued with `previous_response_id` (a tool result
//! included, equal to sending the whole conversation), read back, deleted, dropped past
//! `server.responses_store`, their input items listed page by page; and aborted responses,
//! ended `cancelled`.

use super::*;

async fn create(s: &TestServer, body: &Value) -> Value {
    let r = s.send("POST", "/v1/responses", body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    r.json()
}

fn text_of(r: &Value) -> String {
    said_by_response(r).1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_continue_read_and_delete() {
    let s = start(config()).await;
    let first = create(
        &s,
        &responses(json!("Hello"), json!({"max_output_tokens": 6})),
    )
    .await;
    assert_eq!(first["store"], true);
    let id1 = first["id"].as_str().unwrap();
    let r = s.get(&format!("/v1/responses/{id1}")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), first, "read back as answered");

    // The next turn sees the first (its instructions its own).
    let second = create(
        &s,
        &responses(
            json!("More"),
            json!({"previous_response_id": id1, "instructions": "Be brief.",
                   "max_output_tokens": 6}),
        ),
    )
    .await;
    assert_eq!(second["previous_response_id"], id1);
    let history = |extra: Vec<Value>| {
        let mut m = vec![
            json!({"role": "user", "content": "Hello"}),
            json!({"role": "assistant", "content": text_of(&first)}),
            json!({"role": "user", "content": "More"}),
        ];
        m.extend(extra);
        m
    };
    let mut with_system = history(Vec::new());
    with_system.insert(0, json!({"role": "system", "content": "Be brief."}));
    let c = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat_of(json!(with_system), json!({"max_tokens": 6})),
        )
        .await
        .json();
    assert_eq!(said_by_response(&second), said_by_chat(&c));

    // Deleting the first leaves the chain through the second whole; instructions are not
    // carried over.
    let id2 = second["id"].as_str().unwrap();
    let d = s
        .send("DELETE", &format!("/v1/responses/{id1}"), &json!(null))
        .await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(
        d.json(),
        json!({"id": id1, "object": "response", "deleted": true})
    );
    assert_eq!(
        s.get(&format!("/v1/responses/{id1}")).await.error(404)["code"],
        "not_found"
    );
    s.send("DELETE", &format!("/v1/responses/{id1}"), &json!(null))
        .await
        .error(404);
    let third = create(
        &s,
        &responses(
            json!("Again"),
            json!({"previous_response_id": id2, "max_output_tokens": 6}),
        ),
    )
    .await;
    let messages = history(vec![
        json!({"role": "assistant", "content": text_of(&second)}),
        json!({"role": "user", "content": "Again"}),
    ]);
    let c = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat_of(json!(messages), json!({"max_tokens": 6})),
        )
        .await
        .json();
    assert_eq!(said_by_response(&third), said_by_chat(&c));

    // store: false keeps nothing.
    let unstored = create(
        &s,
        &responses(json!("Hi"), json!({"store": false, "max_output_tokens": 2})),
    )
    .await;
    assert_eq!(unstored["store"], false);
    let uid = unstored["id"].as_str().unwrap();
    s.get(&format!("/v1/responses/{uid}")).await.error(404);
    let e = s
        .send(
            "POST",
            "/v1/responses",
            &responses(json!("Hi"), json!({"previous_response_id": uid})),
        )
        .await
        .error(404);
    assert_eq!(e["param"], "previous_response_id");
    assert_eq!(e["code"], "previous_response_not_found");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_result_continues_a_stored_call() {
    let s = start(config()).await;
    let tools = json!({"tools": [weather_tool()], "tool_choice": "required",
                       "parallel_tool_calls": false, "max_output_tokens": 400, "stop": []});
    let first = create(&s, &responses(json!("Weather in Oslo?"), tools.clone())).await;
    let call = first["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("no call: {first}"))
        .clone();
    let call_id = call["call_id"].as_str().unwrap();
    let result = json!([{"type": "function_call_output", "call_id": call_id, "output": "sunny"}]);
    let body = with(
        responses(result, tools.clone()),
        json!({"previous_response_id": first["id"]}),
    );
    let messages = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
    ]);
    let chat_body = chat_of(
        messages,
        json!({"tools": [chat_weather_tool()], "tool_choice": "required",
               "parallel_tool_calls": false, "max_tokens": 400, "stop": []}),
    );
    same_as_chat(&s, &body, &chat_body).await;
    // The same conversation sent whole as items, without the store.
    let items = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": call_id, "name": call["name"],
         "arguments": call["arguments"]},
        {"type": "function_call_output", "call_id": call_id, "output": "sunny"},
    ]);
    same_as_chat(
        &s,
        &with(responses(items, tools), json!({"store": false})),
        &chat_body,
    )
    .await;
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_keeps_the_newest_within_its_budget_and_can_be_off() {
    let s = start(dsv4_server::ServerConfig {
        responses_store: 1,
        ..config()
    })
    .await;
    let body = responses(json!("Hello"), json!({"max_output_tokens": 1}));
    let a = create(&s, &body).await;
    let b = create(&s, &body).await;
    let path = |r: &Value| format!("/v1/responses/{}", r["id"].as_str().unwrap());
    s.get(&path(&a)).await.error(404);
    assert_eq!(s.get(&path(&b)).await.status, 200);
    s.shutdown().await.unwrap();

    let s = start(dsv4_server::ServerConfig {
        responses_store: 0,
        ..config()
    })
    .await;
    let a = create(&s, &body).await;
    assert_eq!(a["store"], false, "it says it was not stored");
    let e = s
        .send(
            "POST",
            "/v1/responses",
            &with(body.clone(), json!({"previous_response_id": a["id"]})),
        )
        .await
        .error(404);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("server.responses_store = 0"),
        "{e}"
    );
    s.shutdown().await.unwrap();

    // A response bigger than the whole byte budget is answered but not kept, and says so,
    // streamed or not; the store stays within its budget.
    let s = start(dsv4_server::ServerConfig {
        responses_store_bytes: 1000,
        ..config()
    })
    .await;
    let big = create(&s, &body).await;
    assert_eq!(big["store"], false, "{big}");
    s.get(&path(&big)).await.error(404);
    let streamed = s
        .send(
            "POST",
            "/v1/responses",
            &with(body.clone(), json!({"stream": true})),
        )
        .await;
    let last = streamed.events().pop().unwrap();
    assert_eq!(last["response"]["store"], false, "{last}");
    assert!(s.state.responses().is_empty());
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_response_is_cancelled_with_what_it_had() {
    let s = start(config()).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    let body = responses(json!("Hi"), json!({"max_output_tokens": 50}));
    // Not streamed: held by a stalled step loop, then aborted.
    let stall = engine.stall();
    let addr = s.addr;
    let text = body.to_string();
    let pending =
        tokio::spawn(
            async move { request(addr, "POST", "/v1/responses", &[], text.as_bytes()).await },
        );
    eventually("the response is in flight", async || {
        !s.state.aborts().is_empty()
    })
    .await;
    let a = s
        .send("POST", "/abort_request", &json!({"abort_all": true}))
        .await;
    assert_eq!(a.json()["aborted"], 1, "{}", a.body);
    drop(stall);
    let r = pending.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["status"], "cancelled", "{v}");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["status"], "incomplete");

    // Streamed: aborted by the id of its first event.
    let stall = engine.stall();
    let streamed = with(body, json!({"stream": true}));
    let (conn, seen) = open_stream(s.addr, "/v1/responses", &streamed).await;
    let created = parse_reply(&seen).events()[0].clone();
    assert_eq!(created["type"], "response.created", "{created}");
    let id = created["response"]["id"].as_str().unwrap().to_string();
    let a = s.send("POST", "/abort_request", &json!({"rid": id})).await;
    assert_eq!(a.json()["aborted"], 1, "{}", a.body);
    drop(stall);
    let events = finish_stream(conn, seen).await.events();
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.incomplete", "{last}");
    assert_eq!(last["response"]["status"], "cancelled");
    assert_eq!(last["response"]["id"], id.as_str());
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_items_page_through_a_stored_response() {
    let s = start(config()).await;
    let items = json!([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "id": "msg_mine",
         "content": [{"type": "input_text", "text": "Hello"}]},
        {"role": "user", "content": "again"},
    ]);
    let r = create(&s, &responses(items, json!({"max_output_tokens": 2}))).await;
    let path = format!("/v1/responses/{}/input_items", r["id"].as_str().unwrap());
    let all = s.get(&path).await.json();
    assert_eq!(all["object"], "list");
    let data = all["data"].as_array().unwrap();
    assert_eq!(data.len(), 3, "{all}");
    assert_eq!(data[0]["content"], "again", "newest first");
    assert_eq!(data[1]["id"], "msg_mine", "an item's own id is kept");
    assert_eq!(data[2]["role"], "developer");
    assert!(data[0]["id"].as_str().unwrap().starts_with("msg_"));
    assert_ne!(data[0]["id"], data[2]["id"]);
    assert_eq!(all["first_id"], data[0]["id"]);
    assert_eq!(all["last_id"], data[2]["id"]);
    assert_eq!(all["has_more"], false);

    let page = s.get(&format!("{path}?order=asc&limit=2")).await.json();
    assert_eq!(page["data"][0]["role"], "developer");
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    assert_eq!(page["has_more"], true);
    let after = page["last_id"].as_str().unwrap();
    let rest = s
        .get(&format!("{path}?order=asc&limit=2&after={after}"))
        .await
        .json();
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest["data"][0]["content"], "again");
    assert_eq!(rest["has_more"], false);

    // A string input is one user message with an input_text part.
    let r = create(
        &s,
        &responses(json!("Hello"), json!({"max_output_tokens": 1})),
    )
    .await;
    let one = s
        .get(&format!(
            "/v1/responses/{}/input_items",
            r["id"].as_str().unwrap()
        ))
        .await
        .json();
    assert_eq!(one["data"][0]["content"][0]["text"], "Hello");
    assert_eq!(one["data"][0]["role"], "user");

    for (query, param) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("order=up", "order"),
        ("after=nope", "after"),
        ("page=2", "page"),
    ] {
        let e = s.get(&format!("{path}?{query}")).await.error(400);
        assert_eq!(e["param"], param, "{query}: {e}");
    }
    s.get("/v1/responses/resp_nope/input_items")
        .await
        .error(404);
    s.shutdown().await.unwrap();
}

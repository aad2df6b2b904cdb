//! Background responses over HTTP: answered `queued` at once and polled to the same answer as
//! a foreground run; streamed, with every event replayable from any sequence number and
//! followable live, and not cancelled when the client goes away; cancelled with what they
//! had; bounded by the store; failed ones kept as failed; bad use refused, naming the field.

use super::*;
use dsv4_server::ServerConfig;

async fn create(s: &TestServer, body: &Value) -> Value {
    let r = s.send("POST", "/v1/responses", body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    r.json()
}

/// Poll `GET /v1/responses/{id}` until it left `queued` and `in_progress`.
async fn until_done(s: &TestServer, id: &str) -> Value {
    poll(
        s,
        &format!("/v1/responses/{id}"),
        "the background response finished",
        |v| !matches!(v["status"].as_str(), Some("queued" | "in_progress")),
    )
    .await
}

/// A request continuing the response `id`.
fn continuing(id: &str) -> Value {
    responses(json!("More"), json!({"previous_response_id": id}))
}

fn id_of(v: &Value) -> String {
    v["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_is_answered_queued_and_polled_to_its_end() {
    let s = start(config()).await;
    let body = responses(json!("Hello"), json!({"max_output_tokens": 6}));
    let foreground = create(&s, &body).await;
    let queued = create(&s, &with(body, json!({"background": true}))).await;
    assert_eq!(queued["status"], "queued", "{queued}");
    assert_eq!(queued["background"], true);
    assert_eq!(queued["output"], json!([]));
    assert!(queued["usage"].is_null() && queued["completed_at"].is_null());
    let id = id_of(&queued);

    let done = until_done(&s, &id).await;
    assert_eq!(done["status"], foreground["status"], "{done}");
    assert_eq!(done["background"], true);
    assert_eq!(done["store"], true);
    assert_eq!(said_by_response(&done), said_by_response(&foreground));
    assert_eq!(s.state.responses().running(), 0);

    // Stored like any response: its input items, a continuation, an idempotent cancel.
    let items = s.get(&format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(items.json()["data"][0]["content"][0]["text"], "Hello");
    let next = responses(
        json!("More"),
        json!({"previous_response_id": id, "max_output_tokens": 4}),
    );
    create(&s, &next).await;
    let c = s
        .send("POST", &format!("/v1/responses/{id}/cancel"), &json!(null))
        .await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(
        c.json(),
        done,
        "cancelling a finished response answers it as it is"
    );
    // Its events were not kept (it was not streamed).
    let e = s
        .get(&format!("/v1/responses/{id}?stream=true"))
        .await
        .error(400);
    assert_eq!(e["param"], "stream", "{e}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_stream_replays_from_any_event_and_outlives_its_client() {
    let s = start(config()).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    let body = responses(
        json!("Hello"),
        json!({"max_output_tokens": 12, "background": true, "stream": true}),
    );

    // The client goes away after the first event; the response runs on.
    let stall = engine.stall();
    let (conn, seen) = open_stream(s.addr, "/v1/responses", &body).await;
    let created = parse_reply(&seen).events()[0].clone();
    assert_eq!(created["type"], "response.created", "{created}");
    assert_eq!(created["response"]["status"], "queued");
    let id = id_of(&created["response"]);
    drop(conn);
    drop(stall);
    let done = until_done(&s, &id).await;
    assert_eq!(
        done["incomplete_details"]["reason"], "max_output_tokens",
        "a disconnect cancels nothing; it ran to its limit: {done}"
    );

    // All events again, checked against the final response; then from a sequence number on.
    let all = typed_events(&s.get(&format!("/v1/responses/{id}?stream=true")).await);
    check_stream(&all, &done);
    for after in [0, 3, all.len() - 2] {
        let rest = typed_events(
            &s.get(&format!(
                "/v1/responses/{id}?stream=true&starting_after={after}"
            ))
            .await,
        );
        assert_eq!(rest, all[after + 1..], "resumed after {after}");
    }
    let none = s
        .get(&format!(
            "/v1/responses/{id}?stream=true&starting_after={}",
            all.len() + 5
        ))
        .await;
    assert!(typed_events(&none).is_empty(), "{}", none.body);

    // A second client follows a running response live and sees what the first sees.
    let stall = engine.stall();
    let (conn, seen) = open_stream(s.addr, "/v1/responses", &body).await;
    let id = id_of(&parse_reply(&seen).events()[0]["response"]);
    let addr = s.addr;
    let path = format!("/v1/responses/{id}?stream=true&starting_after=0");
    let follower = tokio::spawn(async move { request(addr, "GET", &path, &[], b"").await });
    drop(stall);
    let first = typed_events(&finish_stream(conn, seen).await);
    let followed = typed_events(&follower.await.unwrap());
    assert_eq!(followed, first[1..]);
    assert_eq!(first.last().unwrap().0, "response.incomplete");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_background_response_ends_with_what_it_had() {
    let s = start(config()).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    let stall = engine.stall();
    let body = responses(
        json!("Hello"),
        json!({"max_output_tokens": 50, "background": true}),
    );
    let id = id_of(&create(&s, &body).await);
    let addr = s.addr;
    let path = format!("/v1/responses/{id}/cancel");
    let cancel = tokio::spawn(async move { request(addr, "POST", &path, &[], b"").await });
    eventually("the cancel reached the run", async || {
        s.state.aborts().aborting() == 1
    })
    .await;
    drop(stall);
    let r = cancel.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let cancelled = r.json();
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["output"][0]["status"], "incomplete");
    let again = s
        .send("POST", &format!("/v1/responses/{id}/cancel"), &json!(null))
        .await;
    assert_eq!(again.json(), cancelled, "cancelling twice answers the same");
    assert_eq!(
        s.get(&format!("/v1/responses/{id}")).await.json(),
        cancelled
    );
    let d = s
        .send("DELETE", &format!("/v1/responses/{id}"), &json!(null))
        .await;
    assert_eq!(
        d.status, 200,
        "a finished background response can be deleted"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_background_response_is_kept_failed() {
    let s = start(config()).await;
    // The tiny model's greedy answer to "Hi" without stops breaks the strict parser.
    let body = with(
        responses(
            json!("Hi"),
            json!({"max_output_tokens": 8, "background": true}),
        ),
        json!({"stop": []}),
    );
    let id = id_of(&create(&s, &body).await);
    let failed = until_done(&s, &id).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["type"], "model_output_error");
    let e = s
        .send("POST", "/v1/responses", &continuing(&id))
        .await
        .error(400);
    assert_eq!(e["param"], "previous_response_id", "{e}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_use_is_checked() {
    let s = start(ServerConfig {
        responses_store: 1,
        ..config()
    })
    .await;
    let engine = s.state.loaded().unwrap().engine.clone();
    let body = responses(
        json!("Hello"),
        json!({"max_output_tokens": 4, "background": true}),
    );
    let e = s
        .send(
            "POST",
            "/v1/responses",
            &with(body.clone(), json!({"store": false})),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "background", "{e}");

    // One runs; a second is refused (the store keeps one); the running one cannot be
    // continued or deleted yet, but can be read.
    let stall = engine.stall();
    let id = id_of(&create(&s, &body).await);
    let metrics = s.get("/metrics").await.body;
    assert!(
        metrics.contains("\ndsv4:responses_background_running 1\n"),
        "{metrics}"
    );
    let r = s.send("POST", "/v1/responses", &body).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "too_many_background_responses");
    let e = s
        .send("POST", "/v1/responses", &continuing(&id))
        .await
        .error(400);
    assert_eq!(e["code"], "previous_response_in_progress", "{e}");
    s.send("DELETE", &format!("/v1/responses/{id}"), &json!(null))
        .await
        .error(400);
    let now = s.get(&format!("/v1/responses/{id}")).await.json();
    assert!(
        matches!(now["status"].as_str(), Some("queued" | "in_progress")),
        "{now}"
    );
    let items = s.get(&format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(items.status, 200, "{}", items.body);
    drop(stall);
    until_done(&s, &id).await;
    // The next one runs once the first finished (and replaces it in the store).
    let id = id_of(&create(&s, &body).await);
    until_done(&s, &id).await;

    // Query parameters and cancels that make no sense.
    for (query, param) in [
        ("stream=maybe", "stream"),
        ("stream=true&starting_after=x", "starting_after"),
        ("starting_after=1", "starting_after"),
        ("limit=3", "limit"),
    ] {
        let e = s
            .get(&format!("/v1/responses/{id}?{query}"))
            .await
            .error(400);
        assert_eq!(e["param"], param, "{query}: {e}");
    }
    s.get("/v1/responses/resp_nope?stream=true")
        .await
        .error(404);
    s.send("POST", "/v1/responses/resp_nope/cancel", &json!(null))
        .await
        .error(404);
    let plain = create(
        &s,
        &responses(json!("Hello"), json!({"max_output_tokens": 2})),
    )
    .await;
    let e = s
        .send(
            "POST",
            &format!("/v1/responses/{}/cancel", id_of(&plain)),
            &json!(null),
        )
        .await
        .error(400);
    assert!(e["message"].as_str().unwrap().contains("background"), "{e}");
    let metrics = s.get("/metrics").await.body;
    for line in [
        r#"endpoint="/v1/responses/{id}/cancel",status="400""#,
        r#"endpoint="/v1/responses",status="429""#,
        "\ndsv4:responses_stored 1\n",
        "\ndsv4:responses_background_running 0\n",
    ] {
        assert!(metrics.contains(line), "{line}: {metrics}");
    }
    s.shutdown().await.unwrap();

    // A server that stores nothing runs nothing in the background.
    let s = start(ServerConfig {
        responses_store: 0,
        ..config()
    })
    .await;
    let e = s.send("POST", "/v1/responses", &body).await.error(400);
    assert_eq!(e["param"], "background", "{e}");
    s.shutdown().await.unwrap();
}

//! `server.responses_dir`: stored responses survive a restart. A server started on the same
//! directory reads back what the last one stored: `GET` answers the same object, its input
//! items are listed, a continuation answers as it did before the restart, a streamed
//! background response replays the same events, and a deleted response stays deleted. A
//! directory that cannot be used, or that another server holds, stops the server at start.

use super::*;
use dsv4_server::ServerConfig;

fn on_disk(dir: &std::path::Path) -> ServerConfig {
    ServerConfig {
        responses_dir: Some(dir.to_owned()),
        ..config()
    }
}

async fn create(s: &TestServer, body: &Value) -> Value {
    let r = s.send("POST", "/v1/responses", body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(on_disk(dir.path())).await;
    let first = create(
        &s,
        &responses(json!("Hello"), json!({"max_output_tokens": 6})),
    )
    .await;
    let id1 = first["id"].as_str().unwrap().to_string();
    let next = responses(
        json!("More"),
        json!({"previous_response_id": id1, "max_output_tokens": 6}),
    );
    let before = create(&s, &next).await;
    let gone = create(
        &s,
        &responses(json!("Bye"), json!({"max_output_tokens": 2})),
    )
    .await;
    let gone_id = gone["id"].as_str().unwrap().to_string();
    assert_eq!(
        s.send("DELETE", &format!("/v1/responses/{gone_id}"), &json!({}))
            .await
            .status,
        200
    );
    let items = s.get(&format!("/v1/responses/{id1}/input_items")).await;
    assert_eq!(items.status, 200, "{}", items.body);
    s.shutdown().await.unwrap();

    let s = start(on_disk(dir.path())).await;
    let r = s.get(&format!("/v1/responses/{id1}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), first, "read back as answered before the restart");
    let again = s.get(&format!("/v1/responses/{id1}/input_items")).await;
    assert_eq!(again.json(), items.json());
    // The continuation sees the same conversation: the same prompt, the same greedy answer.
    let after = create(&s, &next).await;
    assert_eq!(after["usage"], before["usage"], "{before} {after}");
    assert_eq!(said_by_response(&after), said_by_response(&before));
    // A chain across the restart: continuing the continuation made before it.
    let third = responses(
        json!("Last"),
        json!({"previous_response_id": before["id"], "max_output_tokens": 2}),
    );
    let last = create(&s, &third).await;
    assert!(
        last["usage"]["input_tokens"].as_u64() > before["usage"]["input_tokens"].as_u64(),
        "{last}"
    );
    let e = s.get(&format!("/v1/responses/{gone_id}")).await.error(404);
    assert!(e["message"].as_str().unwrap().contains(&gone_id), "{e}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_stream_replays_the_same_events_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(on_disk(dir.path())).await;
    let body = responses(
        json!("Hello"),
        json!({"max_output_tokens": 12, "background": true, "stream": true}),
    );
    let streamed = typed_events(&s.send("POST", "/v1/responses", &body).await);
    let id = streamed[0].1["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/responses/{id}");
    let done = poll(&s, &path, "the background response finished", |v| {
        v["status"] != "queued" && v["status"] != "in_progress"
    })
    .await;
    let before = typed_events(&s.get(&format!("{path}?stream=true")).await);
    assert_eq!(before, streamed, "kept as streamed");
    s.shutdown().await.unwrap();

    let s = start(on_disk(dir.path())).await;
    assert_eq!(s.get(&path).await.json(), done);
    let after = typed_events(&s.get(&format!("{path}?stream=true")).await);
    assert_eq!(after, before, "every event, replayed after the restart");
    check_stream(&after, &done);
    let rest = typed_events(&s.get(&format!("{path}?stream=true&starting_after=2")).await);
    assert_eq!(rest, before[3..]);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_the_server_cannot_use_stops_it_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let e = dsv4_server::AppState::new(on_disk(&file)).unwrap_err();
    assert!(e.to_string().contains("server.responses_dir"), "{e}");
    let none = ServerConfig {
        responses_store: 0,
        ..on_disk(dir.path())
    };
    let e = dsv4_server::AppState::new(none).unwrap_err();
    assert!(e.to_string().contains("responses_store"), "{e}");
    // One server per directory: a second is refused while the first holds it.
    let held = dsv4_server::AppState::new(on_disk(dir.path())).unwrap();
    let e = dsv4_server::AppState::new(on_disk(dir.path())).unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("server.responses_dir") && e.contains("another server uses it"),
        "{e}"
    );
    drop(held);
    dsv4_server::AppState::new(on_disk(dir.path())).expect("free once the first is gone");
}

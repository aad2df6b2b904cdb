//! `truncation: "auto"`: a conversation longer than the engine can hold loses as few of its
//! oldest turns as make it fit (system and developer messages kept), and answers what chat
//! answers for that shorter conversation; without it, or when even the last turn is too long,
//! the request is refused.

use super::*;
use dsv4_engine::{CacheBudget, EngineConfig};

/// A server whose cache holds 1024 tokens, so a few long turns overflow it.
async fn small_server() -> TestServer {
    start_engine(EngineConfig {
        cache: CacheBudget::Tokens(1024),
        max_running_requests: 4,
        ..Default::default()
    })
    .await
}

/// Chat messages: a developer message, then `turns` long user/assistant exchanges, then
/// `last` from the user.
fn conversation(turns: usize, last: &str) -> Vec<Value> {
    let mut m = vec![json!({"role": "developer", "content": "Be brief."})];
    for k in 0..turns {
        m.push(json!({"role": "user", "content": format!("Turn {k}: {}", "tell me more. ".repeat(20))}));
        m.push(json!({"role": "assistant", "content": format!("Answer {k}.")}));
    }
    m.push(json!({"role": "user", "content": last}));
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_truncation_drops_the_fewest_oldest_turns() {
    let s = small_server().await;
    let messages = conversation(12, "Hello");
    let body = responses(json!(messages), json!({"max_output_tokens": 6}));
    let e = s.send("POST", "/v1/responses", &body).await.error(400);
    assert_eq!(e["code"], "context_length_exceeded", "{e}");
    assert!(e["message"].as_str().unwrap().contains("truncation"), "{e}");

    let auto = s
        .send(
            "POST",
            "/v1/responses",
            &with(body.clone(), json!({"truncation": "auto"})),
        )
        .await;
    assert_eq!(auto.status, 200, "{}", auto.body);
    let auto = auto.json();
    assert_eq!(auto["truncation"], "auto");

    // The answer is chat's for the shortest-dropped conversation chat accepts: the developer
    // message, then from some user turn on.
    let mut want = None;
    for cut in (1..messages.len()).filter(|&i| messages[i]["role"] == "user") {
        let mut kept = vec![messages[0].clone()];
        kept.extend_from_slice(&messages[cut..]);
        let c = s
            .send(
                "POST",
                "/v1/chat/completions",
                &chat_of(json!(kept), json!({"max_tokens": 6})),
            )
            .await;
        if c.status == 200 {
            want = Some((cut, c.json()));
            break;
        }
        assert_eq!(c.status, 400, "{}", c.body);
    }
    let (cut, want) = want.expect("the last turn alone fits");
    assert!(cut > 1, "something was dropped");
    assert_eq!(said_by_response(&auto), said_by_chat(&want));

    // Stored, it is continued with the same rule: the new turn fits after more is dropped.
    let next = s
        .send(
            "POST",
            "/v1/responses",
            &responses(
                json!("More"),
                json!({"previous_response_id": auto["id"], "truncation": "auto",
                       "max_output_tokens": 6}),
            ),
        )
        .await;
    assert_eq!(next.status, 200, "{}", next.body);

    // A last turn longer than the cache cannot be saved by dropping the others.
    let huge = "tell me more. ".repeat(600);
    let body = responses(
        json!(conversation(2, &huge)),
        json!({"max_output_tokens": 6, "truncation": "auto"}),
    );
    let e = s.send("POST", "/v1/responses", &body).await.error(400);
    assert_eq!(e["code"], "context_length_exceeded", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("even the last user turn"),
        "{e}"
    );
    // Errors that are not about length are not truncated away.
    let e = s
        .send(
            "POST",
            "/v1/responses",
            &with(
                responses(json!(messages), json!({"max_output_tokens": 0})),
                json!({"truncation": "auto"}),
            ),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "max_output_tokens", "{e}");
    let e = s
        .send(
            "POST",
            "/v1/responses",
            &responses(json!("Hi"), json!({"truncation": "middle"})),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "truncation", "{e}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_input_token_count_follows_truncation() {
    let s = small_server().await;
    let messages = conversation(12, "Hello");
    let whole = super::input_tokens::count(&s, json!({"input": messages})).await;
    // Too long to run, and counted whole: what a client asks before compacting.
    assert!(whole > 1024, "{whole}");
    // One output token: the count leaves room for at least one, as a response without
    // max_output_tokens does.
    let body = responses(json!(messages), json!({"max_output_tokens": 1}));
    let e = s.send("POST", "/v1/responses", &body).await.error(400);
    assert_eq!(e["code"], "context_length_exceeded", "{e}");
    // With truncation auto, the count is what the response keeps.
    let auto = json!({"input": messages, "truncation": "auto"});
    let kept = super::input_tokens::count(&s, auto).await;
    let r = s
        .send(
            "POST",
            "/v1/responses",
            &with(body, json!({"truncation": "auto"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["input_tokens"], kept);
    assert!(kept < whole, "{kept} {whole}");
}

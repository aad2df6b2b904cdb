//! SageMaker's container contract: `/ping` is `/health`, and `/invocations` answers as chat
//! completions with `messages` and as completions with `prompt`.

use super::common::*;
use serde_json::json;

#[tokio::test]
async fn invocations_answer_as_chat_or_completions_and_ping_is_health() {
    let s = start(config()).await;
    for method in ["GET", "POST"] {
        let r = request(s.addr, method, "/ping", &[], b"").await;
        assert_eq!(
            (r.status, r.json()),
            (200, json!({"status": "ok"})),
            "{method}"
        );
    }
    let chat_req = chat("Hi", json!({"max_tokens": 12, "stop": CLEAN_STOPS}));
    let completion = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 12, "temperature": 0});
    for (body, path) in [
        (chat_req, "/v1/chat/completions"),
        (completion, "/v1/completions"),
    ] {
        let got = s.send("POST", "/invocations", &body).await;
        assert_eq!(got.status, 200, "{}", got.body);
        let want = s.send("POST", path, &body).await.json();
        let (mut got, mut want) = (got.json(), want);
        for v in [&mut got, &mut want] {
            v["id"] = json!(null);
            v["created"] = json!(null);
        }
        assert_eq!(got, want, "{path}");
    }
    let r = s
        .send("POST", "/invocations", &json!({"model": MODEL}))
        .await;
    assert!(
        r.error(400)["message"]
            .as_str()
            .unwrap()
            .contains("`messages`")
    );
    let r = request(s.addr, "POST", "/invocations", &[], b"not json").await;
    assert_eq!(r.error(400)["code"], "invalid_json");
}

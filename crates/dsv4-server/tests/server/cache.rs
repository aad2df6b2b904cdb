//! `POST /reset_prefix_cache` and `POST /flush_cache`: after a flush the same prompt reuses no
//! cached tokens, the answer counts the snapshots dropped, the engine holds none, and the
//! routes need the API key when one is set.

use super::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_drops_every_snapshot_so_the_next_request_starts_cold() {
    let s = start(config()).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(6);
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0});
    let cached = async || {
        let v = s.send("POST", "/v1/completions", &body).await.json();
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached().await, 0);
    assert!(
        cached().await >= 64,
        "the second request reuses whole pages"
    );
    for path in ["/reset_prefix_cache", "/flush_cache"] {
        let snapshots = engine.metrics().prefix_snapshots;
        assert!(snapshots > 0);
        let v = s.send("POST", path, &json!({})).await.json();
        assert_eq!(
            v,
            json!({"status": "ok", "snapshots_dropped": snapshots}),
            "{path}"
        );
        assert_eq!(engine.metrics().prefix_snapshots, 0, "{path}");
        assert_eq!(cached().await, 0, "{path}: the prompt runs cold again");
    }
    s.shutdown().await.unwrap();

    let s = start(dsv4_server::ServerConfig {
        api_key: Some("sekret".into()),
        ..config()
    })
    .await;
    for path in ["/reset_prefix_cache", "/flush_cache"] {
        let e = request(s.addr, "POST", path, &[], b"").await.error(401);
        assert_eq!(e["code"], "invalid_api_key", "{path}");
        let r = request(
            s.addr,
            "POST",
            path,
            &[("Authorization", "Bearer sekret")],
            b"",
        )
        .await;
        assert_eq!(r.json()["status"], "ok", "{path}");
    }
    s.shutdown().await.unwrap();
}

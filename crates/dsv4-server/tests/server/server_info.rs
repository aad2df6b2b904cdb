//! SGLang's informational endpoints: `/get_load` and `/v1/loads` count the running and waiting
//! requests and their tokens as a router needs them (503 while the model loads; `/v1/loads`
//! also as Prometheus text), `/get_model_info` names
//! the model, `/get_server_info` (and `/server_info`) gives the limits, the state now and the
//! resolved profile with secrets redacted; all need the key when one is set; `/metrics` shows
//! the token gauges and the batch fill's idle time in force.

use super::common::*;
use dsv4_server::ServerConfig;
use serde_json::{Value, json};

/// A greedy completion body of `n` tokens that cannot end early.
fn completion(prompt: &str, n: u32) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": n, "ignore_eos": true,
           "temperature": 0})
}

/// The single entry of `/get_load`.
async fn load(s: &TestServer) -> Value {
    let v = s.get("/get_load").await.json();
    let entries = v.as_array().expect("an array, one entry per rank");
    assert_eq!(entries.len(), 1, "{v}");
    assert_eq!(entries[0]["dp_rank"], 0, "{v}");
    entries[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_load_counts_running_and_waiting_requests_and_their_tokens() {
    let s = start_with(config(), slots(1)).await;
    assert_eq!(
        load(&s).await,
        json!({"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0,
               "num_pending_tokens": 0})
    );
    let engine = s.state.loaded().unwrap().engine.clone();
    // One running (a long stream), two waiting behind it.
    let hold = json!({"model": MODEL, "prompt": "hold", "max_tokens": 1500, "ignore_eos": true,
                      "stream": true});
    let (conn, _) = open_stream(s.addr, "/v1/completions", &hold).await;
    let one = send_later(&s, "/v1/completions", completion("one two", 3));
    let two = send_later(&s, "/v1/completions", completion("three four five", 3));
    eventually("two requests waiting", async || {
        engine.metrics().queued_requests == 2
    })
    .await;
    let waiting = engine.metrics().queued_tokens;
    let prompt = |text: &str| {
        let s = &s;
        let text = text.to_string();
        async move {
            let body = json!({"model": MODEL, "prompt": text});
            tokenized(&s.send("POST", "/tokenize", &body).await.json()).len() as u64
        }
    };
    assert_eq!(
        waiting,
        prompt("one two").await + prompt("three four five").await,
        "the waiting requests' prompts"
    );
    let l = load(&s).await;
    assert_eq!(
        (l["num_reqs"].as_u64(), l["num_waiting_reqs"].as_u64()),
        (Some(3), Some(2))
    );
    let tokens = l["num_tokens"].as_u64().unwrap();
    let held = prompt("hold").await;
    assert!(
        tokens > waiting + held && tokens <= waiting + held + 1500,
        "the running request's prompt and what it has generated, plus the waiting prompts: \
         {tokens} (waiting {waiting}, held prompt {held})"
    );
    assert_eq!(l["num_pending_tokens"].as_u64(), Some(waiting));
    assert_eq!(metric(&s, "dsv4:num_tokens_waiting").await, waiting);
    assert!(metric(&s, "dsv4:num_tokens_running").await > held);

    // `/v1/loads` says the same in SGLang's newer shape.
    let v = s.get("/v1/loads").await.json();
    assert_eq!(v["dp_rank_count"], 1, "{v}");
    let e = &v["loads"][0];
    assert_eq!(
        (
            &e["num_running_reqs"],
            &e["num_waiting_reqs"],
            &e["num_total_reqs"]
        ),
        (&json!(1), &json!(2), &json!(3)),
        "{v}"
    );
    let used = e["num_used_tokens"].as_u64().unwrap();
    assert!(used > held, "{v}");
    assert!(
        e["num_total_tokens"].as_u64().unwrap() >= used + waiting,
        "{v}"
    );
    assert_eq!(e["max_running_requests"], 1, "{v}");
    assert!(e["max_total_num_tokens"].as_u64().unwrap() > used, "{v}");
    // The one slot is busy.
    assert_eq!(e["utilization"], 1.0, "{v}");
    assert_eq!(e["queues"]["waiting"], 2, "{v}");
    assert_eq!(e["queues"]["retracted"], 0, "{v}");
    assert_eq!(v["aggregate"]["total_reqs"], 3, "{v}");
    assert!(
        v["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{v}"
    );
    let p = s.get("/v1/loads?include=core&format=prometheus").await;
    assert_eq!(p.status, 200, "{p:?}");
    assert!(p.header("content-type").unwrap().starts_with("text/plain"));
    assert!(
        p.body
            .lines()
            .any(|l| l == "sglang_num_waiting_reqs{dp_rank=\"0\"} 2"),
        "{}",
        p.body
    );
    assert!(!p.body.contains("sglang_queues_"), "{}", p.body);

    // The stream's client leaves; the others run and the load falls to nothing.
    drop(conn);
    for h in [one, two] {
        assert_eq!(h.await.unwrap().0.status, 200);
    }
    eventually("the engine idle", async || {
        engine.metrics().running_requests == 0
    })
    .await;
    assert_eq!(
        load(&s).await,
        json!({"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0,
               "num_pending_tokens": 0})
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_and_server_info_say_what_is_served_and_under_which_profile() {
    let settings = json!({"server": {"api_key": "<redacted>", "port": 8000},
                          "scheduler": {"max_running_requests": 2}});
    let cfg = ServerConfig {
        profile_name: Some("dev-cpu".into()),
        profile_sha256: Some("ab12".into()),
        profile_settings: Some(settings.clone()),
        model_path: "/models/DeepSeek-V4-Flash".into(),
        max_queued_requests: 5,
        ..config()
    };
    let s = start_with(cfg, slots(2)).await;
    let m = s.get("/get_model_info").await.json();
    assert_eq!(m["model_path"], "/models/DeepSeek-V4-Flash");
    assert_eq!(m["tokenizer_path"], m["model_path"]);
    assert_eq!(m["served_model_name"], MODEL);
    assert_eq!(m["is_generation"], true);
    assert_eq!(m["architectures"], json!(["DeepseekV4ForCausalLM"]));

    let info = s.get("/get_server_info").await.json();
    let context = s.get("/v1/models").await.json()["data"][0]["max_model_len"].clone();
    assert_eq!(info["context_length"], context);
    assert_eq!(info["max_running_requests"], 2);
    assert_eq!(info["max_queued_requests"], 5);
    assert_eq!(info["status"], "ready");
    assert_eq!(info["version"], s.get("/version").await.json()["version"]);
    assert_eq!(
        info["dsv4"],
        json!({"profile": "dev-cpu", "profile_sha256": "ab12", "settings": settings})
    );
    let states = info["internal_states"].as_array().unwrap();
    assert_eq!(states.len(), 1, "{info}");
    assert_eq!(states[0]["num_running_reqs"], 0);
    assert_eq!(states[0]["num_waiting_reqs"], 0);
    assert!(states[0]["last_gen_throughput"].is_number(), "{info}");
    assert_eq!(states[0]["avg_spec_accept_length"], Value::Null, "{info}");
    assert!(
        states[0].get("avg_spec_accept_length").is_some(),
        "present: {info}"
    );
    // SGLang's newer name answers the same.
    let mut again = s.get("/server_info").await.json();
    again["internal_states"] = info["internal_states"].clone();
    assert_eq!(again, info);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_loading_the_load_is_unavailable_and_the_info_says_so() {
    let s = start_loading(config()).await;
    for path in ["/get_load", "/v1/loads"] {
        let e = s.get(path).await;
        assert_eq!(e.status, 503, "{path}: {e:?}");
        assert_eq!(e.json()["status"], "loading", "{path}");
    }
    // A bad query is refused before the model is needed.
    let e = s.get("/v1/loads?dp_rank=3").await.error(400);
    assert_eq!(e["param"], "dp_rank", "{e}");
    let info = s.get("/get_server_info").await.json();
    assert_eq!(info["status"], "loading");
    assert_eq!(info["context_length"], Value::Null);
    assert_eq!(info["internal_states"], json!([]));
    assert_eq!(s.get("/get_model_info").await.status, 200);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_info_endpoints_need_the_key_when_one_is_set() {
    let s = start(ServerConfig {
        api_key: Some("sekret".into()),
        ..config()
    })
    .await;
    for path in [
        "/get_load",
        "/v1/loads",
        "/get_model_info",
        "/get_server_info",
        "/server_info",
    ] {
        let e = request(s.addr, "GET", path, &[], b"").await.error(401);
        assert_eq!(e["code"], "invalid_api_key", "{path}");
        let ok = request(
            s.addr,
            "GET",
            path,
            &[("Authorization", "Bearer sekret")],
            b"",
        )
        .await;
        assert_eq!(ok.status, 200, "{path}: {ok:?}");
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_fill_idle_time_only_with_a_fill() {
    let s = start_with(config(), slots(4)).await;
    let text = s.get("/metrics").await.body;
    assert!(!text.contains("dsv4:batch_fill_idle_seconds"), "{text}");
    s.shutdown().await.unwrap();
    let s = start_with(
        ServerConfig {
            batch_max_running: 1,
            batch_fill_idle: Some(std::time::Duration::from_millis(250)),
            ..config()
        },
        slots(4),
    )
    .await;
    let text = s.get("/metrics").await.body;
    assert!(
        text.lines()
            .any(|l| l == "dsv4:batch_fill_idle_seconds 0.25"),
        "{text}"
    );
    s.shutdown().await.unwrap();
}

//! Every kind of bad input gets a 4xx OpenAI error object that names what was wrong, and the
//! server keeps serving.

use super::common::*;
use serde_json::json;

/// A small body limit, so the over-limit case is cheap.
const LIMIT: usize = 64 * 1024;

async fn server() -> TestServer {
    start(dsv4_server::ServerConfig {
        max_request_bytes: LIMIT,
        ..config()
    })
    .await
}

fn tools(parameters: serde_json::Value) -> serde_json::Value {
    json!([{"type": "function", "function": {"name": "f", "parameters": parameters}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_and_wrong_types_are_400_naming_the_field() {
    let s = server().await;
    let path = "/v1/chat/completions";
    for body in [
        &b"{\"model\": "[..],
        b"not json",
        b"",
        b"{} {}",
        b"\xff\xfe{}",
    ] {
        let r = request(s.addr, "POST", path, &[], body).await;
        let e = r.error(400);
        assert_eq!(e["type"], "invalid_request_error", "{e}");
    }
    let r = request(s.addr, "POST", path, &[], b"{\"model\": ").await;
    assert_eq!(r.error(400)["code"], "invalid_json");
    for (body, param) in [
        (chat("hi", json!({"temperature": "hot"})), "temperature"),
        (chat("hi", json!({"max_tokens": -1})), "max_tokens"),
        (chat("hi", json!({"stream": "yes"})), "stream"),
        (json!({"model": MODEL, "messages": "hi"}), "messages"),
        (json!({"model": 7, "messages": []}), "model"),
        (chat("hi", json!({"stop": [1, 2]})), "stop"),
    ] {
        let e = s.send("POST", path, &body).await.error(400);
        assert_eq!(e["param"], param, "{e}");
        assert!(e["message"].as_str().unwrap().contains(param), "{e}");
    }
    let e = s
        .send("POST", path, &chat("hi", json!({"temprature": 0.5})))
        .await
        .error(400);
    assert!(e["message"].as_str().unwrap().contains("temprature"), "{e}");
    let e = s
        .send(
            "POST",
            path,
            &json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await
        .error(400);
    assert!(e["message"].as_str().unwrap().contains("model"), "{e}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semantic_errors_are_4xx_with_the_reason() {
    let s = server().await;
    let path = "/v1/chat/completions";
    let e = s
        .send(
            "POST",
            path,
            &json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await
        .error(404);
    assert_eq!(e["code"], "model_not_found");
    assert!(e["message"].as_str().unwrap().contains(MODEL), "{e}");
    let e = s
        .send("POST", path, &json!({"model": MODEL, "messages": []}))
        .await
        .error(400);
    assert_eq!(e["param"], "messages");
    let e = s
        .send(
            "POST",
            path,
            &json!({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "messages[0]");
    assert!(e["message"].as_str().unwrap().contains("wizard"), "{e}");
    let bad_schema = tools(json!({"type": "object", "properties": {"a": {"type": "nonsense"}}}));
    let e = s
        .send("POST", path, &chat("x", json!({"tools": bad_schema})))
        .await
        .error(400);
    assert_eq!(e["param"], "tools");
    assert!(
        e["message"].as_str().unwrap().contains("JSON Schema"),
        "{e}"
    );
    let e = s
        .send(
            "POST",
            path,
            &chat("x", json!({"tools": [{"type": "function"}]})),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "tools");
    for (extra, param) in [
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tool_choice": "sometimes", "tools": tools(json!({}))}),
            "tool_choice",
        ),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": tools(json!({}))}),
            "tool_choice",
        ),
        (
            json!({"tool_choice": "required", "tools": tools(json!({"anyOf": [{"type": "object"}]}))}),
            "tools",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (json!({"n": 0}), "n"),
        (json!({"n": 17}), "n"),
        (json!({"temperature": 3}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"top_logprobs": 3}), "top_logprobs"),
        (
            json!({"top_logprobs": 2, "logprobs": false}),
            "top_logprobs",
        ),
        (
            json!({"top_logprobs": 21, "logprobs": true}),
            "top_logprobs",
        ),
        (json!({"logprobs": 1}), "logprobs"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"frequency_penalty": -2.5}), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"999999999": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 200}}), "logit_bias"),
        (json!({"logit_bias": {"5": "up"}}), "logit_bias"),
        (json!({"logit_bias": [5]}), "logit_bias"),
        (json!({"min_tokens": 50, "max_tokens": 5}), "min_tokens"),
        (json!({"min_tokens": -1}), "min_tokens"),
        (json!({"ignore_eos": "yes"}), "ignore_eos"),
        (json!({"stop": ["a", ""]}), "stop"),
        (
            json!({"chat_template_kwargs": {"thinking": "yes"}}),
            "chat_template_kwargs.thinking",
        ),
    ] {
        let e = s
            .send("POST", path, &chat("x", extra.clone()))
            .await
            .error(400);
        assert_eq!(e["param"], param, "{extra} → {e}");
    }
    let e = s
        .send("POST", path, &chat("x", json!({"n": 17})))
        .await
        .error(400);
    assert!(
        e["message"].as_str().unwrap().contains("from 1 to 16"),
        "{e}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_over_the_context_and_bodies_over_the_limit_are_refused() {
    let s = start(config()).await;
    let context = 65536;
    let long = "a".repeat(context + 10);
    let e = s
        .send("POST", "/v1/chat/completions", &chat(&long, json!({})))
        .await
        .error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(e["message"].as_str().unwrap().contains("65536"), "{e}");
    let e = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat("hi", json!({"max_tokens": context})),
        )
        .await
        .error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    let e = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": long, "max_tokens": 1}),
        )
        .await
        .error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    assert_eq!(e["param"], "prompt", "{e}");
    s.shutdown().await.unwrap();

    let s = server().await;
    let big = chat(&"b".repeat(LIMIT), json!({}));
    let e = s
        .send("POST", "/v1/chat/completions", &big)
        .await
        .error(413);
    assert_eq!(e["code"], "request_too_large");
    assert!(
        e["message"].as_str().unwrap().contains("max_request_bytes"),
        "{e}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_routes_and_keys_refuse_bad_requests() {
    let s = server().await;
    for (body, param) in [
        (json!({"model": MODEL, "prompt": ["a", [5]]}), "prompt"),
        (json!({"model": MODEL, "prompt": []}), "prompt"),
        (json!({"model": MODEL, "prompt": [[5], []]}), "prompt[1]"),
        (json!({"model": MODEL, "prompt": [[5], ["a"]]}), "prompt"),
        (json!({"model": MODEL, "prompt": vec!["a"; 257]}), "prompt"),
        (
            json!({"model": MODEL, "prompt": vec!["a"; 20], "n": 16}),
            "n",
        ),
        (json!({"model": MODEL, "prompt": {"text": "a"}}), "prompt"),
        (json!({"model": MODEL, "prompt": [-1, 5]}), "prompt"),
        (
            json!({"model": MODEL, "prompt": "a", "best_of": 3}),
            "best_of",
        ),
        (
            json!({"model": MODEL, "prompt": "a", "max_tokens": 0}),
            "max_tokens",
        ),
        (json!({"model": MODEL, "prompt": "a", "n": 0}), "n"),
        (json!({"model": MODEL, "prompt": "a", "n": 17}), "n"),
        (
            json!({"model": MODEL, "prompt": "a", "logprobs": 21}),
            "logprobs",
        ),
        (
            json!({"model": MODEL, "prompt": "a", "logprobs": true}),
            "logprobs",
        ),
        (
            json!({"model": MODEL, "prompt": [5, 6], "suffix": "z"}),
            "prompt",
        ),
        (
            json!({"model": MODEL, "prompt": "a", "suffix": "z", "echo": true}),
            "echo",
        ),
        (
            json!({"model": MODEL, "prompt": "a", "suffix": "z", "truncate_prompt_tokens": 4}),
            "truncate_prompt_tokens",
        ),
        (
            json!({"model": MODEL, "prompt": "a", "logit_bias": {"400": 1}}),
            "logit_bias",
        ),
        (
            json!({"model": MODEL, "prompt": "a", "min_tokens": 17}),
            "min_tokens",
        ),
        (
            json!({"model": MODEL, "prompt": "a", "repetition_penalty": -1}),
            "repetition_penalty",
        ),
    ] {
        let e = s.send("POST", "/v1/completions", &body).await.error(400);
        assert_eq!(e["param"], param, "{body} → {e}");
    }
    let e = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": [0, 99999]}),
        )
        .await
        .error(400);
    assert!(e["message"].as_str().unwrap().contains("99999"), "{e}");
    // max_tokens 0 only scores a prompt; where nothing is echoed the error says so.
    let e = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "a", "max_tokens": 0, "echo": false}),
        )
        .await
        .error(400);
    assert!(e["message"].as_str().unwrap().contains("echo: true"), "{e}");
    let e = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat("x", json!({"max_tokens": 0})),
        )
        .await
        .error(400);
    assert_eq!(e["message"], "max_tokens must be at least 1", "{e}");
    let e = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "a", "max_tokens": 0, "echo": true,
                    "min_tokens": 1}),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "min_tokens", "{e}");
    let e = s.get("/v1/nothing").await.error(404);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("/v1/chat/completions"),
        "{e}"
    );
    s.get("/v1/chat/completions").await.error(405);
    s.get("/v1/models/other").await.error(404);
    // Garbage that is not HTTP: the connection is refused, the server carries on.
    let r = raw(s.addr, b"\x00\x01 nonsense\r\n\r\n").await;
    assert!(r.status >= 400, "{r:?}");
    s.shutdown().await.unwrap();

    let s = start(dsv4_server::ServerConfig {
        api_key: Some("sekret".into()),
        ..config()
    })
    .await;
    let body = chat("hi", json!({"max_tokens": 1}));
    let bytes = body.to_string();
    let path = "/v1/chat/completions";
    request(s.addr, "POST", path, &[], bytes.as_bytes())
        .await
        .error(401);
    let r = request(
        s.addr,
        "POST",
        path,
        &[("Authorization", "Bearer wrong")],
        bytes.as_bytes(),
    );
    assert_eq!(r.await.error(401)["code"], "invalid_api_key");
    request(s.addr, "GET", "/v1/models", &[], b"")
        .await
        .error(401);
    for path in [
        "/tokenize",
        "/detokenize",
        "/generate",
        "/v1/responses",
        "/v1/responses/resp_1/cancel",
    ] {
        let body = json!({"prompt": "hi", "tokens": [1], "text": "hi", "input": "hi"}).to_string();
        request(s.addr, "POST", path, &[], body.as_bytes())
            .await
            .error(401);
    }
    let r = request(
        s.addr,
        "POST",
        path,
        &[("Authorization", "Bearer sekret")],
        bytes.as_bytes(),
    );
    assert_eq!(r.await.status, 200);
    assert_eq!(s.get("/health").await.status, 200, "health needs no key");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_keeps_serving_after_bad_requests() {
    let s = server().await;
    let paths = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/generate",
        "/abort_request",
        "/tokenize",
    ];
    let bodies = [
        &b"{"[..],
        b"[]",
        b"{\"model\": null}",
        b"\"\\ud800\"",
        b"{\"text\": {\"a\": 1}, \"rid\": [[1]]}",
        b"{\"input_ids\": [[[1]]], \"sampling_params\": [[]]}",
        b"{\"rid\": null, \"abort_all\": \"yes\"}",
        b"{\"model\": \"dsv4-tiny\", \"input\": [{\"type\": \"message\", \"content\": [[]]}]}",
        b"{\"model\": \"dsv4-tiny\", \"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": \"f\", \"parameters\": 7}]}",
    ];
    for path in paths {
        for body in bodies {
            let r = request(s.addr, "POST", path, &[], body).await;
            assert!((400..500).contains(&r.status), "{path}: {r:?}");
        }
    }
    let ok = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat("hi", json!({"max_tokens": 4, "stop": CLEAN_STOPS})),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(s.get("/health").await.json()["status"], "ok");
    let metrics = s.get("/metrics").await.body;
    for path in paths {
        let line = format!("dsv4:http_requests_total{{endpoint=\"{path}\",status=\"400\"}}");
        assert!(metrics.contains(&line), "{line}: {metrics}");
    }
    s.shutdown().await.unwrap();
}

//! `/tokenize` and `/detokenize`: a text prompt's ids are the ones `/v1/completions` runs (BOS
//! prepended unless there or turned off), chat messages' are the ones `/v1/chat/completions`
//! runs (its usage counts them, tools and thinking included), ids decode back to the text, and
//! bad input is refused with the field named.

use super::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_prompt_tokenizes_to_what_completions_runs_and_decodes_back() {
    let s = start(config()).await;
    let loaded = s.state.loaded().unwrap();
    let text = "The cat sat on the mat. Ünïcödé ✓";
    let v = s
        .send(
            "POST",
            "/tokenize",
            &json!({"model": MODEL, "prompt": text, "return_token_strs": true}),
        )
        .await
        .json();
    let tokens = tokenized(&v);
    assert_eq!(tokens[0], u64::from(loaded.bos), "BOS first: {v}");
    assert_eq!(v["count"], tokens.len());
    assert_eq!(v["max_model_len"], loaded.context);
    assert_eq!(v["token_strs"].as_array().unwrap().len(), tokens.len());
    // /v1/completions runs exactly these tokens.
    let c = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": text, "max_tokens": 1}),
        )
        .await
        .json();
    assert_eq!(c["usage"]["prompt_tokens"], tokens.len(), "{c}");
    // Without special tokens: no BOS.
    let bare = s
        .send(
            "POST",
            "/tokenize",
            &json!({"prompt": text, "add_special_tokens": false}),
        )
        .await
        .json();
    assert_eq!(tokenized(&bare), tokens[1..]);
    assert!(bare.get("token_strs").is_none());
    let d = s
        .send("POST", "/detokenize", &json!({"tokens": tokenized(&bare)}))
        .await
        .json();
    assert_eq!(d["prompt"], text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_messages_tokenize_to_what_chat_completions_runs() {
    let s = start(config()).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    for extra in [
        json!({}),
        json!({"tools": tools}),
        json!({"chat_template_kwargs": {"thinking": true}}),
    ] {
        let body = chat("What is the weather in Paris?", extra.clone());
        let mut tok = body.clone();
        tok.as_object_mut().unwrap().remove("temperature");
        let v = s.send("POST", "/tokenize", &tok).await.json();
        let c = s
            .send(
                "POST",
                "/v1/chat/completions",
                &chat("What is the weather in Paris?", {
                    let mut e = extra.clone();
                    e.as_object_mut()
                        .unwrap()
                        .insert("max_tokens".into(), json!(1));
                    e
                }),
            )
            .await
            .json();
        assert_eq!(
            c["usage"]["prompt_tokens"],
            tokenized(&v).len(),
            "{extra}: {v} vs {c}"
        );
    }
    let plain = s
        .send("POST", "/tokenize", &chat("hi", json!({})))
        .await
        .json();
    let explicit = s
        .send(
            "POST",
            "/tokenize",
            &chat("hi", json!({"add_generation_prompt": true})),
        )
        .await
        .json();
    assert_eq!(tokenized(&explicit), tokenized(&plain));
    let with_tools = s
        .send("POST", "/tokenize", &chat("hi", json!({"tools": tools})))
        .await
        .json();
    assert!(
        tokenized(&with_tools).len() > tokenized(&plain).len(),
        "the tools are in the prompt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokenize_and_detokenize_bodies_name_the_field() {
    let s = start(config()).await;
    let vocab = s.state.loaded().unwrap().vocab.len();
    for (path, body, param) in [
        ("/tokenize", json!({"prompt": 5}), "prompt"),
        ("/tokenize", json!({"prompt": "x", "bogus": 1}), ""),
        ("/tokenize", json!({"messages": []}), "messages"),
        (
            "/tokenize",
            json!({"messages": [{"role": "user", "content": "x"}], "return_token_strs": "yes"}),
            "return_token_strs",
        ),
        (
            "/tokenize",
            json!({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false}),
            "add_generation_prompt",
        ),
        ("/detokenize", json!({"tokens": [1, vocab]}), "tokens[1]"),
        ("/detokenize", json!({"tokens": [-1]}), "tokens[0]"),
        ("/detokenize", json!({}), ""),
    ] {
        let e = s.send("POST", path, &body).await.error(400);
        let msg = e["message"].as_str().unwrap_or_default();
        assert!(!msg.is_empty(), "{path} {body}: {e}");
        if !param.is_empty() {
            assert_eq!(e["param"], param, "{path} {body}: {e}");
        }
    }
    let e = s
        .send(
            "POST",
            "/tokenize",
            &json!({"model": "other", "prompt": "x"}),
        )
        .await
        .error(404);
    assert_eq!(e["code"], "model_not_found");
    let e = s
        .send(
            "POST",
            "/tokenize",
            &json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await
        .error(404);
    assert_eq!(e["code"], "model_not_found");
}

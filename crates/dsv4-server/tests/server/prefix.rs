//! Chat prefix completion: an assistant message with `prefix: true` (DeepSeek's API), or
//! `continue_final_message: true` (vLLM's and SGLang's), ends the prompt with that message's
//! text and no end-of-sentence token; the answer continues it, as content also in thinking
//! mode, and holds only the new text. Misuse is refused naming the field.

use super::common::*;
use serde_json::{Value, json};

/// A chat body whose messages are a user question then `assistant` (an assistant message),
/// with `extra` fields.
fn continued(assistant: Value, extra: Value) -> Value {
    let mut body = chat("Write code", extra);
    body["messages"].as_array_mut().unwrap().push(assistant);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_continues_the_prefix_as_content() {
    let s = start(config()).await;
    let tokenize = |body: Value| {
        let s = &s;
        async move { tokenized(&s.send("POST", "/tokenize", &body).await.json()) }
    };
    let plain = tokenize(chat("Write code", json!({}))).await;
    let prefix = "```py\n";
    let marked = tokenize(continued(
        json!({"role": "assistant", "content": prefix, "prefix": true}),
        json!({}),
    ))
    .await;
    // The question's prompt, then the prefix's bytes (one token each here), nothing after.
    assert_eq!(marked[..plain.len()], plain[..], "{marked:?}");
    let rest: Vec<u8> = marked[plain.len()..]
        .iter()
        .map(|&t| {
            let v = s.state.loaded().unwrap().vocab.bytes(t as u32).to_vec();
            assert_eq!(v.len(), 1, "token {t}");
            v[0]
        })
        .collect();
    assert_eq!(rest, prefix.as_bytes());
    // vLLM's spelling marks the same message.
    let vllm = tokenize(continued(
        json!({"role": "assistant", "content": prefix}),
        json!({"continue_final_message": true, "add_generation_prompt": false}),
    ))
    .await;
    assert_eq!(vllm, marked);
    // Asked for thinking, the answer still continues the content: the grammar of a choice
    // holds for the new text, which is all the message shows.
    let body = continued(
        json!({"role": "assistant", "content": "The answer is ", "prefix": true}),
        json!({"chat_template_kwargs": {"thinking": true}, "stop": [], "max_tokens": 8,
               "structured_outputs": {"choice": ["yes", "no"]}}),
    );
    let r = s.send("POST", "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let msg = &v["choices"][0]["message"];
    assert!(
        ["yes", "no"].contains(&msg["content"].as_str().unwrap()),
        "{v}"
    );
    assert!(
        msg.get("reasoning_content").is_none_or(Value::is_null),
        "{v}"
    );
    // Its usage counts the prompt that ends with the prefix, rendered in thinking mode: the
    // assistant's turn opens with <think>, closed before the prefix.
    let ids = tokenize(body.clone()).await;
    assert_eq!(v["usage"]["prompt_tokens"], ids.len(), "{v}");
    let tok = &s.state.loaded().unwrap().tokenizer;
    let marker = |m: &str| u64::from(tok.token_id(m).unwrap());
    let (think, end) = (marker("<think>"), marker("</think>"));
    let at = ids.len() - "The answer is ".len();
    assert_eq!((ids[at - 2], ids[at - 1]), (think, end), "{ids:?}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_that_cannot_be_continued_are_refused_naming_the_field() {
    let s = start(config()).await;
    let user_last = chat("hi", json!({"continue_final_message": true}));
    let cases = [
        (user_last, "continue_final_message", "assistant's"),
        (
            continued(
                json!({"role": "assistant", "content": "x"}),
                json!({"continue_final_message": true, "add_generation_prompt": true}),
            ),
            "continue_final_message",
            "send one",
        ),
        (
            chat("hi", json!({"add_generation_prompt": false})),
            "add_generation_prompt",
            "only for continuing",
        ),
        (
            {
                let mut b = continued(
                    json!({"role": "assistant", "content": "x", "prefix": true}),
                    json!({}),
                );
                b["messages"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"role": "user", "content": "more"}));
                b
            },
            "messages[1]",
            "must be the last",
        ),
        (
            continued(
                json!({"role": "assistant", "content": "x", "prefix": 1}),
                json!({}),
            ),
            "messages[1]",
            "true or false",
        ),
    ];
    for (body, param, says) in cases {
        for path in ["/v1/chat/completions", "/tokenize"] {
            let e = s.send("POST", path, &body).await.error(400);
            assert_eq!(e["param"], param, "{path} {body}: {e}");
            let m = e["message"].as_str().unwrap();
            assert!(m.contains(says), "{path} {body}: {m}");
        }
    }
    s.shutdown().await.unwrap();
}

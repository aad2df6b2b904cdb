//! Anthropic's `thinking.display: "omitted"`: the answer's thinking blocks carry no text and
//! no `thinking_delta` streams, but the signature holds the reasoning, and a client that sends
//! such a block back gets that reasoning restored into the prompt.

use super::common::*;
use super::messages::{assembled, message, streams_the_same, weather};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// The reasoning a `dsv4:1:` signature holds.
fn unsigned(signature: &Value) -> String {
    let s = signature.as_str().unwrap();
    let encoded = s.strip_prefix("dsv4:1:").unwrap_or_else(|| panic!("{s}"));
    String::from_utf8(STANDARD.decode(encoded).unwrap()).unwrap()
}

#[tokio::test]
async fn omitted_thinking_answers_the_same_blocks_with_the_reasoning_in_the_signature() {
    let s = start(config()).await;
    let ask = json!([{"role": "user", "content": "What is 2+2?"}]);
    let thinking = json!({"type": "enabled", "budget_tokens": 6});
    let shown = message(ask.clone(), json!({"thinking": thinking}));
    let mut hidden = shown.clone();
    hidden["thinking"]["display"] = json!("omitted");

    let want = s.send("POST", "/v1/messages", &shown).await.json();
    let got = streams_the_same(&s, &hidden).await;
    assert_eq!(want["content"][0]["type"], "thinking", "{want}");
    let reasoning = want["content"][0]["thinking"].as_str().unwrap();
    assert!(!reasoning.is_empty(), "{want}");
    assert_eq!(
        want["content"][0]["signature"], "",
        "summarized signs nothing"
    );
    assert_eq!(got["content"][0]["thinking"], "", "{got}");
    assert_eq!(unsigned(&got["content"][0]["signature"]), reasoning);
    // All else is the same answer.
    let strip = |m: &Value| {
        let mut m = m.clone();
        m["id"] = Value::Null;
        m["content"][0]["thinking"] = Value::Null;
        m["content"][0]["signature"] = Value::Null;
        m
    };
    assert_eq!(strip(&got), strip(&want));

    // The stream shows no reasoning: the block opens empty and closes with the signature.
    let mut streamed = hidden.clone();
    streamed["stream"] = json!(true);
    let r = s.send("POST", "/v1/messages", &streamed).await;
    assert!(!r.body.contains("thinking_delta"), "{}", r.body);
    assert_eq!(
        unsigned(&assembled(&r)["content"][0]["signature"]),
        reasoning
    );

    // "summarized" is the default, said out loud.
    let mut summarized = shown.clone();
    summarized["thinking"]["display"] = json!("summarized");
    let again = s.send("POST", "/v1/messages", &summarized).await.json();
    assert_eq!(again["content"], want["content"]);
}

#[tokio::test]
async fn a_signature_sent_back_restores_the_omitted_reasoning_into_the_prompt() {
    let s = start(config()).await;
    // A tool turn: the chat template keeps the reasoning of a turn that called tools.
    let turn = |block: Value| {
        json!({"model": MODEL, "thinking": {"type": "adaptive"}, "tools": [weather()],
               "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [block,
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "-3 C"}]}]})
    };
    let count = |body: Value| {
        let s = &s;
        async move {
            let r = s.send("POST", "/v1/messages/count_tokens", &body).await;
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()["input_tokens"].as_u64().unwrap()
        }
    };
    let reasoning = "Use the tool for Oslo.";
    let shown = count(turn(
        json!({"type": "thinking", "thinking": reasoning, "signature": ""}),
    ))
    .await;
    let signed = format!("dsv4:1:{}", STANDARD.encode(reasoning));
    let restored = count(turn(
        json!({"type": "thinking", "thinking": "", "signature": signed}),
    ))
    .await;
    let dropped = count(turn(
        json!({"type": "thinking", "thinking": "", "signature": "from another server"}),
    ))
    .await;
    assert_eq!(restored, shown);
    assert!(dropped < shown, "{dropped} vs {shown}");
    // Text, when there is some, wins over the signature.
    let both = count(turn(
        json!({"type": "thinking", "thinking": reasoning, "signature": "dsv4:1:eA=="}),
    ))
    .await;
    assert_eq!(both, shown);

    // The answer's own thinking block, sent back, reads as the reasoning it hid.
    let answer = s
        .send(
            "POST",
            "/v1/messages",
            &message(
                json!([{"role": "user", "content": "What is 2+2?"}]),
                json!({"thinking": {"type": "enabled", "budget_tokens": 6,
                                    "display": "omitted"}}),
            ),
        )
        .await
        .json();
    let block = answer["content"][0].clone();
    assert_eq!(block["thinking"], "", "{answer}");
    let hidden = unsigned(&block["signature"]);
    assert!(!hidden.is_empty(), "{answer}");
    let sent_back = count(turn(block)).await;
    let written = count(turn(
        json!({"type": "thinking", "thinking": hidden, "signature": ""}),
    ))
    .await;
    assert_eq!(sent_back, written, "{answer}");
}

#[tokio::test]
async fn bad_display_values_and_broken_signatures_are_refused_naming_the_field() {
    let s = start(config()).await;
    let hi = json!([{"role": "user", "content": "Hi"}]);
    for display in [json!("hidden"), json!(true)] {
        let r = s
            .send(
                "POST",
                "/v1/messages",
                &message(
                    hi.clone(),
                    json!({"thinking": {"type": "adaptive", "display": display}}),
                ),
            )
            .await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("thinking.display"), "{}", r.body);
    }
    let messages = json!([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "", "signature": "dsv4:1:%%%"},
            {"type": "text", "text": "Hello"}]},
        {"role": "user", "content": "Bye"}]);
    let r = s
        .send(
            "POST",
            "/v1/messages",
            &message(messages, json!({"thinking": {"type": "adaptive"}})),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("messages[1].content[0].signature"),
        "{}",
        r.body
    );
}

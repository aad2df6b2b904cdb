//! Log-probabilities over HTTP: chat's `logprobs.content` entries (greedy tokens are their own
//! most likely alternative; a stream carries each token's entry exactly once, so its chunks
//! concatenate to the answer's list), tool-call tokens included, and the legacy completions
//! lists with `text_offset` into the text.

use super::common::*;
use serde_json::{Value, json};

/// The concatenated `logprobs.content` of a chat stream's chunks (the first, role-only chunk
/// carries none).
fn streamed_chat_entries(events: &[Value]) -> Vec<Value> {
    let chunks: Vec<&Value> = events.iter().filter(|e| e.is_object()).collect();
    assert!(
        chunks[0]["choices"][0]["logprobs"].is_null(),
        "{}",
        chunks[0]
    );
    chunks
        .iter()
        .flat_map(|e| e["choices"].as_array().unwrap().clone())
        .flat_map(|c| {
            c["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// Check one greedy entry: ln p ≤ 0, `top` alternatives most likely first, the token the first.
fn check_greedy_entry(e: &Value, top: usize) {
    let lp = e["logprob"].as_f64().unwrap();
    assert!(lp <= 0.0, "{e}");
    let alts = e["top_logprobs"].as_array().unwrap();
    assert_eq!(alts.len(), top, "{e}");
    let lps: Vec<f64> = alts
        .iter()
        .map(|a| a["logprob"].as_f64().unwrap())
        .collect();
    assert!(lps.windows(2).all(|w| w[0] >= w[1]), "not sorted: {e}");
    assert_eq!(
        alts[0]["token"], e["token"],
        "greedy takes the most likely: {e}"
    );
    assert_eq!(alts[0]["bytes"], e["bytes"], "{e}");
    assert_eq!(lps[0], lp, "{e}");
    let bytes: Vec<u8> = serde_json::from_value(e["bytes"].clone()).unwrap();
    assert_eq!(e["token"], String::from_utf8_lossy(&bytes).as_ref(), "{e}");
}

/// The `logprobs.content` entries of a chat answer's first choice, checked to be one per
/// generated token.
fn one_entry_per_token(v: &Value) -> Vec<Value> {
    let entries = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        entries.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        "one entry per generated token: {v}"
    );
    entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs_follow_greedy_tokens_and_streams_carry_each_once() {
    let s = start(config()).await;
    let path = "/v1/chat/completions";
    let plain = s
        .send(
            "POST",
            path,
            &chat("Hello there", json!({"max_tokens": 8, "stop": CLEAN_STOPS})),
        )
        .await;
    assert!(
        plain.json()["choices"][0]["logprobs"].is_null(),
        "not asked"
    );
    let req = chat(
        "Hello there",
        json!({"max_tokens": 8, "stop": CLEAN_STOPS, "logprobs": true, "top_logprobs": 3}),
    );
    let r = s.send("POST", path, &req).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let entries = one_entry_per_token(&v);
    for e in &entries {
        check_greedy_entry(e, 3);
    }
    let bytes: Vec<u8> = entries
        .iter()
        .flat_map(|e| serde_json::from_value::<Vec<u8>>(e["bytes"].clone()).unwrap())
        .collect();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        String::from_utf8_lossy(&bytes).starts_with(content),
        "the tokens spell the content: {content:?}"
    );

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = s.send("POST", path, &sreq).await.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert_eq!(streamed_chat_entries(&events), entries);

    // `logprobs` alone: entries without alternatives.
    let mut bare = req.clone();
    bare.as_object_mut().unwrap().remove("top_logprobs");
    let v = s.send("POST", path, &bare).await.json();
    let bare_entries = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(bare_entries.len(), entries.len());
    for (b, e) in bare_entries.iter().zip(&entries) {
        assert_eq!((&b["token"], &b["logprob"]), (&e["token"], &e["logprob"]));
        assert_eq!(b["top_logprobs"], json!([]));
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_tokens_have_entries_too() {
    let s = start(config()).await;
    let tools = json!([{"type": "function", "function": {"name": "pick", "parameters":
        {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}},
         "required": ["city"]}}}]);
    let req = chat(
        "Where to?",
        json!({"tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
               "max_tokens": 200, "logprobs": true, "top_logprobs": 1}),
    );
    let v = s.send("POST", "/v1/chat/completions", &req).await.json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let entries = one_entry_per_token(&v);
    let text: String = entries
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert!(text.contains("<｜DSML｜invoke"), "{text}");
    for e in &entries {
        assert!(e["logprob"].as_f64().unwrap() <= 0.0, "{e}");
    }
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = s.send("POST", "/v1/chat/completions", &sreq).await.events();
    assert_eq!(streamed_chat_entries(&events), entries);
    s.shutdown().await.unwrap();
}

/// The four parallel lists of a completion's `logprobs`.
pub fn lists(lp: &Value) -> [Vec<Value>; 4] {
    ["tokens", "token_logprobs", "top_logprobs", "text_offset"].map(|k| {
        lp[k]
            .as_array()
            .unwrap_or_else(|| panic!("{k}: {lp}"))
            .clone()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_logprobs_use_the_legacy_lists_with_offsets_into_the_text() {
    let s = start(config()).await;
    let path = "/v1/completions";
    let req = json!({"model": MODEL, "prompt": "aaaa aaaa aaaa", "max_tokens": 12,
                     "temperature": 0, "logprobs": 2});
    let v = s.send("POST", path, &req).await.json();
    let choice = &v["choices"][0];
    let text = choice["text"].as_str().unwrap();
    let [tokens, token_lps, tops, offsets] = lists(&choice["logprobs"]);
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert!(
        [&tokens, &token_lps, &tops, &offsets]
            .iter()
            .all(|l| l.len() == n)
    );
    assert_eq!(offsets[0], 0);
    // Tokens are checked against the text up to the first that holds part of a character
    // (shown as U+FFFD, which has other bytes in the text); after it only offsets' order.
    let mut whole = true;
    let mut checked = 0;
    for i in 0..n {
        let (tok, lp) = (tokens[i].as_str().unwrap(), token_lps[i].as_f64().unwrap());
        assert!(lp <= 0.0);
        let top = tops[i].as_object().unwrap();
        assert!((1..=2).contains(&top.len()), "{top:?}");
        assert_eq!(
            top[tok].as_f64(),
            Some(lp),
            "greedy: the token is the most likely"
        );
        assert!(top.values().all(|x| x.as_f64().unwrap() <= lp), "{top:?}");
        let at = offsets[i].as_u64().unwrap() as usize;
        let next = offsets.get(i + 1).map(|o| o.as_u64().unwrap() as usize);
        whole &= !tok.contains('\u{FFFD}');
        if whole {
            assert!(next.is_none_or(|next| next == at + tok.len()), "{i}");
            assert_eq!(&text.as_bytes()[at..at + tok.len()], tok.as_bytes(), "{i}");
            checked += 1;
        } else {
            assert!(next.is_none_or(|next| next > at), "{i}");
        }
    }
    assert!(
        checked >= 3,
        "the prompt's first tokens are whole characters: {tokens:?}"
    );
    assert!(
        s.send(
            "POST",
            path,
            &json!({"model": MODEL, "prompt": "x", "max_tokens": 2})
        )
        .await
        .json()["choices"][0]["logprobs"]
            .is_null()
    );

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = s.send("POST", path, &sreq).await.events();
    let mut joined: [Vec<Value>; 4] = Default::default();
    for c in events
        .iter()
        .filter(|e| e.is_object())
        .flat_map(|e| e["choices"].as_array().unwrap().clone())
    {
        for (all, part) in joined.iter_mut().zip(lists(&c["logprobs"])) {
            all.extend(part);
        }
    }
    assert_eq!(joined, [tokens, token_lps, tops, offsets]);
    s.shutdown().await.unwrap();
}

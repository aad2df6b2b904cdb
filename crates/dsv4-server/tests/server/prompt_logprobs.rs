//! vLLM's `prompt_logprobs` on /v1/completions (per choice) and /v1/chat/completions (once, at
//! the top): one item per prompt token, null for the first, else the token and the most likely
//! alternatives, id → {logprob, rank, decoded_token}. The token's entry is bitwise the entry
//! `echo` with `logprobs` shows for it, and its rank is its place under the model's logits; the
//! alternatives rank 1, 2, …; every choice shows the same list though only the first scored
//! it; `max_tokens: 0` only scores; streaming is refused (as vLLM).

use super::common::*;
use super::logprobs::lists;
use serde_json::{Value, json};

const PATH: &str = "/v1/completions";

/// The rank of `id` in `row` (1: the most likely; ties to the lower id).
fn rank(row: &[f32], id: u32) -> u64 {
    let t = row[id as usize];
    1 + row
        .iter()
        .enumerate()
        .filter(|&(i, &v)| v > t || (v == t && (i as u32) < id))
        .count() as u64
}

/// Check a `prompt_logprobs` list against `prompt` and the model's logits for it, with `top`
/// alternatives.
fn check_list(list: &Value, prompt: &[u32], top: usize) {
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), prompt.len());
    assert!(list[0].is_null());
    let mut st = model().new_sequence();
    let out = model().forward(&mut st, prompt).unwrap();
    let v = out.vocab;
    for (j, item) in list.iter().enumerate().skip(1) {
        let map = item.as_object().unwrap();
        let id = prompt[j];
        let own = &map[&id.to_string()];
        let row = &out.logits[(j - 1) * v..j * v];
        assert_eq!(own["rank"], rank(row, id), "token {j}");
        assert!(own["logprob"].as_f64().unwrap() <= 0.0);
        // Every entry's rank is its place under the logits: the prompt token's, and 1..=top.
        for (k, e) in map {
            let alt: u32 = k.parse().unwrap();
            assert_eq!(e["rank"], rank(row, alt), "token {j}, entry {k}");
        }
        let mut ranks: Vec<u64> = map.values().map(|e| e["rank"].as_u64().unwrap()).collect();
        ranks.sort_unstable();
        let own_rank = own["rank"].as_u64().unwrap();
        let mut want: Vec<u64> = (1..=top as u64).collect();
        if own_rank > top as u64 {
            want.push(own_rank);
        }
        assert_eq!(ranks, want, "token {j}: {item}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_carry_each_prompt_tokens_entry_as_echo_scores_it() {
    let s = start(config()).await;
    let loaded = s.state.loaded().unwrap();
    let mut ids = vec![loaded.bos];
    ids.extend(loaded.tokenizer.encode("The cat sat on the mat.").unwrap());
    let req = json!({"model": MODEL, "prompt": ids, "max_tokens": 2, "temperature": 0,
                     "n": 2, "prompt_logprobs": 3});
    let v = s.send("POST", PATH, &req).await.json();
    let choices = v["choices"].as_array().unwrap();
    check_list(&choices[0]["prompt_logprobs"], &ids, 3);
    assert_eq!(
        choices[1]["prompt_logprobs"], choices[0]["prompt_logprobs"],
        "every choice shows the first one's entries"
    );
    assert!(
        choices[0]["logprobs"].is_null(),
        "logprobs was not asked for"
    );
    // The same entries as echo's lists, bit for bit, whose alternatives (here 1) are cut
    // separately from prompt_logprobs' (3).
    let echoed = json!({"model": MODEL, "prompt": ids, "max_tokens": 2, "temperature": 0,
                        "echo": true, "logprobs": 1, "prompt_logprobs": 3});
    let e = s.send("POST", PATH, &echoed).await.json();
    let c = &e["choices"][0];
    assert_eq!(c["prompt_logprobs"], choices[0]["prompt_logprobs"]);
    let [tokens, lps, tops, _] = lists(&c["logprobs"]);
    for j in 1..ids.len() {
        let own = &c["prompt_logprobs"][j][ids[j].to_string()];
        assert_eq!(lps[j], own["logprob"], "token {j}");
        assert_eq!(own["decoded_token"], tokens[j], "token {j}");
        assert_eq!(
            tops[j].as_object().unwrap().len(),
            1,
            "token {j}: {}",
            tops[j]
        );
    }
    // A text prompt's list covers the BOS the server prepended; max_tokens 0 only scores.
    let only = json!({"model": MODEL, "prompt": "The cat", "max_tokens": 0,
                      "prompt_logprobs": 0});
    let o = s.send("POST", PATH, &only).await.json();
    let c = &o["choices"][0];
    assert_eq!(
        (&c["text"], &c["finish_reason"]),
        (&json!(""), &json!("length"))
    );
    assert_eq!(o["usage"]["completion_tokens"], 0);
    let mut text_ids = vec![loaded.bos];
    text_ids.extend(loaded.tokenizer.encode("The cat").unwrap());
    check_list(&c["prompt_logprobs"], &text_ids, 0);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_answers_carry_the_prompts_entries_once() {
    let s = start(config()).await;
    let body = chat(
        "Hello there",
        json!({"max_tokens": 2, "n": 3, "prompt_logprobs": 2}),
    );
    let v = s.send("POST", "/v1/chat/completions", &body).await.json();
    let t = s.send("POST", "/tokenize", &body).await.json();
    let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone()).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    check_list(&v["prompt_logprobs"], &ids, 2);
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    for c in v["choices"].as_array().unwrap() {
        assert!(c.get("prompt_logprobs").is_none(), "{c}");
    }
    let plain = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat("Hello there", json!({"max_tokens": 1})),
        )
        .await
        .json();
    assert!(
        plain.get("prompt_logprobs").is_none(),
        "absent unless asked: {plain}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_refuse_streams_and_too_many_alternatives() {
    let s = start(config()).await;
    for (path, body) in [
        (
            PATH,
            json!({"model": MODEL, "prompt": "a", "stream": true, "prompt_logprobs": 1}),
        ),
        (
            "/v1/chat/completions",
            chat("a", json!({"stream": true, "prompt_logprobs": 1})),
        ),
        (
            PATH,
            json!({"model": MODEL, "prompt": "a", "prompt_logprobs": 21}),
        ),
        (
            "/v1/chat/completions",
            chat("a", json!({"prompt_logprobs": 21})),
        ),
        (
            PATH,
            json!({"model": MODEL, "prompt": "a", "prompt_logprobs": -1}),
        ),
    ] {
        let e = s.send("POST", path, &body).await.error(400);
        assert_eq!(e["param"], "prompt_logprobs", "{body} → {e}");
    }
    s.shutdown().await.unwrap();
}

//! Fill in the middle: `/v1/completions` with `suffix` runs DeepSeek's FIM prompt (BOS,
//! `<｜fim▁begin｜>`, the prompt, `<｜fim▁hole｜>`, the suffix, `<｜fim▁end｜>`) for each text
//! prompt and answers with the middle only.

use super::common::*;
use dsv4_chat::markers;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suffix_makes_each_prompt_a_fill_in_the_middle_prompt() {
    let s = start(config()).await;
    let loaded = s.state.loaded().unwrap();
    let id = |m: &str| u64::from(loaded.tokenizer.token_id(m).unwrap());
    let byte_id = |b: u8| {
        (0..loaded.vocab.len() as u32)
            .find(|&t| loaded.vocab.bytes(t) == [b])
            .map(u64::from)
            .unwrap()
    };
    let bytes = |t: &str| -> Vec<u64> { t.bytes().map(byte_id).collect() };
    // The tiny tokenizer spells each byte as its own token; check the assumption first.
    let plain = s
        .send(
            "POST",
            "/tokenize",
            &json!({"prompt": "def f(", "add_special_tokens": false}),
        )
        .await
        .json();
    assert_eq!(tokenized(&plain), bytes("def f("), "{plain}");
    let r = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": ["def f(", "x = "], "suffix": "):\n    pass",
                    "max_tokens": 4, "temperature": 0, "return_token_ids": true}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    for (k, before) in ["def f(", "x = "].into_iter().enumerate() {
        let mut want = vec![u64::from(loaded.bos), id(markers::FIM_BEGIN)];
        want.extend(bytes(before));
        want.push(id(markers::FIM_HOLE));
        want.extend(bytes("):\n    pass"));
        want.push(id(markers::FIM_END));
        let choice = &v["choices"][k];
        let got: Vec<u64> = choice["prompt_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(got, want, "prompt {k}: {v}");
        // The text is the middle alone: what its generated tokens spell.
        let ids: Vec<u32> = choice["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let spelled: Vec<u8> = ids
            .iter()
            .flat_map(|&t| loaded.vocab.bytes(t).to_vec())
            .collect();
        assert_eq!(
            choice["text"],
            String::from_utf8_lossy(&spelled).as_ref(),
            "{v}"
        );
    }
    // A prompt that starts with the BOS marker keeps one BOS, before the FIM markers.
    let r = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": format!("{}a", markers::BOS), "suffix": "",
                    "max_tokens": 1, "return_token_ids": true}),
        )
        .await
        .json();
    let got = &r["choices"][0]["prompt_token_ids"];
    assert_eq!(got[0], loaded.bos, "{r}");
    assert_eq!(got[1], id(markers::FIM_BEGIN), "{r}");
    assert_eq!(
        r["usage"]["prompt_tokens"], 5,
        "BOS, begin, a, hole, end: {r}"
    );
    s.shutdown().await.unwrap();
}

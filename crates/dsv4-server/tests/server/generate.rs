//! SGLang's native `POST /generate`: outputs equal `/v1/completions`' for the same tokens
//! (text, ids, log-probabilities), SGLang's finish reasons and `[logprob, id, text]` entries,
//! batches with per-prompt parameters and `n`, cumulative streams, JSON-schema outputs, and
//! each kind of bad input named.

use super::common::*;
use serde_json::{Value, json};

/// The byte token for `b` in the tiny vocabulary.
fn byte_token(b: u8) -> u32 {
    128 + u32::from(b)
}

/// The tiny model's end-of-sequence id.
fn eos() -> u32 {
    dsv4_chat::Tokenizer::tiny().unwrap().eos_id()
}

/// POST `body` to /generate, expecting 200.
async fn generate(s: &TestServer, body: Value) -> Value {
    let r = s.send("POST", "/generate", &body).await;
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_equal_completions_and_say_how_they_ended() {
    let s = start(config()).await;
    // Special tokens shown (SGLang's skip_special_tokens false) to compare with completions.
    let greedy = json!({"max_new_tokens": 8, "temperature": 0, "skip_special_tokens": false});
    let v = generate(&s, json!({"text": "Hi", "sampling_params": greedy})).await;
    let c = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 8, "temperature": 0,
                    "return_token_ids": true}),
        )
        .await
        .json();
    assert_eq!(v["output_ids"], c["choices"][0]["token_ids"], "{v} vs {c}");
    assert_eq!(v["text"], c["choices"][0]["text"]);
    let meta = &v["meta_info"];
    assert_eq!(meta["prompt_tokens"], 3, "BOS, \"H\", \"i\": {v}");
    assert_eq!(meta["completion_tokens"], 8);
    assert_eq!(
        meta["finish_reason"],
        json!({"type": "length", "length": 8})
    );
    assert!(meta["e2e_latency"].as_f64().unwrap() >= 0.0 && meta["cached_tokens"].is_u64());
    // The same tokens given as ids.
    let by_ids = generate(
        &s,
        json!({"input_ids": c["choices"][0]["prompt_token_ids"], "sampling_params": greedy}),
    )
    .await;
    assert_eq!(by_ids["output_ids"], v["output_ids"]);

    let (a, z) = (byte_token(b'a'), byte_token(b'z'));
    let cases = [
        // The end-of-sequence token after min_new_tokens: it closes output_ids and is matched.
        (
            json!({"logit_bias": {eos().to_string(): 100, a.to_string(): 50},
                   "min_new_tokens": 2}),
            "aa",
            vec![a, a, eos()],
            json!(eos()),
        ),
        (
            json!({"logit_bias": {z.to_string(): 100}, "stop_token_ids": [z]}),
            "",
            vec![z],
            json!(z),
        ),
        (
            json!({"logit_bias": {a.to_string(): 100}, "stop": "a"}),
            "",
            vec![a],
            json!("a"),
        ),
        (
            json!({"logit_bias": {a.to_string(): 100}, "stop": ["a"], "no_stop_trim": true}),
            "a",
            vec![a],
            json!("a"),
        ),
    ];
    for (mut sp, text, ids, matched) in cases {
        sp["max_new_tokens"] = json!(8);
        let v = generate(&s, json!({"text": "Hi", "sampling_params": sp.clone()})).await;
        assert_eq!(v["text"], text, "{sp}: {v}");
        assert_eq!(v["output_ids"], json!(ids), "{sp}: {v}");
        let finish = &v["meta_info"]["finish_reason"];
        assert_eq!(
            *finish,
            json!({"type": "stop", "matched": matched}),
            "{sp}: {v}"
        );
        let generated = ids.len() - usize::from(matched.is_u64());
        assert_eq!(v["meta_info"]["completion_tokens"], generated, "{sp}: {v}");
    }

    // Special tokens' text is left out by default, as SGLang does.
    let special = 100u32;
    let sp = json!({"logit_bias": {special.to_string(): 100}, "max_new_tokens": 2});
    let v = generate(&s, json!({"text": "Hi", "sampling_params": sp})).await;
    assert_eq!(
        (v["text"].as_str(), &v["output_ids"]),
        (Some(""), &json!([special, special]))
    );
    let mut shown = sp.clone();
    shown["skip_special_tokens"] = json!(false);
    let v = generate(&s, json!({"text": "Hi", "sampling_params": shown})).await;
    let one = dsv4_chat::markers::reserved(special);
    assert_eq!(v["text"], format!("{one}{one}"), "{v}");

    // max_new_tokens 0 only runs the prompt.
    let v = generate(
        &s,
        json!({"text": "Hi", "sampling_params": {"max_new_tokens": 0}}),
    )
    .await;
    assert_eq!(
        (
            v["output_ids"].clone(),
            v["meta_info"]["completion_tokens"].clone()
        ),
        (json!([]), json!(0))
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_sglang_triples_equal_to_the_completions_entries() {
    let s = start(config()).await;
    let prompt = [0u32, 200, 233];
    let v = generate(
        &s,
        json!({"input_ids": prompt, "return_logprob": true, "logprob_start_len": 0,
               "top_logprobs_num": 2, "return_text_in_logprobs": true,
               "sampling_params": {"max_new_tokens": 4, "temperature": 0}}),
    )
    .await;
    // Completions' echo scores the same prompt and output.
    let c = s
        .send(
            "POST",
            "/v1/completions",
            &json!({"model": MODEL, "prompt": prompt, "echo": true, "logprobs": 2,
                    "max_tokens": 4, "temperature": 0, "return_token_ids": true}),
        )
        .await
        .json();
    let lp = &c["choices"][0]["logprobs"]["token_logprobs"];
    let meta = &v["meta_info"];
    let input = meta["input_token_logprobs"].as_array().unwrap();
    assert_eq!(input.len(), 3, "{v}");
    assert_eq!(input[0], json!([null, 0, "<｜begin▁of▁sentence｜>"]));
    for p in 0..3 {
        assert_eq!(input[p][0], lp[p], "position {p}: {v} vs {c}");
        assert_eq!(input[p][1], prompt[p]);
    }
    let output = meta["output_token_logprobs"].as_array().unwrap();
    assert_eq!(output.len(), 4);
    for (k, e) in output.iter().enumerate() {
        assert_eq!(e[0], lp[3 + k], "output {k}: {v} vs {c}");
        assert_eq!(e[1], c["choices"][0]["token_ids"][k]);
        assert!(e[2].is_string());
    }
    let tops = meta["output_top_logprobs"].as_array().unwrap();
    assert!(tops.iter().all(|t| t.as_array().unwrap().len() == 2), "{v}");
    assert_eq!(
        tops[0][0][0], output[0][0],
        "greedy: the token is the most likely"
    );
    assert!(meta["input_top_logprobs"][0].is_null() && meta["input_top_logprobs"][1].is_array());

    // token_ids_logprob: the asked tokens at every position, in the asked order; where one is
    // the token there, its entry is that token's.
    let (out0, out1) = (
        output[0][1].as_u64().unwrap(),
        output[1][1].as_u64().unwrap(),
    );
    let asked = generate(
        &s,
        json!({"input_ids": prompt, "return_logprob": true, "logprob_start_len": 0,
               "token_ids_logprob": [out0, out1, 200],
               "sampling_params": {"max_new_tokens": 4, "temperature": 0}}),
    )
    .await;
    let am = &asked["meta_info"];
    assert_eq!(
        am["output_token_logprobs"],
        meta["output_token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| json!([e[0], e[1], null]))
            .collect::<Value>()
    );
    let outs = am["output_token_ids_logprobs"].as_array().unwrap();
    assert_eq!(outs.len(), 4, "{asked}");
    for at in outs {
        let ids: Vec<u64> = at
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e[1].as_u64().unwrap())
            .collect();
        assert_eq!(ids, [out0, out1, 200], "{asked}");
    }
    assert_eq!(outs[0][0][0], output[0][0], "{asked}");
    assert_eq!(outs[1][1][0], output[1][0], "{asked}");
    let ins = am["input_token_ids_logprobs"].as_array().unwrap();
    assert_eq!(ins.len(), 3);
    assert!(
        ins[0].is_null(),
        "position 0 has nothing before it: {asked}"
    );
    assert_eq!(ins[1][2], json!([lp[1], 200, null]), "{asked}");
    assert!(
        meta.get("output_token_ids_logprobs").is_none(),
        "only when asked: {v}"
    );
    // One list per prompt (null: none for that prompt).
    let pair = generate(
        &s,
        json!({"input_ids": [prompt, prompt], "return_logprob": true,
               "token_ids_logprob": [[out0], null],
               "sampling_params": {"max_new_tokens": 2, "temperature": 0}}),
    )
    .await;
    assert_eq!(
        pair[0]["meta_info"]["output_token_ids_logprobs"][0][0][0], output[0][0],
        "{pair}"
    );
    assert!(
        pair[1]["meta_info"]
            .get("output_token_ids_logprobs")
            .is_none(),
        "{pair}"
    );

    // Streamed with n = 2: the first output scores the prompt, both show its entries.
    let body = json!({"input_ids": prompt, "return_logprob": true, "logprob_start_len": 0,
                      "stream": true, "sampling_params": {"max_new_tokens": 2, "n": 2}});
    let events = s.send("POST", "/generate", &body).await.events();
    for k in 0..2 {
        let last = events.iter().rfind(|e| e["index"] == k).unwrap();
        let got = &last["meta_info"]["input_token_logprobs"];
        for p in 0..3 {
            assert_eq!(got[p][0], lp[p], "output {k}, position {p}: {last}");
        }
    }

    // From position 1, without texts, without alternatives.
    let v = generate(
        &s,
        json!({"input_ids": prompt, "return_logprob": true, "logprob_start_len": 1,
               "sampling_params": {"max_new_tokens": 1, "temperature": 0}}),
    )
    .await;
    let meta = &v["meta_info"];
    assert_eq!(
        meta["input_token_logprobs"][0],
        json!([lp[1], 200, null]),
        "{v}"
    );
    assert_eq!(meta["input_token_logprobs"].as_array().unwrap().len(), 2);
    assert!(meta.get("input_top_logprobs").is_none() && meta.get("output_top_logprobs").is_none());
    // Without return_logprob there are none.
    let v = generate(
        &s,
        json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert!(v["meta_info"].get("output_token_logprobs").is_none(), "{v}");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_take_per_prompt_parameters_and_streams_grow_to_the_answer() {
    let s = start(config()).await;
    let body = json!({"text": ["Hi", "Yo"], "rid": ["one", "two"],
                      "sampling_params": [{"max_new_tokens": 2, "temperature": 0, "n": 2},
                                          {"max_new_tokens": 3, "temperature": 0, "n": 2}]});
    let v = generate(&s, body.clone()).await;
    let outs = v.as_array().unwrap();
    assert_eq!(outs.len(), 4, "{v}");
    let ids: Vec<&str> = outs
        .iter()
        .map(|o| o["meta_info"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["one", "one-1", "two", "two-1"]);
    let counts: Vec<u64> = outs
        .iter()
        .map(|o| o["meta_info"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [2, 2, 3, 3]);
    for (k, prompt) in [(0, "Hi"), (2, "Yo")] {
        let solo = generate(
            &s,
            json!({"text": prompt,
                   "sampling_params": {"max_new_tokens": 2 + k / 2, "temperature": 0}}),
        )
        .await;
        assert_eq!(outs[k]["output_ids"], solo["output_ids"], "{prompt}");
        assert_eq!(
            outs[k + 1]["output_ids"],
            solo["output_ids"],
            "greedy choices agree"
        );
    }

    // Streamed: each event carries its output so far, the last one the whole answer.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = s.send("POST", "/generate", &streamed).await;
    let events = r.events();
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    for (k, whole) in outs.iter().enumerate() {
        let mine: Vec<&Value> = events.iter().filter(|e| e["index"] == k).collect();
        for w in mine.windows(2) {
            let (a, b) = (
                w[0]["text"].as_str().unwrap(),
                w[1]["text"].as_str().unwrap(),
            );
            assert!(b.starts_with(a), "{a:?} then {b:?}");
            assert!(w[0]["meta_info"]["finish_reason"].is_null());
        }
        let last = mine.last().unwrap();
        assert_eq!(last["output_ids"], whole["output_ids"], "output {k}");
        assert_eq!(
            last["meta_info"]["finish_reason"],
            whole["meta_info"]["finish_reason"]
        );
    }
    // One prompt streams without an index.
    let r = s
        .send(
            "POST",
            "/generate",
            &json!({"text": "Hi", "stream": true, "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
    assert!(
        r.events()
            .iter()
            .filter(|e| e.is_object())
            .all(|e| e.get("index").is_none())
    );

    // A JSON schema constrains the output to it.
    let schema = json!({"type": "object", "properties": {"x": {"type": "integer"}},
                        "required": ["x"], "additionalProperties": false});
    for (seed, given) in [(7, schema.clone()), (8, json!(schema.to_string()))] {
        let v = generate(
            &s,
            json!({"text": "Hi", "sampling_params": {"json_schema": given, "max_new_tokens": 256,
                                                     "sampling_seed": seed}}),
        )
        .await;
        assert_eq!(v["meta_info"]["finish_reason"]["type"], "stop", "{v}");
        let text = v["text"].as_str().unwrap();
        let parsed: serde_json::Map<String, Value> = serde_json::from_str(text).unwrap();
        assert_eq!(parsed.keys().collect::<Vec<_>>(), ["x"], "{v}");
        // An integer of any size: digits after an optional minus sign.
        let digits = text
            .split_once(':')
            .unwrap()
            .1
            .trim()
            .trim_end_matches('}')
            .trim();
        let digits = digits.strip_prefix('-').unwrap_or(digits);
        assert!(
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
            "{v}"
        );
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_generate_requests_name_what_is_wrong() {
    let s = start(config()).await;
    let cases = [
        (json!({"text": "a", "input_ids": [1]}), None, "not both"),
        (json!({"sampling_params": {}}), None, "no prompt"),
        (json!({"text": []}), Some("text"), "non-empty"),
        (json!({"text": ["a", 1]}), Some("text[1]"), "strings"),
        (
            json!({"input_ids": [[1], []]}),
            Some("input_ids[1]"),
            "non-empty",
        ),
        (
            json!({"input_ids": [1, -2]}),
            Some("input_ids"),
            "token ids",
        ),
        (
            json!({"text": "a", "prompt": "a"}),
            Some("prompt"),
            "unknown field",
        ),
        (
            json!({"text": "a", "sampling_params": {"max_new_tokens": 2, "best": 1}}),
            Some("sampling_params"),
            "best",
        ),
        (
            json!({"text": "a", "sampling_params": [{}, {"bogus": 1}]}),
            Some("sampling_params"),
            "[1]: unknown field `bogus`",
        ),
        (
            json!({"text": ["a", "b"], "sampling_params": [{}, {}, {}]}),
            Some("sampling_params"),
            "3 values",
        ),
        (
            json!({"text": "a", "sampling_params": {"temperature": 5}}),
            Some("sampling_params.temperature"),
            "0 to 2",
        ),
        (
            json!({"text": "a", "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 3}}),
            Some("sampling_params.min_new_tokens"),
            "",
        ),
        (
            json!({"text": "a", "sampling_params": {"n": 0}}),
            Some("sampling_params.n"),
            "1 to 16",
        ),
        (
            json!({"text": "a", "sampling_params": {"regex": "a+", "ebnf": "root ::= \"a\""}}),
            Some("sampling_params.ebnf"),
            "send only one",
        ),
        (
            json!({"text": "a", "sampling_params": {"json_schema": "{oops"}}),
            Some("sampling_params.json_schema"),
            "not valid JSON",
        ),
        (
            json!({"text": "a", "sampling_params": {"max_new_tokens": 10_000_000}}),
            Some("sampling_params.max_new_tokens"),
            "context",
        ),
        (
            json!({"text": "a", "return_logprob": true, "logprob_start_len": 9}),
            Some("logprob_start_len"),
            "0 to 1",
        ),
        (
            json!({"text": "a", "return_logprob": true, "top_logprobs_num": 21}),
            Some("top_logprobs_num"),
            "20",
        ),
        (
            json!({"text": vec!["a"; 20], "sampling_params": {"n": 16}}),
            Some("sampling_params.n"),
            "320 outputs",
        ),
        (json!({"input_ids": [1, 99999]}), None, "vocabulary"),
        (
            json!({"text": "a", "return_logprob": true, "token_ids_logprob": [1, 99999]}),
            Some("token_ids_logprob"),
            "vocabulary",
        ),
        (
            json!({"text": "a", "return_logprob": true, "token_ids_logprob": [[1], [2]]}),
            Some("token_ids_logprob"),
            "2 values",
        ),
        (
            json!({"text": "a", "return_logprob": true, "token_ids_logprob": vec![1; 257]}),
            Some("token_ids_logprob"),
            "at most 256",
        ),
        (
            json!({"text": "a", "token_ids_logprob": ["a"]}),
            Some("token_ids_logprob"),
            "a list of token ids",
        ),
        (
            json!({"text": "a", "sampling_params": {"logit_bias": {"999999": 1}}}),
            Some("sampling_params.logit_bias"),
            "vocabulary",
        ),
    ];
    for (body, param, says) in cases {
        let e = s.send("POST", "/generate", &body).await.error(400);
        assert_eq!(e["param"].as_str(), param, "{body} → {e}");
        assert!(
            e["message"].as_str().unwrap().contains(says),
            "{body} → {e}"
        );
    }
    let e = s
        .send(
            "POST",
            "/generate",
            &json!({"text": "a", "sampling_params": {"max_new_tokens": 10_000_000}}),
        )
        .await
        .error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    // The server still answers.
    generate(
        &s,
        json!({"text": "a", "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    s.shutdown().await.unwrap();
}

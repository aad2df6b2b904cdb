//! `echo` on /v1/completions: each choice's text starts with the prompt; with `logprobs` the
//! prompt's tokens lead the lists, the sequence's first token with null, every other one
//! scored exactly as generating it would score it (what lm-evaluation-harness's loglikelihood
//! tasks read); streamed lists join up to the answer's; a BOS the server prepended to a text
//! prompt is left out.

use super::common::*;
use super::logprobs::lists;
use serde_json::{Value, json};

const PATH: &str = "/v1/completions";

/// The concatenated text and lists of a completion stream's chunks (one choice).
fn joined(events: &[Value]) -> (String, [Vec<Value>; 4]) {
    let (mut text, mut all): (String, [Vec<Value>; 4]) = Default::default();
    for c in events
        .iter()
        .filter(|e| e.is_object())
        .flat_map(|e| e["choices"].as_array().unwrap().clone())
    {
        text.push_str(c["text"].as_str().unwrap());
        for (all, part) in all.iter_mut().zip(lists(&c["logprobs"])) {
            all.extend(part);
        }
    }
    (text, all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_prompt_tokens_are_scored_as_generating_them_would_be() {
    let s = start(config()).await;
    let loaded = s.state.loaded().unwrap();
    let mut ids = vec![loaded.bos];
    ids.extend(loaded.tokenizer.encode("The cat sat on the mat.").unwrap());
    let len = ids.len();
    // lm-evaluation-harness's loglikelihood request, over token ids.
    let req = json!({"model": MODEL, "prompt": ids, "echo": true, "max_tokens": 1,
                     "temperature": 0, "logprobs": 2});
    let v = s.send("POST", PATH, &req).await.json();
    let choice = &v["choices"][0];
    let text = choice["text"].as_str().unwrap();
    let [tokens, lps, tops, offsets] = lists(&choice["logprobs"]);
    let generated = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(v["usage"]["prompt_tokens"], len);
    assert_eq!(tokens.len(), len + generated, "{v}");
    assert!(
        text.starts_with("<｜begin▁of▁sentence｜>The cat sat on the mat."),
        "{text}"
    );
    assert_eq!(
        (&lps[0], &tops[0], &offsets[0]),
        (&json!(null), &json!(null), &json!(0))
    );
    let mut at = 0;
    for j in 0..tokens.len() {
        let tok = tokens[j].as_str().unwrap();
        assert_eq!(offsets[j], at, "token {j}");
        assert_eq!(&text[at..at + tok.len()], tok, "token {j}");
        at += tok.len();
        if j > 0 {
            assert!(lps[j].as_f64().unwrap() <= 0.0, "{}", lps[j]);
            assert!(!tops[j].as_object().unwrap().is_empty());
        }
    }
    assert_eq!(at, text.len());
    // Prompt token j is what a request for prompt[..j] generates under a bias towards it:
    // its log-probability (under the raw logits) and alternatives are the same, bit for bit.
    for j in [1, len / 2, len - 1] {
        let forced = json!({"model": MODEL, "prompt": &ids[..j], "max_tokens": 1,
                            "temperature": 0, "logprobs": 2,
                            "logit_bias": {ids[j].to_string(): 100}});
        let g = s.send("POST", PATH, &forced).await.json();
        let [gt, gl, gtop, _] = lists(&g["choices"][0]["logprobs"]);
        assert_eq!(
            (&gt[0], &gl[0], &gtop[0]),
            (&tokens[j], &lps[j], &tops[j]),
            "prompt token {j}"
        );
    }
    // Without logprobs only the text is echoed.
    let mut plain = req.clone();
    plain.as_object_mut().unwrap().remove("logprobs");
    let p = s.send("POST", PATH, &plain).await.json();
    assert_eq!(p["choices"][0]["text"], text);
    assert!(p["choices"][0]["logprobs"].is_null());
    // A stream carries the prompt in its first chunk; its pieces join up to the answer.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = s.send("POST", PATH, &sreq).await.events();
    assert_eq!(
        joined(&events),
        (text.to_string(), [tokens, lps, tops, offsets])
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_prompt_is_echoed_without_the_bos_the_server_added() {
    let s = start(config()).await;
    let loaded = s.state.loaded().unwrap();
    let prompt = "Once upon a time";
    let shown = loaded.tokenizer.encode(prompt).unwrap().len();
    let base = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0});
    let bare = s.send("POST", PATH, &base).await.json();
    let mut req = base.clone();
    req["echo"] = json!(true);
    req["logprobs"] = json!(1);
    let v = s.send("POST", PATH, &req).await.json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(
        text,
        format!("{prompt}{}", bare["choices"][0]["text"].as_str().unwrap())
    );
    let [tokens, lps, _, _] = lists(&v["choices"][0]["logprobs"]);
    let generated = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(tokens.len(), shown + generated);
    assert!(
        lps.iter().all(|l| l.as_f64().is_some_and(|l| l <= 0.0)),
        "after the BOS every token has a log-probability: {lps:?}"
    );
    // Every choice of n starts with the prompt.
    let mut many = base.clone();
    many["echo"] = json!(true);
    many["n"] = json!(3);
    many["temperature"] = json!(0.9);
    many["seed"] = json!(5);
    let m = s.send("POST", PATH, &many).await.json();
    for c in m["choices"].as_array().unwrap() {
        assert!(c["text"].as_str().unwrap().starts_with(prompt), "{c}");
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_0_with_echo_scores_the_prompt_and_generates_nothing() {
    // What perplexity and scoring scripts send (OpenAI's legacy API; vLLM accepts it too).
    let s = start(config()).await;
    let loaded = s.state.loaded().unwrap();
    let mut ids = vec![loaded.bos];
    ids.extend(loaded.tokenizer.encode("The cat sat on the mat.").unwrap());
    let len = ids.len();
    let req = json!({"model": MODEL, "prompt": ids, "echo": true, "max_tokens": 0,
                     "logprobs": 2});
    let v = s.send("POST", PATH, &req).await.json();
    let choice = &v["choices"][0];
    assert_eq!(
        choice["text"], "<｜begin▁of▁sentence｜>The cat sat on the mat.",
        "{v}"
    );
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], len);
    assert_eq!(v["usage"]["completion_tokens"], 0);
    assert_eq!(v["usage"]["total_tokens"], len);
    // The prompt's lists are those of the same request generating one token, bit for bit.
    let mut one = req.clone();
    one["max_tokens"] = json!(1);
    one["temperature"] = json!(0);
    let g = s.send("POST", PATH, &one).await.json();
    let scored = lists(&choice["logprobs"]);
    let with_token = lists(&g["choices"][0]["logprobs"]);
    assert_eq!(scored[0].len(), len);
    for (a, b) in scored.iter().zip(&with_token) {
        assert_eq!(a[..], b[..len]);
    }
    // Streamed: one chunk with the whole prompt and its end, then the usage.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let events = s.send("POST", PATH, &sreq).await.events();
    let chunks: Vec<&Value> = events
        .iter()
        .filter(|e| e["choices"].as_array().is_some_and(|c| !c.is_empty()))
        .collect();
    assert_eq!(chunks.len(), 1, "{events:?}");
    assert_eq!(chunks[0]["choices"][0]["finish_reason"], "length");
    let (text, streamed) = joined(&events);
    assert_eq!(
        (text.as_str(), streamed),
        (choice["text"].as_str().unwrap(), scored)
    );
    let usage = events
        .iter()
        .rev()
        .find(|e| e["usage"].is_object())
        .unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 0);
    // Several text prompts: each choice is its prompt, without the BOS the server added.
    let many = json!({"model": MODEL, "prompt": ["Once upon", "a time"], "echo": true,
                      "max_tokens": 0});
    let m = s.send("POST", PATH, &many).await.json();
    let texts: Vec<&str> = m["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["Once upon", "a time"], "{m}");
    assert_eq!(m["usage"]["completion_tokens"], 0);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choices_of_one_echoed_prompt_share_its_scoring_streamed_or_not() {
    // Only the first choice scores the prompt; the others reuse its prefill through the prefix
    // cache (whole pages of 64) and show its entries. A stream holds their first chunks back
    // until the first choice's has brought them.
    let s = start(config()).await;
    let engine = s.state.loaded().unwrap().engine.clone();
    let prompt = "Once upon a time there was a small model. ".repeat(4);
    let req = json!({"model": MODEL, "prompt": prompt, "max_tokens": 2, "echo": true,
                     "logprobs": 1, "n": 3, "temperature": 0.9, "seed": 4});
    let cached = engine.metrics().cached_tokens_total;
    let v = s.send("POST", PATH, &req).await.json();
    assert!(
        engine.metrics().cached_tokens_total >= cached + 2 * 64,
        "choices 1 and 2 reuse the first one's pages"
    );
    let choices = v["choices"].as_array().unwrap();
    let shown = prompt.len();
    let lists_of = |c: &Value| -> Vec<Vec<Value>> {
        lists(&c["logprobs"])
            .iter()
            .map(|l| l[..shown].to_vec())
            .collect()
    };
    for c in choices {
        assert!(c["text"].as_str().unwrap().starts_with(&prompt), "{c}");
        assert_eq!(
            lists_of(c),
            lists_of(&choices[0]),
            "the prompt's lists are shared"
        );
    }
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    streamed["seed"] = json!(5);
    s.send("POST", "/reset_prefix_cache", &json!({}))
        .await
        .json();
    let cached = engine.metrics().cached_tokens_total;
    let events = s.send("POST", PATH, &streamed).await.events();
    assert!(
        engine.metrics().cached_tokens_total >= cached + 2 * 64,
        "streamed, choices 1 and 2 reuse the first one's pages too"
    );
    // Each choice's chunks assemble to its lists, whose prompt part is the first choice's.
    let per_choice: Vec<Vec<Vec<Value>>> = (0..3)
        .map(|k| {
            let mine: Vec<Value> = events
                .iter()
                .filter(|e| e.is_object() && e["choices"][0]["index"] == k)
                .cloned()
                .collect();
            joined(&mine)
                .1
                .iter()
                .map(|l| l[..shown].to_vec())
                .collect()
        })
        .collect();
    assert_eq!(per_choice[1], per_choice[0], "{events:?}");
    assert_eq!(per_choice[2], per_choice[0]);
    assert_eq!(
        per_choice[0],
        lists_of(&choices[0]),
        "equal to the unstreamed scoring"
    );
    s.shutdown().await.unwrap();
}

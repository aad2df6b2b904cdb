//! Beam search (`use_beam_search`, vLLM's extension) on completions and chat: the choices are
//! the best hypotheses of an independent search over one-token requests, one beam is greedy
//! decoding, a stop string ends a hypothesis, streams carry the same answer, chat and
//! completions search alike, an abort stops the search, a search beside other requests
//! answers as it does alone, and what beam search cannot do is a 400 naming the field.

use super::common::*;
use serde_json::{Value, json};

/// Token ids of a JSON list.
fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

async fn completion(s: &TestServer, body: Value) -> Value {
    let mut body = body;
    body["model"] = json!(MODEL);
    let r = s.send("POST", "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// The 20 most likely next tokens after `prompt` with their log-probabilities (f32, as the
/// engine computes them), most likely first, ties to the lower id: what one engine request
/// reports, asked over HTTP.
async fn top20(s: &TestServer, prompt: &[u32]) -> Vec<(u32, f64)> {
    let v = completion(
        s,
        json!({"prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": true,
               "logprobs": 20, "return_tokens_as_token_ids": true}),
    )
    .await;
    let top = v["choices"][0]["logprobs"]["top_logprobs"][0]
        .as_object()
        .unwrap_or_else(|| panic!("{v}"));
    let mut out: Vec<(u32, f64)> = top
        .iter()
        .map(|(k, lp)| {
            let id = k.strip_prefix("token_id:").unwrap().parse().unwrap();
            (id, f64::from(lp.as_f64().unwrap() as f32))
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    assert_eq!(out.len(), 20, "{v}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_choices_are_the_best_of_an_independent_two_step_search() {
    let s = start(config()).await;
    let eos = s.state.loaded().unwrap().eos;
    let width = 3;
    let v = completion(
        &s,
        json!({"prompt": "Hello", "max_tokens": 2, "n": width, "use_beam_search": true,
               "length_penalty": 0, "return_token_ids": true, "logprobs": 2}),
    )
    .await;
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), width, "{v}");
    let prompt = ids(&choices[0]["prompt_token_ids"]);
    // The same search, written out: with length_penalty 0 a hypothesis scores its sum.
    let mut hyps: Vec<(f64, Vec<u32>)> = Vec::new();
    let mut beams: Vec<(f64, Vec<u32>)> = Vec::new();
    for (t, lp) in top20(&s, &prompt).await {
        if t == eos {
            hyps.push((lp, vec![t]));
        } else if beams.len() < width {
            beams.push((lp, vec![t]));
        }
    }
    let mut cands = Vec::new();
    for (sum, tokens) in &beams {
        let mut p = prompt.clone();
        p.extend(tokens);
        for (t, lp) in top20(&s, &p).await {
            let mut next = tokens.clone();
            next.push(t);
            cands.push((sum + lp, next));
        }
    }
    cands.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut kept = 0;
    for (sum, tokens) in cands {
        if tokens[1] == eos {
            hyps.push((sum, tokens));
        } else if kept < width {
            kept += 1;
            hyps.push((sum, tokens));
        }
    }
    hyps.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (k, (sum, want)) in hyps.iter().take(width).enumerate() {
        let c = &choices[k];
        assert_eq!(c["index"], k, "{v}");
        // vLLM's `token_ids` end with the end token of a hypothesis that ended on one.
        assert_eq!(ids(&c["token_ids"]), *want, "choice {k} (sum {sum}): {v}");
        let ended = want.last() == Some(&eos);
        assert_eq!(c["finish_reason"], if ended { "stop" } else { "length" });
        // Each entry is the one-token request's: the chosen token's ln p and the 2 best.
        let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), want.len() - usize::from(ended), "{c}");
        assert_eq!(
            c["logprobs"]["top_logprobs"][0].as_object().unwrap().len(),
            2
        );
    }
    // Usage counts the answered hypotheses' tokens, as vLLM's.
    let generated: usize = hyps
        .iter()
        .take(width)
        .map(|h| h.1.len() - usize::from(h.1.last() == Some(&eos)))
        .sum();
    assert_eq!(v["usage"]["completion_tokens"], generated, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_beam_that_never_ends_is_greedy_decoding() {
    let s = start(config()).await;
    let ask = |extra: Value| {
        let mut body = json!({"prompt": "Hello", "max_tokens": 6, "ignore_eos": true,
                              "return_token_ids": true});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let beam = completion(&s, ask(json!({"use_beam_search": true, "n": 1}))).await;
    let greedy = completion(&s, ask(json!({"temperature": 0}))).await;
    assert_eq!(
        beam["choices"][0]["token_ids"], greedy["choices"][0]["token_ids"],
        "{beam} {greedy}"
    );
    assert_eq!(beam["choices"][0]["text"], greedy["choices"][0]["text"]);
    assert_eq!(beam["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_ends_a_hypothesis_and_is_cut() {
    let s = start(config()).await;
    let loaded = s.state.loaded().unwrap();
    let greedy = completion(
        &s,
        json!({"prompt": "Hello", "max_tokens": 1, "temperature": 0, "ignore_eos": true,
               "return_token_ids": true}),
    )
    .await;
    let first = ids(&greedy["choices"][0]["token_ids"])[0];
    let stop = String::from_utf8(loaded.vocab.bytes(first).to_vec()).unwrap();
    assert!(
        stop.chars().all(|c| c.is_ascii_graphic()),
        "the test needs a printable first token, got {stop:?}"
    );
    // The most likely first token completes the stop string: that hypothesis scores its one
    // log-probability, which no longer sequence beats (length_penalty 0), so it comes first.
    let v = completion(
        &s,
        json!({"prompt": "Hello", "max_tokens": 6, "n": 2, "use_beam_search": true,
               "length_penalty": 0, "stop": [stop], "return_token_ids": true}),
    )
    .await;
    let best = &v["choices"][0];
    assert_eq!(best["text"], "", "{v}");
    assert_eq!(best["finish_reason"], "stop");
    assert_eq!(best["stop_reason"], json!(stop));
    assert_eq!(ids(&best["token_ids"]), [first]);
    for c in v["choices"].as_array().unwrap() {
        assert!(!c["text"].as_str().unwrap().contains(&stop), "{v}");
    }
    // With the stop string kept, the best text is the stop string itself.
    let kept = completion(
        &s,
        json!({"prompt": "Hello", "max_tokens": 6, "n": 2, "use_beam_search": true,
               "length_penalty": 0, "stop": [stop], "include_stop_str_in_output": true}),
    )
    .await;
    assert_eq!(kept["choices"][0]["text"], json!(stop), "{kept}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_prompts_search_apart_and_streams_carry_the_same_answer() {
    let s = start(config()).await;
    let body = |prompt: Value, stream: bool| {
        json!({"prompt": prompt, "max_tokens": 4, "n": 2, "use_beam_search": true,
               "length_penalty": 0.5, "stream": stream, "return_token_ids": true})
    };
    let both = completion(&s, body(json!(["Hello", "Bye"]), false)).await;
    let bye = completion(&s, body(json!("Bye"), false)).await;
    let choices = both["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4, "{both}");
    for k in 0..2 {
        assert_eq!(choices[2 + k]["index"], 2 + k);
        assert_eq!(
            choices[2 + k]["token_ids"],
            bye["choices"][k]["token_ids"],
            "{both} {bye}"
        );
        assert_eq!(choices[2 + k]["text"], bye["choices"][k]["text"]);
    }
    let mut streamed = body(json!(["Hello", "Bye"]), true);
    streamed["model"] = json!(MODEL);
    let r = s.send("POST", "/v1/completions", &streamed).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let mut texts = vec![String::new(); 4];
    let mut reasons = vec![Value::Null; 4];
    for e in r.events().iter().filter(|e| e.is_object()) {
        for c in e["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            texts[i].push_str(c["text"].as_str().unwrap());
            if !c["finish_reason"].is_null() {
                reasons[i] = c["finish_reason"].clone();
            }
        }
    }
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(
            texts[i],
            c["text"].as_str().unwrap(),
            "choice {i}: {}",
            r.body
        );
        assert_eq!(reasons[i], c["finish_reason"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_searches_as_completions_do_over_its_prompt() {
    let s = start(config()).await;
    let r = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat(
                "Hello",
                json!({"max_tokens": 3, "n": 2, "use_beam_search": true,
                       "return_token_ids": true, "ignore_eos": true}),
            ),
        )
        .await;
    let prompt = {
        let t = s
            .send(
                "POST",
                "/tokenize",
                &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]}),
            )
            .await
            .json();
        tokenized(&t)
    };
    let plain = completion(
        &s,
        json!({"prompt": prompt, "max_tokens": 3, "n": 2, "use_beam_search": true,
               "return_token_ids": true, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(ids(&v["prompt_token_ids"]), ids(&json!(prompt)), "{v}");
    for k in 0..2 {
        assert_eq!(
            v["choices"][k]["token_ids"], plain["choices"][k]["token_ids"],
            "{v} {plain}"
        );
        assert_eq!(
            v["choices"][k]["message"]["content"], plain["choices"][k]["text"],
            "{v} {plain}"
        );
    }
    assert_eq!(v["usage"], plain["usage"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_beam_search_cannot_do_is_refused_naming_the_field() {
    let s = start(config()).await;
    for (extra, param) in [
        (json!({"length_penalty": 0.5}), "length_penalty"),
        (
            json!({"use_beam_search": true, "presence_penalty": 1}),
            "presence_penalty",
        ),
        (
            json!({"use_beam_search": true, "repetition_penalty": 1.2}),
            "repetition_penalty",
        ),
        (
            json!({"use_beam_search": true, "logit_bias": {"200": 5}}),
            "logit_bias",
        ),
        (
            json!({"use_beam_search": true, "allowed_token_ids": [200]}),
            "allowed_token_ids",
        ),
        (
            json!({"use_beam_search": true, "bad_words": ["x"]}),
            "bad_words",
        ),
        (
            json!({"use_beam_search": true, "response_format": {"type": "json_object"}}),
            "use_beam_search",
        ),
        (
            json!({"use_beam_search": true, "echo": true, "max_tokens": 0}),
            "max_tokens",
        ),
    ] {
        let mut body = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 4});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let e = s.send("POST", "/v1/completions", &body).await.error(400);
        assert_eq!(e["param"], param, "{extra}: {e}");
    }
    let e = s
        .send(
            "POST",
            "/v1/chat/completions",
            &chat(
                "Hello",
                json!({"use_beam_search": true, "frequency_penalty": 1}),
            ),
        )
        .await
        .error(400);
    assert_eq!(e["param"], "frequency_penalty", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_stops_the_search_with_the_best_beams_so_far() {
    let s = start(config()).await;
    let long = 4000;
    let body = json!({"model": MODEL, "prompt": "Hi", "max_tokens": long, "n": 2,
                      "use_beam_search": true, "ignore_eos": true, "return_token_ids": true});
    let (reply, aborted) = tokio::join!(s.send("POST", "/v1/completions", &body), async {
        // The search registers itself and, beside it, each step's engine requests; wait for
        // both, then abort everything (a non-streamed request's id is not known yet).
        eventually("the search runs", async || s.state.aborts().len() >= 2).await;
        let r = s
            .send("POST", "/abort_request", &json!({"abort_all": true}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["aborted"].as_u64().unwrap()
    });
    assert!(aborted >= 1, "{aborted}");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{v}");
    for c in choices {
        assert_eq!(c["finish_reason"], "abort", "{v}");
        assert!(ids(&c["token_ids"]).len() < long, "{v}");
    }
    eventually("nothing is left registered", async || {
        s.state.aborts().is_empty() && s.state.in_flight() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_beside_other_requests_answers_as_it_does_alone() {
    let s = start(config()).await;
    let search = |prompt: &str| {
        json!({"model": MODEL, "prompt": prompt, "max_tokens": 8, "n": 3,
               "use_beam_search": true, "ignore_eos": true, "return_token_ids": true,
               "logprobs": 3})
    };
    let alone = completion(&s, search("Hello")).await;
    // The same search again while two other searches and two sampled requests run: its beams'
    // one-token requests share steps (and prefix pages) with theirs.
    let sampled = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 64, "n": 2,
                         "temperature": 1, "seed": 5, "ignore_eos": true});
    let bodies = [search("Hello"), search("Hello there"), search("Bye")];
    let (again, other, third, noise, more) = tokio::join!(
        s.send("POST", "/v1/completions", &bodies[0]),
        s.send("POST", "/v1/completions", &bodies[1]),
        s.send("POST", "/v1/completions", &bodies[2]),
        s.send("POST", "/v1/completions", &sampled),
        s.send("POST", "/v1/completions", &sampled),
    );
    for r in [&other, &third, &noise, &more] {
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(again.status, 200, "{}", again.body);
    let again = again.json();
    for k in 0..3 {
        let (a, b) = (&alone["choices"][k], &again["choices"][k]);
        assert_eq!(
            a["token_ids"], b["token_ids"],
            "choice {k}: {alone} {again}"
        );
        assert_eq!(a["logprobs"], b["logprobs"], "choice {k}");
    }
    assert_eq!(other.json()["choices"].as_array().unwrap().len(), 3);
}

//! `dsv4 generate --batch FILE`: many requests through the engine at once. JSONL in, one object
//! per request (`id`, `prompt` or `messages`, `max_tokens`, optional sampling fields — those
//! of `BatchRequest` — `stop` and `logprobs`); JSONL out in input order (`id`, `text`,
//! `tokens`, `finish_reason` (with `stop_token` when a token ended it), `usage`, `timing`,
//! `logprobs` when asked, and `error` when it failed). `messages` are rendered with the DSV4
//! chat encoding of dsv4-chat (chat mode, no tools).

use crate::commands::engine_config::engine_config;
use anyhow::{Context, bail};
use dsv4_chat::tokenizer::Tokenizer;
use dsv4_chat::{Conversation, EncodeOptions, encode_prompt_ids};
use dsv4_config::Profile;
use dsv4_engine::{
    Detokenizer, Engine, Request, RequestStream, SamplingParams, Timing, TokenLogprob, Usage,
};
use dsv4_model::Model;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;

/// `stop` may be one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// One input line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    id: serde_json::Value,
    prompt: Option<String>,
    /// OpenAI-style messages; rendered from the line's own JSON text (key order preserved).
    messages: Option<serde_json::Value>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    seed: Option<u64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    /// Token id → bias (−100 to 100), as OpenAI's `logit_bias`.
    logit_bias: Option<BTreeMap<u32, f32>>,
    min_tokens: Option<usize>,
    ignore_eos: Option<bool>,
    stop: Option<Stop>,
    /// Token ids that end the request as the end-of-sequence token does.
    stop_token_ids: Option<Vec<u32>>,
    /// Only these token ids may be generated.
    allowed_token_ids: Option<Vec<u32>>,
    /// Return each token's log-probability with this many alternatives (0 to 20).
    logprobs: Option<usize>,
    /// Return each prompt token's log-probability (after the first) with this many
    /// alternatives (0 to 20).
    prompt_logprobs: Option<usize>,
}

/// A generated token's log-probability in an output line.
#[derive(Debug, Serialize)]
struct LogprobEntry {
    token: u32,
    logprob: f32,
    /// `[id, logprob]` pairs, most likely first.
    top: Vec<(u32, f32)>,
}

impl LogprobEntry {
    fn new(token: u32, lp: TokenLogprob) -> Self {
        Self {
            token,
            logprob: lp.logprob,
            top: lp.top,
        }
    }
}

/// One output line.
#[derive(Debug, Serialize)]
struct BatchResult {
    id: serde_json::Value,
    text: String,
    tokens: Vec<u32>,
    finish_reason: &'static str,
    /// With `eos`: the token that ended the request (the end-of-sequence token or a
    /// `stop_token_ids` id), which `tokens` does not hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_token: Option<u32>,
    usage: Usage,
    timing: Timing,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Vec<LogprobEntry>>,
    /// The prompt's tokens after the first, each given those before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<Vec<LogprobEntry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Parse the JSONL file into engine requests (BOS first), naming the line of any problem.
fn read_requests(
    path: &Path,
    tok: &Tokenizer,
    bos: u32,
    default_max_tokens: usize,
) -> anyhow::Result<Vec<(serde_json::Value, Request)>> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot open the batch file {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let r: BatchRequest = serde_json::from_str(&line).with_context(|| {
            format!(
                "{}: not a request object (fields: id, prompt or messages, max_tokens, \
                 temperature, top_p, top_k, min_p, seed, presence_penalty, frequency_penalty, \
                 repetition_penalty, logit_bias, min_tokens, ignore_eos, stop, stop_token_ids, \
                 allowed_token_ids, logprobs, prompt_logprobs)",
                at()
            )
        })?;
        let prompt = match (r.prompt, r.messages) {
            (Some(p), None) => {
                let mut ids = vec![bos];
                ids.extend(tok.encode(&p).with_context(at)?);
                ids
            }
            (None, Some(_)) => {
                // The DSV4 prompt carries BOS as text.
                let conv = Conversation::from_json_str(&line).with_context(at)?;
                encode_prompt_ids(&conv, &EncodeOptions::default(), tok)
                    .with_context(at)?
                    .1
            }
            _ => bail!("{}: give exactly one of `prompt` and `messages`", at()),
        };
        let stop = match r.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        let defaults = SamplingParams::default();
        let req = Request {
            prompt,
            max_tokens: r.max_tokens.unwrap_or(default_max_tokens),
            sampling: SamplingParams {
                temperature: r.temperature.unwrap_or(defaults.temperature),
                top_p: r.top_p.unwrap_or(defaults.top_p),
                top_k: r.top_k.unwrap_or(defaults.top_k),
                min_p: r.min_p.unwrap_or(defaults.min_p),
                seed: r.seed.unwrap_or(defaults.seed),
                presence_penalty: r.presence_penalty.unwrap_or(defaults.presence_penalty),
                frequency_penalty: r.frequency_penalty.unwrap_or(defaults.frequency_penalty),
                repetition_penalty: r.repetition_penalty.unwrap_or(defaults.repetition_penalty),
                logit_bias: r.logit_bias.unwrap_or_default().into_iter().collect(),
                min_tokens: r.min_tokens.unwrap_or(defaults.min_tokens),
                stop_token_ids: r.stop_token_ids.unwrap_or_default(),
                allowed_token_ids: r.allowed_token_ids.unwrap_or_default(),
                bad_words_ids: Vec::new(),
            },
            stop,
            ignore_eos: r.ignore_eos.unwrap_or(false),
            logprobs: r.logprobs,
            prompt_logprobs: r.prompt_logprobs,
            ..Default::default()
        };
        out.push((r.id, req));
    }
    if out.is_empty() {
        bail!(
            "{} holds no requests (one JSON object per line)",
            path.display()
        );
    }
    Ok(out)
}

/// Run every request of `path` through an engine on `model`; write one result line each to
/// the output `open_out` opens, in input order. The output is opened only once every request
/// has parsed and the engine has started, so a bad batch file truncates no earlier results.
pub fn run_batch<W: Write>(
    model: Model,
    tok: Tokenizer,
    profile: &Profile,
    path: &Path,
    default_max_tokens: usize,
    open_out: impl FnOnce() -> anyhow::Result<W>,
) -> anyhow::Result<()> {
    let cfg = engine_config(profile)?;
    let requests = read_requests(path, &tok, model.cfg.bos_token_id, default_max_tokens)?;
    let tok = Arc::new(tok);
    let detok: Arc<dyn Detokenizer> = {
        let tok = Arc::clone(&tok);
        Arc::new(move |ids: &[u32]| tok.decode(ids).unwrap_or_default())
    };
    let debug = crate::commands::plan::debug_options(profile);
    let engine = Engine::spawn_debug(Arc::new(model), cfg, Some(detok), debug)?;
    tracing::info!(requests = requests.len(), pools = %engine.pool_report(), "batch started");
    // (id, whether it asked for logprobs, its prompt if it asked for the prompt's, its stream)
    type Submitted = (
        serde_json::Value,
        bool,
        Option<Vec<u32>>,
        anyhow::Result<RequestStream>,
    );
    let streams: Vec<Submitted> = requests
        .into_iter()
        .map(|(id, r)| {
            let logprobs = r.logprobs.is_some();
            let prompt = r.prompt_logprobs.map(|_| r.prompt.clone());
            (
                id,
                logprobs,
                prompt,
                engine.submit(r).map_err(anyhow::Error::from),
            )
        })
        .collect();
    let mut out = open_out()?;
    let mut failed = 0;
    let total = streams.len();
    for (id, wants_logprobs, prompt, stream) in streams {
        let result = match stream {
            Ok(s) => {
                let c = s.collect_blocking();
                let f = c.finished;
                let logprobs = wants_logprobs.then(|| {
                    c.tokens
                        .iter()
                        .zip(c.logprobs)
                        .map(|(&t, lp)| LogprobEntry::new(t, lp))
                        .collect()
                });
                let prompt_logprobs = prompt.map(|p| {
                    p.iter()
                        .skip(1)
                        .zip(c.prompt_logprobs)
                        .map(|(&t, lp)| LogprobEntry::new(t, lp))
                        .collect()
                });
                BatchResult {
                    id,
                    text: f.text.unwrap_or_default(),
                    tokens: c.tokens,
                    finish_reason: f.reason.as_str(),
                    stop_token: f.stop_token,
                    usage: f.usage,
                    timing: f.timing,
                    logprobs,
                    prompt_logprobs,
                    error: f.error,
                }
            }
            Err(e) => BatchResult {
                id,
                text: String::new(),
                tokens: Vec::new(),
                finish_reason: "error",
                stop_token: None,
                usage: Usage::default(),
                timing: Timing::default(),
                logprobs: None,
                prompt_logprobs: None,
                error: Some(format!("{e:#}")),
            },
        };
        failed += usize::from(result.error.is_some());
        writeln!(out, "{}", serde_json::to_string(&result)?)?;
        out.flush()?;
    }
    let m = engine.metrics();
    tracing::info!(
        generated = m.generated_tokens_total,
        prefix_hit_rate = m.prefix_hit_rate,
        preemptions = m.preemptions_total,
        "batch done"
    );
    if failed > 0 {
        bail!("{failed} of {total} requests failed (see their `error` fields)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_backend_reference::ReferenceBackend;
    use dsv4_core::Numerics;
    use dsv4_model::{ModelSource, load_model};

    fn tiny() -> Model {
        load_model(
            &ModelSource::Tiny { seed: 0 },
            Arc::new(ReferenceBackend),
            Numerics::default(),
        )
        .unwrap()
    }

    fn profile() -> Profile {
        let mut p = Profile::default();
        p.cache.max_total_tokens = 2048;
        p.scheduler.max_running_requests = 4;
        p
    }

    fn run(lines: &str) -> (anyhow::Result<()>, Vec<serde_json::Value>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, lines).unwrap();
        let mut out = Vec::new();
        let r = run_batch(
            tiny(),
            Tokenizer::tiny().unwrap(),
            &profile(),
            &path,
            5,
            || Ok(&mut out),
        );
        let rows = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (r, rows)
    }

    #[test]
    fn batch_results_come_back_in_input_order_with_the_solo_tokens() {
        let (r, rows) = run(concat!(
            r#"{"id": "a", "prompt": "hello there", "max_tokens": 3}"#,
            "\n\n",
            r#"{"id": 7, "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "seed": 3}"#,
            "\n",
            r#"{"id": "c", "prompt": "hello there", "max_tokens": 4, "top_k": 1}"#,
            "\n"
        ));
        r.unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0]["id"], "a");
        assert_eq!(rows[1]["id"], 7);
        assert_eq!(rows[0]["finish_reason"], "length");
        assert_eq!(rows[0]["tokens"].as_array().unwrap().len(), 3);
        assert_eq!(
            rows[1]["tokens"].as_array().unwrap().len(),
            5,
            "default max_tokens"
        );
        // top_k 1 is greedy: the same prompt gives the same first tokens.
        assert_eq!(
            rows[2]["tokens"].as_array().unwrap()[..3],
            rows[0]["tokens"].as_array().unwrap()[..]
        );
        let tok = Tokenizer::tiny().unwrap();
        let ids: Vec<u32> = rows[0]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(rows[0]["text"], tok.decode(&ids).unwrap());
        assert!(rows[0]["timing"]["e2e_ms"].as_f64().unwrap() > 0.0);
        let conv = Conversation::from_json_str(r#"[{"role": "user", "content": "hi"}]"#).unwrap();
        let (_, chat_ids) = encode_prompt_ids(&conv, &EncodeOptions::default(), &tok).unwrap();
        assert_eq!(
            rows[1]["usage"]["prompt_tokens"],
            chat_ids.len(),
            "DSV4 chat encoding"
        );
        assert_eq!(
            rows[0]["usage"]["prompt_tokens"],
            1 + tok.encode("hello there").unwrap().len()
        );
    }

    #[test]
    fn stop_strings_end_generation_and_cut_the_text() {
        let (r, rows) = run(r#"{"id": 1, "prompt": "hello there", "max_tokens": 8}"#);
        r.unwrap();
        let text = rows[0]["text"].as_str().unwrap().to_string();
        // Stop at the second generated character, wherever it came from.
        let stop: String = text.chars().skip(1).take(1).collect();
        assert!(!stop.is_empty(), "the tiny model generated text: {text:?}");
        let line =
            serde_json::json!({"id": 1, "prompt": "hello there", "max_tokens": 8, "stop": stop})
                .to_string();
        let (r, rows) = run(&line);
        r.unwrap();
        assert_eq!(rows[0]["finish_reason"], "stop");
        let cut = rows[0]["text"].as_str().unwrap();
        assert!(
            text.starts_with(cut) && !cut.contains(&stop),
            "{cut:?} from {text:?}"
        );
    }

    #[test]
    fn bad_lines_and_refused_requests_are_reported() {
        let (r, rows) = run(r#"{"id": 1, "max_tokens": 3}"#);
        let e = format!("{:#}", r.unwrap_err());
        assert!(e.contains("line 1") && e.contains("`prompt`"), "{e}");
        assert!(rows.is_empty());
        let (r, _) = run(r#"{"id": 1, "prompt": "x", "temprature": 1}"#);
        assert!(format!("{:#}", r.unwrap_err()).contains("line 1"));
        let (r, _) = run(r#"{"id": 1, "messages": [{"role": "wizard", "content": "x"}]}"#);
        assert!(format!("{:#}", r.unwrap_err()).contains("line 1"));
        let (r, rows) = run(concat!(
            r#"{"id": 1, "prompt": "x", "max_tokens": 2, "top_p": 0}"#,
            "\n",
            r#"{"id": 2, "prompt": "x", "max_tokens": 2}"#
        ));
        assert!(format!("{:#}", r.unwrap_err()).contains("1 of 2 requests failed"));
        assert_eq!(rows[0]["finish_reason"], "error");
        assert!(rows[0]["error"].as_str().unwrap().contains("top_p"));
        assert_eq!(rows[1]["finish_reason"], "length");
    }

    #[test]
    fn the_token_that_ended_a_request_is_reported() {
        let z = 128 + u32::from(b'z');
        let line = serde_json::json!({"id": 1, "prompt": "x", "max_tokens": 4, "min_tokens": 1,
            "logit_bias": {z.to_string(): 100}, "stop_token_ids": [z]});
        let plain = serde_json::json!({"id": 2, "prompt": "x", "max_tokens": 2});
        let (r, rows) = run(&format!("{line}\n{plain}"));
        r.unwrap();
        assert_eq!(rows[0]["finish_reason"], "eos");
        assert_eq!(rows[0]["stop_token"], z);
        assert_eq!(
            rows[0]["tokens"].as_array().unwrap().len(),
            1,
            "{}",
            rows[0]
        );
        assert!(rows[1].get("stop_token").is_none(), "{}", rows[1]);
    }

    #[test]
    fn allowed_token_ids_reach_the_engine() {
        let (q, r) = (128 + u32::from(b'q'), 128 + u32::from(b'r'));
        let line = serde_json::json!({"id": 1, "prompt": "x", "max_tokens": 6,
            "temperature": 1.0, "seed": 9, "allowed_token_ids": [q, r]});
        let (res, rows) = run(&line.to_string());
        res.unwrap();
        let tokens: Vec<u64> = rows[0]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(tokens.len(), 6, "{}", rows[0]);
        assert!(
            tokens
                .iter()
                .all(|&t| t == u64::from(q) || t == u64::from(r)),
            "{}",
            rows[0]
        );
    }

    #[test]
    fn logit_bias_penalties_and_logprobs_reach_the_engine() {
        let a = 128 + u32::from(b'A');
        let tok = Tokenizer::tiny().unwrap();
        assert_eq!(
            tok.decode(&[a]).unwrap(),
            "A",
            "byte tokens sit at 128 + byte"
        );
        let lines = [
            serde_json::json!({"id": 0, "prompt": "hello", "max_tokens": 12,
                "logit_bias": {a.to_string(): 30}}),
            serde_json::json!({"id": 1, "prompt": "hello", "max_tokens": 4, "logprobs": 2,
                "prompt_logprobs": 1}),
            serde_json::json!({"id": 2, "prompt": "hello", "max_tokens": 12,
                "logit_bias": {a.to_string(): 30}, "frequency_penalty": 2,
                "presence_penalty": 2, "repetition_penalty": 1.5, "min_p": 0.2,
                "min_tokens": 12, "ignore_eos": true, "logprobs": 0}),
            serde_json::json!({"id": 3, "prompt": "hello", "max_tokens": 2, "min_tokens": 3}),
            serde_json::json!({"id": 4, "prompt": "hello", "max_tokens": 2,
                "logit_bias": {"99999": 1}}),
            serde_json::json!({"id": 5, "prompt": "hello", "max_tokens": 0,
                "prompt_logprobs": 1}),
        ];
        let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        let (r, rows) = run(&text.join("\n"));
        assert!(format!("{:#}", r.unwrap_err()).contains("2 of 6 requests failed"));
        assert_eq!(
            rows[0]["text"],
            "A".repeat(12),
            "a bias of 30 wins every greedy choice"
        );
        assert!(rows[0].get("logprobs").is_none(), "not asked for");
        assert!(rows[0].get("prompt_logprobs").is_none(), "not asked for");
        // BOS, then "hello": five entries, one per byte token after BOS.
        let prompt = rows[1]["prompt_logprobs"].as_array().unwrap();
        let hello: Vec<u32> = b"hello".iter().map(|&b| 128 + u32::from(b)).collect();
        assert_eq!(prompt.len(), hello.len(), "{prompt:?}");
        for (e, t) in prompt.iter().zip(hello) {
            assert_eq!(e["token"], t);
            assert!(e["logprob"].as_f64().unwrap() <= 0.0);
            assert_eq!(e["top"].as_array().unwrap().len(), 1);
        }
        let tokens = rows[1]["tokens"].as_array().unwrap();
        let lps = rows[1]["logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), tokens.len());
        for (t, lp) in tokens.iter().zip(lps) {
            assert_eq!(&lp["token"], t);
            let top = lp["top"].as_array().unwrap();
            assert_eq!(top.len(), 2);
            assert_eq!(&top[0][0], t, "greedy takes the most likely token");
            assert_eq!(top[0][1], lp["logprob"]);
            assert!(lp["logprob"].as_f64().unwrap() <= 0.0);
        }
        // Each A costs it 2 more (and 2 once): the penalties end the run of A's.
        let penalized = rows[2]["text"].as_str().unwrap();
        assert!(
            penalized.starts_with('A') && penalized != "A".repeat(12),
            "{penalized:?}"
        );
        assert_eq!(rows[2]["finish_reason"], "length");
        assert_eq!(rows[2]["logprobs"].as_array().unwrap().len(), 12);
        assert!(rows[3]["error"].as_str().unwrap().contains("min_tokens"));
        assert!(rows[4]["error"].as_str().unwrap().contains("logit_bias"));
        // max_tokens 0 scores the prompt (the same entries) and generates nothing.
        assert_eq!(rows[5]["prompt_logprobs"], rows[1]["prompt_logprobs"]);
        assert_eq!(rows[5]["tokens"], serde_json::json!([]));
        assert_eq!(rows[5]["finish_reason"], "length");
        assert_eq!(rows[5]["usage"]["completion_tokens"], 0);
    }

    #[test]
    fn a_bad_batch_file_opens_no_output() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, "{\"id\": 1, \"prompt\": \"x\"}\nnot json\n").unwrap();
        let mut opened = false;
        let r = run_batch(
            tiny(),
            Tokenizer::tiny().unwrap(),
            &profile(),
            &path,
            5,
            || {
                opened = true;
                Ok(Vec::new())
            },
        );
        assert!(format!("{:#}", r.unwrap_err()).contains("line 2"));
        assert!(
            !opened,
            "an existing --output file would have been truncated"
        );
    }
}

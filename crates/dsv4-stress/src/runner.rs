//! [`run_stress`]: the concurrent phase (N sessions, C at a time, each up to K turns), then the
//! optional solo replay, then the report.

use crate::answer::{Answer, Outcome};
use crate::client::Client;
use crate::error::StressError;
use crate::metrics::Metrics;
use crate::options::{Api, Oracle, StreamMode, StressOptions};
use crate::progress::Progress;
use crate::report::{SessionRecord, StressReport, TurnRecord, zero_counts};
use crate::responses::responses_body;
use crate::signatures::{Expectation, Finding, Signature, classify_failure, detect};
use crate::workload::{SessionPlan, ToolChoice, append_answer, plan_session, tools_json};
use futures_util::StreamExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// One session of the concurrent phase: its record, and per turn the body sent and the answer.
struct SessionRun {
    record: SessionRecord,
    bodies: Vec<Value>,
    answers: Vec<Option<Answer>>,
}

/// Shared state of the concurrent phase.
struct Phase<'a> {
    opts: &'a StressOptions,
    client: &'a Client,
    model: &'a str,
    max_model_len: Option<u64>,
    deadline: Option<Instant>,
    progress: &'a Progress,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// Run the stress workload of `opts` against its server and return the report. Fails only when
/// the options are unusable, the server is not ready within `opts.ready_timeout` or cannot be
/// reached (`GET /v1/models`); failed requests
/// and corrupted answers are counted in the report.
pub async fn run_stress(opts: &StressOptions) -> Result<StressReport, StressError> {
    opts.validate()?;
    let client = Client::new(
        &opts.url,
        opts.api_key.clone(),
        opts.request_timeout,
        opts.ca_cert.as_deref(),
    )?;
    crate::ready::wait_ready(
        &opts.url,
        opts.ready_timeout,
        opts.progress,
        opts.ca_cert.as_deref(),
    )
    .await?;
    let server = client.identity(opts.model.as_deref()).await?;
    let progress = Progress::new(opts.progress, opts.sessions);
    let start = Instant::now();
    let phase = Phase {
        opts,
        client: &client,
        model: &server.model,
        max_model_len: server.max_model_len,
        deadline: opts.duration.map(|d| start + d),
        progress: &progress,
        in_flight: AtomicUsize::new(0),
        max_in_flight: AtomicUsize::new(0),
    };
    let mut runs: Vec<SessionRun> = futures_util::stream::iter(0..opts.sessions)
        .map(|i| run_session(&phase, plan_session(opts, i)))
        .buffer_unordered(opts.concurrency)
        .collect()
        .await;
    let duration = start.elapsed().as_secs_f64();
    runs.sort_by_key(|r| r.record.session);
    let max_concurrency = phase.max_in_flight.load(Ordering::Relaxed);

    let mut oracle_requests = 0;
    if opts.oracle == Some(Oracle::Solo) {
        oracle_requests = solo_replay(opts, &client, &mut runs, &progress).await;
    }
    progress.finish();

    let answers: Vec<&Answer> = runs
        .iter()
        .flat_map(|r| r.answers.iter().flatten())
        .collect();
    let metrics = Metrics::compute(answers.iter().copied(), duration, max_concurrency);
    let (mut completed, mut failed) = (0, 0);
    let mut signatures = zero_counts();
    let mut signature_sessions = zero_counts();
    let mut records = Vec::with_capacity(runs.len());
    for run in runs {
        let mut rec = run.record;
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for t in &rec.turns {
            if t.ok {
                completed += 1;
            } else {
                failed += 1;
            }
            for f in &t.findings {
                *counts.entry(f.signature.name().to_owned()).or_default() += 1;
            }
        }
        for (name, n) in &counts {
            *signatures.entry(name.clone()).or_default() += n;
            *signature_sessions.entry(name.clone()).or_default() += 1;
        }
        rec.failed = !counts.is_empty();
        rec.signatures = counts;
        records.push(rec);
    }
    Ok(StressReport {
        sessions: records.len(),
        failed_sessions: records.iter().filter(|r| r.failed).count(),
        completed,
        failed,
        signatures,
        signature_sessions,
        metrics,
        server,
        options: opts.clone(),
        oracle_requests,
        records,
    })
}

/// The request body of one turn.
fn request_body(phase: &Phase<'_>, plan: &SessionPlan, messages: &[Value], t: usize) -> Value {
    let opts = phase.opts;
    let turn = &plan.turns[t];
    let mut body = json!({
        "model": phase.model,
        "messages": messages,
        "tools": tools_json(&plan.tools, opts.strict_tools),
        "tool_choice": turn.tool_choice.to_json(),
        "parallel_tool_calls": opts.parallel_tool_calls,
        "max_tokens": opts.max_tokens,
        "temperature": opts.temperature,
        "seed": plan.seed >> 33,
        "stream": turn.stream,
    });
    if turn.stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    if opts.logprobs {
        body["logprobs"] = json!(true);
    }
    // A stop string could cut a forced (grammar-constrained) call, so forced turns get none.
    if !opts.stop.is_empty() && turn.tool_choice == ToolChoice::Auto {
        body["stop"] = json!(opts.stop);
    }
    match opts.api {
        Api::Chat => body,
        Api::Responses => responses_body(&body, false),
        Api::ResponsesBackground => responses_body(&body, true),
    }
}

/// Set `stream` (and, for chat, `stream_options`) of a body.
fn with_stream(api: Api, body: &Value, stream: bool) -> Value {
    let mut b = body.clone();
    b["stream"] = json!(stream);
    match b.as_object_mut() {
        _ if api.is_responses() => {}
        Some(o) if stream => {
            o.insert("stream_options".into(), json!({"include_usage": true}));
        }
        Some(o) => {
            o.remove("stream_options");
        }
        None => {}
    }
    b
}

fn sha256_hex(v: &Value) -> String {
    let d = Sha256::digest(v.to_string().as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Would the next request (prompt so far plus `new_bytes` of new messages and the answer
/// budget) exceed the context? Byte counts bound token counts from above for byte-level BPE.
fn over_context(phase: &Phase<'_>, prompt_so_far: u64, new_bytes: usize) -> bool {
    phase.max_model_len.is_some_and(|limit| {
        prompt_so_far + new_bytes as u64 + u64::from(phase.opts.max_tokens) > limit
    })
}

async fn run_session(phase: &Phase<'_>, plan: SessionPlan) -> SessionRun {
    let opts = phase.opts;
    let mut messages = vec![
        json!({"role": "system", "content": plan.system}),
        json!({"role": "user", "content": plan.turns[0].user_text}),
    ];
    let mut run = SessionRun {
        record: SessionRecord {
            session: plan.index,
            seed: plan.seed,
            failed: false,
            signatures: BTreeMap::new(),
            tools: plan.tools.iter().map(|t| t.name.clone()).collect(),
            ended: "turns".into(),
            turns: Vec::new(),
        },
        bodies: Vec::new(),
        answers: Vec::new(),
    };
    // Tokens of the last prompt plus its answer, and the message count they covered.
    let mut known: Option<(u64, usize)> = None;
    for t in 0..plan.turns.len() {
        if phase.deadline.is_some_and(|d| Instant::now() >= d) {
            run.record.ended = "deadline".into();
            break;
        }
        let turn = &plan.turns[t];
        if t > 0 && messages.last().is_some_and(|m| m["role"] == "assistant") {
            messages.push(json!({"role": "user", "content": turn.user_text}));
        }
        let (so_far, covered) = known.unwrap_or((0, 0));
        let new_bytes: usize = messages[covered..]
            .iter()
            .map(|m| m.to_string().len() + 16)
            .sum();
        let tools_bytes = if known.is_none() {
            tools_json(&plan.tools, phase.opts.strict_tools)
                .to_string()
                .len()
        } else {
            0
        };
        if over_context(phase, so_far, new_bytes + tools_bytes) {
            run.record.ended = "context".into();
            break;
        }
        let body = request_body(phase, &plan, &messages, t);
        let now = phase.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        phase.max_in_flight.fetch_max(now, Ordering::Relaxed);
        let outcome = phase.client.send(opts.api, &body).await;
        phase.in_flight.fetch_sub(1, Ordering::Relaxed);
        let expect = Expectation {
            tools: &plan.tools,
            required: turn.tool_choice == ToolChoice::Required,
            named: match &turn.tool_choice {
                ToolChoice::Named(n) => Some(n.as_str()),
                _ => None,
            },
            repeat_threshold: opts.repeat_threshold,
        };
        let mut record = turn_record(t, turn.stream, &turn.tool_choice, &body, &outcome);
        let stop = match &outcome {
            Ok(a) => {
                record.findings = detect(a, &expect);
                phase.progress.tokens(a.output_tokens());
                append_answer(&mut messages, a, opts.growth_chars);
                // The assistant message is covered by the answer's tokens; tool results after
                // it are new. Without usage, every message is counted in bytes.
                known = a
                    .prompt_tokens
                    .map(|p| (p + a.output_tokens(), messages.len() - a.tool_calls.len()));
                false
            }
            Err(f) if f.status == Some(400) && f.message.contains("context_length_exceeded") => {
                run.record.ended = "context".into();
                true
            }
            Err(f) => {
                record.findings = vec![classify_failure(f)];
                run.record.ended = "error".into();
                true
            }
        };
        run.bodies.push(body);
        run.answers.push(outcome.ok());
        run.record.turns.push(record);
        if stop {
            break;
        }
    }
    let failed = run.record.turns.iter().any(|t| !t.findings.is_empty());
    phase.progress.session_done(failed);
    run
}

fn turn_record(
    t: usize,
    stream: bool,
    choice: &ToolChoice,
    body: &Value,
    o: &Outcome,
) -> TurnRecord {
    let mut r = TurnRecord {
        turn: t,
        stream,
        tool_choice: choice.label(),
        messages: body["messages"]
            .as_array()
            .or(body["input"].as_array())
            .map_or(0, Vec::len),
        request_sha256: sha256_hex(body),
        ok: o.is_ok(),
        status: None,
        error: None,
        finish_reason: None,
        content: String::new(),
        tool_calls: Vec::new(),
        prompt_tokens: None,
        completion_tokens: None,
        logprobs: 0,
        resumed: 0,
        ttft_ms: None,
        e2el_ms: 0.0,
        findings: Vec::new(),
    };
    match o {
        Ok(a) => {
            r.finish_reason = a.finish_reason.clone();
            r.content = a.content.clone();
            r.tool_calls = a.tool_calls.clone();
            r.prompt_tokens = a.prompt_tokens;
            r.completion_tokens = Some(a.output_tokens());
            r.logprobs = a.logprobs.len();
            r.resumed = a.resumed;
            r.ttft_ms = a.ttft.map(|s| s * 1000.0);
            r.e2el_ms = a.e2el * 1000.0;
        }
        Err(f) => {
            r.status = f.status;
            r.error = Some(f.message.clone());
            r.e2el_ms = f.e2el * 1000.0;
        }
    }
    r
}

/// Replay every answered turn alone, in order, and add `solo_divergence` (and, in mixed stream
/// mode, `stream_mismatch`) findings. Returns the number of requests sent.
async fn solo_replay(
    opts: &StressOptions,
    client: &Client,
    runs: &mut [SessionRun],
    progress: &Progress,
) -> usize {
    let total: usize = runs
        .iter()
        .map(|r| r.answers.iter().flatten().count())
        .sum();
    progress.start_replay(total);
    let mut sent = 0;
    for run in runs.iter_mut() {
        for (t, answer) in run.answers.iter().enumerate() {
            let Some(answer) = answer else { continue };
            let body = &run.bodies[t];
            let findings = &mut run.record.turns[t].findings;
            sent += 1;
            let solo = client.send(opts.api, body).await;
            match &solo {
                Ok(s) => {
                    if let Some(d) = answer.difference(s) {
                        findings.push(Finding {
                            signature: Signature::SoloDivergence,
                            detail: format!("concurrent vs alone: {d}"),
                        });
                    }
                }
                Err(f) => findings.push(Finding {
                    signature: Signature::SoloDivergence,
                    detail: format!("the replay alone failed: {}", classify_failure(f).detail),
                }),
            }
            if opts.stream == StreamMode::Mixed
                && let Ok(s) = &solo
            {
                sent += 1;
                let other = client
                    .send(opts.api, &with_stream(opts.api, body, !answer.stream))
                    .await;
                let mode = |stream: bool| if stream { "streamed" } else { "not streamed" };
                let detail = match &other {
                    Ok(o) => s.difference(o),
                    Err(f) => Some(format!(
                        "the request failed: {}",
                        classify_failure(f).detail
                    )),
                };
                if let Some(d) = detail {
                    findings.push(Finding {
                        signature: Signature::StreamMismatch,
                        detail: format!(
                            "alone {} vs {}: {d}",
                            mode(answer.stream),
                            mode(!answer.stream)
                        ),
                    });
                }
            }
            progress.replayed();
        }
    }
    sent
}

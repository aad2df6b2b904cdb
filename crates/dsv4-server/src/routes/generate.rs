//! `POST /generate`: SGLang's native endpoint, what SGLang-based RL and evaluation clients call.
//! A text (BOS prepended unless it starts with it, as SGLang's tokenizer does for DeepSeek
//! models) or token ids, or a batch of them, each with `n` outputs; no chat template. The
//! answer is `{"text", "output_ids", "meta_info"}` per output (a list for a batch or `n` > 1),
//! streamed as server-sent events that each carry the output so far (SGLang's default), then
//! `data: [DONE]`. `output_ids` end with the token that ended the output, `finish_reason` says
//! which (`{"type": "stop", "matched": …}` or `{"type": "length", "length": N}`), and
//! `return_logprob` gives SGLang's `[logprob, id, text]` entries for the output and, from
//! `logprob_start_len`, the prompt, scored once per prompt.

use super::chat::structured_constraint;
use super::completions::prompt_ids;
use super::{
    EventSource, body_bytes, check_model, error_event, json_response, loaded_model, sse_response,
};
use super::{admission, request_priority};
use crate::api::common::{StopReason, check_n, parse_body, random_hex, random_u64, stop_strings};
use crate::api::completion::{MAX_PROMPTS, Prompt};
use crate::api::generate::{
    DEFAULT_MAX_NEW_TOKENS, GenerateFinish, GenerateOutput, GenerateRequest, GenerateSampling,
    LogprobEntry, MetaInfo, PerPrompt,
};
use crate::api::logprobs::{finite, token_string};
use crate::api::sampling::{check_fit, top_count};
use crate::api::structured::{self, Shape};
use crate::batch::BatchLine;
use crate::error::ApiError;
use crate::output::{Delta, OutputDecoder};
use crate::run::{Merged, SharedScoring, Step, all_queued, merge, start_choices};
use crate::state::{AppState, Loaded};
use crate::thinking_budget::request_budget;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use axum::response::sse::Event as SseEvent;
use dsv4_engine::{FinishReason, MAX_LOGPROB_TOKEN_IDS, Request, TokenLogprob};
use futures_util::StreamExt;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// The handler.
pub async fn generate(
    State(state): State<AppState>,
    line: Option<Extension<BatchLine>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let line = line.is_some();
    let mut req: GenerateRequest = parse_body(&body)?;
    if let Some(model) = &req.model {
        check_model(&state, model)?;
    }
    req.refuse_unsupported()?;
    req.priority = request_priority(&state, req.priority, line)?;
    req.admission = admission(&state, line);
    let (prompts, batch) = req.prompts()?;
    let specs = prepare(&state, &loaded, &req, prompts).await?;
    let stream = req.stream.unwrap_or(false);
    let names = req.return_text_in_logprobs.unwrap_or(false);
    let mut runs = Vec::new();
    let mut outs = Vec::new();
    for spec in specs {
        // A prompt's first output scores it; the others show its entries (a stream holds their
        // events back until it has them).
        let decoder = || {
            OutputDecoder::raw(&spec.stops)
                .with_min_tokens(spec.request.sampling.min_tokens)
                .with_stop_in_output(spec.keep_stop)
                .with_special_tokens_skipped(spec.skip_special)
        };
        // Output k of the prompt is `rid` or `rid-k`, as start_choices registers it.
        let rid = spec
            .rid
            .clone()
            .unwrap_or_else(|| random_hex(state.next_serial()));
        runs.extend(start_choices(
            &state,
            &loaded,
            spec.request.clone(),
            spec.n,
            &rid,
            decoder,
        )?);
        let first = outs.len();
        for k in 0..spec.n {
            outs.push(Out::new(&spec, &rid, k, first));
        }
    }
    all_queued(&mut runs).await?;
    let batch = batch || outs.len() > 1;
    let sharing = SharedScoring::new(
        outs.iter().map(|o| o.first).collect(),
        outs.iter().map(|o| o.input.is_some()).collect(),
    );
    let generation = Generation {
        runs: merge(runs),
        loaded,
        outs,
        sharing,
        text_in_logprobs: names,
        batch,
        done: false,
    };
    if stream {
        Ok(sse_response(generation))
    } else {
        generation.answer().await
    }
}

/// One prompt, checked: the engine request its `n` outputs start from and what its outputs
/// show.
struct Spec {
    request: Request,
    n: usize,
    rid: Option<String>,
    stops: Vec<String>,
    keep_stop: bool,
    skip_special: bool,
    /// With `return_logprob`: the alternatives per position.
    top: Option<usize>,
    /// With `return_logprob` and `logprob_start_len` ≥ 0: the first prompt position shown.
    input: Option<usize>,
    /// With `return_logprob` and `token_ids_logprob`: the tokens shown at every position.
    asked: Option<Vec<u32>>,
}

/// Check every prompt's options (per-prompt lists must have one value per prompt).
async fn prepare(
    state: &AppState,
    loaded: &Loaded,
    req: &GenerateRequest,
    prompts: Vec<Prompt>,
) -> Result<Vec<Spec>, ApiError> {
    let count = prompts.len();
    let sampling = spread(
        &req.sampling_params,
        count,
        "sampling_params",
        Default::default(),
    )?;
    let rids: Vec<Option<String>> = match &req.rid {
        None => vec![None; count],
        Some(v) => v.spread(count, "rid")?.into_iter().map(Some).collect(),
    };
    let logprob = spread(&req.return_logprob, count, "return_logprob", false)?;
    let starts = spread(&req.logprob_start_len, count, "logprob_start_len", -1)?;
    let tops = spread(&req.top_logprobs_num, count, "top_logprobs_num", 0)?;
    let asked_ids = match &req.token_ids_logprob {
        None => vec![None; count],
        Some(lists) => lists.spread(count)?,
    };
    let mut specs = Vec::with_capacity(count);
    // Each distinct structured output is compiled once (a batch usually shares one).
    let mut compiled: Vec<(Option<Shape>, Option<dsv4_engine::Constraint>)> = Vec::new();
    for (k, p) in prompts.into_iter().enumerate() {
        let field = match (&p, count) {
            (Prompt::Text(_), 1) => "text".to_string(),
            (Prompt::Tokens(_), 1) => "input_ids".to_string(),
            (Prompt::Text(_), _) => format!("text[{k}]"),
            (Prompt::Tokens(_), _) => format!("input_ids[{k}]"),
        };
        // Text gets BOS prepended unless it starts with it (SGLang's tokenizer adds it for
        // DeepSeek models); token ids are used as given.
        let (prompt, _) = prompt_ids(loaded, p, &field)?;
        let sp = &sampling[k];
        // The shared checks name the OpenAI fields; here they are SGLang's sampling_params.
        let named = |e: ApiError| match e.param.as_deref() {
            Some(p) if !p.starts_with("sampling_params") => {
                let p = match p {
                    "min_tokens" => "min_new_tokens",
                    "seed" => "sampling_seed",
                    p => p,
                };
                let p = format!("sampling_params.{p}");
                e.with_param(p)
            }
            _ => e,
        };
        let n = check_n(sp.n).map_err(named)?;
        let params = sp
            .fields()
            .to_params(random_u64(state.next_serial()))
            .map_err(named)?;
        let max_tokens = max_new_tokens(loaded, &prompt, sp.max_new_tokens, &field)?;
        check_fit(&params, loaded.vocab.len(), max_tokens).map_err(named)?;
        let top = logprob[k]
            .then(|| top_count("top_logprobs_num", tops[k]))
            .transpose()?;
        let input = match (top, starts[k]) {
            (None, _) | (_, -1) => None,
            (Some(_), s) if s >= 0 && (s as u64) < prompt.len() as u64 => Some(s as usize),
            (Some(_), s) => {
                return Err(ApiError::bad_param(
                    "logprob_start_len",
                    format!(
                        "logprob_start_len must be -1 (output only) or a prompt position from \
                         0 to {}, got {s}",
                        prompt.len() - 1
                    ),
                ));
            }
        };
        let asked = match (top, &asked_ids[k]) {
            (Some(_), Some(ids)) => Some(checked_ids(ids, loaded.vocab.len())?),
            _ => None,
        };
        let stops = stop_strings(sp.stop.clone()).map_err(named)?;
        let shape = shape_of(sp)?;
        let constraint = match compiled.iter().find(|(s, _)| *s == shape) {
            Some((_, c)) => c.clone(),
            None => {
                let c = structured_constraint(state, loaded, shape.as_ref()).await?;
                compiled.push((shape, c.clone()));
                c
            }
        };
        let budget = request_budget(
            (sp.thinking_budget, "sampling_params.thinking_budget"),
            state.cfg().thinking_token_budget,
            loaded.think_end.opens(&prompt),
            false,
        )?;
        let constraint = loaded
            .think_end
            .budgeted(budget.is_some(), budget, constraint);
        let request = Request {
            prompt,
            max_tokens,
            sampling: params,
            stop: stops.clone(),
            ignore_eos: sp.ignore_eos.unwrap_or(false),
            logprobs: top,
            prompt_logprobs: input.and(top),
            logprob_token_ids: asked.clone().unwrap_or_default(),
            constraint,
            priority: req.priority.unwrap_or(0),
            ..req.admission.request()
        };
        specs.push(Spec {
            request,
            n,
            rid: rids[k].clone(),
            stops,
            keep_stop: sp.no_stop_trim.unwrap_or(false),
            skip_special: sp.skip_special_tokens.unwrap_or(true),
            top,
            input,
            asked,
        });
    }
    let outputs: usize = specs.iter().map(|s| s.n).sum();
    if outputs > MAX_PROMPTS {
        return Err(ApiError::bad_param(
            "sampling_params.n",
            format!(
                "{count} prompts with their n make {outputs} outputs; at most {MAX_PROMPTS} per \
                 request"
            ),
        ));
    }
    Ok(specs)
}

/// `v` for each of `count` prompts, `default` when it is not given.
fn spread<T: Clone>(
    v: &Option<PerPrompt<T>>,
    count: usize,
    field: &str,
    default: T,
) -> Result<Vec<T>, ApiError> {
    match v {
        None => Ok(vec![default; count]),
        Some(v) => v.spread(count, field),
    }
}

/// `token_ids_logprob`'s ids for one prompt, checked: at most [`MAX_LOGPROB_TOKEN_IDS`], each
/// in the vocabulary of `vocab` tokens.
fn checked_ids(ids: &[u32], vocab: usize) -> Result<Vec<u32>, ApiError> {
    let bad = |m: String| Err(ApiError::bad_param("token_ids_logprob", m));
    if ids.len() > MAX_LOGPROB_TOKEN_IDS {
        return bad(format!(
            "token_ids_logprob lists {} token ids; at most {MAX_LOGPROB_TOKEN_IDS} are accepted",
            ids.len()
        ));
    }
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => bad(format!(
            "token_ids_logprob names token {t}, outside the vocabulary (ids 0 to {})",
            vocab - 1
        )),
        None => Ok(ids.to_vec()),
    }
}

/// `max_new_tokens` checked against the context (`field` names the prompt): unset, the
/// default 128 lowered to the room left; 0 only runs the prompt.
fn max_new_tokens(
    loaded: &Loaded,
    prompt: &[u32],
    asked: Option<u64>,
    field: &str,
) -> Result<usize, ApiError> {
    let context = loaded.context;
    if prompt.len() > context {
        return Err(ApiError::bad_param(
            field,
            format!(
                "the prompt is {} tokens but the model's context is {context} tokens",
                prompt.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let room = (context - prompt.len()) as u64;
    match asked {
        None => Ok(DEFAULT_MAX_NEW_TOKENS.min(room) as usize),
        Some(n) if n <= room => Ok(n as usize),
        Some(n) => Err(ApiError::bad_param(
            "sampling_params.max_new_tokens",
            format!(
                "the prompt ({} tokens) plus max_new_tokens ({n}) exceeds the model's context \
                 of {context} tokens; lower max_new_tokens to at most {room}",
                prompt.len()
            ),
        )
        .with_code("context_length_exceeded")),
    }
}

/// The structured output of `json_schema`, `regex`, `ebnf` or `structural_tag` (at most one).
fn shape_of(sp: &GenerateSampling) -> Result<Option<Shape>, ApiError> {
    let field = |k: &str| format!("sampling_params.{k}");
    let mut shapes = Vec::new();
    if let Some(v) = sp.json_schema.as_ref().filter(|v| !v.is_null()) {
        let f = field("json_schema");
        shapes.push(Shape::json(structured::schema(v, &f)?, &f));
    }
    if let Some(rx) = &sp.regex {
        shapes.push(structured::regex(rx, &field("regex"))?);
    }
    if let Some(g) = &sp.ebnf {
        shapes.push(structured::grammar(g, &field("ebnf"))?);
    }
    if let Some(v) = sp.structural_tag.as_ref().filter(|v| !v.is_null()) {
        shapes.push(structured::structural_value(v, &field("structural_tag"))?);
    }
    structured::one(shapes)
}

/// One output as it accumulates.
struct Out {
    id: String,
    /// The index of its prompt's first output (which scores the prompt for the others).
    first: usize,
    prompt: Vec<u32>,
    max_tokens: usize,
    top: Option<usize>,
    input: Option<usize>,
    asked: Option<Vec<u32>>,
    started: Instant,
    text: String,
    output_ids: Vec<u32>,
    generated: usize,
    /// The prompt's entries (entry k scores prompt token k + 1), once known.
    prompt_entries: Option<Vec<TokenLogprob>>,
    /// The output's tokens with their entries.
    tokens: Vec<(u32, TokenLogprob)>,
    finish: Option<GenerateFinish>,
    cached_tokens: Option<usize>,
}

impl Out {
    /// Output `k` of `spec` (whose outputs are `rid`, `rid-1`, …), whose first output is the
    /// request's output `first`.
    fn new(spec: &Spec, rid: &str, k: usize, first: usize) -> Self {
        let id = match k {
            0 => rid.to_string(),
            k => format!("{rid}-{k}"),
        };
        Self {
            id,
            first,
            prompt: spec.request.prompt.clone(),
            max_tokens: spec.request.max_tokens,
            top: spec.top,
            input: spec.input,
            asked: spec.asked.clone(),
            started: Instant::now(),
            text: String::new(),
            output_ids: Vec::new(),
            generated: 0,
            prompt_entries: None,
            tokens: Vec::new(),
            finish: None,
            cached_tokens: None,
        }
    }

    /// Take in a step of its run.
    fn absorb(&mut self, step: Step) {
        for d in step.deltas {
            if let Delta::Content(c) = d {
                self.text.push_str(&c);
            }
        }
        self.output_ids.extend(step.token_ids);
        self.generated = step.generated;
        if step.prompt_logprobs.is_some() {
            self.prompt_entries = step.prompt_logprobs;
        }
        self.tokens
            .extend(step.logprobs.into_iter().map(|t| (t.id, t.logprob)));
        if let Some(f) = step.finished {
            self.cached_tokens = Some(f.usage.cached_tokens);
            self.generated = f.usage.completion_tokens;
            self.finish = Some(match (f.reason, f.stop_token, step.stop_reason) {
                (FinishReason::Length, ..) => GenerateFinish::Length {
                    length: self.max_tokens,
                },
                (FinishReason::Cancelled, ..) => GenerateFinish::Abort {
                    message: "aborted by /abort_request".into(),
                },
                (_, Some(t), _) => GenerateFinish::Stop { matched: t.into() },
                (_, None, Some(StopReason::Text(s))) => GenerateFinish::Stop { matched: s.into() },
                (_, None, _) => GenerateFinish::Stop {
                    matched: Value::Null,
                },
            });
        }
    }

    /// The output so far as SGLang shows it; `text_in` puts token texts in the entries.
    fn body(&self, loaded: &Loaded, text_in: bool, index: Option<usize>) -> GenerateOutput {
        let entry = |lp: Option<f32>, id: u32| -> LogprobEntry {
            (
                lp.map(finite),
                id,
                text_in.then(|| token_string(&loaded.vocab, id)),
            )
        };
        let top_list = |e: &TokenLogprob, n: usize| -> Vec<LogprobEntry> {
            e.top
                .iter()
                .take(n)
                .map(|&(id, lp)| entry(Some(lp), id))
                .collect()
        };
        let asked_list = |e: &TokenLogprob, ids: &[u32]| -> Vec<LogprobEntry> {
            ids.iter()
                .zip(&e.asked)
                .map(|(&id, &lp)| entry(Some(lp), id))
                .collect()
        };
        let mut meta = MetaInfo {
            id: self.id.clone(),
            finish_reason: self.finish.clone(),
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.generated,
            cached_tokens: self.cached_tokens,
            e2e_latency: self
                .finish
                .as_ref()
                .map(|_| self.started.elapsed().as_secs_f64()),
            input_token_logprobs: None,
            output_token_logprobs: None,
            input_top_logprobs: None,
            output_top_logprobs: None,
            input_token_ids_logprobs: None,
            output_token_ids_logprobs: None,
        };
        if let Some(top) = self.top {
            meta.output_token_logprobs = Some(
                self.tokens
                    .iter()
                    .map(|(id, e)| entry(Some(e.logprob), *id))
                    .collect(),
            );
            if top > 0 {
                meta.output_top_logprobs =
                    Some(self.tokens.iter().map(|(_, e)| top_list(e, top)).collect());
            }
            if let Some(ids) = &self.asked {
                meta.output_token_ids_logprobs = Some(
                    self.tokens
                        .iter()
                        .map(|(_, e)| asked_list(e, ids))
                        .collect(),
                );
            }
            if let (Some(start), Some(entries)) = (self.input, &self.prompt_entries) {
                // Position p ≥ 1 is scored by entry p − 1; position 0 has nothing before it.
                let at = |p: usize| p.checked_sub(1).and_then(|k| entries.get(k));
                let positions = start..self.prompt.len();
                meta.input_token_logprobs = Some(
                    positions
                        .clone()
                        .map(|p| entry(at(p).map(|e| e.logprob), self.prompt[p]))
                        .collect(),
                );
                if top > 0 {
                    meta.input_top_logprobs = Some(
                        positions
                            .clone()
                            .map(|p| at(p).map(|e| top_list(e, top)))
                            .collect(),
                    );
                }
                if let Some(ids) = &self.asked {
                    meta.input_token_ids_logprobs = Some(
                        positions
                            .map(|p| at(p).map(|e| asked_list(e, ids)))
                            .collect(),
                    );
                }
            }
        }
        GenerateOutput {
            text: self.text.clone(),
            output_ids: self.output_ids.clone(),
            meta_info: meta,
            index,
        }
    }
}

/// A `/generate` request in flight, all its outputs.
struct Generation {
    runs: Merged,
    loaded: Arc<Loaded>,
    outs: Vec<Out>,
    /// A stream's events waiting for their prompt's scoring.
    sharing: SharedScoring,
    text_in_logprobs: bool,
    /// The answer is a list (a batch, or `n` > 1).
    batch: bool,
    done: bool,
}

impl Generation {
    /// Run every output to its end and answer (the first error fails the request).
    async fn answer(mut self) -> Result<Response, ApiError> {
        while let Some((i, step)) = self.runs.next().await {
            self.outs[i].absorb(step?);
        }
        // A prompt's first output scored it for the others.
        for i in 0..self.outs.len() {
            if self.outs[i].prompt_entries.is_none() {
                self.outs[i].prompt_entries = self.outs[self.outs[i].first].prompt_entries.clone();
            }
        }
        let bodies: Vec<GenerateOutput> = self
            .outs
            .iter()
            .map(|o| o.body(&self.loaded, self.text_in_logprobs, None))
            .collect();
        if self.batch {
            Ok(json_response(&bodies))
        } else {
            Ok(json_response(&bodies[0]))
        }
    }
}

impl EventSource for Generation {
    async fn next_events(&mut self) -> Vec<SseEvent> {
        let Some((i, step)) = self.runs.next().await else {
            self.done = true;
            return vec![SseEvent::default().data("[DONE]")];
        };
        match step {
            Ok(step) => {
                let ready = self.sharing.ready(i, step);
                ready
                    .into_iter()
                    .map(|(i, step)| {
                        self.outs[i].absorb(step);
                        let index = self.batch.then_some(i);
                        let body = self.outs[i].body(&self.loaded, self.text_in_logprobs, index);
                        SseEvent::default().data(serde_json::to_string(&body).unwrap_or_default())
                    })
                    .collect()
            }
            Err(e) => {
                self.done = true;
                vec![error_event(&e), SseEvent::default().data("[DONE]")]
            }
        }
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

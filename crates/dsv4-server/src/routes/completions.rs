//! `POST /v1/completions`: raw text completion of one or more prompts (text gets BOS prepended
//! unless it starts with it; token ids are used as given) in `n` choices each (prompt p's are
//! choices p·n …), answered as one `text_completion` object or a stream of them (the choices'
//! chunks interleaved). No chat
//! encoding and no DSML parsing. With `echo`, each choice's text starts with the prompt (a BOS
//! the server prepended is left out); with `logprobs` too, the prompt's tokens lead the
//! lists, the sequence's first token with null (what lm-evaluation-harness scores with). With
//! `echo`, `max_tokens: 0` runs the prompt and generates nothing: the choice is the prompt
//! (scored with `logprobs`), ending `length` (OpenAI's legacy API; vLLM). `prompt_logprobs`
//! (vLLM) adds each choice's `prompt_logprobs` list; a prompt's first choice scores it for all.

use super::chat::max_tokens;
use super::{
    EventSource, body_bytes, check_model, error_event, json_response, loaded_model, sse_response,
};
use crate::api::common::{
    UsageBody, check_n, parse_body, random_hex, random_u64, stop_strings, unix_now, unsupported,
};
use crate::api::completion::{
    Completion, CompletionChoice, CompletionRequest, DEFAULT_MAX_TOKENS, MAX_PROMPTS, Prompt,
};
use crate::api::logprobs::{CompletionLogprobs, PromptLogprobs, prompt_logprobs, truncated};
use crate::api::sampling::check_fit;
use crate::error::ApiError;
use crate::output::{Delta, OutputDecoder};
use crate::run::{GeneratedToken, Merged, finish_reason, merge, start_choices};
use crate::state::{AppState, Loaded};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use axum::response::sse::Event as SseEvent;
use dsv4_chat::markers;
use dsv4_engine::{Request, TokenLogprob, Usage};
use futures_util::StreamExt;
use std::sync::Arc;

/// The handler.
pub async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let req: CompletionRequest = parse_body(&body)?;
    check_model(&state, &req.model)?;
    let Prepared {
        prompts,
        stops,
        min_tokens,
        n,
        logprobs,
        prompt_logprobs,
    } = prepare(&state, &loaded, &req)?;
    // Prompt p's choices are p·n … p·n + n − 1; a prompt that cannot start drops (cancels)
    // the choices already started. A streamed echo with logprobs shows the prompt's entries in
    // every choice's first chunk, so each choice scores it; otherwise only a prompt's first
    // choice does and the others show its entries.
    let stream = req.stream.unwrap_or(false);
    let every = stream && logprobs.is_some() && req.echo.unwrap_or(false);
    let mut runs = Vec::with_capacity(prompts.len() * n);
    let mut echoes = Vec::new();
    let mut prompt_ids = Vec::new();
    let keep_stop = req.include_stop_str_in_output.unwrap_or(false);
    for (request, echo) in prompts {
        if prompt_logprobs.is_some() {
            prompt_ids.push(request.prompt.clone());
        }
        runs.extend(start_choices(&state, &loaded, request, n, every, || {
            OutputDecoder::raw(&stops)
                .with_min_tokens(min_tokens)
                .with_stop_in_output(keep_stop)
        })?);
        echoes.extend(echo);
    }
    let total = runs.len();
    let out = TextStream {
        runs: merge(runs),
        loaded,
        id: format!("cmpl-{}", random_hex(state.next_serial())),
        created: unix_now(),
        model: state.cfg().model_id.clone(),
        include_usage: req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        logprobs,
        prompt_logprobs,
        prompt_ids,
        n,
        echoes,
        echoed: vec![false; total],
        offsets: vec![0; total],
        usages: vec![None; total],
        done: false,
    };
    if stream {
        Ok(sse_response(out))
    } else {
        out.answer().await
    }
}

/// What a choice's text starts with under `echo`.
struct Echo {
    /// The prompt's tokens shown: all but a BOS the server prepended.
    tokens: Vec<u32>,
    /// Whether a BOS was prepended (so the first shown token has a log-probability).
    added_bos: bool,
    /// Their text (their bytes as lossy UTF-8).
    text: String,
}

/// A checked request: per prompt, the engine request its `n` choices start from and its echo
/// (with `echo`); the stop strings and `min_tokens` (for the output decoders); `n`; the
/// alternatives asked for with `logprobs` and with `prompt_logprobs`.
struct Prepared {
    prompts: Vec<(Request, Option<Echo>)>,
    stops: Vec<String>,
    min_tokens: usize,
    n: usize,
    logprobs: Option<usize>,
    prompt_logprobs: Option<usize>,
}

fn prepare(
    state: &AppState,
    loaded: &Loaded,
    req: &CompletionRequest,
) -> Result<Prepared, ApiError> {
    let n = check_n(req.n)?;
    unsupported("best_of", req.best_of, 1)?;
    if req.suffix.is_some() {
        unsupported("suffix", Some(true), false)?;
    }
    let logprobs = req.logprobs()?;
    let prompt_logprobs = req.prompt_logprobs()?;
    let prompts = req.prompts()?;
    if prompts.len() * n > MAX_PROMPTS {
        return Err(ApiError::bad_param(
            "n",
            format!(
                "{} prompts × n = {n} is {} choices; at most {MAX_PROMPTS} per request",
                prompts.len(),
                prompts.len() * n
            ),
        ));
    }
    let stop = stop_strings(req.stop.clone())?;
    let sampling = req.sampling().to_params(random_u64(state.next_serial()))?;
    let asked = Some(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    let one = prompts.len() == 1;
    let mut out = Vec::with_capacity(prompts.len());
    for (k, p) in prompts.into_iter().enumerate() {
        let field = if one {
            "prompt".to_string()
        } else {
            format!("prompt[{k}]")
        };
        let (prompt, added_bos) = prompt_ids(loaded, p, &field)?;
        let echo = req.echo.unwrap_or(false);
        let only_prompt = echo || prompt_logprobs.is_some();
        let max_tokens = max_tokens(loaded, &prompt, asked, &field, Some(only_prompt))?;
        check_fit(&sampling, loaded.vocab.len(), max_tokens)?;
        let echo = echo.then(|| Echo::new(loaded, &prompt, added_bos));
        // The engine scores the prompt once for both views, with the larger count.
        let scored = logprobs.filter(|_| echo.is_some()).max(prompt_logprobs);
        let request = Request {
            prompt,
            max_tokens,
            sampling: sampling.clone(),
            stop: stop.clone(),
            ignore_eos: req.ignore_eos.unwrap_or(false),
            logprobs,
            prompt_logprobs: scored,
            ..Default::default()
        };
        out.push((request, echo));
    }
    Ok(Prepared {
        prompts: out,
        stops: stop,
        min_tokens: sampling.min_tokens,
        n,
        logprobs,
        prompt_logprobs,
    })
}

/// The token ids of prompt `p` (from request field `field`), and whether BOS was prepended
/// (text that does not start with the BOS marker gets it; token ids are used as given).
fn prompt_ids(loaded: &Loaded, p: Prompt, field: &str) -> Result<(Vec<u32>, bool), ApiError> {
    match p {
        Prompt::Tokens(ids) if ids.is_empty() => {
            Err(ApiError::bad_param(field, "the prompt has no tokens"))
        }
        Prompt::Tokens(ids) => Ok((ids, false)),
        Prompt::Text(text) => {
            let mut ids = Vec::new();
            let add = !text.starts_with(markers::BOS);
            if add {
                ids.push(loaded.bos);
            }
            ids.extend(
                loaded
                    .tokenizer
                    .encode(&text)
                    .map_err(|e| ApiError::internal(format!("tokenizing the {field}: {e}")))?,
            );
            Ok((ids, add))
        }
    }
}

impl Echo {
    /// The echo of `prompt`, leaving out a BOS the server added.
    fn new(loaded: &Loaded, prompt: &[u32], added_bos: bool) -> Self {
        let tokens = prompt[usize::from(added_bos)..].to_vec();
        let bytes: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| loaded.vocab.bytes(t).iter().copied())
            .collect();
        Self {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            tokens,
            added_bos,
        }
    }
}

/// A text completion in flight, all its choices (streamed or not).
struct TextStream {
    runs: Merged,
    loaded: Arc<Loaded>,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// The alternatives asked for with `logprobs` (None: no log-probabilities).
    logprobs: Option<usize>,
    /// The alternatives asked for with `prompt_logprobs` (None: not asked for).
    prompt_logprobs: Option<usize>,
    /// With `prompt_logprobs`, each prompt's ids as run (BOS included); else empty.
    prompt_ids: Vec<Vec<u32>>,
    /// Choices per prompt.
    n: usize,
    /// With `echo`, each prompt's echo (choice c shows prompt c / n); else empty.
    echoes: Vec<Echo>,
    /// Per choice: whether its prompt was shown.
    echoed: Vec<bool>,
    /// Per choice: byte offset in its text of the next token's text (`text_offset`).
    offsets: Vec<usize>,
    /// Per choice: its usage once it has finished.
    usages: Vec<Option<Usage>>,
    done: bool,
}

/// The text of raw-mode deltas.
fn text_of(deltas: Vec<Delta>) -> String {
    deltas
        .into_iter()
        .filter_map(|d| match d {
            Delta::Content(c) => Some(c),
            _ => None,
        })
        .collect()
}

impl TextStream {
    /// Choice `index` with `text`; with logprobs asked, the lists of `tokens`. The choice's
    /// first piece starts with the echoed prompt, whose tokens' entries `prompt` holds (entry
    /// `k` scores the sequence's token `k + 1`).
    fn choice(
        &mut self,
        index: usize,
        mut text: String,
        tokens: &[GeneratedToken],
        prompt: Option<Vec<TokenLogprob>>,
        finish: Option<&'static str>,
    ) -> CompletionChoice {
        let vocab = &self.loaded.vocab;
        let offset = &mut self.offsets[index];
        let mut logprobs = self.logprobs.map(|_| CompletionLogprobs::default());
        if let Some(e) = self
            .echoes
            .get(index / self.n)
            .filter(|_| !self.echoed[index])
        {
            self.echoed[index] = true;
            text.insert_str(0, &e.text);
            if let (Some(lp), Some(top)) = (logprobs.as_mut(), self.logprobs) {
                let entries = truncated(&prompt.unwrap_or_default(), top);
                for (j, &id) in e.tokens.iter().enumerate() {
                    let entry = (j + usize::from(e.added_bos))
                        .checked_sub(1)
                        .and_then(|k| entries.get(k));
                    lp.push(vocab, id, vocab.bytes(id).len(), entry, offset);
                }
            }
        }
        if let Some(lp) = logprobs.as_mut() {
            lp.extend(CompletionLogprobs::new(vocab, tokens, offset));
        }
        CompletionChoice {
            index,
            text,
            finish_reason: finish,
            logprobs,
            prompt_logprobs: None,
        }
    }

    /// A completion object with `choices`.
    fn object(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Option<UsageBody>>,
    ) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    /// The usage of all choices (once all have finished): each prompt counted once, the
    /// generated tokens of every choice.
    fn usage(&self) -> UsageBody {
        let per_prompt = self.usages.chunks(self.n).map(|c| {
            let usages: Vec<Usage> = c.iter().flatten().copied().collect();
            UsageBody::total(&usages)
        });
        UsageBody::sum(per_prompt)
    }

    fn event(body: &Completion) -> SseEvent {
        SseEvent::default().data(serde_json::to_string(body).unwrap_or_default())
    }

    /// Run every choice to its end and answer one completion (the first error fails it all).
    async fn answer(mut self) -> Result<Response, ApiError> {
        let n = self.usages.len();
        let mut texts = vec![String::new(); n];
        let mut tokens: Vec<Vec<GeneratedToken>> = vec![Vec::new(); n];
        let mut reasons = vec![None; n];
        let mut prompts: Vec<Option<Vec<TokenLogprob>>> = vec![None; n];
        while let Some((i, step)) = self.runs.next().await {
            let step = step?;
            texts[i].push_str(&text_of(step.deltas));
            tokens[i].extend(step.logprobs);
            if step.prompt_logprobs.is_some() {
                prompts[i] = step.prompt_logprobs;
            }
            if let Some(f) = step.finished {
                reasons[i] = Some(finish_reason(f.reason, false));
                self.usages[i] = Some(f.usage);
            }
        }
        // Each prompt's first choice scored it (every choice, when streamed).
        for i in 0..prompts.len() {
            if prompts[i].is_none() {
                prompts[i] = prompts[i - i % self.n].clone();
            }
        }
        let scored: Vec<Option<PromptLogprobs>> = match self.prompt_logprobs {
            Some(top) => self
                .prompt_ids
                .iter()
                .zip(prompts.iter().step_by(self.n))
                .map(|(ids, entries)| {
                    let entries = entries.as_deref().unwrap_or_default();
                    Some(prompt_logprobs(&self.loaded.vocab, ids, entries, top))
                })
                .collect(),
            None => Vec::new(),
        };
        let choices = texts
            .into_iter()
            .zip(tokens)
            .zip(prompts)
            .zip(reasons)
            .enumerate()
            .map(|(i, (((text, tokens), prompt), reason))| {
                let mut c = self.choice(i, text, &tokens, prompt, reason);
                c.prompt_logprobs = scored.get(i / self.n).cloned().flatten();
                c
            })
            .collect();
        let usage = self.usage();
        Ok(json_response(&self.object(choices, Some(Some(usage)))))
    }
}

impl EventSource for TextStream {
    async fn next_events(&mut self) -> Vec<SseEvent> {
        let usage = self.include_usage.then_some(None);
        let Some((i, step)) = self.runs.next().await else {
            self.done = true;
            let mut out = Vec::new();
            if self.include_usage {
                let last = self.object(Vec::new(), Some(Some(self.usage())));
                out.push(Self::event(&last));
            }
            out.push(SseEvent::default().data("[DONE]"));
            return out;
        };
        let step = match step {
            Ok(step) => step,
            Err(e) => {
                self.done = true;
                return vec![error_event(&e), SseEvent::default().data("[DONE]")];
            }
        };
        let reason = step.finished.map(|f| {
            self.usages[i] = Some(f.usage);
            finish_reason(f.reason, false)
        });
        let choice = self.choice(
            i,
            text_of(step.deltas),
            &step.logprobs,
            step.prompt_logprobs,
            reason,
        );
        vec![Self::event(&self.object(vec![choice], usage))]
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

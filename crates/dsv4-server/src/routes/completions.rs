//! `POST /v1/completions`: raw text completion of one prompt (text gets BOS prepended unless
//! it starts with it; token ids are used as given) in `n` choices, answered as one
//! `text_completion` object or a stream of them (the choices' chunks interleaved). No chat
//! encoding and no DSML parsing.

use super::chat::max_tokens;
use super::{EventSource, body_bytes, check_model, error_event, json_response, sse_response};
use crate::api::common::{
    UsageBody, check_n, parse_body, random_hex, random_u64, stop_strings, unix_now, unsupported,
};
use crate::api::completion::{
    Completion, CompletionChoice, CompletionRequest, DEFAULT_MAX_TOKENS, Prompt,
};
use crate::api::logprobs::CompletionLogprobs;
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
use dsv4_engine::{Request, Usage};
use futures_util::StreamExt;
use std::sync::Arc;

/// The handler.
pub async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = state
        .loaded()
        .ok_or_else(|| ApiError::unavailable("the model is still loading; retry shortly"))?;
    let req: CompletionRequest = parse_body(&body)?;
    check_model(&state, &req.model)?;
    let (request, stops, n) = prepare(&state, &loaded, &req)?;
    let logprobs = request.logprobs.is_some();
    let runs = start_choices(&state, &loaded, request, n, || OutputDecoder::raw(&stops))?;
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
        offsets: vec![0; n],
        usages: vec![None; n],
        done: false,
    };
    if req.stream.unwrap_or(false) {
        Ok(sse_response(out))
    } else {
        out.answer().await
    }
}

/// The engine request every choice starts from, the stop strings and the number of choices.
fn prepare(
    state: &AppState,
    loaded: &Loaded,
    req: &CompletionRequest,
) -> Result<(Request, Vec<String>, usize), ApiError> {
    let n = check_n(req.n)?;
    unsupported("echo", req.echo, false)?;
    unsupported("best_of", req.best_of, 1)?;
    if req.suffix.is_some() {
        unsupported("suffix", Some(true), false)?;
    }
    let logprobs = req.logprobs()?;
    let prompt = match req.prompt()? {
        Prompt::Tokens(ids) if ids.is_empty() => {
            return Err(ApiError::bad_param("prompt", "the prompt has no tokens"));
        }
        Prompt::Tokens(ids) => ids,
        Prompt::Text(text) => {
            let mut ids = Vec::new();
            if !text.starts_with(markers::BOS) {
                ids.push(loaded.bos);
            }
            ids.extend(
                loaded
                    .tokenizer
                    .encode(&text)
                    .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}")))?,
            );
            ids
        }
    };
    let asked = Some(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    let max_tokens = max_tokens(loaded, &prompt, asked, "prompt")?;
    let stop = stop_strings(req.stop.clone())?;
    let sampling = req.sampling().to_params(random_u64(state.next_serial()))?;
    check_fit(&sampling, loaded.vocab.len(), max_tokens)?;
    Ok((
        Request {
            prompt,
            max_tokens,
            sampling,
            stop: stop.clone(),
            ignore_eos: req.ignore_eos.unwrap_or(false),
            logprobs,
            ..Default::default()
        },
        stop,
        n,
    ))
}

/// A text completion in flight, all its choices (streamed or not).
struct TextStream {
    runs: Merged,
    loaded: Arc<Loaded>,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
    /// Per choice: byte offset in its completion of the next token's text (`text_offset`).
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
    /// Choice `index` with `text`; with logprobs asked, the lists of `tokens`.
    fn choice(
        &mut self,
        index: usize,
        text: String,
        tokens: &[GeneratedToken],
        finish: Option<&'static str>,
    ) -> CompletionChoice {
        let logprobs = self
            .logprobs
            .then(|| CompletionLogprobs::new(&self.loaded.vocab, tokens, &mut self.offsets[index]));
        CompletionChoice {
            index,
            text,
            finish_reason: finish,
            logprobs,
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

    /// The usage of all choices (once all have finished).
    fn usage(&self) -> UsageBody {
        let usages: Vec<Usage> = self.usages.iter().flatten().copied().collect();
        UsageBody::total(&usages)
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
        while let Some((i, step)) = self.runs.next().await {
            let step = step?;
            texts[i].push_str(&text_of(step.deltas));
            tokens[i].extend(step.logprobs);
            if let Some(f) = step.finished {
                reasons[i] = Some(finish_reason(f.reason, false));
                self.usages[i] = Some(f.usage);
            }
        }
        let choices = texts
            .into_iter()
            .zip(tokens)
            .zip(reasons)
            .enumerate()
            .map(|(i, ((text, tokens), reason))| self.choice(i, text, &tokens, reason))
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
        let choice = self.choice(i, text_of(step.deltas), &step.logprobs, reason);
        vec![Self::event(&self.object(vec![choice], usage))]
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

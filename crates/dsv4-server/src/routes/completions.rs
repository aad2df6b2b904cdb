//! `POST /v1/completions`: raw text completion of one prompt (text gets BOS prepended unless
//! it starts with it; token ids are used as given), answered as one `text_completion` object or
//! a stream of them. No chat encoding and no DSML parsing.

use super::chat::max_tokens;
use super::{EventSource, body_bytes, check_model, error_event, json_response, sse_response};
use crate::api::common::{
    UsageBody, check_n, parse_body, random_hex, stop_strings, unix_now, unsupported,
};
use crate::api::completion::{
    Completion, CompletionChoice, CompletionRequest, DEFAULT_MAX_TOKENS, Prompt,
};
use crate::api::logprobs::CompletionLogprobs;
use crate::api::sampling::check_fit;
use crate::error::ApiError;
use crate::output::{Delta, OutputDecoder};
use crate::run::{GeneratedToken, Run, finish_reason};
use crate::state::{AppState, Loaded};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use axum::response::sse::Event as SseEvent;
use dsv4_chat::markers;
use dsv4_engine::Request;

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
    let (request, stops) = prepare(&state, &loaded, &req)?;
    let logprobs = request.logprobs.is_some();
    let run = Run::start(&state, &loaded, request, OutputDecoder::raw(&stops))?;
    let out = TextStream {
        run,
        id: format!("cmpl-{}", random_hex(state.next_serial())),
        created: unix_now(),
        model: state.cfg().model_id.clone(),
        include_usage: req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        stream: req.stream.unwrap_or(false),
        logprobs,
        offset: 0,
        done: false,
    };
    if out.stream {
        Ok(sse_response(out))
    } else {
        out.answer().await
    }
}

fn prepare(
    state: &AppState,
    loaded: &Loaded,
    req: &CompletionRequest,
) -> Result<(Request, Vec<String>), ApiError> {
    check_n(req.n)?;
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
    let sampling = req.sampling().to_params(state.next_serial())?;
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
    ))
}

/// A text completion in flight (streamed or not).
struct TextStream {
    run: Run,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    stream: bool,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
    /// Byte offset in the completion of the next token's text (`text_offset`).
    offset: usize,
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
    /// A completion object with `text`; with logprobs asked, the lists of `tokens`.
    fn object(
        &mut self,
        text: String,
        tokens: &[GeneratedToken],
        finish: Option<&'static str>,
        usage: Option<Option<UsageBody>>,
    ) -> Completion {
        let logprobs = self
            .logprobs
            .then(|| CompletionLogprobs::new(self.run.vocab(), tokens, &mut self.offset));
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: vec![CompletionChoice {
                index: 0,
                text,
                finish_reason: finish,
                logprobs,
            }],
            usage,
        }
    }

    fn event(body: &Completion) -> SseEvent {
        SseEvent::default().data(serde_json::to_string(body).unwrap_or_default())
    }

    async fn answer(mut self) -> Result<Response, ApiError> {
        let (mut text, mut tokens) = (String::new(), Vec::new());
        loop {
            let step = self.run.next().await?;
            text.push_str(&text_of(step.deltas));
            tokens.extend(step.logprobs);
            if let Some(f) = step.finished {
                let reason = Some(finish_reason(f.reason, false));
                let body = self.object(text, &tokens, reason, Some(Some(f.usage.into())));
                return Ok(json_response(&body));
            }
        }
    }
}

impl EventSource for TextStream {
    async fn next_events(&mut self) -> Vec<SseEvent> {
        let step = match self.run.next().await {
            Ok(step) => step,
            Err(e) => {
                self.done = true;
                return vec![error_event(&e), SseEvent::default().data("[DONE]")];
            }
        };
        let usage = self.include_usage.then_some(None);
        let text = text_of(step.deltas);
        let Some(f) = step.finished else {
            return vec![Self::event(&self.object(text, &step.logprobs, None, usage))];
        };
        self.done = true;
        let reason = Some(finish_reason(f.reason, false));
        let mut out = vec![Self::event(&self.object(
            text,
            &step.logprobs,
            reason,
            usage,
        ))];
        if self.include_usage {
            let mut last = self.object(String::new(), &[], None, Some(Some(f.usage.into())));
            last.choices.clear();
            out.push(Self::event(&last));
        }
        out.push(SseEvent::default().data("[DONE]"));
        out
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

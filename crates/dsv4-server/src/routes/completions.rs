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
//! `return_token_ids` (vLLM) adds each choice's prompt and answer ids, and every choice says its
//! `stop_reason`.

use super::chat::{max_tokens, structured_constraint};
use super::{
    EventSource, body_bytes, check_model, error_event, json_response, loaded_model, sse_response,
};
use super::{admission, request_priority};
use crate::api::common::{
    StopReason, StreamUsage, UsageBody, check_n, keep_stop_string, parse_body, random_hex,
    random_u64, stop_strings, truncate_prompt, unix_now, unsupported,
};
use crate::api::completion::{
    Completion, CompletionChoice, CompletionRequest, DEFAULT_MAX_TOKENS, MAX_PROMPTS, Prompt,
};
use crate::api::logprobs::{
    CompletionLogprobs, PromptLogprobs, TokenNames, prompt_logprobs, truncated,
};
use crate::api::sampling::{bad_words_ids, check_fit};
use crate::batch::BatchLine;
use crate::beam::{self, BeamParams};
use crate::error::ApiError;
use crate::output::{Delta, OutputDecoder};
use crate::run::{
    GeneratedToken, Merged, SharedScoring, Step, all_queued, finish_reason, merge, start_choices,
};
use crate::state::{AppState, Loaded};
use crate::thinking_budget::request_budget;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use axum::response::sse::Event as SseEvent;
use dsv4_chat::markers;
use dsv4_engine::{Request, TokenLogprob, Usage};
use futures_util::StreamExt;
use futures_util::future::try_join_all;
use std::sync::Arc;

/// The handler.
pub async fn completions(
    State(state): State<AppState>,
    line: Option<Extension<BatchLine>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let line = line.is_some();
    let mut req: CompletionRequest = parse_body(&body)?;
    req.priority = request_priority(&state, req.priority, line)?;
    req.admission = admission(&state, line);
    check_model(&state, &req.model)?;
    let Prepared {
        prompts,
        stops,
        min_tokens,
        n,
        logprobs,
        prompt_logprobs,
        beam,
    } = prepare(&state, &loaded, &req).await?;
    // Prompt p's choices are p·n … p·n + n − 1; a prompt that cannot start drops (cancels)
    // the choices already started. Only a prompt's first choice scores it; the others show its
    // entries (a stream holds their chunks back until it has them).
    let stream = req.stream.unwrap_or(false);
    let lists_echo = logprobs.is_some() && req.echo.unwrap_or(false);
    let mut runs = Vec::with_capacity(prompts.len() * n);
    let mut echoes = Vec::new();
    let mut prompt_ids = Vec::new();
    let keep_stop = keep_stop_string(req.include_stop_str_in_output, req.no_stop_trim)?;
    let skip_special = req.skip_special_tokens.unwrap_or(false);
    let id = format!("cmpl-{}", random_hex(state.next_serial()));
    let decoder = || {
        OutputDecoder::raw(&stops)
            .with_min_tokens(min_tokens)
            .with_stop_in_output(keep_stop)
            .with_special_tokens_skipped(skip_special)
    };
    if let Some(p) = beam {
        // Every prompt's search runs at once; its choices replay its best hypotheses.
        let searches = prompts
            .iter()
            .map(|(request, _)| beam::start_beams(&state, &loaded, request, p, &id, decoder));
        runs.extend(try_join_all(searches).await?.into_iter().flatten());
    }
    for (request, echo) in prompts {
        prompt_ids.push(request.prompt.clone());
        if beam.is_none() {
            runs.extend(start_choices(&state, &loaded, request, n, &id, decoder)?);
        }
        echoes.extend(echo);
    }
    all_queued(&mut runs).await?;
    let total = runs.len();
    let out = TextStream {
        runs: merge(runs),
        loaded,
        id,
        created: unix_now(),
        model: state.cfg().model_id.clone(),
        usage: StreamUsage::new(req.stream_options.as_ref())?,
        logprobs,
        names_as_ids: req.return_tokens_as_token_ids.unwrap_or(false),
        prompt_logprobs,
        return_token_ids: req.return_token_ids.unwrap_or(false),
        prompt_ids,
        n,
        echoes,
        started: vec![false; total],
        offsets: vec![0; total],
        usages: vec![None; total],
        sharing: SharedScoring::new(
            (0..total).map(|i| i - i % n).collect(),
            vec![lists_echo; total],
        ),
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
    /// With `use_beam_search`: the search (every prompt's request passed [`beam::check`]).
    beam: Option<BeamParams>,
}

async fn prepare(
    state: &AppState,
    loaded: &Loaded,
    req: &CompletionRequest,
) -> Result<Prepared, ApiError> {
    let n = check_n(req.n)?;
    unsupported("best_of", req.best_of, 1)?;
    unsupported("return_hidden_states", req.return_hidden_states, false)?;
    let beam = beam::params(req.use_beam_search, req.length_penalty, n)?;
    if req.suffix.is_some() {
        if req.echo == Some(true) {
            return Err(ApiError::bad_param(
                "echo",
                "`echo` would show the fill-in-the-middle markup of a prompt with `suffix`; \
                 send one of them",
            ));
        }
        if req.truncate_prompt_tokens.is_some() {
            return Err(ApiError::bad_param(
                "truncate_prompt_tokens",
                "`truncate_prompt_tokens` would cut the start of a fill-in-the-middle prompt; \
                 send it without `suffix`",
            ));
        }
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
    let mut sampling = req.sampling().to_params(random_u64(state.next_serial()))?;
    sampling.bad_words_ids = bad_words_ids(req.bad_words.as_ref(), &loaded.tokenizer)?;
    let constraint = structured_constraint(state, loaded, req.structured()?.as_ref()).await?;
    let asked = Some(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    let one = prompts.len() == 1;
    let mut out = Vec::with_capacity(prompts.len());
    for (k, p) in prompts.into_iter().enumerate() {
        let field = if one {
            "prompt".to_string()
        } else {
            format!("prompt[{k}]")
        };
        let p = match &req.suffix {
            Some(suffix) => fill_in_the_middle(loaded, p, suffix, &field)?,
            None => p,
        };
        let (mut prompt, added_bos) = prompt_ids(loaded, p, &field)?;
        // A truncated prompt no longer starts with the BOS the server added.
        let cut = truncate_prompt(&mut prompt, req.truncate_prompt_tokens, loaded.context)?;
        let added_bos = added_bos && !cut;
        let echo = req.echo.unwrap_or(false);
        let only_prompt = echo || prompt_logprobs.is_some();
        let max_tokens = max_tokens(
            loaded,
            &prompt,
            asked,
            (&field, "max_tokens"),
            Some(only_prompt),
        )?;
        check_fit(&sampling, loaded.vocab.len(), max_tokens)?;
        let budget = request_budget(
            (req.thinking_token_budget, "thinking_token_budget"),
            state.cfg().thinking_token_budget,
            loaded.think_end.opens(&prompt),
            beam.is_some(),
        )?;
        let constraint = loaded
            .think_end
            .budgeted(budget.is_some(), budget, constraint.clone());
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
            constraint,
            priority: req.priority.unwrap_or(0),
            ..req.admission.request()
        };
        if let Some(p) = &beam {
            beam::check(&request, p)?;
        }
        out.push((request, echo));
    }
    Ok(Prepared {
        prompts: out,
        stops: stop,
        min_tokens: sampling.min_tokens,
        n,
        logprobs,
        prompt_logprobs,
        beam,
    })
}

/// Prompt `p` (from request field `field`) as the text before the hole and `suffix` as the
/// text after it, in DeepSeek's fill-in-the-middle prompt: BOS, `<｜fim▁begin｜>`, the text,
/// `<｜fim▁hole｜>`, the suffix, `<｜fim▁end｜>` (the format of DeepSeek's FIM completion, which
/// DeepSeek-Coder and V3 document; the tokenizer must have the three tokens).
fn fill_in_the_middle(
    loaded: &Loaded,
    p: Prompt,
    suffix: &str,
    field: &str,
) -> Result<Prompt, ApiError> {
    let Prompt::Text(text) = p else {
        return Err(ApiError::bad_param(
            field,
            "`suffix` needs text prompts (the text before the hole), not token ids",
        ));
    };
    let markers = [markers::FIM_BEGIN, markers::FIM_HOLE, markers::FIM_END];
    if let Some(m) = markers
        .into_iter()
        .find(|m| loaded.tokenizer.token_id(m).is_none())
    {
        return Err(ApiError::bad_param(
            "suffix",
            format!("this model's tokenizer has no {m} token, so it cannot fill in the middle"),
        ));
    }
    let before = text.strip_prefix(markers::BOS).unwrap_or(&text);
    Ok(Prompt::Text(format!(
        "{}{}{before}{}{suffix}{}",
        markers::BOS,
        markers::FIM_BEGIN,
        markers::FIM_HOLE,
        markers::FIM_END
    )))
}

/// The token ids of prompt `p` (from request field `field`), and whether BOS was prepended
/// (text that does not start with the BOS marker gets it; token ids are used as given).
/// `/generate` tokenizes the same way.
pub(super) fn prompt_ids(
    loaded: &Loaded,
    p: Prompt,
    field: &str,
) -> Result<(Vec<u32>, bool), ApiError> {
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
    /// The usage a stream reports.
    usage: StreamUsage,
    /// The alternatives asked for with `logprobs` (None: no log-probabilities).
    logprobs: Option<usize>,
    /// `return_tokens_as_token_ids`.
    names_as_ids: bool,
    /// The alternatives asked for with `prompt_logprobs` (None: not asked for).
    prompt_logprobs: Option<usize>,
    /// `return_token_ids`.
    return_token_ids: bool,
    /// Each prompt's ids as run (BOS included).
    prompt_ids: Vec<Vec<u32>>,
    /// Choices per prompt.
    n: usize,
    /// With `echo`, each prompt's echo (choice c shows prompt c / n); else empty.
    echoes: Vec<Echo>,
    /// Per choice: whether its first piece was made (it carries the echo and the prompt's
    /// ids).
    started: Vec<bool>,
    /// Per choice: byte offset in its text of the next token's text (`text_offset`).
    offsets: Vec<usize>,
    /// Per choice: its usage once it has finished.
    usages: Vec<Option<Usage>>,
    /// A stream's chunks waiting for their prompt's scoring.
    sharing: SharedScoring,
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

/// One piece of a choice: all of it, or what a stream chunk carries.
struct Piece {
    text: String,
    /// The tokens with log-probabilities (with `logprobs`).
    tokens: Vec<GeneratedToken>,
    /// With an echo and `logprobs`, the prompt's entries (entry `k` scores the sequence's
    /// token `k + 1`).
    prompt: Option<Vec<TokenLogprob>>,
    /// The tokens' ids.
    token_ids: Vec<u32>,
    /// On the choice's last piece: its finish reason and stop reason.
    finish: Option<(&'static str, Option<StopReason>)>,
}

impl TextStream {
    /// Choice `index` made of `piece`. The choice's first piece starts with the echoed prompt
    /// (and its entries, with logprobs asked) and carries the prompt's ids (with
    /// `return_token_ids`).
    fn choice(&mut self, index: usize, piece: Piece) -> CompletionChoice {
        let Piece {
            mut text,
            tokens,
            prompt,
            token_ids,
            finish,
        } = piece;
        let names = TokenNames {
            vocab: &self.loaded.vocab,
            as_ids: self.names_as_ids,
        };
        let offset = &mut self.offsets[index];
        let mut logprobs = self.logprobs.map(|_| CompletionLogprobs::default());
        let first = !std::mem::replace(&mut self.started[index], true);
        if let Some(e) = self.echoes.get(index / self.n).filter(|_| first) {
            text.insert_str(0, &e.text);
            if let (Some(lp), Some(top)) = (logprobs.as_mut(), self.logprobs) {
                let entries = truncated(&prompt.unwrap_or_default(), top);
                for (j, &id) in e.tokens.iter().enumerate() {
                    let entry = (j + usize::from(e.added_bos))
                        .checked_sub(1)
                        .and_then(|k| entries.get(k));
                    lp.push(names, id, names.vocab.bytes(id).len(), entry, offset);
                }
            }
        }
        if let Some(lp) = logprobs.as_mut() {
            lp.extend(CompletionLogprobs::new(names, &tokens, offset));
        }
        let ids = self.return_token_ids;
        CompletionChoice {
            index,
            text,
            finish_reason: finish.as_ref().map(|f| f.0),
            logprobs,
            prompt_logprobs: None,
            stop_reason: finish.map(|f| f.1),
            prompt_token_ids: (ids && first).then(|| self.prompt_ids[index / self.n].clone()),
            token_ids: ids.then_some(token_ids),
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
        let mut pieces: Vec<Piece> = (0..n)
            .map(|_| Piece {
                text: String::new(),
                tokens: Vec::new(),
                prompt: None,
                token_ids: Vec::new(),
                finish: None,
            })
            .collect();
        while let Some((i, step)) = self.runs.next().await {
            let step = step?;
            let p = &mut pieces[i];
            p.text.push_str(&text_of(step.deltas));
            p.tokens.extend(step.logprobs);
            p.token_ids.extend(step.token_ids);
            if step.prompt_logprobs.is_some() {
                p.prompt = step.prompt_logprobs;
            }
            if let Some(f) = step.finished {
                p.finish = Some((finish_reason(f.reason, false), step.stop_reason));
                self.usages[i] = Some(f.usage);
            }
        }
        // Each prompt's first choice scored it.
        for i in 0..n {
            if pieces[i].prompt.is_none() {
                pieces[i].prompt = pieces[i - i % self.n].prompt.clone();
            }
        }
        let scored: Vec<Option<PromptLogprobs>> = match self.prompt_logprobs {
            Some(top) => self
                .prompt_ids
                .iter()
                .zip(pieces.iter().step_by(self.n))
                .map(|(ids, p)| {
                    let entries = p.prompt.as_deref().unwrap_or_default();
                    Some(prompt_logprobs(&self.loaded.vocab, ids, entries, top))
                })
                .collect(),
            None => Vec::new(),
        };
        let choices = pieces
            .into_iter()
            .enumerate()
            .map(|(i, piece)| {
                let mut c = self.choice(i, piece);
                c.prompt_logprobs = scored.get(i / self.n).cloned().flatten();
                // A whole answer always says its stop reason (null when there is none).
                c.stop_reason = Some(c.stop_reason.flatten());
                c
            })
            .collect();
        let usage = self.usage();
        Ok(json_response(&self.object(choices, Some(Some(usage)))))
    }
}

impl EventSource for TextStream {
    async fn next_events(&mut self) -> Vec<SseEvent> {
        let Some((i, step)) = self.runs.next().await else {
            self.done = true;
            let mut out = Vec::new();
            if self.usage.last {
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
        let ready = self.sharing.ready(i, step);
        ready
            .into_iter()
            .map(|(i, step)| self.chunk_event(i, step))
            .collect()
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

impl TextStream {
    /// The chunk of choice `i`'s `step`.
    fn chunk_event(&mut self, i: usize, step: Step) -> SseEvent {
        let prompt_tokens = self.prompt_ids[i / self.n].len();
        let usage = match &step.finished {
            _ if !self.usage.last => None,
            _ if !self.usage.every => Some(None),
            Some(f) => Some(Some(UsageBody::from(f.usage))),
            None => Some(Some(UsageBody::so_far(prompt_tokens, step.generated))),
        };
        let finish = step.finished.map(|f| {
            self.usages[i] = Some(f.usage);
            (finish_reason(f.reason, false), step.stop_reason)
        });
        let piece = Piece {
            text: text_of(step.deltas),
            tokens: step.logprobs,
            prompt: step.prompt_logprobs,
            token_ids: step.token_ids,
            finish,
        };
        let choice = self.choice(i, piece);
        Self::event(&self.object(vec![choice], usage))
    }
}

//! `POST /v1/chat/completions`: check the request, encode the DSV4 prompt (`chat_prompt.rs`:
//! tools in the system prompt, thinking or chat mode), build the grammar constraint for
//! `tool_choice` required/named or `response_format`, run its `n` choices, and answer one JSON
//! object or a stream of server-sent `chat.completion.chunk` events ([`super::chat_stream`]).
//! Each choice is parsed by its own strict DSML parser; an answer that breaks the grammar is an
//! error, never content.

use super::chat_prompt::{ChatPrompt, chat_prompt};
use super::chat_stream::ChatStream;
use super::{admission, request_priority};
use super::{body_bytes, check_model, json_response, loaded_model, sse_response};
use crate::api::chat::{
    AssistantBody, ChatCompletion, ChatRequest, ChoiceBody, FunctionBody, ToolCallBody, ToolChoice,
};
use crate::api::common::{
    StopReason, StreamUsage, UsageBody, check_n, keep_stop_string, parse_body, random_hex,
    random_u64, stop_strings, unix_now, unsupported,
};
use crate::api::logprobs::{ChatLogprobs, TokenNames, prompt_logprobs};
use crate::api::sampling::{bad_words_ids, check_fit};
use crate::api::structured::Shape;
use crate::batch::BatchLine;
use crate::beam;
use crate::config::OutputParsing;
use crate::error::ApiError;
use crate::grammar::Target;
use crate::output::{Delta, OutputDecoder};
use crate::run::{
    GeneratedToken, Merged, all_queued, finish_reason, fit_max_tokens, merge, start_choices,
};
use crate::state::{AppState, Loaded};
use crate::thinking_budget::{ReasoningCount, reasoning_total, request_budget};
use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use dsv4_chat::{ParserOptions, ToolSet};
use dsv4_engine::Request;
use futures_util::StreamExt;
use std::sync::Arc;

/// The handler.
pub async fn chat_completions(
    State(state): State<AppState>,
    line: Option<Extension<BatchLine>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let loaded = loaded_model(&state)?;
    let line = line.is_some();
    let mut req: ChatRequest = parse_body(&body)?;
    req.priority = request_priority(&state, req.priority, line)?;
    req.admission = admission(&state, line);
    check_model(&state, &req.model)?;
    let prepared = prepare(&state, &loaded, &req, &body).await?;
    let meta = Meta {
        id: format!("chatcmpl-{}", random_hex(state.next_serial())),
        created: unix_now(),
        model: state.cfg().model_id.clone(),
        thinking: prepared.decoder.thinking,
        logprobs: prepared.request.logprobs.is_some(),
        names_as_ids: req.return_tokens_as_token_ids.unwrap_or(false),
        prompt_tokens: prepared.request.prompt.len(),
        prompt_ids: req
            .return_token_ids
            .unwrap_or(false)
            .then(|| prepared.request.prompt.clone()),
        stream_reasoning: req.stream_reasoning.unwrap_or(true),
    };
    // `prompt_logprobs`: the prompt as run and the alternatives asked for.
    let scored = prepared
        .request
        .prompt_logprobs
        .map(|top| (prepared.request.prompt.clone(), top));
    let Prepared {
        request,
        decoder,
        n,
    } = prepared;
    let usage = StreamUsage::new(req.stream_options.as_ref())?;
    let mut runs = match beam::params(req.use_beam_search, req.length_penalty, n)? {
        Some(p) => {
            beam::check(&request, &p)?;
            beam::start_beams(&state, &loaded, &request, p, &meta.id, || decoder.build()).await?
        }
        None => start_choices(&state, &loaded, request, n, &meta.id, || decoder.build())?,
    };
    all_queued(&mut runs).await?;
    let runs = merge(runs);
    if req.stream.unwrap_or(false) {
        Ok(sse_response(ChatStream::new(
            state, loaded, runs, n, meta, usage,
        )))
    } else {
        answer(&state, &loaded, runs, n, meta, scored).await
    }
}

/// A checked request, ready to run.
struct Prepared {
    /// The engine request every choice starts from.
    request: Request,
    decoder: DecoderSpec,
    /// The number of choices.
    n: usize,
}

/// What each choice's own output decoder is made from.
pub(super) struct DecoderSpec {
    pub(super) parsing: OutputParsing,
    /// Thinking mode.
    pub(super) thinking: bool,
    /// The tools whose calls the parser accepts.
    pub(super) tools: Arc<ToolSet>,
    pub(super) stop: Vec<String>,
    pub(super) min_tokens: usize,
    /// `include_stop_str_in_output`.
    pub(super) keep_stop: bool,
    /// A structured output (grammar-decided) is the content: taken as written.
    pub(super) verbatim_content: bool,
    /// `skip_special_tokens` on a raw answer.
    pub(super) skip_special: bool,
    /// A streamed answer sends each tool call's arguments as the model writes them.
    pub(super) stream_arguments: bool,
}

impl DecoderSpec {
    /// The decoder of an answer on the Responses or Messages API: the server's parsing, the
    /// tools `choice` lets it call (none for `none`), `stop`, and none of chat's extra output
    /// options; a `structured` answer's content is taken as written.
    pub(super) fn plain(
        state: &AppState,
        thinking: bool,
        (choice, tools): (&ToolChoice, Arc<ToolSet>),
        stop: &[String],
        structured: bool,
    ) -> Self {
        DecoderSpec {
            parsing: state.cfg().output,
            thinking,
            tools: if *choice == ToolChoice::None {
                Arc::new(ToolSet::default())
            } else {
                tools
            },
            stop: stop.to_vec(),
            min_tokens: 0,
            keep_stop: false,
            verbatim_content: structured,
            skip_special: false,
            stream_arguments: false,
        }
    }

    /// The same decoder sending tool calls' arguments as they are written when `on` (a
    /// streamed answer).
    pub(super) fn with_streamed_arguments(self, on: bool) -> Self {
        Self {
            stream_arguments: on,
            ..self
        }
    }

    /// A fresh decoder (one per choice: each has its own parser state).
    pub(super) fn build(&self) -> OutputDecoder {
        OutputDecoder::chat(
            self.parsing,
            ParserOptions {
                thinking: self.thinking,
                tools: Some(Arc::clone(&self.tools)),
                verbatim_content: self.verbatim_content,
                stream_arguments: self.stream_arguments,
            },
            &self.stop,
        )
        .with_min_tokens(self.min_tokens)
        .with_stop_in_output(self.keep_stop)
        .with_special_tokens_skipped(self.skip_special)
    }
}

async fn prepare(
    state: &AppState,
    loaded: &Loaded,
    req: &ChatRequest,
    body: &[u8],
) -> Result<Prepared, ApiError> {
    let n = check_n(req.n)?;
    unsupported("store", req.store, false)?;
    unsupported("return_hidden_states", req.return_hidden_states, false)?;
    let logprobs = req.logprobs()?;
    let prompt_logprobs = req.prompt_logprobs()?;
    let ChatPrompt {
        ids: prompt,
        tools,
        choice,
        thinking,
    } = chat_prompt(loaded, req, body)?;
    let parser_tools = if choice == ToolChoice::None {
        Arc::new(ToolSet::default())
    } else {
        Arc::clone(&tools)
    };
    let max_tokens = max_tokens(
        loaded,
        &prompt,
        req.max_completion_tokens.or(req.max_tokens),
        ("messages", "max_tokens"),
        None,
    )?;
    let stop = stop_strings(req.stop.clone())?;
    let mut sampling = req.sampling().to_params(random_u64(state.next_serial()))?;
    sampling.bad_words_ids = bad_words_ids(req.bad_words.as_ref(), &loaded.tokenizer)?;
    check_fit(&sampling, loaded.vocab.len(), max_tokens)?;
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let shape = req.structured()?;
    let constraint = constraint(
        state,
        loaded,
        shape.as_ref(),
        parallel,
        &choice,
        &tools,
        thinking,
    )
    .await?;
    let budget = request_budget(
        (req.thinking_token_budget, "thinking_token_budget"),
        state.cfg().thinking_token_budget,
        thinking,
        req.use_beam_search == Some(true),
    )?;
    let constraint = loaded.think_end.budgeted(thinking, budget, constraint);
    let parsing = req.parsing(state.cfg().output);
    let decoder = DecoderSpec {
        parsing,
        thinking,
        tools: parser_tools,
        stop: stop.clone(),
        min_tokens: sampling.min_tokens,
        keep_stop: keep_stop_string(req.include_stop_str_in_output, req.no_stop_trim)?,
        verbatim_content: shape.is_some(),
        skip_special: req.skip_special(parsing),
        // Beams are streamed as they are ranked, not token by token.
        stream_arguments: req.stream == Some(true) && req.use_beam_search != Some(true),
    };
    Ok(Prepared {
        request: Request {
            prompt,
            max_tokens,
            sampling,
            stop,
            ignore_eos: req.ignore_eos.unwrap_or(false),
            logprobs,
            prompt_logprobs,
            constraint,
            priority: req.priority.unwrap_or(0),
            ..req.admission.request()
        },
        decoder,
        n,
    })
}

/// Check the prompt against the context and choose `max_tokens`; `prompt_field` is the request
/// field the prompt came from (`messages`, `prompt` on /v1/completions, `input` on
/// /v1/responses) and `limit` the token limit's (`max_tokens`, or `max_output_tokens`), both
/// named in errors.
/// `only_prompt` is None on chat; on /v1/completions it says whether the request echoes or
/// scores its prompt (`echo`, `prompt_logprobs`): then 0 runs and scores the prompt without
/// generating anything (OpenAI's legacy API and vLLM accept it with `echo`, and scoring scripts
/// send it), so the prompt may fill the whole context.
pub(super) fn max_tokens(
    loaded: &Loaded,
    prompt: &[u32],
    asked: Option<u64>,
    (prompt_field, limit): (&str, &str),
    only_prompt: Option<bool>,
) -> Result<usize, ApiError> {
    let context = loaded.context;
    let too_long =
        |m: String| ApiError::bad_param(prompt_field, m).with_code("context_length_exceeded");
    let zero = asked == Some(0) && only_prompt == Some(true);
    if zero && prompt.len() > context {
        return Err(too_long(format!(
            "the prompt is {} tokens but the model's context is {context} tokens; shorten the \
             {prompt_field}",
            prompt.len()
        )));
    }
    if zero {
        return Ok(0);
    }
    if prompt.len() >= context {
        return Err(too_long(format!(
            "the prompt is {} tokens but the model's context is {context} tokens (room for at \
             least one generated token is needed); shorten the {prompt_field}",
            prompt.len()
        )));
    }
    let room = context - prompt.len();
    match asked {
        Some(0) => Err(ApiError::bad_param(
            limit,
            match only_prompt {
                None => format!("{limit} must be at least 1"),
                Some(_) => format!(
                    "{limit} must be at least 1, or 0 with echo: true or prompt_logprobs (the \
                     prompt is scored and nothing is generated)"
                ),
            },
        )),
        Some(n) if n > room as u64 => Err(too_long(format!(
            "the prompt ({} tokens) plus {limit} ({n}) exceeds the model's context of \
             {context} tokens; lower {limit} to at most {room} or shorten the {prompt_field}",
            prompt.len()
        ))),
        Some(n) => Ok(n as usize),
        None => Ok(fit_max_tokens(loaded.engine.limits(), prompt, room)),
    }
}

/// The grammar constraint a request asks for, if any: the structured output its answer
/// follows (`shape`: a JSON schema, regex, choice or grammar, with the field that asked for it,
/// named in errors), the tool calls its `choice` requires (`parallel`: several in one answer),
/// or, with `tool_choice` auto and a strict tool, free content and calls whose strict tools'
/// arguments follow their schemas. The compile time, or a cache hit, goes to `state`'s
/// metrics.
pub(super) async fn constraint(
    state: &AppState,
    loaded: &Loaded,
    shape: Option<&Shape>,
    parallel: bool,
    choice: &ToolChoice,
    tools: &ToolSet,
    thinking: bool,
) -> Result<Option<dsv4_engine::Constraint>, ApiError> {
    let (target, param) = match (choice, shape) {
        (ToolChoice::Required | ToolChoice::Named(_), Some(shape)) => {
            return Err(ApiError::bad_param(
                shape.field.as_str(),
                format!(
                    "`{}` cannot be combined with tool_choice \"required\" or a named tool; \
                     use one or the other",
                    shape.field
                ),
            ));
        }
        (ToolChoice::Required, None) => (
            Target::ToolCalls {
                only: None,
                parallel,
            },
            "tools",
        ),
        (ToolChoice::Named(name), None) => {
            if tools.get(name).is_none() {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!(
                        "tool_choice names `{name}`, which is not among the request's tools ({})",
                        tools.names().join(", ")
                    ),
                ));
            }
            (
                Target::ToolCalls {
                    only: Some(name.as_str()),
                    parallel,
                },
                "tool_choice",
            )
        }
        (_, Some(shape)) => (shape.target(), shape.field.as_str()),
        (ToolChoice::Auto, None) if tools.tools().iter().any(|t| t.strict()) => {
            (Target::ContentOrCalls { parallel }, "tools")
        }
        (_, None) => return Ok(None),
    };
    let started = std::time::Instant::now();
    let waiting = state.stats().grammar_wait();
    let got = loaded.grammars.constrain(target, tools, thinking).await;
    drop(waiting);
    if got.cached {
        state.stats().grammar_cache_hit();
    } else {
        state
            .stats()
            .grammar_compiled(started.elapsed().as_secs_f64());
    }
    got.constraint
        .map(Some)
        .map_err(|e| ApiError::bad_param(param, format!("cannot be enforced by a grammar: {e}")))
}

/// The constraint of a structured output on an answer with no tools and no thinking
/// (`/v1/completions`, `/generate`).
pub(super) async fn structured_constraint(
    state: &AppState,
    loaded: &Loaded,
    shape: Option<&Shape>,
) -> Result<Option<dsv4_engine::Constraint>, ApiError> {
    constraint(
        state,
        loaded,
        shape,
        false,
        &ToolChoice::None,
        &ToolSet::default(),
        false,
    )
    .await
}

/// What every chunk and answer repeats.
pub(super) struct Meta {
    /// "chatcmpl-…".
    pub(super) id: String,
    /// Unix seconds.
    pub(super) created: u64,
    /// The model id.
    pub(super) model: String,
    /// Whether the request is in thinking mode.
    pub(super) thinking: bool,
    /// Whether the request asked for log-probabilities.
    pub(super) logprobs: bool,
    /// `return_tokens_as_token_ids`.
    pub(super) names_as_ids: bool,
    /// The prompt's length in tokens.
    pub(super) prompt_tokens: usize,
    /// With `return_token_ids`: the prompt's ids.
    pub(super) prompt_ids: Option<Vec<u32>>,
    /// SGLang's `stream_reasoning`: false holds a streamed answer's reasoning back until it is
    /// complete.
    pub(super) stream_reasoning: bool,
}

impl Meta {
    /// How the request's `logprobs` name tokens.
    pub(super) fn names<'a>(&self, loaded: &'a Loaded) -> TokenNames<'a> {
        TokenNames {
            vocab: &loaded.vocab,
            as_ids: self.names_as_ids,
        }
    }
}

/// A tool call of tool `name` as the API shows it, with a fresh id.
pub(super) fn tool_call_body(state: &AppState, name: String, arguments: String) -> ToolCallBody {
    ToolCallBody {
        id: format!("call_{}", random_hex(state.next_serial())),
        kind: "function",
        function: FunctionBody { name, arguments },
    }
}

/// One choice of a non-streamed answer, as it accumulates.
#[derive(Default)]
struct Answer {
    content: String,
    reasoning: String,
    calls: Vec<ToolCallBody>,
    tokens: Vec<GeneratedToken>,
    token_ids: Vec<u32>,
    finished: Option<dsv4_engine::Finished>,
    stop_reason: Option<StopReason>,
}

/// Run every choice to its end and answer one `chat.completion` (the first error fails the
/// request; the other choices are cancelled). With `scored` (the prompt and the alternatives
/// asked for), the answer carries `prompt_logprobs` from the first choice, which scored it.
async fn answer(
    state: &AppState,
    loaded: &Loaded,
    mut runs: Merged,
    n: usize,
    meta: Meta,
    scored: Option<(Vec<u32>, usize)>,
) -> Result<Response, ApiError> {
    let mut answers: Vec<Answer> = (0..n).map(|_| Answer::default()).collect();
    let mut reasoning: Vec<ReasoningCount> = (0..n)
        .map(|_| loaded.think_end.counter(meta.thinking))
        .collect();
    let mut entries = None;
    while let Some((i, step)) = runs.next().await {
        let step = step?;
        if step.prompt_logprobs.is_some() {
            entries = step.prompt_logprobs;
        }
        reasoning[i].push(&step.token_ids);
        let a = &mut answers[i];
        a.tokens.extend(step.logprobs);
        a.token_ids.extend(step.token_ids);
        for d in step.deltas {
            match d {
                Delta::Content(c) => a.content.push_str(&c),
                Delta::Reasoning(r) => a.reasoning.push_str(&r),
                Delta::ToolCall(c) => a.calls.push(tool_call_body(state, c.name, c.arguments)),
                // Only streamed answers stream arguments; the checked call is whole.
                Delta::ToolCallPiece(_) => {}
            }
        }
        if step.finished.is_some() {
            a.finished = step.finished;
            a.stop_reason = step.stop_reason;
        }
    }
    let mut usages = Vec::with_capacity(n);
    let mut choices = Vec::with_capacity(n);
    for (index, a) in answers.into_iter().enumerate() {
        let finished = a
            .finished
            .ok_or_else(|| ApiError::internal(format!("choice {index} ended without finishing")))?;
        usages.push(finished.usage);
        choices.push(ChoiceBody {
            index,
            finish_reason: finish_reason(finished.reason, !a.calls.is_empty()),
            message: AssistantBody {
                role: "assistant",
                content: (!a.content.is_empty() || a.calls.is_empty()).then_some(a.content),
                reasoning_content: meta.thinking.then_some(a.reasoning),
                tool_calls: a.calls,
            },
            logprobs: meta
                .logprobs
                .then(|| ChatLogprobs::new(meta.names(loaded), &a.tokens)),
            stop_reason: a.stop_reason,
            token_ids: meta.prompt_ids.is_some().then_some(a.token_ids),
        });
    }
    let body = ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices,
        usage: UsageBody::total(&usages).with_reasoning(reasoning_total(
            reasoning
                .iter()
                .zip(usages.iter().map(|u| u.completion_tokens)),
        )),
        prompt_logprobs: scored.map(|(ids, top)| {
            prompt_logprobs(
                &loaded.vocab,
                &ids,
                entries.as_deref().unwrap_or_default(),
                top,
            )
        }),
        prompt_token_ids: meta.prompt_ids,
    };
    Ok(json_response(&body))
}

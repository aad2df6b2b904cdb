//! Beam search (vLLM's `use_beam_search` on chat and completions): the request's `n` is the
//! beam width. Each step extends every kept beam by one token: one engine request per beam,
//! over the prompt and the beam's tokens, asking for the [`CANDIDATES`] most likely next tokens
//! under the raw logits (the prefix cache reuses the shared prefix up to its last page
//! boundary). Of all beams' candidates, ranked by the sum of their tokens' log-probabilities,
//! an end token (end-of-sequence unless `ignore_eos`, a `stop_token_ids` id; not before
//! `min_tokens`) or a completed stop string ends a hypothesis (as vLLM's), and the first
//! `width` others are the next step's beams. A hypothesis scores its sum
//! divided by (tokens generated, the end token not counted) ^ `length_penalty`, as Hugging Face's
//! `BeamSearchScorer`. The search stops when `width` hypotheses have ended and no running beam
//! scores better at its current length than the worst of them (Hugging Face's
//! `early_stopping=False`), or at `max_tokens` (the running beams then end with `length`). The
//! `width` best hypotheses, best first, are replayed as the request's choices through their own
//! output decoders ([`Run::replay`]), so chat parsing, stop strings, `logprobs`, `echo` and
//! streaming work as for sampled choices.

use crate::error::ApiError;
use crate::output::OutputDecoder;
use crate::run::Run;
use crate::state::{AppState, Loaded};
use dsv4_engine::{
    Event, FinishReason, Finished, MAX_TOP_LOGPROBS, Request, RequestId, TokenEvent, TokenLogprob,
    Usage, stop_string_ends,
};
use futures_util::future::try_join_all;
use std::sync::Arc;

/// Candidates each beam offers per step: its most likely next tokens.
pub const CANDIDATES: usize = MAX_TOP_LOGPROBS;

/// What the search is asked for besides the engine request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamParams {
    /// Beams kept, and hypotheses answered (the request's `n`).
    pub width: usize,
    /// The exponent of the generated length a hypothesis's log-probability is divided by.
    pub length_penalty: f64,
}

/// The search a request asks for with `use_beam_search` and `length_penalty` and its `n`
/// choices: None to sample. `length_penalty` without beam search is a 400.
pub fn params(
    use_beam_search: Option<bool>,
    length_penalty: Option<f32>,
    n: usize,
) -> Result<Option<BeamParams>, ApiError> {
    match (use_beam_search.unwrap_or(false), length_penalty) {
        (false, Some(_)) => Err(ApiError::bad_param(
            "length_penalty",
            "length_penalty applies to beam search only: send use_beam_search: true with it",
        )),
        (false, None) => Ok(None),
        (true, lp) => Ok(Some(BeamParams {
            width: n,
            length_penalty: f64::from(lp.unwrap_or(1.0)),
        })),
    }
}

/// Check that `req` (the engine request the choices would run) asks for nothing beam search
/// cannot do: a grammar, penalties, `logit_bias`, `allowed_token_ids`, `bad_words` and
/// `max_tokens: 0`, each a 400 naming its field. Temperature, top-p/k, min-p and the seed do
/// not apply (the search is deterministic).
pub fn check(req: &Request, p: &BeamParams) -> Result<(), ApiError> {
    let s = &req.sampling;
    let refused = [
        (
            req.constraint.is_some(),
            "use_beam_search",
            "beam search does not follow a grammar: leave out response_format, \
             structured_outputs, regex, ebnf and a required or named tool_choice",
        ),
        (
            s.presence_penalty != 0.0,
            "presence_penalty",
            "penalties do not apply to beam search",
        ),
        (
            s.frequency_penalty != 0.0,
            "frequency_penalty",
            "penalties do not apply to beam search",
        ),
        (
            s.repetition_penalty != 1.0,
            "repetition_penalty",
            "penalties do not apply to beam search",
        ),
        (
            !s.logit_bias.is_empty(),
            "logit_bias",
            "logit_bias does not apply to beam search",
        ),
        (
            !s.allowed_token_ids.is_empty(),
            "allowed_token_ids",
            "allowed_token_ids does not apply to beam search",
        ),
        (
            !s.bad_words_ids.is_empty(),
            "bad_words",
            "bad_words do not apply to beam search",
        ),
        (
            req.max_tokens == 0,
            "max_tokens",
            "beam search needs max_tokens of at least 1",
        ),
        (
            !p.length_penalty.is_finite(),
            "length_penalty",
            "length_penalty must be a finite number",
        ),
    ];
    match refused.into_iter().find(|r| r.0) {
        Some((_, param, why)) => Err(ApiError::bad_param(
            param,
            format!("{why} (use_beam_search)"),
        )),
        None => Ok(()),
    }
}

/// A partial sequence: its tokens, their entries and the sum of their log-probabilities.
#[derive(Debug, Clone, Default)]
struct Beam {
    tokens: Vec<u32>,
    /// Each token's log-probability with the alternatives asked for (`logprobs`).
    entries: Vec<TokenLogprob>,
    sum: f64,
}

/// How a hypothesis ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    /// On this end token (not among its tokens).
    Token(u32),
    /// On a stop string its last token completed.
    Stop,
    /// At `max_tokens`.
    Length,
    /// An abort stopped the search.
    Aborted,
}

/// A finished sequence with its score.
#[derive(Debug, Clone)]
struct Hypothesis {
    beam: Beam,
    end: End,
    score: f64,
}

/// `sum` over `len` generated tokens with `penalty` (a length under 1 counts as 1).
fn score(sum: f64, len: usize, penalty: f64) -> f64 {
    sum / (len.max(1) as f64).powf(penalty)
}

/// What one beam's one-token engine request brought.
struct Expansion {
    /// Its candidates, most likely first (empty when an abort came first).
    top: Vec<(u32, f32)>,
    /// The prompt's entries (the first step, with `prompt_logprobs`).
    prompt: Option<Vec<TokenLogprob>>,
    cached_tokens: usize,
    aborted: bool,
}

/// Run `beam` one token further: the engine request over the prompt and its tokens.
async fn expand(
    state: &AppState,
    loaded: &Arc<Loaded>,
    req: &Request,
    beam: &Beam,
    (rid, first): (&str, bool),
) -> Result<Expansion, ApiError> {
    let mut prompt = req.prompt.clone();
    prompt.extend(&beam.tokens);
    let one = Request {
        prompt,
        max_tokens: 1,
        ignore_eos: true,
        logprobs: Some(CANDIDATES),
        prompt_logprobs: req.prompt_logprobs.filter(|_| first),
        // Admitted as the request would be; only its first step may be refused at a full
        // queue, not a search under way.
        priority: req.priority,
        queue_limit: req.queue_limit.filter(|_| first),
        yields: req.yields,
        ..Default::default()
    };
    // Not under `rid`: an abort of the request stops the search through its own guard.
    let ids = (format!("{rid}-beam"), format!("{rid}-beam"));
    let mut run = Run::start(state, loaded, one, ids, OutputDecoder::raw(&[]))?;
    let mut out = Expansion {
        top: Vec::new(),
        prompt: None,
        cached_tokens: 0,
        aborted: false,
    };
    loop {
        let step = run.next().await?;
        if let Some(t) = step.logprobs.into_iter().last() {
            out.top = t.logprob.top;
        }
        if step.prompt_logprobs.is_some() {
            out.prompt = step.prompt_logprobs;
        }
        if let Some(f) = step.finished {
            out.cached_tokens = f.usage.cached_tokens;
            out.aborted = f.reason == FinishReason::Cancelled;
            return Ok(out);
        }
    }
}

/// The best hypotheses, best first, with the prompt's entries and cached tokens of the first
/// step, and whether an abort stopped the search.
struct Searched {
    hypotheses: Vec<Hypothesis>,
    prompt: Option<Vec<TokenLogprob>>,
    cached_tokens: usize,
    aborted: bool,
}

/// Search from `req`'s prompt (its run id `rid`).
async fn search(
    state: &AppState,
    loaded: &Arc<Loaded>,
    req: &Request,
    p: BeamParams,
    rid: &str,
) -> Result<Searched, ApiError> {
    let ends =
        |t: u32| (t == loaded.eos && !req.ignore_eos) || req.sampling.stop_token_ids.contains(&t);
    let tok = &loaded.tokenizer;
    let detok = |ids: &[u32]| tok.decode(ids).unwrap_or_default();
    let min_tokens = req.sampling.min_tokens;
    let kept = req.logprobs.unwrap_or(0);
    let mut out = Searched {
        hypotheses: Vec::new(),
        prompt: None,
        cached_tokens: 0,
        aborted: false,
    };
    // `/abort_request` names the search as the request `rid`, between steps too.
    let guard = state
        .aborts()
        .register(rid.to_string(), rid.to_string(), RequestId(u64::MAX));
    let mut running = vec![Beam::default()];
    let mut done: Vec<Hypothesis> = Vec::new();
    let mut early = false;
    for step in 0..req.max_tokens {
        if guard.aborted() {
            out.aborted = true;
            break;
        }
        let grown = try_join_all(
            running
                .iter()
                .map(|b| expand(state, loaded, req, b, (rid, step == 0))),
        )
        .await?;
        if step == 0 {
            out.prompt = grown[0].prompt.clone();
            out.cached_tokens = grown[0].cached_tokens;
        }
        if grown.iter().any(|g| g.aborted) {
            out.aborted = true;
            break;
        }
        // Every beam's candidates, ranked by their sums (a stable sort: ties keep the beam's
        // order, then the candidate's).
        let mut cands: Vec<(f64, usize, usize)> = grown
            .iter()
            .enumerate()
            .flat_map(|(b, g)| {
                let sum = running[b].sum;
                (0..g.top.len()).map(move |r| (sum + f64::from(g.top[r].1), b, r))
            })
            .collect();
        cands.sort_by(|x, y| y.0.total_cmp(&x.0));
        let mut next = Vec::with_capacity(p.width);
        let mut spelled: Vec<Option<Vec<u32>>> = vec![None; running.len()];
        for &(sum, b, r) in &cands {
            let parent = &running[b];
            let top = &grown[b].top;
            let (token, logprob) = top[r];
            let len = parent.tokens.len();
            if ends(token) {
                if len >= min_tokens {
                    let beam = Beam {
                        sum,
                        ..parent.clone()
                    };
                    let score = score(sum, len, p.length_penalty);
                    done.push(Hypothesis {
                        beam,
                        end: End::Token(token),
                        score,
                    });
                }
                continue;
            }
            let full = next.len() == p.width;
            // Whether it completes a stop string, checked on the beam's tokens with this one
            // after them (one copy per beam, not per candidate).
            let stopped = !req.stop.is_empty() && {
                let with = spelled[b].get_or_insert_with(|| {
                    let mut t = parent.tokens.clone();
                    t.push(token);
                    t
                });
                with[len] = token;
                stop_string_ends(with, &req.stop, &detok, min_tokens)
            };
            if full && !stopped {
                // The beams are full: only an end can still make a hypothesis.
                continue;
            }
            let mut child = parent.clone();
            child.tokens.push(token);
            child.sum = sum;
            child.entries.push(TokenLogprob {
                logprob,
                top: top[..kept.min(top.len())].to_vec(),
                rank: r as u32 + 1,
                asked: Vec::new(),
            });
            if stopped {
                let score = score(sum, len + 1, p.length_penalty);
                done.push(Hypothesis {
                    beam: child,
                    end: End::Stop,
                    score,
                });
            } else {
                next.push(child);
            }
        }
        done.sort_by(|x, y| y.score.total_cmp(&x.score));
        done.truncate(p.width);
        running = next;
        let len = step + 1;
        let settled = done.len() == p.width
            && running.first().is_none_or(|best| {
                done[p.width - 1].score >= score(best.sum, len, p.length_penalty)
            });
        if running.is_empty() || settled {
            early = true;
            break;
        }
    }
    if !early {
        let end = if out.aborted {
            End::Aborted
        } else {
            End::Length
        };
        done.extend(running.into_iter().map(|beam| {
            let score = score(beam.sum, beam.tokens.len(), p.length_penalty);
            Hypothesis { beam, end, score }
        }));
        done.sort_by(|x, y| y.score.total_cmp(&x.score));
        done.truncate(p.width);
    }
    if out.aborted {
        // Aborted before the first step: each choice ends with what it had, nothing.
        while done.len() < p.width {
            let beam = Beam::default();
            done.push(Hypothesis {
                beam,
                end: End::Aborted,
                score: f64::NEG_INFINITY,
            });
        }
    }
    if done.len() < p.width {
        // Only end tokens held back by `min_tokens` can leave too few: every other candidate
        // either continues a beam or ends a hypothesis.
        return Err(ApiError::bad_param(
            "min_tokens",
            format!(
                "beam search found {} of the n = {} hypotheses: every beam's {CANDIDATES} most \
                 likely next tokens were end tokens, held back by min_tokens",
                done.len(),
                p.width
            ),
        ));
    }
    out.hypotheses = done;
    Ok(out)
}

/// The events a hypothesis replays: the prompt's entries (first choice, when asked), its
/// tokens (with their entries under `logprobs`), and its end.
fn events(
    req: &Request,
    h: &Hypothesis,
    prompt: Option<Vec<TokenLogprob>>,
    cached: usize,
) -> Vec<Event> {
    let mut out: Vec<Event> = prompt.map(Event::Prompt).into_iter().collect();
    for (index, (&token, entry)) in h.beam.tokens.iter().zip(&h.beam.entries).enumerate() {
        out.push(Event::Token(TokenEvent {
            token,
            index,
            logits: None,
            logprob: req.logprobs.map(|_| entry.clone()),
        }));
    }
    let (reason, stop_token) = match h.end {
        End::Token(t) => (FinishReason::Eos, Some(t)),
        End::Stop => (FinishReason::Stop, None),
        End::Length => (FinishReason::Length, None),
        End::Aborted => (FinishReason::Cancelled, None),
    };
    out.push(Event::Finished(Finished {
        reason,
        usage: Usage {
            prompt_tokens: req.prompt.len(),
            completion_tokens: h.beam.tokens.len(),
            cached_tokens: cached,
            preemptions: 0,
        },
        timing: Default::default(),
        text: None,
        error: None,
        stop_token,
    }));
    out
}

/// Beam-search `req` and start its choices: the `p.width` best hypotheses, best first, as
/// runs `rid`, `rid-1`, … (as [`crate::run::start_choices`] names sampled ones), each through
/// its own decoder from `decoder`. `/abort_request` with `rid` stops the search after the step
/// it is on (the choices then end `abort` with the best hypotheses so far); the search's own
/// one-token engine requests run as `rid-beam`.
pub async fn start_beams(
    state: &AppState,
    loaded: &Arc<Loaded>,
    req: &Request,
    p: BeamParams,
    rid: &str,
    mut decoder: impl FnMut() -> OutputDecoder,
) -> Result<Vec<Run>, ApiError> {
    let searched = search(state, loaded, req, p, rid).await?;
    let Searched {
        hypotheses,
        mut prompt,
        cached_tokens,
        aborted,
    } = searched;
    Ok(hypotheses
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let id = match i {
                0 => rid.to_string(),
                i => format!("{rid}-{i}"),
            };
            let evs = events(req, h, prompt.take(), cached_tokens);
            let aborted = aborted && h.end == End::Aborted;
            Run::replay(
                state,
                loaded,
                (req, evs),
                (id, rid.to_string()),
                decoder(),
                aborted,
            )
        })
        .collect())
}

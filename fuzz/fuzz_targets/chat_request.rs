//! Fuzz target for everything `POST /v1/chat/completions` does with a body before the engine
//! runs it: the typed request (`parse_body`), `tool_choice`, thinking mode, stop strings, `n`,
//! the sampling fields and beam search's checks (then the engine's logit processing and sampler on a row of the tiny
//! vocabulary under the parameters they give), the DSV4 prompt encoding and tokenization, and
//! the llguidance grammars for `tool_choice` "required" and the structured output
//! (`response_format`, `structured_outputs`, `regex`, `ebnf`: compiled over the tiny model's
//! vocabulary, then walked for a few tokens chosen by the input); and the same body as a
//! `/v1/completions` request (its prompts, log-probability count, sampling fields and
//! structured output). Nothing may panic, the sampler's token is in the vocabulary, and accepted prompts
//! number 1 to `MAX_PROMPTS`.
//!
//! Input: the request body. Seeds: `fuzz/seeds/chat_request/` (see docs/chat.md).
#![no_main]

use std::sync::{Arc, OnceLock};

use dsv4_chat::{Conversation, Tokenizer, ToolSet, encode_prompt_ids};
use dsv4_core::SplitMix64;
use dsv4_engine::Constraint;
use dsv4_engine::sampling::{TokenCounts, penalizes, process, sample, validate};
use dsv4_server::api::chat::ChatRequest;
use dsv4_server::api::common::{check_n, parse_body, stop_strings};
use dsv4_server::api::completion::{CompletionRequest, MAX_PROMPTS};
use dsv4_server::api::sampling::check_fit;
use dsv4_server::grammar::{GrammarCompiler, Target};
use dsv4_server::vocab::Vocab;
use libfuzzer_sys::fuzz_target;

/// Tokens walked through each compiled grammar.
const WALK: usize = 24;

struct Env {
    tok: Tokenizer,
    vocab: usize,
    grammars: Arc<GrammarCompiler>,
    /// Waits for the grammar compiler's thread.
    rt: tokio::runtime::Runtime,
}

impl Env {
    /// The constraint for `target`, compiled as a request's is.
    fn constraint(
        &self,
        target: Target<'_>,
        tools: &ToolSet,
        thinking: bool,
    ) -> Option<Constraint> {
        self.rt
            .block_on(self.grammars.constraint(target, tools, thinking))
            .ok()
    }
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let tok = Tokenizer::tiny().expect("the tiny tokenizer loads");
        let vocab_size = dsv4_model::ModelConfig::tiny().vocab_size;
        let vocab = Vocab::new(&tok, vocab_size).expect("the tiny vocabulary maps");
        let grammars = GrammarCompiler::new(&vocab.tok_env(tok.clone()), tok.clone(), 0)
            .expect("the grammar compiler builds");
        Env {
            tok,
            vocab: vocab.len(),
            grammars: Arc::new(grammars),
            rt: tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime starts"),
        }
    })
}

/// Walk `c` for up to [`WALK`] tokens, each the allowed token picked by the next input byte.
fn walk(c: &Constraint, vocab: usize, picks: &[u8]) {
    let mut state = c.0.start();
    for &pick in picks.iter().cycle().take(WALK) {
        let mut logits = vec![0.0f32; vocab];
        if state.mask(&mut logits).is_err() {
            return;
        }
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&i| logits[i as usize] == 0.0)
            .collect();
        let Some(&token) = allowed.get(pick as usize % allowed.len().max(1)) else {
            return;
        };
        if state.advance(token).is_err() {
            return;
        }
    }
}

fuzz_target!(|body: &[u8]| {
    let env = env();
    if let Ok(c) = parse_body::<CompletionRequest>(body) {
        if let Ok(prompts) = c.prompts() {
            assert!(
                (1..=MAX_PROMPTS).contains(&prompts.len()),
                "{} prompts",
                prompts.len()
            );
        }
        let _ = c.logprobs();
        let _ = c.sampling().to_params(7);
        if let Ok(Some(shape)) = c.structured() {
            if let Some(c) = env.constraint(shape.target(), &Default::default(), false) {
                walk(&c, env.vocab, body);
            }
        }
    }
    let Ok(req) = parse_body::<ChatRequest>(body) else {
        return;
    };
    let (Ok(_), Ok(thinking)) = (req.tool_choice(), req.thinking()) else {
        return;
    };
    let _ = stop_strings(req.stop.clone());
    if let Ok(n) = check_n(req.n)
        && let Ok(Some(beam)) =
            dsv4_server::beam::params(req.use_beam_search, req.length_penalty, n)
        && let Ok(sampling) = req.sampling().to_params(7)
    {
        let one = dsv4_engine::Request {
            prompt: vec![0],
            max_tokens: 4,
            sampling,
            ..Default::default()
        };
        let _ = dsv4_server::beam::check(&one, &beam);
    }
    if let Ok(p) = req.sampling().to_params(7)
        && check_fit(&p, env.vocab, 16).is_ok()
        && validate(&p).is_ok()
    {
        // A row with ties, a masked token and a spread of logits; the body's bytes as history.
        let mut row: Vec<f32> = (0..env.vocab)
            .map(|i| (i * 37 % 23) as f32 * 0.5 - 5.0)
            .collect();
        row[1] = f32::NEG_INFINITY;
        let prompt: Vec<u32> = body.iter().take(64).map(|&b| u32::from(b)).collect();
        let mut counts = TokenCounts::new(&prompt, &p);
        for &b in body.iter().take(32) {
            counts.record(u32::from(b) % env.vocab as u32, penalizes(&p));
        }
        process(&mut row, &p, &counts);
        let token = sample(&row, &p, &mut SplitMix64::new(p.seed));
        assert!(
            (token as usize) < env.vocab,
            "token {token} outside the vocabulary"
        );
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let Ok(conv) = Conversation::from_json_str(text) else {
        return;
    };
    let _ = encode_prompt_ids(&conv, &req.encode_options(thinking), &env.tok);
    let tools = conv.tools.clone().unwrap_or_default();
    let shape = req.structured().ok().flatten();
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let mut targets = vec![Target::ToolCalls {
        only: tools.tools().first().map(|t| t.name()),
        parallel,
    }];
    if let Some(shape) = &shape {
        targets.push(shape.target());
    }
    for target in targets {
        if let Some(c) = env.constraint(target, &tools, thinking) {
            walk(&c, env.vocab, body);
        }
    }
});

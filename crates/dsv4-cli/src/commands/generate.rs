//! `dsv4 generate`: greedy, deterministic generation from a prompt, streamed to stdout; or, with
//! `--batch FILE`, many JSONL requests at once through the serving engine ([`batch`]).

pub mod batch;

use super::forward::{model_source, open_model, tokenizer_for};
use anyhow::{Context, bail};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `dsv4 generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The prompt text.
    #[arg(long, required_unless_present = "batch", conflicts_with = "batch")]
    pub prompt: Option<String>,
    /// Tokens to generate at most (with --batch: for requests without `max_tokens`).
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Run the requests of a JSONL file through the engine (continuous batching, prefix cache;
    /// see docs/engine.md) and print one JSON result per line, in input order.
    #[arg(long, value_name = "FILE")]
    pub batch: Option<PathBuf>,
    /// With --batch: write the results to this file instead of stdout.
    #[arg(long, value_name = "FILE", requires = "batch")]
    pub output: Option<PathBuf>,
    /// Checkpoint directory; the embedded tiny model when omitted and the profile says "tiny".
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// The outcome of a generation, as printed by `--json`.
#[derive(Debug, serde::Serialize)]
pub struct Generation {
    /// Prompt token ids (BOS first).
    pub prompt_ids: Vec<u32>,
    /// Generated token ids.
    pub completion_ids: Vec<u32>,
    /// Generated text.
    pub text: String,
    /// Why generation stopped: "eos" or "length".
    pub finish_reason: &'static str,
}

/// Greedy argmax (ties to the lower id).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Run `dsv4 generate`; with `json`, print one JSON object instead of streaming text.
pub fn run(args: &GenerateArgs, profile: &dsv4_config::Profile, json: bool) -> anyhow::Result<()> {
    // The tokenizer first: a missing tokenizer.json fails before the (long) weight load.
    let tok = tokenizer_for(&model_source(args.model.as_deref(), profile))?;
    let (model, _) = open_model(args.model.as_deref(), profile)?;
    if let Some(file) = &args.batch {
        return match &args.output {
            Some(out) => {
                super::check_output_path("--output", out)?;
                batch::run_batch(model, tok, profile, file, args.max_tokens, || {
                    std::fs::File::create(out)
                        .with_context(|| format!("cannot create {}", out.display()))
                })
            }
            None => batch::run_batch(model, tok, profile, file, args.max_tokens, || {
                Ok(std::io::stdout().lock())
            }),
        };
    }
    let prompt = args
        .prompt
        .as_deref()
        .context("give --prompt TEXT, or --batch FILE")?;
    let mut prompt_ids = vec![model.cfg.bos_token_id];
    prompt_ids.extend(tok.encode(prompt)?);
    // The same limit the engine and the server apply, checked before the prefill: a run that
    // ran out of positions half-way would lose what it generated.
    let context = model.cfg.max_position_embeddings;
    if prompt_ids.len() >= context {
        bail!(
            "the prompt is {} tokens but the model's context is {context} tokens (room for at \
             least one generated token is needed); shorten the prompt",
            prompt_ids.len()
        );
    }
    if prompt_ids.len().saturating_add(args.max_tokens) > context {
        bail!(
            "the prompt ({} tokens) plus --max-tokens ({}) exceeds the model's context of \
             {context} tokens; lower --max-tokens to at most {}",
            prompt_ids.len(),
            args.max_tokens,
            context - prompt_ids.len()
        );
    }
    let mut seq = model.new_sequence();
    let out = model.forward(&mut seq, &prompt_ids)?;
    let v = out.vocab;
    let mut next = argmax(&out.logits[out.logits.len() - v..]);
    let mut completion = Vec::new();
    let mut finish = "length";
    let stdout = std::io::stdout();
    let mut printed = String::new();
    while completion.len() < args.max_tokens {
        if next == model.cfg.eos_token_id {
            finish = "eos";
            break;
        }
        completion.push(next);
        if !json {
            // Print the text decoded so far minus what is already shown (byte tokens may split
            // a UTF-8 character; the lossy decode settles once the character is complete).
            let text = tok.decode(&completion)?;
            if text.starts_with(&printed) && !text.ends_with('\u{FFFD}') {
                let mut lock = stdout.lock();
                write!(lock, "{}", &text[printed.len()..])?;
                lock.flush()?;
                printed = text;
            }
        }
        if completion.len() == args.max_tokens {
            break;
        }
        let out = model.forward(&mut seq, &[next])?;
        next = argmax(&out.logits);
    }
    let text = tok.decode(&completion)?;
    if json {
        let g = Generation {
            prompt_ids,
            completion_ids: completion,
            text,
            finish_reason: finish,
        };
        println!("{}", serde_json::to_string_pretty(&g)?);
    } else {
        if text.starts_with(&printed) {
            print!("{}", &text[printed.len()..]);
        }
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, finish: {finish}]",
            prompt_ids.len(),
            completion.len()
        );
    }
    Ok(())
}

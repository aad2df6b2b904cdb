//! `dsv4 chat render` and `dsv4 chat parse`: the DSV4 prompt encoding and the strict DSML
//! parser on the command line, for debugging any DSV4 deployment (ours or another engine's
//! logs). Both only wire files and stdin to `dsv4_chat`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use dsv4_chat::{
    Conversation, EncodeOptions, ParserOptions, ReasoningEffort, Tokenizer, ToolSet, encode_prompt,
    encode_prompt_ids, parse_completion_chunked,
};

/// The `chat` subcommands.
#[derive(Debug, Subcommand)]
pub enum ChatCommand {
    /// Print the exact DSV4 prompt text of a conversation (no newline is added).
    Render(RenderArgs),
    /// Read a raw completion on stdin; print the OpenAI assistant message as JSON, or
    /// {"error": {"class", "message", "offset"}} and exit 1.
    Parse(ParseArgs),
}

/// Arguments of `dsv4 chat render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// JSON file: an array of OpenAI messages, or a request object with `messages` (and `tools`).
    #[arg(long, value_name = "FILE")]
    messages: PathBuf,
    /// JSON file with an OpenAI `tools` array (replaces a request object's `tools`).
    #[arg(long, value_name = "FILE")]
    tools: Option<PathBuf>,
    /// Thinking mode: the prompt ends with `<think>` instead of `</think>`.
    #[arg(long)]
    thinking: bool,
    /// Reasoning effort; in thinking mode "max" prepends the maximum-effort instructions.
    #[arg(long, value_name = "high|max")]
    reasoning_effort: Option<ReasoningEffort>,
    /// Keep the reasoning of earlier turns (by default it is dropped unless tools are declared).
    #[arg(long)]
    keep_thinking: bool,
    /// Print {"prompt": TEXT, "token_ids": [...]} instead of the prompt text.
    #[arg(long)]
    json: bool,
    /// tokenizer.json for the token ids of --json (default: the embedded tiny tokenizer).
    #[arg(long, value_name = "FILE", requires = "json")]
    tokenizer: Option<PathBuf>,
}

/// Arguments of `dsv4 chat parse`.
#[derive(Debug, Args)]
pub struct ParseArgs {
    /// JSON file with the request's OpenAI `tools` array: other tool names are `unknown_tool`,
    /// arguments are checked against each tool's JSON Schema.
    #[arg(long, value_name = "FILE")]
    tools: Option<PathBuf>,
    /// The prompt ended with `<think>`: the completion starts with reasoning.
    #[arg(long)]
    thinking: bool,
    /// Feed stdin through the streaming parser in N-byte chunks (the result must not change).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    chunks: Option<u64>,
}

/// Runs a `chat` subcommand.
pub fn run(cmd: &ChatCommand) -> anyhow::Result<()> {
    match cmd {
        ChatCommand::Render(args) => render(args),
        ChatCommand::Parse(args) => parse(args),
    }
}

fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {what} file {}", path.display()))
}

fn tools(path: &Path) -> anyhow::Result<Arc<ToolSet>> {
    let set = ToolSet::from_json_str(&read(path, "tools")?)
        .with_context(|| format!("tools file {}", path.display()))?;
    Ok(Arc::new(set))
}

fn render(args: &RenderArgs) -> anyhow::Result<()> {
    let mut conv = Conversation::from_json_str(&read(&args.messages, "messages")?)
        .with_context(|| format!("messages file {}", args.messages.display()))?;
    if let Some(path) = &args.tools {
        conv.tools = Some(tools(path)?);
    }
    let opts = EncodeOptions {
        thinking: args.thinking,
        reasoning_effort: args.reasoning_effort,
        drop_thinking: !args.keep_thinking,
        add_bos: true,
    };
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let tokenizer = match &args.tokenizer {
            Some(path) => Tokenizer::from_file(path)?,
            None => Tokenizer::tiny()?,
        };
        let (prompt, ids) = encode_prompt_ids(&conv, &opts, &tokenizer)?;
        let out = serde_json::json!({"prompt": prompt, "token_ids": ids});
        writeln!(stdout, "{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        stdout.write_all(encode_prompt(&conv, &opts)?.as_bytes())?;
    }
    stdout.flush()?;
    Ok(())
}

fn parse(args: &ParseArgs) -> anyhow::Result<()> {
    let options = ParserOptions {
        thinking: args.thinking,
        tools: args.tools.as_deref().map(tools).transpose()?,
        verbatim_content: false,
        stream_arguments: false,
    };
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .context("cannot read the completion from stdin")?;
    let chunk = args
        .chunks
        .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let mut stdout = std::io::stdout().lock();
    match parse_completion_chunked(&input, chunk, options) {
        Ok(message) => {
            writeln!(
                stdout,
                "{}",
                serde_json::to_string_pretty(&message.to_openai_json())?
            )?;
            Ok(())
        }
        Err(e) => {
            writeln!(stdout, "{}", serde_json::to_string_pretty(&e.to_json())?)?;
            stdout.flush()?;
            Err(anyhow::Error::new(e).context("the completion does not parse"))
        }
    }
}

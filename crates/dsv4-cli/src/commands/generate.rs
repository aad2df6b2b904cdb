//! `dsv4 generate`: greedy, deterministic generation from a prompt.

use std::path::PathBuf;

/// Arguments of `dsv4 generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Checkpoint directory; the embedded tiny model when omitted and the profile says "tiny".
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// Run `dsv4 generate`.
pub fn run(_args: &GenerateArgs, _profile: &dsv4_config::Profile) -> anyhow::Result<()> {
    anyhow::bail!("generate: the forward pass is being wired in (lead's task)")
}

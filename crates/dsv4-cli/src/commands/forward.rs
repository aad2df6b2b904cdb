//! `dsv4 model forward`: run a prefill over given token ids and write the logits as .npy.

use std::path::PathBuf;

/// Arguments of `dsv4 model forward`.
#[derive(Debug, clap::Args)]
pub struct ForwardArgs {
    /// Checkpoint directory (config.json + safetensors); the profile's model when omitted.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',', required = true)]
    pub tokens: Vec<u32>,
    /// Where to write the f32 logits [T, vocab] as .npy.
    #[arg(long)]
    pub out: PathBuf,
    /// Also write the indexer's selected entries per ratio-4 layer and position as JSON.
    #[arg(long)]
    pub dump_topk: Option<PathBuf>,
}

/// Run `dsv4 model forward`.
pub fn run(_args: &ForwardArgs, _profile: &dsv4_config::Profile) -> anyhow::Result<()> {
    anyhow::bail!("model forward: the forward pass is being wired in (lead's task)")
}

//! `dsv4 model init-tiny`, `init-random` and `inspect`: write the tiny (or any config's) checkpoint
//! with generated weights; count a config's parameters and per-token cache bytes.

use anyhow::Context;
use dsv4_config::{ModelSource, Profile};
use dsv4_model::ModelConfig;
use dsv4_model::params::{CacheBytes, ParamCounts, cache_bytes, count_params};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Arguments of `dsv4 model init-tiny`.
#[derive(Debug, clap::Args)]
pub struct InitTinyArgs {
    /// Directory to write config.json, model.safetensors and tokenizer.json into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Weight seed; the profile's `model.seed` when omitted.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// Arguments of `dsv4 model init-random`.
#[derive(Debug, clap::Args)]
pub struct InitRandomArgs {
    /// An embedded config ("tiny", "small") or a config.json file.
    #[arg(long, value_name = "NAME|FILE")]
    pub config: String,
    /// Directory to write config.json and model.safetensors into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Weight seed; the profile's `model.seed` when omitted.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// Arguments of `dsv4 model inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// A config.json file.
    #[arg(long, value_name = "FILE", conflicts_with = "model")]
    pub config: Option<PathBuf>,
    /// A checkpoint directory (its config.json is read); the profile's model when neither is given.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `dsv4 model init-tiny`.
pub fn init_tiny(args: &InitTinyArgs, profile: &Profile) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or(profile.model.seed);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create output directory {}", args.out.display()))?;
    dsv4_model::tiny::init_tiny(&args.out, seed)
        .with_context(|| format!("cannot write the tiny model to {}", args.out.display()))?;
    let tokenizer = args.out.join("tokenizer.json");
    std::fs::write(&tokenizer, dsv4_chat::tokenizer::tiny_tokenizer_json())
        .with_context(|| format!("cannot write {}", tokenizer.display()))?;
    println!(
        "wrote the tiny model (seed {seed}) to {}: config.json, model.safetensors, tokenizer.json",
        args.out.display()
    );
    Ok(())
}

/// Run `dsv4 model init-random`: any config, weights generated from a seed as the tiny model's.
pub fn init_random(args: &InitRandomArgs, profile: &Profile) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or(profile.model.seed);
    let cfg = match ModelConfig::embedded(&args.config) {
        Some(cfg) => cfg,
        None => ModelConfig::from_file(Path::new(&args.config)).with_context(|| {
            format!(
                "`{}` is neither an embedded config (tiny, small) nor a readable config.json",
                args.config
            )
        })?,
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create output directory {}", args.out.display()))?;
    dsv4_model::tiny::init_random(&args.out, &cfg, seed)
        .with_context(|| format!("cannot write the model to {}", args.out.display()))?;
    println!(
        "wrote a {}-layer model with random weights (seed {seed}) to {}: config.json, model.safetensors",
        cfg.num_hidden_layers,
        args.out.display()
    );
    Ok(())
}

/// Which config `inspect` reads, and how to name it.
fn load_config(args: &InspectArgs, profile: &Profile) -> anyhow::Result<(ModelConfig, String)> {
    let from_file = |path: &Path| -> anyhow::Result<(ModelConfig, String)> {
        let cfg = ModelConfig::from_file(path)
            .with_context(|| format!("cannot load model config {}", path.display()))?;
        Ok((cfg, path.display().to_string()))
    };
    if let Some(file) = &args.config {
        return from_file(file);
    }
    let dir = match (&args.model, profile.model.source()) {
        (Some(dir), _) => dir.clone(),
        (None, ModelSource::Dir(dir)) => dir,
        (None, ModelSource::Tiny { .. }) => {
            return Ok((ModelConfig::tiny(), "embedded tiny model".to_string()));
        }
    };
    from_file(&dir.join("config.json"))
}

/// Parameter counts as printed by `inspect --json`.
#[derive(Debug, Serialize)]
struct ParamsJson {
    /// Main model, MTP layers excluded.
    total: u64,
    /// Touched per token in the main model, embedding table excluded.
    active: u64,
    /// The embedding table alone.
    embedding: u64,
    /// The output head alone.
    head: u64,
    /// The MTP layers' own parameters.
    mtp: u64,
    /// Touched per MTP draft step in the MTP layers.
    mtp_active: u64,
}

/// One cache buffer's per-token cost.
#[derive(Debug, Serialize)]
struct BufferJson {
    /// Buffer name.
    name: &'static str,
    /// Layers that hold this buffer.
    layers: u64,
    /// Bytes of one entry.
    entry_bytes: u64,
    /// Tokens per entry (1, 4 or 128).
    tokens_per_entry: u64,
    /// Bytes per token across all its layers.
    bytes_per_token: f64,
}

/// Cache sizes as printed by `inspect --json`.
#[derive(Debug, Serialize)]
struct CacheJson {
    kv_cache_dtype: String,
    index_k_dtype: String,
    buffers: Vec<BufferJson>,
    /// The SWA buffer stops growing at this many tokens per request.
    swa_window: u64,
    /// SWA bytes of one request once its window is full (all layers).
    swa_cap_bytes: u64,
    /// Compressed KV + index-K bytes per token (all layers), the long-context growth.
    compressed_bytes_per_token: f64,
    /// Compressor state per request (all layers).
    compressor_state_bytes_per_request: u64,
}

/// The document of `inspect --json`.
#[derive(Debug, Serialize)]
struct InspectJson {
    source: String,
    layers: usize,
    mtp_layers: usize,
    params: ParamsJson,
    cache: CacheJson,
}

fn params_json(p: &ParamCounts) -> ParamsJson {
    ParamsJson {
        total: p.total_main,
        active: p.active_main,
        embedding: p.embedding,
        head: p.head,
        mtp: p.mtp,
        mtp_active: p.mtp_active,
    }
}

fn cache_json(c: &CacheBytes) -> CacheJson {
    let buffer = |name, layers: u64, entry_bytes: u64, tokens_per_entry: u64| BufferJson {
        name,
        layers,
        entry_bytes,
        tokens_per_entry,
        bytes_per_token: (layers * entry_bytes) as f64 / tokens_per_entry as f64,
    };
    CacheJson {
        kv_cache_dtype: c.kv_dtype.to_string(),
        index_k_dtype: c.index_k_dtype.to_string(),
        buffers: vec![
            buffer("swa_kv", c.swa_layers, c.swa_bytes_per_token, 1),
            buffer("c4_kv", c.c4_layers, c.c4_bytes_per_4_tokens, 4),
            buffer("c4_index_k", c.c4_layers, c.index_k_bytes_per_4_tokens, 4),
            buffer("c128_kv", c.c128_layers, c.c128_bytes_per_128_tokens, 128),
        ],
        swa_window: c.swa_window,
        swa_cap_bytes: c.swa_cap_bytes,
        compressed_bytes_per_token: c.compressed_bytes_per_token,
        compressor_state_bytes_per_request: c.c4_state_bytes * c.c4_layers
            + c.c128_state_bytes * c.c128_layers,
    }
}

/// A count in human units: 284.3B, 13.1B, 529.6M, 12.0K, 512.
pub fn human_count(n: u64) -> String {
    let n = n as f64;
    for (scale, unit) in [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")] {
        if n >= scale {
            return format!("{:.1}{unit}", n / scale);
        }
    }
    format!("{n}")
}

/// A byte size in binary units: 584 B, 24.5 KiB, 3.1 MiB.
pub fn human_bytes(n: f64) -> String {
    for (scale, unit) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if n >= scale as f64 {
            return format!("{:.1} {unit}", n / scale as f64);
        }
    }
    if n.fract() == 0.0 {
        format!("{n} B")
    } else {
        format!("{n:.1} B")
    }
}

/// The text of `inspect`.
fn text(doc: &InspectJson) -> String {
    let p = &doc.params;
    let c = &doc.cache;
    let mut out = format!(
        "model: {} ({} layers + {} MTP)\n\nparameters\n",
        doc.source, doc.layers, doc.mtp_layers
    );
    let rows = [
        ("total (main model, MTP excluded)", p.total),
        ("active per token (embedding excluded)", p.active),
        ("embedding table", p.embedding),
        ("output head", p.head),
        ("MTP layer(s)", p.mtp),
        ("MTP active per draft step", p.mtp_active),
    ];
    for (what, n) in rows {
        out.push_str(&format!("  {what:<40} {:>9}  ({n})\n", human_count(n)));
    }
    out.push_str(&format!(
        "\ncache per token (kv_cache_dtype={}, index_k_dtype={})\n",
        c.kv_cache_dtype, c.index_k_dtype
    ));
    for b in &c.buffers {
        out.push_str(&format!(
            "  {:<12} {:>4} B/entry, 1 entry per {:>3} token(s), {:>3} layers: {:>12} per token\n",
            b.name,
            b.entry_bytes,
            b.tokens_per_entry,
            b.layers,
            human_bytes(b.bytes_per_token)
        ));
    }
    out.push_str(&format!(
        "  swa_kv stops growing at {} tokens ({} per request); compressed KV + index-K grow {} \
         per token; compressor state {} per request\n",
        c.swa_window,
        human_bytes(c.swa_cap_bytes as f64),
        human_bytes(c.compressed_bytes_per_token),
        human_bytes(c.compressor_state_bytes_per_request as f64)
    ));
    out
}

/// Run `dsv4 model inspect`.
pub fn inspect(args: &InspectArgs, profile: &Profile) -> anyhow::Result<()> {
    let (cfg, source) = load_config(args, profile)?;
    let numerics = profile.numerics();
    let cache = cache_bytes(&cfg, numerics.kv_cache_dtype, numerics.index_k_dtype)
        .with_context(|| format!("cannot size the caches of {source} ({numerics})"))?;
    let doc = InspectJson {
        layers: cfg.num_hidden_layers,
        mtp_layers: cfg.num_nextn_predict_layers,
        params: params_json(&count_params(&cfg)),
        cache: cache_json(&cache),
        source,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", text(&doc));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_count(284_300_000_000), "284.3B");
        assert_eq!(human_count(13_049_999_999), "13.0B");
        assert_eq!(human_count(1_500), "1.5K");
        assert_eq!(human_count(999), "999");
        assert_eq!(human_bytes(584.0), "584 B");
        assert_eq!(human_bytes(2048.0), "2.0 KiB");
        assert_eq!(human_bytes(0.5), "0.5 B");
        assert_eq!(human_bytes(91.25), "91.2 B");
    }
}

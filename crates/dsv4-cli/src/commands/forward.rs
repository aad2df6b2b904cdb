//! `dsv4 model forward`: run a prefill over given token ids and write the logits as .npy, and
//! optionally the indexer's selections as JSON. Also the helpers `generate` and `serve` share:
//! where the model comes from, its tokenizer, and opening it on the profile's backend.

use anyhow::Context;
use dsv4_chat::Tokenizer;
use dsv4_kernels::registry::{self, BackendOptions};
use dsv4_model::forward::Model;
use dsv4_model::load::{ModelSource, load_model};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

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

/// The model a command runs: `--model DIR` if given, else the profile's `[model]`, on the
/// profile's backend with its numerics and execution options.
pub fn open_model(
    model_dir: Option<&Path>,
    profile: &dsv4_config::Profile,
) -> anyhow::Result<(Model, ModelSource)> {
    let source = model_source(model_dir, profile);
    let backend = registry::create(&profile.backend.kind, &backend_options(profile))?;
    tracing::info!(backend = backend.name(), numerics = %profile.numerics(), ?source, "loading model");
    let mut model = load_model(&source, backend, profile.numerics())
        .with_context(|| format!("cannot load the model ({source:?})"))?;
    // The profile's execution mode (captured plans, multi-stream overlap, injected faults).
    model.set_exec(super::plan::exec_options(profile)?);
    Ok((model, source))
}

/// Where a command's model comes from: `--model DIR` if given, else the profile's `[model]`.
pub fn model_source(model_dir: Option<&Path>, profile: &dsv4_config::Profile) -> ModelSource {
    match model_dir {
        Some(dir) => ModelSource::Dir(dir.to_path_buf()),
        None => match profile.model.source() {
            dsv4_config::ModelSource::Tiny { seed } => ModelSource::Tiny { seed },
            dsv4_config::ModelSource::Dir(dir) => ModelSource::Dir(dir),
        },
    }
}

/// The tokenizer of a model source: the embedded tiny one, or `DIR/tokenizer.json`.
pub fn tokenizer_for(source: &ModelSource) -> anyhow::Result<Tokenizer> {
    match source {
        ModelSource::Tiny { .. } => Ok(Tokenizer::tiny()?),
        ModelSource::Dir(dir) => {
            let path = dir.join("tokenizer.json");
            Tokenizer::from_file(&path).with_context(|| format!("cannot load {}", path.display()))
        }
    }
}

/// The options the profile creates its backends with (`[backend]`, `exec.threads`).
pub fn backend_options(profile: &dsv4_config::Profile) -> BackendOptions {
    BackendOptions {
        threads: profile.exec.threads,
        device: profile.backend.device.clone(),
        f64_sums: profile.backend.cuda_sums.f64_sums(),
        cpu_f32_sums: profile.backend.cpu_sums == dsv4_config::CpuSums::F32,
        tensor_core_linears: profile.backend.cuda_linear.tensor_cores(),
        device_routing: profile.backend.cuda_routing.on_device(),
        device_attention: profile.backend.cuda_attention.on_device(),
        page_cache_mib: profile.backend.cuda_page_cache_mib.count(),
        // `auto` (or nothing) leaves the shapes to the backend.
        decode_shapes: Some(profile.backend.cuda_decode.trim())
            .filter(|s| !s.is_empty() && *s != "auto")
            .map(str::to_string),
        check_cached_pages: profile.debug.canary.iter().any(|p| {
            matches!(
                p,
                dsv4_config::CanaryPool::Kv | dsv4_config::CanaryPool::IndexK
            )
        }),
    }
}

/// Write f32 values of `shape` as a NumPy .npy (format 1.0, little-endian, C order).
pub fn write_npy(path: &Path, shape: &[usize], values: &[f32]) -> anyhow::Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Magic (6) + version (2) + header length (2) + header + '\n' must be a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.div_ceil(64) * 64 - unpadded));
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + values.len() * 4);
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in values {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let mut f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(&bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Run `dsv4 model forward`.
pub fn run(args: &ForwardArgs, profile: &dsv4_config::Profile) -> anyhow::Result<()> {
    super::check_output_path("--out", &args.out)?;
    if let Some(path) = &args.dump_topk {
        super::check_output_path("--dump-topk", path)?;
    }
    let (model, _) = open_model(args.model.as_deref(), profile)?;
    let mut seq = model.new_sequence();
    let out = model.forward(&mut seq, &args.tokens)?;
    let t = args.tokens.len();
    write_npy(&args.out, &[t, out.vocab], &out.logits)?;
    eprintln!(
        "wrote logits [{t}, {}] to {}",
        out.vocab,
        args.out.display()
    );
    if let Some(path) = &args.dump_topk {
        let layers: BTreeMap<String, &Vec<Vec<u32>>> =
            out.topk.iter().map(|(l, v)| (l.to_string(), v)).collect();
        let doc = serde_json::json!({
            "tokens": args.tokens,
            "index_topk": model.cfg.index_topk,
            "layers": layers,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!(
            "wrote indexer selections of {} ratio-4 layers to {}",
            out.topk.len(),
            path.display()
        );
    }
    Ok(())
}

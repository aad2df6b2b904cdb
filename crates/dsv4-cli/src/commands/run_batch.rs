//! `dsv4 run-batch`: an OpenAI Batch API input file (JSONL of `{"custom_id", "method", "url",
//! "body"}`) run offline through the server's own routes (vLLM's `run-batch`), writing OpenAI's
//! batch output lines in input order. The file is checked before the model loads; progress goes
//! to stderr. Any of the files may be an http(s) URL (`remote.rs`).

mod remote;

use super::check_output_path;
use super::engine_config::engine_config;
use super::forward::{model_source, tokenizer_for};
use super::serve::{Engine, ServeArgs, load, model_id, server_config};
use anyhow::{Context, bail};
use dsv4_config::Resolved;
use dsv4_server::AppState;
use dsv4_server::batch::{self, Options, Sinks, Summary};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the progress line is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Arguments of `dsv4 run-batch` (the profile comes from the global --profile and --set).
#[derive(Debug, clap::Args)]
pub struct RunBatchArgs {
    /// The batch input file (JSONL, one `{"custom_id", "method": "POST", "url", "body"}` per
    /// line; url /v1/chat/completions, /v1/completions or /v1/responses); `-` reads stdin; an
    /// http(s) URL is downloaded.
    #[arg(short = 'i', long = "input-file", value_name = "FILE|URL")]
    pub input: PathBuf,
    /// Where the output lines go (JSONL, one per input line, in input order); `-` is stdout; an
    /// http(s) URL gets the file with PUT once the batch has run (kept locally if that fails).
    #[arg(short = 'o', long = "output-file", value_name = "FILE|URL")]
    pub output: PathBuf,
    /// Write failed lines here instead of into the output file, as OpenAI splits a batch's
    /// output and error files (a file, or an http(s) URL as for --output-file).
    #[arg(long, value_name = "FILE|URL")]
    pub error_file: Option<PathBuf>,
    /// Checkpoint directory; the profile's model.path when omitted ("tiny": the embedded model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The model id the bodies' `model` must name (default: "dsv4-tiny" for the embedded model,
    /// the checkpoint directory's name otherwise).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Times to try an upload to a URL again after a failure that may pass (no answer, 408,
    /// 429 or 5xx), waiting 1 s, then twice as long each time (vLLM tries 5 times in all).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub upload_retries: u32,
    /// Requests in flight at once (default: twice scheduler.max_running_requests).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrency: Option<u32>,
    /// Print the summary as one JSON object on stdout (not with `-o -`).
    #[arg(long)]
    pub json: bool,
    /// No progress lines on stderr.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Run the batch file through the profile's model.
pub fn run(args: &RunBatchArgs, resolved: &Resolved) -> anyhow::Result<()> {
    let to_stdout = args.output == Path::new("-");
    if args.json && to_stdout {
        bail!("--json prints the summary on stdout, where `-o -` writes the output; pick one");
    }
    let serve = ServeArgs {
        engine: Engine::Native,
        port: None,
        host: None,
        model: args.model.clone(),
        served_model_name: args.served_model_name.clone(),
    };
    let id = model_id(&serve, resolved);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let text = match remote::url(&args.input) {
        Some(url) => utf8(runtime.block_on(remote::download(url))?, &args.input)?,
        None => read_input(&args.input)?,
    };
    let items = batch::parse(&text, &id, None)
        .with_context(|| format!("{}: nothing has run", args.input.display()))?;
    let engine = engine_config(&resolved.profile)?;
    let concurrency = args.max_concurrency.map_or_else(
        || engine.max_running_requests.saturating_mul(2),
        |n| n as usize,
    );
    let (mut output, output_upload) = open_output("--output-file", &args.output)?;
    let (mut errors, error_upload) = match &args.error_file {
        Some(path) if path == Path::new("-") => {
            bail!("--error-file needs a file; failed lines go to the output when it is not given")
        }
        Some(path) => {
            let (sink, upload) = open_output("--error-file", path)?;
            (Some(sink), upload)
        }
        None => (None, None),
    };
    let mut cfg = server_config(&serve, resolved, id.clone())?;
    // Nothing listens: no key to check, and no server's response directory to write into.
    cfg.api_key = None;
    cfg.responses_dir = None;
    cfg.files_dir = None;
    // No interactive requests to pause lines for: --max-concurrency alone bounds them.
    cfg.batch_fill_idle = None;
    let tok = tokenizer_for(&model_source(args.model.as_deref(), &resolved.profile))?;
    if !args.quiet {
        eprintln!(
            "run-batch: {} requests from {}; loading model {id} (profile {})",
            items.len(),
            args.input.display(),
            resolved.requested
        );
    }
    let loaded = load(args.model.as_deref(), resolved, tok)?;
    // `set_ready` starts the step-loop watch, a task of this runtime.
    let _entered = runtime.enter();
    let state = AppState::new(cfg)?;
    state.set_ready(loaded);
    let opts = Options::new(concurrency, id_prefix());
    let started = Instant::now();
    let mut last = started;
    let quiet = args.quiet;
    let summary = runtime
        .block_on(batch::run(
            &state,
            items,
            &opts,
            Sinks {
                output: &mut *output,
                errors: errors.as_mut().map(|e| &mut **e as &mut (dyn Write + Send)),
            },
            |s| {
                if !quiet && (last.elapsed() >= PROGRESS_EVERY || s.done == s.total) {
                    last = Instant::now();
                    eprintln!("{}", progress_line(s, started.elapsed()));
                }
            },
        ))
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    output
        .flush()
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    if let Some(e) = errors.as_mut() {
        e.flush().context("cannot write the --error-file")?;
    }
    drop((output, errors));
    for upload in output_upload.iter().chain(&error_upload) {
        if !quiet {
            eprintln!("run-batch: uploading {}", upload.url);
        }
        runtime.block_on(upload.send(args.upload_retries, |why| {
            if !quiet {
                eprintln!("run-batch: {why}");
            }
        }))?;
    }
    let tokens = summary.tokens;
    let output_per_s = tokens.output as f64 / seconds.max(1e-9);
    if args.json {
        let report = serde_json::json!({
            "total": summary.total,
            "succeeded": summary.succeeded,
            "failed": summary.failed,
            "seconds": seconds,
            "usage": tokens.usage(),
            "output_tokens_per_s": output_per_s,
            "output_file": args.output,
            "error_file": args.error_file,
        });
        println!("{report}");
    }
    if !quiet {
        eprintln!(
            "run-batch: done: {} succeeded, {} failed, in {seconds:.1} s; {} prompt tokens ({} \
             cached), {} generated ({output_per_s:.0}/s); output {}{}",
            summary.succeeded,
            summary.failed,
            tokens.input,
            tokens.cached,
            tokens.output,
            args.output.display(),
            args.error_file
                .as_ref()
                .map_or(String::new(), |e| format!(", failed lines {}", e.display()))
        );
    }
    Ok(())
}

/// The whole input (a file or stdin), as UTF-8.
fn read_input(path: &Path) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("cannot read the batch from stdin")?;
    } else {
        File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .with_context(|| format!("cannot read the batch file {}", path.display()))?;
    }
    utf8(bytes, path)
}

/// The batch file read from `path`, as UTF-8 text.
fn utf8(bytes: Vec<u8>, path: &Path) -> anyhow::Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 text (first bad byte at offset {}); a batch file is JSONL",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// A writer for output lines.
type Sink = Box<dyn Write + Send>;

/// An output sink opened before the model loads, so a bad path fails at once; for a URL, the
/// local file it is written to and the upload that sends it afterwards.
fn open_output(flag: &str, path: &Path) -> anyhow::Result<(Sink, Option<remote::Upload>)> {
    if path == Path::new("-") {
        return Ok((Box::new(BufWriter::new(std::io::stdout())), None));
    }
    if let Some(url) = remote::url(path) {
        let kind = if flag == "--error-file" {
            "error"
        } else {
            "output"
        };
        let upload = remote::Upload::new(kind, url);
        let file = File::create(&upload.local).with_context(|| {
            format!(
                "{flag} {url}: cannot create the local file {}",
                upload.local.display()
            )
        })?;
        return Ok((Box::new(BufWriter::new(file)), Some(upload)));
    }
    check_output_path(flag, path)?;
    let file =
        File::create(path).with_context(|| format!("{flag} {}: cannot create", path.display()))?;
    Ok((Box::new(BufWriter::new(file)), None))
}

/// `batch_req_{hex}`: the output ids' prefix, from the clock, so two runs' ids differ.
fn id_prefix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("batch_req_{:x}", nanos & 0xffff_ffff_ffff)
}

/// One progress line: how far, how fast, how long still.
fn progress_line(s: &Summary, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let rate = s.done as f64 / secs;
    let left = if rate > 0.0 && s.done < s.total {
        format!(", about {:.0} s left", (s.total - s.done) as f64 / rate)
    } else {
        String::new()
    };
    format!(
        "run-batch: {}/{} answered ({} failed), {rate:.1} requests/s{left}",
        s.done, s.total, s.failed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_says_how_far_and_how_long_still() {
        let s = Summary {
            total: 10,
            done: 4,
            succeeded: 3,
            failed: 1,
            ..Summary::default()
        };
        assert_eq!(
            progress_line(&s, Duration::from_secs(2)),
            "run-batch: 4/10 answered (1 failed), 2.0 requests/s, about 3 s left"
        );
        let done = Summary { done: 10, ..s };
        assert!(!progress_line(&done, Duration::from_secs(5)).contains("left"));
    }

    #[test]
    fn input_that_is_not_text_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.jsonl");
        std::fs::write(&path, b"{\"a\": 1}\n\xff\xfe").unwrap();
        let e = read_input(&path).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && e.contains("offset 9"), "{e}");
        let e = read_input(&dir.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("cannot read the batch file"), "{e}");
    }
}

//! `dsv4 serve`: serve the profile's model over HTTP. The native engine is dsv4's own
//! OpenAI-compatible server (crate dsv4-server): it binds first (printing the URL, so `--port 0`
//! can be read back), loads the model while `/health` answers 503 "loading", and drains on
//! SIGTERM. `--engine sglang` replaces this process with the SGLang launch command that
//! reproduces the profile (`dsv4 profile export NAME --target sglang`).

use super::engine_config::engine_config;
use super::forward::{model_source, open_model, tokenizer_for};
use anyhow::{Context, bail};
use dsv4_chat::Tokenizer;
use dsv4_config::export::{PYTHON, SglangCommand, sglang};
use dsv4_config::{Profile, ReasoningParser, Resolved, ToolCallParser};
use dsv4_server::tls::TlsFiles;
use dsv4_server::{
    AppState, Loaded, OutputParsing, RequestPriority, Server, ServerConfig, shutdown_signal,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `dsv4 serve` (the profile comes from the global --profile and --set).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Which engine serves: dsv4's own server (`native`) or SGLang.
    #[arg(long, value_enum, default_value_t = Engine::Native)]
    pub engine: Engine,
    /// Port to listen on, overriding server.port; 0 picks a free port (the bound address is
    /// printed on stdout).
    #[arg(long)]
    pub port: Option<u16>,
    /// Address to listen on, overriding server.host.
    #[arg(long)]
    pub host: Option<String>,
    /// Checkpoint directory; the profile's model.path when omitted ("tiny": the embedded model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The model id clients send as `model` (default: "dsv4-tiny" for the embedded model, the
    /// checkpoint directory's name otherwise).
    #[arg(long)]
    pub served_model_name: Option<String>,
}

/// The engines `dsv4 serve` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// dsv4's built-in OpenAI-compatible server.
    Native,
    /// SGLang, launched with the profile exported to its flags and environment.
    Sglang,
}

/// Serve the resolved profile with the chosen engine.
pub fn run(args: &ServeArgs, resolved: &Resolved) -> anyhow::Result<()> {
    match args.engine {
        Engine::Native => serve_native(args, resolved),
        Engine::Sglang => {
            if args.port.is_some()
                || args.host.is_some()
                || args.model.is_some()
                || args.served_model_name.is_some()
            {
                bail!(
                    "--port, --host, --model and --served-model-name apply to the native engine; \
                     with --engine sglang set the profile keys instead (e.g. --set server.port=8001)"
                );
            }
            exec_sglang(&sglang(resolved))
        }
    }
}

/// The server options of the profile and the command line.
pub(crate) fn server_config(
    args: &ServeArgs,
    resolved: &Resolved,
    model_id: String,
) -> anyhow::Result<ServerConfig> {
    let s = &resolved.profile.server;
    Ok(ServerConfig {
        host: args.host.clone().unwrap_or_else(|| s.host.clone()),
        port: args.port.unwrap_or(s.port),
        api_key: s.api_key.clone(),
        max_request_bytes: usize::try_from(s.max_request_bytes)
            .context("server.max_request_bytes is too large for this machine")?,
        health_stall: Duration::from_secs(s.health_stall_s),
        responses_store: usize::try_from(s.responses_store)
            .context("server.responses_store is too large for this machine")?,
        responses_store_bytes: usize::try_from(s.responses_store_mib << 20)
            .context("server.responses_store_mib is too large for this machine")?,
        responses_dir: s.responses_dir.clone().map(Into::into),
        files_bytes: usize::try_from(s.files_mib << 20)
            .context("server.files_mib is too large for this machine")?,
        files_dir: s.files_dir.clone().map(Into::into),
        batch_max_running: usize::try_from(s.batch_max_running)
            .context("server.batch_max_running is too large for this machine")?,
        batch_fill_idle: (s.batch_fill_idle_ms > 0)
            .then(|| Duration::from_millis(s.batch_fill_idle_ms)),
        request_priority: match s.request_priority {
            dsv4_config::RequestPriority::Use => RequestPriority::Use,
            dsv4_config::RequestPriority::Ignore => RequestPriority::Ignore,
            dsv4_config::RequestPriority::Refuse => RequestPriority::Refuse,
        },
        // The rule tls-needs-cert-and-key refuses one without the other before this runs.
        tls: match (&s.ssl_certfile, &s.ssl_keyfile) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                certfile: cert.into(),
                keyfile: key.into(),
                ca_certs: s.ssl_ca_certs.clone().map(Into::into),
                refresh: (s.ssl_refresh_s > 0).then(|| Duration::from_secs(s.ssl_refresh_s)),
            }),
            _ => None,
        },
        max_queued_requests: usize::try_from(resolved.profile.scheduler.max_queued_requests)
            .context("scheduler.max_queued_requests is too large for this machine")?,
        model_id,
        output: OutputParsing::from_switches(
            s.tool_call_parser == ToolCallParser::DeepseekV4,
            s.reasoning_parser == ReasoningParser::DeepseekV4,
        )?,
        thinking_token_budget: s.thinking_token_budget.count(),
        profile_name: Some(resolved.requested.clone()),
        profile_sha256: Some(profile_sha256(resolved)),
        profile_settings: Some(resolved.nested_json()),
        model_path: model_path(args, resolved),
    })
}

/// Where the weights come from: `--model`, else the profile's `model.path` (`tiny` for the
/// embedded model).
fn model_path(args: &ServeArgs, resolved: &Resolved) -> String {
    model_dir(args, resolved).map_or_else(|| "tiny".into(), |d| d.display().to_string())
}

/// The checkpoint directory: `--model`, else the profile's; `None` for the embedded model.
fn model_dir(args: &ServeArgs, resolved: &Resolved) -> Option<PathBuf> {
    match (&args.model, resolved.profile.model.source()) {
        (Some(dir), _) => Some(dir.clone()),
        (None, dsv4_config::ModelSource::Dir(dir)) => Some(dir),
        (None, dsv4_config::ModelSource::Tiny { .. }) => None,
    }
}

/// What `dsv4 serve` prints of how it admits requests: running slots, the batches' share,
/// the queue limit and what priorities do (the keys are in docs/profiles.md).
fn scheduling_line(cfg: &ServerConfig, profile: &Profile, max_running: usize) -> String {
    let mut batches = match cfg.batch_max_running {
        0 => format!("up to {max_running} lines"),
        n if n > max_running => format!(
            "up to {max_running} lines (server.batch_max_running = {n} is more than the slots)"
        ),
        n => format!("up to {n} lines"),
    };
    if let Some(idle) = cfg.batch_fill_idle {
        let ms = idle.as_millis();
        if (1..max_running).contains(&cfg.batch_max_running) {
            batches += &format!(", all {max_running} after {ms} ms without interactive requests");
        } else {
            batches += &format!(
                " (server.batch_fill_idle_ms = {ms} has no slot to fill: the share is every slot)"
            );
        }
    }
    let queue = match cfg.max_queued_requests {
        0 => "unlimited".to_string(),
        n => format!("503 past {n} waiting"),
    };
    let priority = match cfg.request_priority {
        RequestPriority::Use => "used",
        RequestPriority::Ignore => "ignored",
        RequestPriority::Refuse => "refused",
    };
    let sched = &profile.scheduler;
    let preemption = if sched.priority_preemption {
        format!("on past a gap of {}", sched.priority_preemption_threshold)
    } else {
        "off".to_string()
    };
    format!(
        "dsv4 serve: scheduling: {max_running} running slots; batches {batches}; queue \
         {queue}; request priorities {priority}; priority preemption {preemption}"
    )
}

/// SHA-256 (hex) of the resolved profile: every key with its value, one `key=value` line each,
/// in the schema's key order (secrets are already redacted in the settings).
fn profile_sha256(resolved: &Resolved) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for s in &resolved.settings {
        h.update(format!("{}={}\n", s.key, s.value).as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The model id: `--served-model-name`, else "dsv4-tiny" or the checkpoint directory's name.
pub(crate) fn model_id(args: &ServeArgs, resolved: &Resolved) -> String {
    if let Some(name) = &args.served_model_name {
        return name.clone();
    }
    let Some(dir) = model_dir(args, resolved) else {
        return "dsv4-tiny".into();
    };
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Load the model and start the engine with `tok` (blocking; runs beside the server).
pub(crate) fn load(
    model_dir: Option<&Path>,
    resolved: &Resolved,
    tok: Tokenizer,
) -> anyhow::Result<Loaded> {
    let profile = &resolved.profile;
    let cfg = engine_config(profile)?;
    let (model, _) = open_model(model_dir, profile)?;
    let debug = super::plan::debug_options(profile);
    let grammar_cache = usize::try_from(profile.server.grammar_cache)
        .context("server.grammar_cache is too large for this machine")?;
    let loaded = Loaded::new(Arc::new(model), tok, cfg, debug, grammar_cache)?;
    tracing::info!(pools = %loaded.engine.pool_report(), "engine started");
    Ok(loaded)
}

/// Serve with dsv4's own server until SIGTERM or Ctrl-C, then drain.
fn serve_native(args: &ServeArgs, resolved: &Resolved) -> anyhow::Result<()> {
    let id = model_id(args, resolved);
    let cfg = server_config(args, resolved, id.clone())?;
    // What can fail fast does before the port opens: the engine options and the tokenizer (a
    // missing tokenizer.json). Only the weight load runs beside the listening server.
    let max_running = engine_config(&resolved.profile)?.max_running_requests;
    let tok = tokenizer_for(&model_source(args.model.as_deref(), &resolved.profile))?;
    let has_key = cfg.api_key.is_some();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let state = AppState::new(cfg)?;
        let server = Server::bind(state.clone()).await?;
        let url = server.url();
        let auth = if has_key {
            " -H \"Authorization: Bearer $DSV4_API_KEY\""
        } else {
            ""
        };
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "dsv4 serve: listening on {url} (model {id}, profile {}; loading the model)",
            resolved.requested
        )?;
        writeln!(
            out,
            "try: curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d \
             '{{\"model\": \"{id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}], \
             \"max_tokens\": 16}}'"
        )?;
        writeln!(out, "{}", scheduling_line(state.cfg(), &resolved.profile, max_running))?;
        if let Some(dir) = &state.cfg().responses_dir {
            writeln!(
                out,
                "dsv4 serve: {} stored responses read back from {} (server.responses_dir)",
                state.responses().len(),
                dir.display()
            )?;
        }
        if let Some(dir) = &state.cfg().files_dir {
            writeln!(
                out,
                "dsv4 serve: {} files and {} batches read back from {} (server.files_dir)",
                state.files().len(),
                state.batches().all().len(),
                dir.display()
            )?;
            let unfinished = state.batches().running();
            if unfinished > 0 {
                writeln!(
                    out,
                    "dsv4 serve: {unfinished} batches had not ended; they go on from their last \
                     answered line once the model is loaded"
                )?;
            }
        }
        out.flush()?;
        drop(out);
        let serving = tokio::spawn(server.run(shutdown_signal()));
        let model_dir = args.model.clone();
        let resolved_owned = resolved.clone();
        let loaded =
            tokio::task::spawn_blocking(move || load(model_dir.as_deref(), &resolved_owned, tok))
            .await
            .context("the model loader panicked")??;
        state.set_ready(loaded);
        println!("dsv4 serve: ready ({url}/health answers 200)");
        serving.await.context("the server task panicked")??;
        Ok(())
    })
}

/// Check the command can run and SGLang is importable, print the warnings, then exec it.
fn exec_sglang(cmd: &SglangCommand) -> anyhow::Result<()> {
    if !cmd.runnable() {
        let reasons: Vec<String> = cmd
            .blockers
            .iter()
            .map(|b| format!("{} = {}: {}", b.key, b.value, b.message))
            .collect();
        bail!(
            "profile `{}` cannot run on SGLang: {}",
            cmd.profile,
            reasons.join("; ")
        );
    }
    check_sglang_importable(&cmd.profile)?;
    for w in &cmd.warnings {
        eprintln!(
            "warning: not reproduced on SGLang: {} = {}: {}",
            w.key, w.value, w.message
        );
    }
    let argv = cmd.argv();
    tracing::info!(argv = ?argv, env = ?cmd.env, "starting SGLang");
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    command.envs(cmd.env.iter().map(|(k, v)| (k, v)));
    exec(command, &argv)
}

/// Fail with a clear message unless `python3 -c "import sglang"` succeeds.
fn check_sglang_importable(profile: &str) -> anyhow::Result<()> {
    let alternative = format!(
        "install SGLang for {PYTHON} (`{PYTHON} -m pip install sglang`), or run `dsv4 profile \
         export {profile} --target sglang --format sh` and start the script where SGLang is \
         installed"
    );
    let output = match Command::new(PYTHON).args(["-c", "import sglang"]).output() {
        Ok(output) => output,
        Err(e) => bail!("cannot run `{PYTHON}` to start SGLang ({e}); {alternative}"),
    };
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let reason = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no error output")
        .trim();
    bail!(
        "SGLang is not available: `{PYTHON} -c \"import sglang\"` failed ({reason}); {alternative}"
    )
}

/// Replace this process with `command` (on Unix); elsewhere run it and return its status.
#[cfg(unix)]
fn exec(mut command: Command, argv: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let error = command.exec();
    Err(error).with_context(|| format!("could not start `{}`", argv.join(" ")))
}

/// Replace this process with `command` (on Unix); elsewhere run it and return its status.
#[cfg(not(unix))]
fn exec(mut command: Command, argv: &[String]) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("could not start `{}`", argv.join(" ")))?;
    if !status.success() {
        bail!("SGLang exited with {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheduling_line_says_each_limit_and_when_the_batch_share_is_capped() {
        let mut profile = Profile::default();
        let mut cfg = ServerConfig::default();
        assert_eq!(
            scheduling_line(&cfg, &profile, 64),
            "dsv4 serve: scheduling: 64 running slots; batches up to 64 lines; queue unlimited; \
             request priorities used; priority preemption off"
        );
        cfg.batch_max_running = 16;
        cfg.max_queued_requests = 8;
        cfg.request_priority = RequestPriority::Refuse;
        profile.scheduler.priority_preemption = true;
        profile.scheduler.priority_preemption_threshold = 2;
        assert_eq!(
            scheduling_line(&cfg, &profile, 64),
            "dsv4 serve: scheduling: 64 running slots; batches up to 16 lines; queue 503 past 8 \
             waiting; request priorities refused; priority preemption on past a gap of 2"
        );
        cfg.batch_fill_idle = Some(Duration::from_millis(1500));
        assert!(scheduling_line(&cfg, &profile, 64).contains(
            "batches up to 16 lines, all 64 after 1500 ms without interactive requests; "
        ));
        cfg.batch_max_running = 100;
        assert!(scheduling_line(&cfg, &profile, 64).contains(
            "batches up to 64 lines (server.batch_max_running = 100 is more than the slots) \
             (server.batch_fill_idle_ms = 1500 has no slot to fill: the share is every slot)"
        ));
    }

    #[test]
    fn the_server_reports_the_model_path_and_every_setting_without_secrets() {
        let mut opts = dsv4_config::ResolveOptions::new("dev-cpu");
        opts.search.local_dir = None;
        opts.sets = vec!["server.api_key=hunter2".into()];
        let resolved = dsv4_config::resolve(&opts).unwrap();
        let mut args = ServeArgs {
            engine: Engine::Native,
            port: None,
            host: None,
            model: None,
            served_model_name: None,
        };
        let cfg = server_config(&args, &resolved, "dsv4-tiny".into()).unwrap();
        assert_eq!(cfg.model_path, "tiny");
        assert_eq!(
            cfg.api_key.as_deref(),
            Some("hunter2"),
            "the key still guards"
        );
        let settings = cfg.profile_settings.unwrap();
        assert_eq!(settings, resolved.nested_json());
        assert!(!settings.to_string().contains("hunter2"), "{settings}");
        assert_eq!(
            settings["scheduler"]["max_running_requests"],
            json_value(&resolved, "scheduler.max_running_requests")
        );
        args.model = Some("/models/DeepSeek-V4-Flash".into());
        let cfg = server_config(&args, &resolved, "x".into()).unwrap();
        assert_eq!(cfg.model_path, "/models/DeepSeek-V4-Flash");
    }

    /// The resolved value of `key`.
    fn json_value(resolved: &Resolved, key: &str) -> serde_json::Value {
        resolved.setting(key).unwrap().value.clone()
    }
}

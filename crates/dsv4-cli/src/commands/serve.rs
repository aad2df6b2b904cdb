//! `dsv4 serve`: serve the profile's model over HTTP. The built-in server is a later issue; today
//! `--engine sglang` replaces this process with the SGLang launch command that reproduces the
//! profile (`dsv4 profile export NAME --target sglang`).

use anyhow::{Context, bail};
use dsv4_config::Resolved;
use dsv4_config::export::{PYTHON, SglangCommand, sglang};
use std::process::Command;

/// Arguments of `dsv4 serve` (the profile comes from the global --profile and --set).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Which engine serves: dsv4's own server (`native`, not available yet) or SGLang.
    #[arg(long, value_enum, default_value_t = Engine::Native)]
    pub engine: Engine,
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
        Engine::Native => bail!(
            "the built-in server is not available yet; use --engine sglang to serve profile `{}` \
             with SGLang (see `dsv4 profile export {} --target sglang`)",
            resolved.requested,
            resolved.requested
        ),
        Engine::Sglang => exec_sglang(&sglang(resolved)),
    }
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

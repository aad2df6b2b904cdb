//! `dsv4 ab`: compare two dsv4 configurations (or servers) under the same stress workload
//! (crate dsv4-stress, module `ab`). Each booted arm is resolved here first, so a bad profile or
//! `--set` fails before anything starts, and its settings with their origins go into the bundle.
//!
//! Arms: `--a` is a profile name/path or a URL (default: the global `--profile`); `--a-set` adds
//! overrides to A. `--b` likewise; without `--b`, B is A's profile with A's overrides plus the
//! `--b-set` ones — "the same, with this change". Global `--set` applies to both arms.

use super::stress::WorkloadArgs;
use anyhow::{Context, bail};
use dsv4_config::{Origin, Profile, ResolveOptions, Resolved};
use dsv4_stress::ab::{AbOptions, ArmSpec, Target, run_ab_until};
use dsv4_stress::parse_duration;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `dsv4 ab`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example (the multi-stream aliasing fault, and the fix):\n  dsv4 ab --a dev-cpu \
    --a-set exec.cuda_graph=true --a-set exec.multi_stream_overlap=true \
    --a-set debug.inject=arena-ignores-streams --b-set exec.multi_stream_overlap=false \
    --oracle solo --stop-before-markup --sessions 32 --repeat 2 --json ab.json\n\
    The bundle (--json) is evidence for `dsv4 ledger record --evidence`. See docs/stress.md."
)]
pub struct AbArgs {
    /// Arm A (the baseline): a profile name or path, or the URL of a running server (default:
    /// the global --profile).
    #[arg(long, value_name = "PROFILE|URL")]
    pub a: Option<String>,
    /// An override for arm A only (repeatable), e.g. --a-set exec.multi_stream_overlap=true.
    #[arg(long = "a-set", value_name = "KEY=VALUE")]
    pub a_sets: Vec<String>,
    /// Arm B (the change): a profile name or path, or a URL (default: A's profile with A's
    /// overrides, then the --b-set ones).
    #[arg(long, value_name = "PROFILE|URL")]
    pub b: Option<String>,
    /// An override for arm B only (repeatable), e.g. --b-set exec.multi_stream_overlap=false.
    #[arg(long = "b-set", value_name = "KEY=VALUE")]
    pub b_sets: Vec<String>,
    /// Repeats; each boots a fresh server per arm, in the order A B.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// How long a server may take to answer /health with 200 after it is started (e.g. 120s).
    #[arg(long, value_parser = parse_duration, default_value = "300s")]
    pub boot_timeout: Duration,
    /// Write the evidence bundle (JSON, format dsv4-ab/1) to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// An arm before resolution.
enum ArmArg {
    Boot { profile: String, sets: Vec<String> },
    Url(String),
}

fn is_url(s: &str) -> bool {
    s.starts_with("http://") || s.starts_with("https://")
}

/// The two arms from the flags.
fn arms(args: &AbArgs, profile: &str, sets: &[String]) -> anyhow::Result<(ArmArg, ArmArg)> {
    let arm = |given: &str, own: &[String], flag: &str| -> anyhow::Result<ArmArg> {
        if is_url(given) {
            if !own.is_empty() {
                bail!("--{flag}-set cannot change a server given by URL ({given})");
            }
            return Ok(ArmArg::Url(given.to_owned()));
        }
        let mut all = sets.to_vec();
        all.extend(own.iter().cloned());
        Ok(ArmArg::Boot {
            profile: given.to_owned(),
            sets: all,
        })
    };
    let a = arm(args.a.as_deref().unwrap_or(profile), &args.a_sets, "a")?;
    let b = match (&args.b, &a) {
        (Some(b), _) => arm(b, &args.b_sets, "b")?,
        (None, ArmArg::Url(url)) => {
            bail!("arm A is the server at {url}: give --b (a profile or URL) for arm B")
        }
        (None, ArmArg::Boot { profile, sets }) => {
            if args.b_sets.is_empty() {
                bail!(
                    "arm B would be identical to A: give --b PROFILE|URL or at least one --b-set"
                );
            }
            let mut all = sets.clone();
            all.extend(args.b_sets.iter().cloned());
            ArmArg::Boot {
                profile: profile.clone(),
                sets: all,
            }
        }
    };
    Ok((a, b))
}

/// Resolve a booted arm (an error for a bad profile or override, before anything starts).
fn resolve(
    profile: &str,
    sets: &[String],
    dir: Option<&Path>,
    arm: &str,
) -> anyhow::Result<Resolved> {
    let opts = ResolveOptions::from_process(profile, dir.map(Path::to_path_buf), sets);
    Profile::resolve(&opts).with_context(|| format!("arm {arm}: profile {profile}"))
}

/// The configuration recorded in the bundle: files, the values that differ from the built-in
/// defaults with their origin and comment, and the whole resolved configuration.
fn config_json(r: &Resolved) -> serde_json::Value {
    let set: Vec<_> = r
        .settings
        .iter()
        .filter(|s| s.origin != Origin::Default)
        .collect();
    serde_json::json!({
        "requested": r.requested,
        "files": r.files,
        "settings": set,
        "resolved": r.nested_json(),
    })
}

/// `key=value` of every key whose value differs between the two resolved configurations.
fn differing(a: &Resolved, b: &Resolved) -> (Vec<String>, Vec<String>) {
    let (mut la, mut lb) = (Vec::new(), Vec::new());
    for sa in &a.settings {
        if let Some(sb) = b.setting(sa.key)
            && sa.value != sb.value
        {
            la.push(format!("{}={}", sa.key, sa.value_text()));
            lb.push(format!("{}={}", sb.key, sb.value_text()));
        }
    }
    (la, lb)
}

/// A shell-safe rendering of the command line.
fn command_line() -> String {
    let quote = |s: String| {
        if !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_=./:,@+".contains(c))
        {
            s
        } else {
            format!("'{}'", s.replace('\'', r"'\''"))
        }
    };
    std::iter::once("dsv4".to_owned())
        .chain(std::env::args().skip(1).map(quote))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run `dsv4 ab` with the global profile, profile directory and `--set` overrides.
pub fn run(
    args: &AbArgs,
    profile: &str,
    profile_dir: Option<&Path>,
    sets: &[String],
) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        super::check_output_path("--json", path)?;
    }
    let (a, b) = arms(args, profile, sets)?;
    let resolve_arm = |arm: &ArmArg, name: &str| -> anyhow::Result<Option<Resolved>> {
        match arm {
            ArmArg::Boot { profile, sets } => resolve(profile, sets, profile_dir, name).map(Some),
            ArmArg::Url(_) => Ok(None),
        }
    };
    let (ra, rb) = (resolve_arm(&a, "A")?, resolve_arm(&b, "B")?);
    let (mut la, mut lb) = match (&ra, &rb) {
        (Some(ra), Some(rb)) => differing(ra, rb),
        _ => (Vec::new(), Vec::new()),
    };
    if let (Some(_), Some(_)) = (&ra, &rb)
        && la.is_empty()
    {
        bail!("arms A and B resolve to the same configuration: nothing to compare");
    }
    let spec = |arm: ArmArg, resolved: Option<Resolved>, label: &mut Vec<String>| -> ArmSpec {
        let (target, fallback) = match arm {
            ArmArg::Url(url) => (Target::Url { url: url.clone() }, url),
            ArmArg::Boot { profile, sets } => {
                let text = std::iter::once(profile.clone())
                    .chain(sets.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(" ");
                (Target::Boot { profile, sets }, text)
            }
        };
        if label.is_empty() {
            label.push(fallback);
        }
        ArmSpec {
            label: label.join(", "),
            target,
            config: resolved
                .as_ref()
                .map_or(serde_json::Value::Null, config_json),
        }
    };
    let mut serve_extra = Vec::new();
    if let Some(dir) = profile_dir {
        serve_extra.push("--profile-dir".to_owned());
        serve_extra.push(dir.display().to_string());
    }
    let opts = AbOptions {
        a: spec(a, ra, &mut la),
        b: spec(b, rb, &mut lb),
        repeat: args.repeat,
        workload: args.workload.options("http://127.0.0.1:1", false),
        binary: std::env::current_exe().context("cannot find the dsv4 binary itself")?,
        serve_extra,
        boot_timeout: args.boot_timeout,
        command: command_line(),
        progress: !args.quiet,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // On SIGTERM or Ctrl-C the run is dropped, which kills the servers it booted (they would
    // otherwise outlive this process when only it receives the signal).
    let bundle = rt
        .block_on(run_ab_until(&opts, dsv4_server::shutdown_signal()))?
        .context("interrupted: the servers this run booted were stopped")?;
    // The summary first: a bundle that cannot be written (disk full) still shows the run.
    print!("{}", bundle.summary());
    if let Some(path) = &args.json {
        std::fs::write(path, bundle.to_json() + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("evidence bundle: {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: AbArgs,
    }

    fn parse(args: &[&str]) -> AbArgs {
        Wrap::try_parse_from(std::iter::once("ab").chain(args.iter().copied()))
            .unwrap()
            .args
    }

    fn boot(arm: ArmArg) -> (String, Vec<String>) {
        match arm {
            ArmArg::Boot { profile, sets } => (profile, sets),
            ArmArg::Url(url) => panic!("a URL arm: {url}"),
        }
    }

    #[test]
    fn b_is_a_plus_its_own_sets_and_global_sets_reach_both() {
        let args = parse(&["--a-set", "x.a=1", "--b-set", "x.b=2"]);
        let global = vec!["g.k=0".to_owned()];
        let (a, b) = arms(&args, "dev-cpu", &global).unwrap();
        assert_eq!(
            boot(a),
            ("dev-cpu".into(), vec!["g.k=0".into(), "x.a=1".into()])
        );
        assert_eq!(
            boot(b),
            (
                "dev-cpu".into(),
                vec!["g.k=0".into(), "x.a=1".into(), "x.b=2".into()]
            )
        );
        // An explicit --b does not inherit A's overrides.
        let args = parse(&[
            "--a", "p1", "--a-set", "x.a=1", "--b", "p2", "--b-set", "x.b=2",
        ]);
        let (a, b) = arms(&args, "dev-cpu", &[]).unwrap();
        assert_eq!(boot(a), ("p1".into(), vec!["x.a=1".into()]));
        assert_eq!(boot(b), ("p2".into(), vec!["x.b=2".into()]));
        // URLs are arms as they are.
        let args = parse(&["--a", "p1", "--b", "http://127.0.0.1:8000"]);
        let (_, b) = arms(&args, "dev-cpu", &["g.k=0".to_owned()]).unwrap();
        assert!(matches!(b, ArmArg::Url(u) if u == "http://127.0.0.1:8000"));
    }
}

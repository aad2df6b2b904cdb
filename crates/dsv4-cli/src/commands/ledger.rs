//! `dsv4 ledger ...`: record a validated profile change (or a hypothesis, or an observation) as one
//! git commit with its evidence, list and show records, verify the ledger, render incident docs.

use anyhow::{Context, bail};
use dsv4_ledger::{Ledger, RecordRequest, Status, find_root, render_all, verify};
use std::path::PathBuf;

/// Subcommands of `dsv4 ledger`.
#[derive(Debug, clap::Subcommand)]
pub enum LedgerCommand {
    /// Record a change (with the global --profile and one --set KEY=VALUE) or a hypothesis, commit it.
    Record(RecordArgs),
    /// List the records, oldest first.
    Log {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Repository (default: the one containing the current directory).
        #[arg(long, value_name = "DIR")]
        repo: Option<PathBuf>,
    },
    /// Print one record (id or unique prefix) and the records that supersede it.
    Show {
        /// The record id or a unique prefix of it.
        id: String,
        /// Print JSON instead of TOML.
        #[arg(long)]
        json: bool,
        /// Repository (default: the one containing the current directory).
        #[arg(long, value_name = "DIR")]
        repo: Option<PathBuf>,
    },
    /// Check records, evidence hashes, supersedes links, commit trailers, rendered docs, and that
    /// profile values differing from the defaults are justified by validated records.
    Verify {
        /// Fail on unjustified profile values too.
        #[arg(long)]
        strict: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Repository (default: the one containing the current directory).
        #[arg(long, value_name = "DIR")]
        repo: Option<PathBuf>,
    },
    /// Re-render every incident document into docs/incidents/ (working tree only; no commit).
    Render {
        /// Repository (default: the one containing the current directory).
        #[arg(long, value_name = "DIR")]
        repo: Option<PathBuf>,
    },
}

/// Arguments of `dsv4 ledger record` (the profile and the change come from the global --profile
/// and --set).
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// The incident this record belongs to (a file name: letters, digits, '-', '_', '.').
    #[arg(long)]
    incident: String,
    /// proposed, validated, falsified or superseded.
    #[arg(long)]
    status: String,
    /// One-line title.
    #[arg(long)]
    title: String,
    /// The hypothesis or finding, in prose.
    #[arg(long, default_value = "")]
    hypothesis: String,
    /// An evidence file (repeatable); `PATH@sha256:HEX` also checks its hash.
    #[arg(long, value_name = "FILE")]
    evidence: Vec<String>,
    /// A record this one supersedes (repeatable; id or unique prefix).
    #[arg(long, value_name = "ID")]
    supersedes: Vec<String>,
    /// The value the key must have now (refused otherwise).
    #[arg(long)]
    from: Option<String>,
    /// The record's date, UTC RFC 3339 (default: now).
    #[arg(long)]
    date: Option<String>,
    /// Record on a detached HEAD or an unborn branch.
    #[arg(long)]
    allow_detached: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Repository (default: the one containing the current directory).
    #[arg(long, value_name = "DIR")]
    repo: Option<PathBuf>,
}

/// Run a `dsv4 ledger` subcommand; `profile` and `sets` are the global --profile and --set.
pub fn run(cmd: &LedgerCommand, profile: &str, sets: &[String]) -> anyhow::Result<()> {
    match cmd {
        LedgerCommand::Record(args) => record(args, profile, sets),
        LedgerCommand::Log { json, repo } => log(&root(repo)?, *json),
        LedgerCommand::Show { id, json, repo } => show(&root(repo)?, id, *json),
        LedgerCommand::Verify { strict, json, repo } => verify_cmd(&root(repo)?, *strict, *json),
        LedgerCommand::Render { repo } => render(&root(repo)?),
    }
}

fn root(repo: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let start = match repo {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("reading the current directory")?,
    };
    Ok(find_root(&start)?)
}

fn record(args: &RecordArgs, profile: &str, sets: &[String]) -> anyhow::Result<()> {
    if sets.len() > 1 {
        bail!(
            "ledger record takes one --set KEY=VALUE per record (got {})",
            sets.len()
        );
    }
    let req = RecordRequest {
        profile: sets.first().map(|_| profile.to_string()),
        set: sets.first().cloned(),
        from: args.from.clone(),
        evidence: args.evidence.clone(),
        incident: args.incident.clone(),
        status: Status::parse(&args.status)?,
        title: args.title.clone(),
        hypothesis: args.hypothesis.clone(),
        supersedes: args.supersedes.clone(),
        allow_detached: args.allow_detached,
        date: args.date.clone(),
    };
    let out = dsv4_ledger::record(&root(&args.repo)?, &req)?;
    if args.json {
        let v = serde_json::json!({
            "record": out.record, "commit": out.commit, "subject": out.subject, "files": out.files,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{} {}", &out.commit[..12], out.subject);
        for f in &out.files {
            println!("  {f}");
        }
    }
    Ok(())
}

fn log(root: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let ledger = Ledger::load(root)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&ledger.records)?);
        return Ok(());
    }
    let superseded = ledger.superseded_by();
    for r in &ledger.records {
        let change = r.change.as_ref().map_or(String::new(), |c| {
            format!(" [{}: {}]", c.profile, c.summary())
        });
        let later = superseded.get(&r.id).map_or(String::new(), |s| {
            format!(" (superseded by {})", s.join(", "))
        });
        println!(
            "{}  {}  {:<10} {:<13} {}: {}{change}{later}",
            r.date,
            r.id,
            r.status.as_str(),
            r.kind.as_str(),
            r.incident,
            r.title
        );
    }
    Ok(())
}

fn show(root: &std::path::Path, id: &str, json: bool) -> anyhow::Result<()> {
    let ledger = Ledger::load(root)?;
    let rec = ledger.get(id)?;
    let later = ledger.superseded_by().remove(&rec.id).unwrap_or_default();
    if json {
        let v = serde_json::json!({ "record": rec, "superseded_by": later });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", rec.to_toml()?);
        if !later.is_empty() {
            println!("# superseded by (derived): {}", later.join(", "));
        }
    }
    Ok(())
}

fn verify_cmd(root: &std::path::Path, strict: bool, json: bool) -> anyhow::Result<()> {
    let report = verify(root)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for p in &report.problems {
            println!("error [{}]: {}", p.check, p.message);
        }
        for p in &report.unjustified {
            let level = if strict { "error" } else { "warning" };
            println!("{level} [{}]: {}", p.check, p.message);
        }
        println!(
            "{} record(s); {} problem(s); {} unjustified profile value(s)",
            report.records,
            report.problems.len(),
            report.unjustified.len()
        );
    }
    if !report.ok(strict) {
        bail!("ledger verify failed");
    }
    Ok(())
}

fn render(root: &std::path::Path) -> anyhow::Result<()> {
    let ledger = Ledger::load(root)?;
    for (path, text) in render_all(&ledger)? {
        let full = root.join(&path);
        let current = std::fs::read_to_string(&full).ok();
        if current.as_deref() == Some(text.as_str()) {
            println!("unchanged {path}");
            continue;
        }
        if let Some(dir) = full.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&full, text).with_context(|| format!("writing {}", full.display()))?;
        println!("wrote {path}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository with one committed profile and an evidence file beside it.
    fn repo() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let mut cfg = repo.config().unwrap();
        cfg.set_str("user.name", "Tess Ter").unwrap();
        cfg.set_str("user.email", "tess@example.com").unwrap();
        std::fs::create_dir_all(dir.path().join("profiles")).unwrap();
        let profile = "[backend]\nkind = \"cuda-sm120\"\n\n[exec]\nmulti_stream_overlap = true\n";
        std::fs::write(dir.path().join("profiles/p.toml"), profile).unwrap();
        let mut index = repo.index().unwrap();
        index
            .add_path(std::path::Path::new("profiles/p.toml"))
            .unwrap();
        index.write().unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("Tess Ter", "tess@example.com").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "init", &tree, &[])
            .unwrap();
        let evidence = dir.path().join("run.log");
        std::fs::write(&evidence, "12 of 200 sessions corrupted\n").unwrap();
        (dir, evidence)
    }

    fn args(root: &std::path::Path, evidence: &std::path::Path) -> RecordArgs {
        RecordArgs {
            incident: "inc".into(),
            status: "validated".into(),
            title: "Overlap off".into(),
            hypothesis: String::new(),
            evidence: vec![evidence.display().to_string()],
            supersedes: Vec::new(),
            from: Some("true".into()),
            date: Some("2026-11-29T19:30:00Z".into()),
            allow_detached: false,
            json: false,
            repo: Some(root.to_path_buf()),
        }
    }

    #[test]
    fn record_then_log_show_verify_render() {
        let (dir, evidence) = repo();
        let root = Some(dir.path().to_path_buf());
        let sets = vec!["exec.multi_stream_overlap=false".to_string()];
        let two = vec![sets[0].clone(), "exec.cuda_graph=true".to_string()];
        let cmd = LedgerCommand::Record(args(dir.path(), &evidence));
        assert!(
            run(&cmd, "p", &two)
                .unwrap_err()
                .to_string()
                .contains("one --set")
        );
        run(&cmd, "p", &sets).unwrap();
        let profile = std::fs::read_to_string(dir.path().join("profiles/p.toml")).unwrap();
        assert!(
            profile.contains("multi_stream_overlap = false"),
            "{profile}"
        );
        let ledger = Ledger::load(dir.path()).unwrap();
        assert_eq!(ledger.records.len(), 1);
        let id = ledger.records[0].id.clone();
        run(
            &LedgerCommand::Log {
                json: true,
                repo: root.clone(),
            },
            "p",
            &[],
        )
        .unwrap();
        run(
            &LedgerCommand::Show {
                id: id[..18].to_string(),
                json: false,
                repo: root.clone(),
            },
            "p",
            &[],
        )
        .unwrap();
        let verify = |strict| LedgerCommand::Verify {
            strict,
            json: false,
            repo: root.clone(),
        };
        run(&verify(false), "p", &[]).unwrap();
        // backend.kind differs from the default without a record: strict fails.
        assert!(run(&verify(true), "p", &[]).is_err());
        std::fs::write(dir.path().join("docs/incidents/inc.md"), "edited\n").unwrap();
        assert!(run(&verify(false), "p", &[]).is_err());
        run(&LedgerCommand::Render { repo: root.clone() }, "p", &[]).unwrap();
        run(&verify(false), "p", &[]).unwrap();
    }
}

//! `ledger record`: check the request against HEAD (profile value, evidence, HEAD state), then
//! write the profile change, the record, its evidence and the re-rendered incident documents as
//! ONE commit built from HEAD's tree. Every check runs before anything is written.

use crate::commit::{Base, commit_files};
use crate::error::LedgerError;
use crate::evidence::{EvidenceFile, ab_summary, sha256};
use crate::profile_edit::{current_value, normalized_value, profile_path, set_key};
use crate::record::{Change, Kind, Record, Status};
use crate::render::render_incident;
use crate::store::{EVIDENCE_DIR, Ledger, entry_path};
use dsv4_core::time::{is_rfc3339, now_unix, rfc3339};
use git2::Repository;
use std::path::{Path, PathBuf};

/// What to record.
#[derive(Debug, Clone)]
pub struct RecordRequest {
    /// The profile the change applies to (required with `set`).
    pub profile: Option<String>,
    /// The change, `key=value`.
    pub set: Option<String>,
    /// The value the key must have now; refused when it has another.
    pub from: Option<String>,
    /// Evidence files; `PATH@sha256:HEX` also checks the file's hash.
    pub evidence: Vec<String>,
    /// The incident id.
    pub incident: String,
    /// The record's status.
    pub status: Status,
    /// One-line title.
    pub title: String,
    /// The hypothesis or finding.
    pub hypothesis: String,
    /// Ids (or unique prefixes) of records this one supersedes.
    pub supersedes: Vec<String>,
    /// Record on a detached or unborn HEAD.
    pub allow_detached: bool,
    /// The record's date (RFC 3339 UTC); now when absent.
    pub date: Option<String>,
}

/// What `record` wrote.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The new record.
    pub record: Record,
    /// The new commit's id.
    pub commit: String,
    /// The commit's subject.
    pub subject: String,
    /// The repository-relative files the commit added or changed.
    pub files: Vec<String>,
}

/// The largest evidence file accepted: it is copied into the repository and committed.
pub const MAX_EVIDENCE_BYTES: u64 = 64 << 20;

/// The longest `--title` accepted: it becomes the commit subject and the incident heading.
pub const MAX_TITLE_CHARS: usize = 200;

/// Record `req` in the repository whose working tree is at `root`.
pub fn record(root: &Path, req: &RecordRequest) -> Result<Recorded, LedgerError> {
    let repo = Repository::open(root)?;
    let workdir = repo
        .workdir()
        .ok_or_else(|| {
            LedgerError::Invalid("the repository is bare; run in a working tree".into())
        })?
        .to_path_buf();
    let base = Base::of(&repo)?;
    match (&base, req.allow_detached) {
        (Base::Detached(_), false) => return Err(LedgerError::Head("HEAD is detached".into())),
        (Base::Unborn, false) => return Err(LedgerError::Head("HEAD has no commit yet".into())),
        _ => {}
    }
    check_slug("incident", &req.incident)?;
    if req.title.trim().is_empty() || req.title.contains(['\n', '\r']) {
        return Err(LedgerError::Invalid(
            "--title must be one non-empty line".into(),
        ));
    }
    let title_chars = req.title.chars().count();
    if title_chars > MAX_TITLE_CHARS {
        return Err(LedgerError::Invalid(format!(
            "--title is {title_chars} characters; keep it to {MAX_TITLE_CHARS} (it is the \
             commit subject) and put the detail in the evidence or the incident page"
        )));
    }
    let ledger = Ledger::load(&workdir)?;
    let supersedes = req
        .supersedes
        .iter()
        .map(|id| ledger.get(id).map(|r| r.id.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut profile_text = None;
    let change = match (&req.set, &req.profile) {
        (Some(set), Some(profile)) => {
            let (change, text) = profile_change(&repo, &base, &workdir, profile, set, req)?;
            // Checked now; applied below with the record id in the comment of a new key.
            set_key(&text, &change.key, &change.to, "")?;
            profile_text = Some(text);
            Some(change)
        }
        (Some(_), None) => return Err(LedgerError::Invalid("--set needs --profile".into())),
        (None, _) => None,
    };
    let evidence = read_evidence(&req.evidence)?;
    if evidence.is_empty() && matches!(req.status, Status::Validated | Status::Falsified) {
        return Err(LedgerError::Invalid(format!(
            "a {} record needs --evidence",
            req.status
        )));
    }
    let date = match &req.date {
        Some(d) if is_rfc3339(d) => d.clone(),
        Some(d) => {
            return Err(LedgerError::Invalid(format!(
                "--date {d:?}: expected UTC RFC 3339 like 2026-11-29T19:30:00Z"
            )));
        }
        None => rfc3339(now_unix()),
    };
    let sig = repo.signature()?;
    let author = format!(
        "{} <{}>",
        sig.name().unwrap_or("unknown"),
        sig.email().unwrap_or("unknown")
    );
    let kind = match (&change, req.hypothesis.is_empty()) {
        (Some(_), _) => Kind::ConfigChange,
        (None, false) => Kind::Hypothesis,
        (None, true) => Kind::Observation,
    };
    let mut rec = Record {
        id: String::new(),
        title: req.title.trim().to_string(),
        date,
        author,
        incident: req.incident.clone(),
        kind,
        status: req.status,
        hypothesis: req.hypothesis.trim().to_string(),
        supersedes,
        change,
        evidence: evidence
            .iter()
            .map(|(_, _, sum, ab)| EvidenceFile {
                path: String::new(),
                sha256: sum.clone(),
                ab: ab.clone(),
            })
            .collect(),
    };
    rec.id = rec.make_id();
    if ledger.records.iter().any(|r| r.id == rec.id) {
        return Err(LedgerError::Invalid(format!(
            "record {} already exists",
            rec.id
        )));
    }
    if let (Some(c), Some(text)) = (&rec.change, &profile_text) {
        let note = format!("ledger {}: {}", rec.id, rec.title);
        let edited = set_key(text, &c.key, &c.to, &note)?;
        files.push((profile_path(&c.profile)?, edited.into_bytes()));
    }
    for ((name, bytes, _, _), e) in evidence.into_iter().zip(rec.evidence.iter_mut()) {
        e.path = format!("{EVIDENCE_DIR}/{}/{name}", rec.id);
        files.push((e.path.clone(), bytes));
    }
    files.push((entry_path(&rec.id), rec.to_toml()?.into_bytes()));
    let mut next = ledger.clone();
    next.records.push(rec.clone());
    next.records
        .sort_by(|a, b| (&a.date, &a.id).cmp(&(&b.date, &b.id)));
    let mut incidents = vec![rec.incident.clone()];
    for old in &rec.supersedes {
        incidents.push(next.get(old)?.incident.clone());
    }
    incidents.sort();
    incidents.dedup();
    for incident in &incidents {
        let (path, text) = render_incident(&next, incident)?;
        files.push((path, text.into_bytes()));
    }
    let subject = rec.subject();
    let message = commit_message(&rec, &subject);
    let oid = commit_files(&repo, &base, &files, &message)?;
    write_worktree(&repo, &workdir, &files)?;
    Ok(Recorded {
        record: rec,
        commit: oid.to_string(),
        subject,
        files: files.into_iter().map(|(p, _)| p).collect(),
    })
}

/// Check the profile (committed, unmodified, current value as stated) and produce the change and
/// the committed file text.
fn profile_change(
    repo: &Repository,
    base: &Base<'_>,
    workdir: &Path,
    profile: &str,
    set: &str,
    req: &RecordRequest,
) -> Result<(Change, String), LedgerError> {
    let path = profile_path(profile)?;
    let (key, to) = set
        .split_once('=')
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| LedgerError::Invalid(format!("--set {set:?}: expected key=value")))?;
    let committed = base.file(repo, &path)?.ok_or_else(|| {
        LedgerError::Invalid(format!(
            "{path} is not committed at HEAD; commit the profile first"
        ))
    })?;
    let on_disk = std::fs::read(workdir.join(&path)).map_err(|e| LedgerError::io(&path, e))?;
    let status = repo.status_file(Path::new(&path))?;
    if on_disk != committed || !(status.is_empty() || status == git2::Status::CURRENT) {
        return Err(LedgerError::Invalid(format!(
            "{path} has uncommitted changes; commit or stash them first"
        )));
    }
    let (from, origin) = current_value(workdir, profile, key)?;
    let to = normalized_value(workdir, profile, key, to)?;
    if let Some(expected) = req.from.as_ref().filter(|e| **e != from) {
        return Err(LedgerError::WrongFrom {
            profile: profile.to_string(),
            key: key.to_string(),
            expected: expected.clone(),
            actual: from,
            origin,
        });
    }
    if from == to {
        return Err(LedgerError::Invalid(format!(
            "{key} is already {to} in {profile} (from {origin})"
        )));
    }
    let text = String::from_utf8(committed)
        .map_err(|_| LedgerError::Invalid(format!("{path} is not UTF-8")))?;
    let change = Change {
        profile: profile.to_string(),
        key: key.to_string(),
        from,
        to,
    };
    Ok((change, text))
}

/// Evidence file (name, bytes, sha256, A/B summary) for each argument, hashes checked.
type Evidence = (String, Vec<u8>, String, Option<crate::evidence::AbSummary>);

fn read_evidence(args: &[String]) -> Result<Vec<Evidence>, LedgerError> {
    let mut out: Vec<Evidence> = Vec::new();
    for arg in args {
        let (path, expected) = match arg.rsplit_once("@sha256:") {
            Some((p, h)) if h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()) => {
                (PathBuf::from(p), Some(h.to_ascii_lowercase()))
            }
            _ => (PathBuf::from(arg), None),
        };
        let meta = std::fs::metadata(&path)
            .map_err(|e| LedgerError::Invalid(format!("evidence {}: {e}", path.display())))?;
        if !meta.is_file() {
            return Err(LedgerError::Invalid(format!(
                "evidence {}: not a regular file",
                path.display()
            )));
        }
        if meta.len() > MAX_EVIDENCE_BYTES {
            return Err(LedgerError::Invalid(format!(
                "evidence {} is {:.1} MiB; the ledger commits at most {} MiB per file (git \
                 hosts refuse large blobs): compress it, or keep the raw file elsewhere and \
                 record its summary",
                path.display(),
                meta.len() as f64 / (1u64 << 20) as f64,
                MAX_EVIDENCE_BYTES >> 20
            )));
        }
        let bytes = std::fs::read(&path)
            .map_err(|e| LedgerError::Invalid(format!("evidence {}: {e}", path.display())))?;
        let sum = sha256(&bytes);
        if let Some(expected) = expected.filter(|h| *h != sum) {
            return Err(LedgerError::Invalid(format!(
                "evidence {}: sha256 is {sum}, not {expected}",
                path.display()
            )));
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                LedgerError::Invalid(format!("evidence {}: no file name", path.display()))
            })?
            .to_string();
        if out.iter().any(|(n, ..)| *n == name) {
            return Err(LedgerError::Invalid(format!(
                "two evidence files are named {name}"
            )));
        }
        let ab = ab_summary(&bytes, &path)?;
        out.push((name, bytes, sum, ab));
    }
    Ok(out)
}

/// Subject, title, hypothesis, evidence summary, then the trailers.
pub fn commit_message(rec: &Record, subject: &str) -> String {
    let mut m = format!("{subject}\n\n{}\n", rec.title);
    if !rec.hypothesis.is_empty() {
        m.push_str(&format!("\nHypothesis: {}\n", rec.hypothesis));
    }
    if !rec.evidence.is_empty() {
        m.push_str("\nEvidence:\n");
        for e in &rec.evidence {
            match &e.ab {
                Some(ab) => m.push_str(&format!("- {}: {}\n", e.path, ab.line())),
                None => m.push_str(&format!("- {} (sha256 {})\n", e.path, e.sha256)),
            }
        }
    }
    m.push_str(&format!(
        "\nLedger-Id: {}\nIncident: {}\n",
        rec.id, rec.incident
    ));
    if let Some(c) = &rec.change {
        m.push_str(&format!(
            "Profile: {}\nChange: {}\n",
            c.profile,
            c.summary()
        ));
    }
    m.push_str(&format!("Status: {}\n", rec.status));
    for e in &rec.evidence {
        m.push_str(&format!("Evidence: {} sha256:{}\n", e.path, e.sha256));
    }
    for s in &rec.supersedes {
        m.push_str(&format!("Supersedes: {s}\n"));
    }
    m
}

/// Write the committed files into the working tree and refresh exactly their index entries, so
/// `git status` stays clean for them; every other index entry and file is left alone.
fn write_worktree(
    repo: &Repository,
    workdir: &Path,
    files: &[(String, Vec<u8>)],
) -> Result<(), LedgerError> {
    for (path, bytes) in files {
        let full = workdir.join(path);
        if let Some(dir) = full.parent() {
            std::fs::create_dir_all(dir).map_err(|e| LedgerError::io(dir, e))?;
        }
        std::fs::write(&full, bytes).map_err(|e| LedgerError::io(&full, e))?;
    }
    let mut index = repo.index()?;
    index.read(false)?;
    for (path, _) in files {
        index.add_path(Path::new(path))?;
    }
    index.write()?;
    Ok(())
}

/// Refuse names that cannot be file names.
fn check_slug(what: &str, s: &str) -> Result<(), LedgerError> {
    let ok = !s.is_empty()
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(LedgerError::Invalid(format!(
            "{what} {s:?}: use letters, digits, '-', '_' and '.'"
        )))
    }
}

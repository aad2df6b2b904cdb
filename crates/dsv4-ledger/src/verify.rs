//! `ledger verify`: every record parses, evidence hashes match, supersedes links resolve and form no
//! cycle, ledger commits' trailers match their records, rendered documents are current, and every
//! shipped-profile value that differs from the built-in default is justified by a validated record.

use crate::commit::trailers;
use crate::error::LedgerError;
use crate::evidence::sha256;
use crate::profile_edit::assemble_in;
use crate::record::{Kind, Record, Status};
use crate::render::render_all;
use crate::store::Ledger;
use dsv4_config::Origin;
use dsv4_config::schema::find_key;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One thing verify found wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The check: `record`, `evidence`, `supersedes`, `trailers`, `render`, `profile`, `unjustified`.
    pub check: &'static str,
    /// What is wrong and where.
    pub message: String,
}

/// The outcome of verify.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Records checked.
    pub records: usize,
    /// Problems that always fail verify.
    pub problems: Vec<Problem>,
    /// Profile values that differ from the default without a validated record (fail with `--strict`).
    pub unjustified: Vec<Problem>,
}

impl VerifyReport {
    /// Whether verify passes (`strict`: unjustified values fail too).
    pub fn ok(&self, strict: bool) -> bool {
        self.problems.is_empty() && (!strict || self.unjustified.is_empty())
    }
}

/// Verify the ledger of the repository whose working tree is at `root`.
pub fn verify(root: &Path) -> Result<VerifyReport, LedgerError> {
    let mut report = VerifyReport::default();
    let ledger = match Ledger::load(root) {
        Ok(l) => l,
        Err(e @ LedgerError::BadRecord { .. }) => {
            report.problems.push(problem("record", e.to_string()));
            return Ok(report);
        }
        Err(e) => return Err(e),
    };
    report.records = ledger.records.len();
    for r in &ledger.records {
        if r.make_id() != r.id {
            report.problems.push(problem(
                "record",
                format!("{} was edited after it was recorded (its content hash differs); records are append-only: record a new one that supersedes it", r.id),
            ));
        }
    }
    check_evidence(&ledger, &mut report.problems);
    check_links(&ledger, &mut report.problems);
    check_trailers(&ledger, &mut report.problems)?;
    check_rendered(&ledger, &mut report.problems)?;
    check_justified(&ledger, &mut report)?;
    Ok(report)
}

fn problem(check: &'static str, message: String) -> Problem {
    Problem { check, message }
}

fn check_evidence(ledger: &Ledger, out: &mut Vec<Problem>) {
    for r in &ledger.records {
        for e in &r.evidence {
            match std::fs::read(ledger.root.join(&e.path)) {
                Ok(bytes) if sha256(&bytes) == e.sha256 => {}
                Ok(bytes) => out.push(problem(
                    "evidence",
                    format!(
                        "{}: {} has sha256 {}, the record says {}",
                        r.id,
                        e.path,
                        sha256(&bytes),
                        e.sha256
                    ),
                )),
                Err(err) => out.push(problem("evidence", format!("{}: {}: {err}", r.id, e.path))),
            }
        }
    }
}

fn check_links(ledger: &Ledger, out: &mut Vec<Problem>) {
    let ids: BTreeMap<&str, &Record> = ledger.records.iter().map(|r| (r.id.as_str(), r)).collect();
    for r in &ledger.records {
        for s in &r.supersedes {
            if !ids.contains_key(s.as_str()) {
                out.push(problem(
                    "supersedes",
                    format!("{} supersedes {s}, which does not exist", r.id),
                ));
            }
        }
    }
    // A cycle: following supersedes links from a record leads back to it.
    for start in &ledger.records {
        let mut stack: Vec<&str> = start.supersedes.iter().map(String::as_str).collect();
        let mut seen = std::collections::BTreeSet::new();
        while let Some(id) = stack.pop() {
            if id == start.id {
                out.push(problem(
                    "supersedes",
                    format!("{} is in a supersedes cycle", start.id),
                ));
                break;
            }
            if let Some(r) = ids.get(id).filter(|_| seen.insert(id)) {
                stack.extend(r.supersedes.iter().map(String::as_str));
            }
        }
    }
}

fn check_trailers(ledger: &Ledger, out: &mut Vec<Problem>) -> Result<(), LedgerError> {
    let Ok(repo) = git2::Repository::open(&ledger.root) else {
        return Ok(());
    };
    let Ok(head) = repo.head().and_then(|h| h.peel_to_commit()) else {
        return Ok(());
    };
    let mut walk = repo.revwalk()?;
    walk.push(head.id())?;
    for oid in walk {
        let commit = repo.find_commit(oid?)?;
        let message = String::from_utf8_lossy(commit.message_bytes()).into_owned();
        let t = trailers(&message);
        let get = |k: &str| {
            t.iter()
                .filter(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        let Some(id) = get("Ledger-Id").first().map(|s| s.to_string()) else {
            continue;
        };
        let short = &commit.id().to_string()[..10];
        let Ok(r) = ledger.get(&id) else {
            out.push(problem(
                "trailers",
                format!("commit {short}: Ledger-Id {id} has no record"),
            ));
            continue;
        };
        let mut expect = vec![
            ("Incident", vec![r.incident.clone()]),
            ("Status", vec![r.status.to_string()]),
        ];
        if let Some(c) = &r.change {
            expect.push(("Profile", vec![c.profile.clone()]));
            expect.push(("Change", vec![c.summary()]));
        }
        expect.push(("Supersedes", r.supersedes.clone()));
        expect.push((
            "Evidence",
            r.evidence
                .iter()
                .map(|e| format!("{} sha256:{}", e.path, e.sha256))
                .collect(),
        ));
        for (key, want) in expect {
            let got: Vec<String> = get(key).into_iter().map(str::to_string).collect();
            if got != want {
                out.push(problem(
                    "trailers",
                    format!("commit {short} ({id}): {key} trailer {got:?}, record says {want:?}"),
                ));
            }
        }
    }
    Ok(())
}

fn check_rendered(ledger: &Ledger, out: &mut Vec<Problem>) -> Result<(), LedgerError> {
    for (path, text) in render_all(ledger)? {
        match std::fs::read_to_string(ledger.root.join(&path)) {
            Ok(on_disk) if on_disk == text => {}
            Ok(_) => out.push(problem(
                "render",
                format!("{path} is stale; run `dsv4 ledger render`"),
            )),
            Err(_) => out.push(problem(
                "render",
                format!("{path} is missing; run `dsv4 ledger render`"),
            )),
        }
    }
    Ok(())
}

/// Whether a validated record (not superseded by a non-validated one) sets `key` to `value` in
/// `profile`.
pub fn justifying_record<'l>(
    ledger: &'l Ledger,
    profile: &str,
    key: &str,
    value: &str,
) -> Option<&'l Record> {
    let superseded = ledger.superseded_by();
    ledger.records.iter().rev().find(|r| {
        r.kind == Kind::ConfigChange
            && r.status == Status::Validated
            && r.change
                .as_ref()
                .is_some_and(|c| c.profile == profile && c.key == key && c.to == value)
            && superseded.get(&r.id).is_none_or(|later| {
                later
                    .iter()
                    .all(|id| ledger.get(id).is_ok_and(|l| l.status == Status::Validated))
            })
    })
}

fn check_justified(ledger: &Ledger, report: &mut VerifyReport) -> Result<(), LedgerError> {
    let dir = ledger.root.join("profiles");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(str::to_string))
        .collect();
    names.sort();
    for name in names {
        let resolved = match assemble_in(&ledger.root, &name) {
            Ok(r) => r,
            Err(e) => {
                report.problems.push(problem("profile", e.to_string()));
                continue;
            }
        };
        let own = format!("{name}.toml");
        for s in &resolved.settings {
            let Origin::File { file, .. } = &s.origin else {
                continue;
            };
            if !file.ends_with(&own) || file.starts_with("embedded:") {
                continue;
            }
            let default = find_key(s.key).map_or("", |k| k.default);
            let default = if default.is_empty() {
                "(unset)"
            } else {
                default
            };
            let value = s.value_text();
            if value != default && justifying_record(ledger, &name, s.key, &value).is_none() {
                report.unjustified.push(problem(
                    "unjustified",
                    format!(
                        "{name}: {} = {value} (default {default}) has no validated ledger record",
                        s.key
                    ),
                ));
            }
        }
    }
    Ok(())
}

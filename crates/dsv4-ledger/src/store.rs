//! Reading the ledger: every record under `ledger/entries/`, sorted by date then id, with the
//! "superseded by" links derived from the records' `supersedes` (never stored).

use crate::error::LedgerError;
use crate::record::Record;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where records live, relative to the repository root.
pub const ENTRIES_DIR: &str = "ledger/entries";
/// Where evidence lives, relative to the repository root.
pub const EVIDENCE_DIR: &str = "ledger/evidence";
/// Where incident documents are rendered, relative to the repository root.
pub const INCIDENTS_DIR: &str = "docs/incidents";
/// The user-editable incident template, relative to the repository root.
pub const TEMPLATE_PATH: &str = "ledger/templates/incident.md.j2";

/// The records of one repository.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// The repository root.
    pub root: PathBuf,
    /// Every record, oldest first.
    pub records: Vec<Record>,
}

impl Ledger {
    /// Load every record under `root/ledger/entries` (none when the directory does not exist).
    pub fn load(root: &Path) -> Result<Ledger, LedgerError> {
        let dir = root.join(ENTRIES_DIR);
        let mut records = Vec::new();
        if dir.is_dir() {
            let entries = std::fs::read_dir(&dir).map_err(|e| LedgerError::io(&dir, e))?;
            for entry in entries {
                let path = entry.map_err(|e| LedgerError::io(&dir, e))?.path();
                if path.extension().is_some_and(|e| e == "toml") {
                    let text =
                        std::fs::read_to_string(&path).map_err(|e| LedgerError::io(&path, e))?;
                    let record = Record::parse(&text, &path)?;
                    if path.file_stem().and_then(|s| s.to_str()) != Some(record.id.as_str()) {
                        return Err(LedgerError::BadRecord {
                            path,
                            message: format!("its id is {}, not the file name", record.id),
                        });
                    }
                    records.push(record);
                }
            }
        }
        records.sort_by(|a, b| (&a.date, &a.id).cmp(&(&b.date, &b.id)));
        Ok(Ledger {
            root: root.to_path_buf(),
            records,
        })
    }

    /// The record with this id, or the only one whose id starts with it.
    pub fn get(&self, id: &str) -> Result<&Record, LedgerError> {
        if let Some(r) = self.records.iter().find(|r| r.id == id) {
            return Ok(r);
        }
        let mut matches = self.records.iter().filter(|r| r.id.starts_with(id));
        match (matches.next(), matches.next()) {
            (Some(r), None) if !id.is_empty() => Ok(r),
            (Some(_), Some(_)) => Err(LedgerError::Invalid(format!(
                "record id prefix {id} is ambiguous"
            ))),
            _ => Err(LedgerError::UnknownId(id.to_string())),
        }
    }

    /// For each record id, the ids of the records that supersede it.
    pub fn superseded_by(&self) -> BTreeMap<String, Vec<String>> {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in &self.records {
            for old in &r.supersedes {
                map.entry(old.clone()).or_default().push(r.id.clone());
            }
        }
        map
    }

    /// The incident ids, sorted.
    pub fn incidents(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.records.iter().map(|r| r.incident.clone()).collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

/// The repository-relative path of record `id`.
pub fn entry_path(id: &str) -> String {
    format!("{ENTRIES_DIR}/{id}.toml")
}

/// The repository-relative path of incident `incident`'s document.
pub fn incident_path(incident: &str) -> String {
    format!("{INCIDENTS_DIR}/{incident}.md")
}

/// The working tree root of the git repository containing `start`.
pub fn find_root(start: &Path) -> Result<PathBuf, LedgerError> {
    let repo = git2::Repository::discover(start).map_err(|e| {
        LedgerError::Invalid(format!(
            "{} is not inside a git repository ({})",
            start.display(),
            e.message()
        ))
    })?;
    repo.workdir()
        .map(Path::to_path_buf)
        .ok_or_else(|| LedgerError::Invalid("the repository is bare; run in a working tree".into()))
}

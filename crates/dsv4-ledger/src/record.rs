//! The record format: one TOML file per record under `ledger/entries/<id>.toml`. Records are
//! append-only; a status change is a new record whose `supersedes` names the old one.

use crate::error::LedgerError;
use crate::evidence::EvidenceFile;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::Path;

/// What a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A change of one profile key.
    ConfigChange,
    /// A hypothesis about a cause.
    Hypothesis,
    /// Something observed.
    Observation,
}

impl Kind {
    /// The kind as written in records (`config-change`, `hypothesis`, `observation`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ConfigChange => "config-change",
            Kind::Hypothesis => "hypothesis",
            Kind::Observation => "observation",
        }
    }
}

/// Where a record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Put forward, not yet tested.
    Proposed,
    /// Confirmed by its evidence.
    Validated,
    /// Refuted by its evidence.
    Falsified,
    /// Replaced by a later record.
    Superseded,
}

impl Status {
    /// Parse a status as written on the command line.
    pub fn parse(text: &str) -> Result<Status, LedgerError> {
        match text {
            "proposed" => Ok(Status::Proposed),
            "validated" => Ok(Status::Validated),
            "falsified" => Ok(Status::Falsified),
            "superseded" => Ok(Status::Superseded),
            other => Err(LedgerError::Invalid(format!(
                "unknown status {other:?}: expected proposed, validated, falsified or superseded"
            ))),
        }
    }

    /// The status as written in records and trailers.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Proposed => "proposed",
            Status::Validated => "validated",
            Status::Falsified => "falsified",
            Status::Superseded => "superseded",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A change of one key of one profile, values spelled as in a profile file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The profile name (file `profiles/<profile>.toml`).
    pub profile: String,
    /// The dotted key.
    pub key: String,
    /// The value before.
    pub from: String,
    /// The value after.
    pub to: String,
}

impl Change {
    /// `key from→to`, as in commit subjects and the `Change` trailer.
    pub fn summary(&self) -> String {
        format!("{} {}→{}", self.key, self.from, self.to)
    }
}

/// One ledger record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Collision-free id: `YYYYMMDDTHHMMSSZ-` and 12 hex digits of a content hash.
    pub id: String,
    /// One-line title.
    pub title: String,
    /// UTC time, RFC 3339 (`2026-11-29T19:30:00Z`).
    pub date: String,
    /// Who recorded it (`Name <email>`).
    pub author: String,
    /// The incident it belongs to.
    pub incident: String,
    /// What it is about.
    pub kind: Kind,
    /// Where it stands.
    pub status: Status,
    /// The hypothesis or finding, in prose.
    #[serde(default)]
    pub hypothesis: String,
    /// Records this one replaces.
    #[serde(default)]
    pub supersedes: Vec<String>,
    /// The profile change, for a config-change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
    /// The evidence files, copied under `ledger/evidence/<id>/`.
    #[serde(default)]
    pub evidence: Vec<EvidenceFile>,
}

impl Record {
    /// The id for a record with these contents at `date` (hash over everything but the id).
    pub fn make_id(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            &self.title,
            &self.date,
            &self.author,
            &self.incident,
            &self.hypothesis,
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        h.update(self.status.as_str());
        for s in &self.supersedes {
            h.update(s.as_bytes());
            h.update([0]);
        }
        if let Some(c) = &self.change {
            h.update(format!("{}\0{}\0{}\0{}", c.profile, c.key, c.from, c.to));
        }
        for e in &self.evidence {
            h.update(e.sha256.as_bytes());
        }
        let hex = hex(&h.finalize());
        let stamp: String = self
            .date
            .chars()
            .filter(|c| *c != '-' && *c != ':')
            .collect();
        format!("{stamp}-{}", &hex[..12])
    }

    /// The record as TOML text.
    pub fn to_toml(&self) -> Result<String, LedgerError> {
        toml::to_string(self).map_err(|e| LedgerError::Invalid(format!("record {}: {e}", self.id)))
    }

    /// Parse a record file's text (`path` is for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Record, LedgerError> {
        toml::from_str(text).map_err(|e| LedgerError::BadRecord {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })
    }

    /// The commit subject: `ledger(profile): key from→to [status]`, or `ledger(incident): title
    /// [status]` for a record without a change.
    pub fn subject(&self) -> String {
        match &self.change {
            Some(c) => format!("ledger({}): {} [{}]", c.profile, c.summary(), self.status),
            None => format!(
                "ledger({}): {} [{}]",
                self.incident, self.title, self.status
            ),
        }
    }
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_match_the_record_format() {
        for kind in [Kind::ConfigChange, Kind::Hypothesis, Kind::Observation] {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
        }
    }

    #[test]
    fn status_parse_rejects_unknown() {
        assert_eq!(Status::parse("validated").unwrap(), Status::Validated);
        assert!(Status::parse("done").is_err());
    }
}

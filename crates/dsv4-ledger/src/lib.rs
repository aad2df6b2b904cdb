//! The dsv4 ledger: every change to a shipped profile is a record (TOML under `ledger/entries/`)
//! with hashed evidence (under `ledger/evidence/<id>/`), committed with git2 as one commit with
//! trailers built from HEAD's tree; incident documents are rendered from the records.

pub mod commit;
pub mod error;
pub mod evidence;
pub mod profile_edit;
pub mod record;
pub mod recorder;
pub mod render;
pub mod store;
pub mod verify;

pub use error::LedgerError;
pub use evidence::{AbSummary, ArmSummary, EvidenceFile};
pub use record::{Change, Kind, Record, Status};
pub use recorder::{MAX_EVIDENCE_BYTES, MAX_TITLE_CHARS, RecordRequest, Recorded, record};
pub use render::{DEFAULT_TEMPLATE, render_all, render_incident};
pub use store::{Ledger, find_root};
pub use verify::{Problem, VerifyReport, verify};

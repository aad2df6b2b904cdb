//! Mode shorthands of `dsv4 diff --model`: the same backend and numerics on both sides with one
//! execution knob flipped, so any difference is the execution mode's fault (the sides must
//! agree bitwise; see [`crate::model::exact`]).

use crate::DiffError;

/// An execution-mode diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeDiff {
    /// Eager plans (oracle) against captured plans replayed per batch bucket (candidate).
    CapturedVsEager,
    /// One stream (oracle) against the KV, compressor, indexer and shared-expert chains on side
    /// streams, run as seeded interleavings (candidate).
    OverlapVsSerial,
}

impl ModeDiff {
    /// Every shorthand.
    pub const ALL: [ModeDiff; 2] = [ModeDiff::CapturedVsEager, ModeDiff::OverlapVsSerial];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModeDiff::CapturedVsEager => "captured-vs-eager",
            ModeDiff::OverlapVsSerial => "overlap-vs-serial",
        }
    }

    /// The shorthand of a name.
    pub fn parse(name: &str) -> Result<ModeDiff, DiffError> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == name)
            .ok_or_else(|| DiffError::InvalidOption {
                what: "mode",
                message: format!(
                    "unknown mode `{name}`; use {}",
                    Self::ALL.map(ModeDiff::name).join(" or ")
                ),
            })
    }

    /// The profile key it flips.
    pub fn key(self) -> &'static str {
        match self {
            ModeDiff::CapturedVsEager => "exec.cuda_graph",
            ModeDiff::OverlapVsSerial => "exec.multi_stream_overlap",
        }
    }

    /// `KEY=false`: the oracle's override.
    pub fn oracle_set(self) -> String {
        format!("{}=false", self.key())
    }

    /// `KEY=true`: the candidate's override (as `--against-set`).
    pub fn candidate_set(self) -> String {
        format!("{}=true", self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthands_flip_one_exec_key() {
        for m in ModeDiff::ALL {
            assert_eq!(ModeDiff::parse(m.name()).unwrap(), m);
            assert!(m.oracle_set().ends_with("=false") && m.candidate_set().ends_with("=true"));
        }
        assert_eq!(
            ModeDiff::CapturedVsEager.candidate_set(),
            "exec.cuda_graph=true"
        );
        let e = ModeDiff::parse("graphs").unwrap_err().to_string();
        assert!(e.contains("captured-vs-eager or overlap-vs-serial"), "{e}");
    }
}

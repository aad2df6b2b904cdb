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
    /// Activations in host memory, every op uploading and reading back (oracle), against
    /// device-resident activations (candidate); the same on backends without device memory.
    ResidentVsHost,
}

impl ModeDiff {
    /// Every shorthand.
    pub const ALL: [ModeDiff; 3] = [
        ModeDiff::CapturedVsEager,
        ModeDiff::OverlapVsSerial,
        ModeDiff::ResidentVsHost,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModeDiff::CapturedVsEager => "captured-vs-eager",
            ModeDiff::OverlapVsSerial => "overlap-vs-serial",
            ModeDiff::ResidentVsHost => "resident-vs-host",
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
                    "unknown mode `{name}`; use one of {}",
                    Self::ALL.map(ModeDiff::name).join(", ")
                ),
            })
    }

    /// The profile key it flips.
    pub fn key(self) -> &'static str {
        match self {
            ModeDiff::CapturedVsEager => "exec.cuda_graph",
            ModeDiff::OverlapVsSerial => "exec.multi_stream_overlap",
            ModeDiff::ResidentVsHost => "exec.host_activations",
        }
    }

    /// The key's value on the candidate side (the oracle gets the other).
    fn candidate_value(self) -> bool {
        !matches!(self, ModeDiff::ResidentVsHost)
    }

    /// `KEY=VALUE`: the oracle's override.
    pub fn oracle_set(self) -> String {
        format!("{}={}", self.key(), !self.candidate_value())
    }

    /// `KEY=VALUE`: the candidate's override (as `--against-set`).
    pub fn candidate_set(self) -> String {
        format!("{}={}", self.key(), self.candidate_value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthands_flip_one_exec_key() {
        for m in ModeDiff::ALL {
            assert_eq!(ModeDiff::parse(m.name()).unwrap(), m);
            assert_ne!(m.oracle_set(), m.candidate_set());
            assert!(m.oracle_set().starts_with(m.key()) && m.candidate_set().starts_with(m.key()));
        }
        assert_eq!(
            ModeDiff::ResidentVsHost.oracle_set(),
            "exec.host_activations=true"
        );
        assert_eq!(
            ModeDiff::CapturedVsEager.candidate_set(),
            "exec.cuda_graph=true"
        );
        let e = ModeDiff::parse("graphs").unwrap_err().to_string();
        assert!(
            e.contains("captured-vs-eager, overlap-vs-serial, resident-vs-host"),
            "{e}"
        );
    }
}

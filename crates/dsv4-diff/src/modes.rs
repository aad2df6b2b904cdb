//! Mode shorthands of `dsv4 diff --model`: the same backend and numerics on both sides with one
//! execution knob flipped, or the candidate's sequence batched with others, so any difference
//! is the execution mode's fault (the sides must agree bitwise; see [`crate::model::exact`]).

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
    /// The sequence alone (oracle) against the same sequence sharing every step with
    /// [`BATCH_NEIGHBOURS`] other sequences (candidate): batch invariance, op by op.
    BatchedVsSolo,
}

/// "1 other sequence", "3 other sequences": a neighbour count in words.
pub fn others(n: usize) -> String {
    format!("{n} other sequence{}", if n == 1 { "" } else { "s" })
}

/// The other sequences in the candidate's steps under [`ModeDiff::BatchedVsSolo`].
pub const BATCH_NEIGHBOURS: usize = 3;

impl ModeDiff {
    /// Every shorthand.
    pub const ALL: [ModeDiff; 4] = [
        ModeDiff::CapturedVsEager,
        ModeDiff::OverlapVsSerial,
        ModeDiff::ResidentVsHost,
        ModeDiff::BatchedVsSolo,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModeDiff::CapturedVsEager => "captured-vs-eager",
            ModeDiff::OverlapVsSerial => "overlap-vs-serial",
            ModeDiff::ResidentVsHost => "resident-vs-host",
            ModeDiff::BatchedVsSolo => "batched-vs-solo",
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

    /// The profile key it flips, if it flips one.
    pub fn key(self) -> Option<&'static str> {
        match self {
            ModeDiff::CapturedVsEager => Some("exec.cuda_graph"),
            ModeDiff::OverlapVsSerial => Some("exec.multi_stream_overlap"),
            ModeDiff::ResidentVsHost => Some("exec.host_activations"),
            ModeDiff::BatchedVsSolo => None,
        }
    }

    /// The `KEY=VALUE` overrides of the oracle and of the candidate (as `--against-set`), if
    /// the mode flips a key.
    pub fn sets(self) -> Option<(String, String)> {
        let key = self.key()?;
        // The candidate runs the mode's subject: captured, overlapped, resident.
        let candidate = !matches!(self, ModeDiff::ResidentVsHost);
        Some((
            format!("{key}={}", !candidate),
            format!("{key}={candidate}"),
        ))
    }

    /// Other sequences in each of the candidate's steps.
    pub fn neighbours(self) -> usize {
        match self {
            ModeDiff::BatchedVsSolo => BATCH_NEIGHBOURS,
            _ => 0,
        }
    }

    /// What each side runs, in words, with `neighbours` other sequences in the candidate's
    /// steps (the mode's own count unless `--neighbours` chose another).
    pub fn describe(self, neighbours: usize) -> String {
        match self.sets() {
            Some((o, c)) => format!("oracle {o}, candidate {c}"),
            None => format!(
                "oracle alone, candidate in every step with {}",
                others(neighbours)
            ),
        }
    }

    /// Checks a `--neighbours` count against the mode: the batched mode compares nothing
    /// without at least one other sequence.
    pub fn check_neighbours(self, neighbours: usize) -> Result<(), DiffError> {
        if self == ModeDiff::BatchedVsSolo && neighbours == 0 {
            return Err(DiffError::InvalidOption {
                what: "neighbours",
                message: "--mode batched-vs-solo needs at least one other sequence \
                          (--neighbours N with N >= 1): with none both sides run the sequence \
                          alone"
                    .into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthands_flip_one_exec_key_or_batch_the_candidate() {
        for m in ModeDiff::ALL {
            assert_eq!(ModeDiff::parse(m.name()).unwrap(), m);
            match m.sets() {
                Some((o, c)) => {
                    let key = m.key().unwrap();
                    assert!(o != c && o.starts_with(key) && c.starts_with(key));
                    assert_eq!(m.neighbours(), 0);
                }
                None => assert_eq!(m.neighbours(), BATCH_NEIGHBOURS),
            }
        }
        let (oracle, _) = ModeDiff::ResidentVsHost.sets().unwrap();
        assert_eq!(oracle, "exec.host_activations=true");
        let (_, candidate) = ModeDiff::CapturedVsEager.sets().unwrap();
        assert_eq!(candidate, "exec.cuda_graph=true");
        assert_eq!(
            ModeDiff::BatchedVsSolo.describe(5),
            "oracle alone, candidate in every step with 5 other sequences"
        );
        let e = ModeDiff::BatchedVsSolo.check_neighbours(0).unwrap_err();
        assert!(e.to_string().contains("at least one other sequence"), "{e}");
        assert!(ModeDiff::BatchedVsSolo.check_neighbours(1).is_ok());
        // The other modes compare one sequence anyway; neighbours are an option there.
        assert!(ModeDiff::CapturedVsEager.check_neighbours(0).is_ok());
        let e = ModeDiff::parse("graphs").unwrap_err().to_string();
        assert!(
            e.contains("captured-vs-eager, overlap-vs-serial, resident-vs-host, batched-vs-solo"),
            "{e}"
        );
    }
}

//! Running one op call under watch: outputs live in the middle of a buffer whose guard regions
//! and (for pure outputs) whose middle are filled with a poison NaN before the call; after it the
//! guards must be intact, every output written and finite. Calls are timed, and a panic is caught
//! and reported (a panic message starting with [`UNSUPPORTED_PREFIX`] marks an op the backend
//! does not implement).

use crate::metrics;
use crate::tolerance::{Metric, Tolerance};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// A backend that does not implement an op panics with a message starting with this word; the
/// diff reports such a case as `unsupported`, not as a failure.
pub const UNSUPPORTED_PREFIX: &str = "unsupported";

/// Guard elements (f32) or bytes on each side of an output.
pub(crate) const GUARD: usize = 64;
/// The poison: a quiet NaN whose payload no arithmetic produces.
pub(crate) const POISON_BITS: u32 = 0x7FC0_D0D0;
/// The guard byte of byte buffers.
pub(crate) const GUARD_BYTE: u8 = 0xA5;

/// Why one side's run of a case is not acceptable, whatever the other side computed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Problem {
    /// An output element still holds the poison.
    NotWritten {
        part: &'static str,
        index: usize,
        len: usize,
    },
    /// A guard element or byte changed.
    GuardCorrupted { after: bool, offset: usize },
    /// An output is NaN or infinite.
    NonFinite {
        part: &'static str,
        index: usize,
        value: f32,
    },
    /// The op panicked.
    Panicked(String),
    /// The backend says it does not implement the op.
    Unsupported(String),
    /// The op returned an error.
    OpError(String),
    /// An output has the wrong length.
    WrongLength {
        part: &'static str,
        expected: usize,
        got: usize,
    },
    /// A page byte outside the written slot changed.
    OutsideSlot { byte: usize },
    /// A byte of the written slot depends on what the page held before (it was not written).
    SlotByteNotWritten { byte: usize },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NotWritten { part, index, len } => {
                write!(
                    f,
                    "{part}[{index}] of {len} was not written (still poisoned)"
                )
            }
            Problem::GuardCorrupted { after, offset } => write!(
                f,
                "guard element {offset} {} the output was overwritten",
                if *after { "after" } else { "before" }
            ),
            Problem::NonFinite { part, index, value } => {
                write!(f, "non-finite output {part}[{index}] = {value}")
            }
            Problem::Panicked(m) => write!(f, "panicked: {m}"),
            Problem::Unsupported(m) => write!(f, "unsupported: {m}"),
            Problem::OpError(m) => write!(f, "returned an error: {m}"),
            Problem::WrongLength {
                part,
                expected,
                got,
            } => write!(f, "{part} has {got} values, expected {expected}"),
            Problem::OutsideSlot { byte } => {
                write!(f, "page byte {byte} outside the written slot changed")
            }
            Problem::SlotByteNotWritten { byte } => write!(
                f,
                "slot byte {byte} keeps what the page held before (not written)"
            ),
        }
    }
}

fn poison() -> f32 {
    f32::from_bits(POISON_BITS)
}

/// An f32 output (or in-place operand) with poisoned guard regions on both sides.
#[derive(Debug, Clone)]
pub(crate) struct GuardedF32 {
    buf: Vec<f32>,
    len: usize,
}

impl GuardedF32 {
    /// `len` outputs, all poisoned.
    pub fn poisoned(len: usize) -> Self {
        Self {
            buf: vec![poison(); len + 2 * GUARD],
            len,
        }
    }

    /// An in-place operand holding `values`.
    pub fn with_values(values: &[f32]) -> Self {
        let mut g = Self::poisoned(values.len());
        g.slice_mut().copy_from_slice(values);
        g
    }

    /// The slice handed to the op.
    pub fn slice_mut(&mut self) -> &mut [f32] {
        &mut self.buf[GUARD..GUARD + self.len]
    }

    /// Overwrite a guard element (tests of the detector).
    #[cfg(test)]
    pub fn corrupt_guard(&mut self, after: bool, offset: usize) {
        let i = if after {
            GUARD + self.len + offset
        } else {
            offset
        };
        self.buf[i] = 0.0;
    }

    fn check_guards(&self) -> Result<(), Problem> {
        let before = &self.buf[..GUARD];
        let after = &self.buf[GUARD + self.len..];
        for (after_side, region) in [(false, before), (true, after)] {
            if let Some(offset) = region.iter().position(|v| v.to_bits() != POISON_BITS) {
                return Err(Problem::GuardCorrupted {
                    after: after_side,
                    offset,
                });
            }
        }
        Ok(())
    }

    /// A pure output: guards intact, every element written, all finite.
    pub fn into_output(self, part: &'static str) -> Result<Vec<f32>, Problem> {
        self.check_guards()?;
        let mid = &self.buf[GUARD..GUARD + self.len];
        if let Some(index) = mid.iter().position(|v| v.to_bits() == POISON_BITS) {
            return Err(Problem::NotWritten {
                part,
                index,
                len: self.len,
            });
        }
        check_finite(part, mid)?;
        Ok(mid.to_vec())
    }

    /// An in-place operand: guards intact, all finite.
    pub fn into_in_place(self, part: &'static str) -> Result<Vec<f32>, Problem> {
        self.check_guards()?;
        let mid = &self.buf[GUARD..GUARD + self.len];
        check_finite(part, mid)?;
        Ok(mid.to_vec())
    }
}

/// A byte buffer (a cache page) with guard bytes on both sides.
#[derive(Debug, Clone)]
pub(crate) struct GuardedBytes {
    buf: Vec<u8>,
    len: usize,
}

impl GuardedBytes {
    /// A buffer holding `bytes`.
    pub fn with_bytes(bytes: &[u8]) -> Self {
        let mut buf = vec![GUARD_BYTE; bytes.len() + 2 * GUARD];
        buf[GUARD..GUARD + bytes.len()].copy_from_slice(bytes);
        Self {
            buf,
            len: bytes.len(),
        }
    }

    /// The slice handed to the op.
    pub fn slice_mut(&mut self) -> &mut [u8] {
        &mut self.buf[GUARD..GUARD + self.len]
    }

    /// Guards intact: the middle bytes.
    pub fn into_bytes(self) -> Result<Vec<u8>, Problem> {
        for (after, region) in [
            (false, &self.buf[..GUARD]),
            (true, &self.buf[GUARD + self.len..]),
        ] {
            if let Some(offset) = region.iter().position(|&b| b != GUARD_BYTE) {
                return Err(Problem::GuardCorrupted { after, offset });
            }
        }
        Ok(self.buf[GUARD..GUARD + self.len].to_vec())
    }
}

/// Every value finite.
pub(crate) fn check_finite(part: &'static str, values: &[f32]) -> Result<(), Problem> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(Problem::NonFinite {
            part,
            index,
            value: values[index],
        }),
        None => Ok(()),
    }
}

/// An exact length.
pub(crate) fn check_len(part: &'static str, expected: usize, got: usize) -> Result<(), Problem> {
    if expected == got {
        Ok(())
    } else {
        Err(Problem::WrongLength {
            part,
            expected,
            got,
        })
    }
}

/// Run `f` once, timing it and turning a panic into a [`Problem`].
pub(crate) fn call<R>(f: impl FnOnce() -> R) -> Result<(R, Duration), Problem> {
    let start = Instant::now();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Ok((r, start.elapsed())),
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(non-text panic payload)".to_string());
            if msg.starts_with(UNSUPPORTED_PREFIX) {
                Err(Problem::Unsupported(msg))
            } else {
                Err(Problem::Panicked(msg))
            }
        }
    }
}

/// What one side's run of a case produced.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Produced {
    /// One f32 output.
    Values(Vec<f32>),
    /// Several named f32 outputs (mhc_pre's u, post, comb).
    Parts(Vec<(&'static str, Vec<f32>)>),
    /// Page bytes.
    Bytes(Vec<u8>),
    /// A set of indices.
    Indices(Vec<usize>),
}

/// One checked run: its output and the time of the op call alone.
#[derive(Debug, Clone)]
pub(crate) struct Ran {
    /// The checked output.
    pub out: Produced,
    /// Wall time of the backend call(s) being measured.
    pub elapsed: Duration,
}

/// The metric value of a comparison, and where the largest difference is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Compared {
    /// The metric's value.
    pub value: f64,
    /// Where the values differ most (None when identical).
    pub detail: Option<String>,
}

fn compare_values(metric: Metric, part: &str, a: &[f32], b: &[f32]) -> Result<Compared, Problem> {
    check_len("output", a.len(), b.len())?;
    let value = match metric {
        Metric::Nmse => metrics::nmse(a, b),
        _ => metrics::value_mismatches(a, b) as f64,
    };
    let detail = metrics::first_value_mismatch(a, b).map(|first| {
        let worst = (0..a.len())
            .max_by(|&i, &j| {
                let d = |k: usize| (f64::from(a[k]) - f64::from(b[k])).abs();
                d(i).total_cmp(&d(j))
            })
            .unwrap_or(first);
        format!(
            "{part}: first difference at [{first}] ({} vs {}), largest at [{worst}] ({} vs {})",
            a[first], b[first], a[worst], b[worst]
        )
    });
    Ok(Compared { value, detail })
}

/// Compare the oracle's and the candidate's outputs with the op's metric.
pub(crate) fn compare(
    tol: &Tolerance,
    oracle: &Produced,
    cand: &Produced,
) -> Result<Compared, Problem> {
    match (oracle, cand) {
        (Produced::Values(a), Produced::Values(b)) => compare_values(tol.metric, "out", a, b),
        (Produced::Parts(a), Produced::Parts(b)) => {
            check_len("parts", a.len(), b.len())?;
            let mut worst: Option<Compared> = None;
            for ((name, pa), (_, pb)) in a.iter().zip(b) {
                let c = compare_values(tol.metric, name, pa, pb)?;
                let better = worst
                    .as_ref()
                    .is_none_or(|w| c.value > w.value || c.value.is_nan());
                if better {
                    worst = Some(c);
                }
            }
            Ok(worst.unwrap_or(Compared {
                value: 0.0,
                detail: None,
            }))
        }
        (Produced::Bytes(a), Produced::Bytes(b)) => {
            check_len("page", a.len(), b.len())?;
            let first = a.iter().zip(b).position(|(x, y)| x != y);
            Ok(Compared {
                value: metrics::byte_mismatches(a, b) as f64,
                detail: first.map(|i| {
                    format!(
                        "first differing page byte {i}: {:#04x} vs {:#04x}",
                        a[i], b[i]
                    )
                }),
            })
        }
        (Produced::Indices(a), Produced::Indices(b)) => {
            check_len("index set", a.len(), b.len())?;
            let mut sorted = b.clone();
            sorted.sort_unstable();
            if sorted.windows(2).any(|w| w[0] == w[1]) {
                return Err(Problem::OpError("top-k returned a repeated index".into()));
            }
            let value = metrics::recall(a, b);
            let missing: Vec<usize> = a
                .iter()
                .copied()
                .filter(|x| sorted.binary_search(x).is_err())
                .take(5)
                .collect();
            Ok(Compared {
                value,
                detail: (!missing.is_empty())
                    .then(|| format!("candidate misses oracle indices {missing:?}…")),
            })
        }
        _ => Err(Problem::OpError(
            "the two sides produced different kinds of output".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_elements_guards_and_non_finite_values_are_caught() {
        let mut g = GuardedF32::poisoned(4);
        g.slice_mut()[..3].copy_from_slice(&[1.0, 2.0, 3.0]);
        assert_eq!(
            g.clone().into_output("out"),
            Err(Problem::NotWritten {
                part: "out",
                index: 3,
                len: 4
            })
        );
        g.slice_mut()[3] = 4.0;
        assert_eq!(g.clone().into_output("out"), Ok(vec![1.0, 2.0, 3.0, 4.0]));
        let mut bad = g.clone();
        bad.corrupt_guard(true, 0);
        assert_eq!(
            bad.into_output("out"),
            Err(Problem::GuardCorrupted {
                after: true,
                offset: 0
            })
        );
        let mut bad = g.clone();
        bad.corrupt_guard(false, GUARD - 1);
        assert!(matches!(
            bad.into_in_place("x"),
            Err(Problem::GuardCorrupted { after: false, .. })
        ));
        g.slice_mut()[1] = f32::INFINITY;
        assert!(matches!(
            g.into_output("out"),
            Err(Problem::NonFinite { index: 1, .. })
        ));
    }

    #[test]
    fn byte_guards_and_panics() {
        let mut b = GuardedBytes::with_bytes(&[1, 2, 3]);
        b.slice_mut()[0] = 9;
        assert_eq!(b.clone().into_bytes(), Ok(vec![9, 2, 3]));
        b.buf[GUARD + 3] = 0;
        assert!(matches!(
            b.into_bytes(),
            Err(Problem::GuardCorrupted { after: true, .. })
        ));
        let p = call(|| panic!("unsupported: hadamard")).unwrap_err();
        assert!(matches!(p, Problem::Unsupported(_)), "{p:?}");
        let p = call(|| -> () { panic!("index out of bounds {}", 3) }).unwrap_err();
        assert_eq!(p, Problem::Panicked("index out of bounds 3".into()));
        assert_eq!(call(|| 5).unwrap().0, 5);
    }

    #[test]
    fn comparisons_by_metric() {
        let nmse = Tolerance {
            metric: Metric::Nmse,
            limit: 1e-7,
            why: "",
        };
        let c = compare(
            &nmse,
            &Produced::Values(vec![1.0, 2.0]),
            &Produced::Values(vec![1.0, 2.5]),
        )
        .unwrap();
        assert!((c.value - 0.05).abs() < 1e-12);
        assert!(c.detail.unwrap().contains("[1]"));
        assert!(
            compare(
                &nmse,
                &Produced::Values(vec![1.0]),
                &Produced::Values(vec![1.0, 2.0])
            )
            .is_err()
        );
        let recall = Tolerance {
            metric: Metric::Recall,
            limit: 1.0,
            why: "",
        };
        let c = compare(
            &recall,
            &Produced::Indices(vec![1, 2, 3, 4]),
            &Produced::Indices(vec![4, 3, 2, 0]),
        )
        .unwrap();
        assert_eq!(c.value, 0.75);
        assert!(
            compare(
                &recall,
                &Produced::Indices(vec![1, 2]),
                &Produced::Indices(vec![2, 2])
            )
            .is_err()
        );
        let bytes = Tolerance {
            metric: Metric::ByteMismatches,
            limit: 0.0,
            why: "",
        };
        let c = compare(
            &bytes,
            &Produced::Bytes(vec![1, 2, 3]),
            &Produced::Bytes(vec![1, 0, 0]),
        )
        .unwrap();
        assert_eq!(c.value, 2.0);
        let parts = compare(
            &nmse,
            &Produced::Parts(vec![("u", vec![1.0]), ("post", vec![2.0])]),
            &Produced::Parts(vec![("u", vec![1.0]), ("post", vec![3.0])]),
        )
        .unwrap();
        assert!(parts.detail.unwrap().starts_with("post"));
    }
}

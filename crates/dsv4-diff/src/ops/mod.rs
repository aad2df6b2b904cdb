//! `--ops` mode: run every selected case of the op catalog on the oracle and the candidate, each
//! with freshly drawn inputs, under the harness's guard/poison/finiteness checks, and compare the
//! outputs with the op's metric and tolerance.

mod case;
mod catalog;
mod harness;
mod run;

pub use case::{CaseMeta, SizeClass};
pub use harness::UNSUPPORTED_PREFIX;
pub use run::{OpsOptions, list_cases, run_ops};

//! dsv4-diff: differential testing of backends. `--ops` sweeps every op of the backend trait
//! over tiny, odd and real Flash shapes and the numerics knobs, with seeded inputs, poisoned
//! outputs, guard regions and per-op tolerances (the shape of ggml's test-backend-ops);
//! `--model` runs a forward pass on both sides with a tap after every op and names the first
//! tap that departs. Each side is a backend plus its resolved configuration.
//!
//! ```
//! use dsv4_diff::{OpsOptions, SideConfig, diff};
//! dsv4_backend_reference::link();
//! let oracle = SideConfig::default().open("oracle").unwrap();
//! let candidate = SideConfig::default().open("candidate").unwrap();
//! let ops = OpsOptions { ops: vec!["swiglu".into()], ..OpsOptions::default() };
//! let report = diff(&oracle, &candidate, Some(&ops), None).unwrap();
//! assert!(report.passed);
//! ```

#![warn(missing_docs)]

pub mod error;
#[cfg(any(test, feature = "faulty-backend"))]
pub mod faulty;
pub mod metrics;
pub mod model;
pub mod modes;
pub mod op;
pub mod ops;
mod progress;
pub mod render;
pub mod report;
pub mod selection;
pub mod side;
pub mod tolerance;

#[cfg(test)]
mod tests;

pub use error::DiffError;
pub use model::{ModelOptions, run_model};
pub use modes::ModeDiff;
pub use op::Op;
pub use ops::{OpsOptions, run_ops};
pub use render::render;
pub use report::{DiffReport, Status};
pub use side::{Side, SideConfig};

/// Run the requested modes (`ops`, `model`; at least one) on two sides and build the report.
pub fn diff(
    oracle: &Side,
    candidate: &Side,
    ops: Option<&OpsOptions>,
    model: Option<&ModelOptions>,
) -> Result<DiffReport, DiffError> {
    if ops.is_none() && model.is_none() {
        return Err(DiffError::InvalidOption {
            what: "mode",
            message: "run the op sweep, the model diff, or both".into(),
        });
    }
    let ops = ops
        .map(|o| run_ops(oracle.backend.as_ref(), candidate.backend.as_ref(), o))
        .transpose()?;
    let model = model.map(|m| run_model(oracle, candidate, m)).transpose()?;
    Ok(DiffReport::new(oracle.info(), candidate.info(), ops, model))
}

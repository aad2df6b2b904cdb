//! One case of the op sweep: an op at one shape (and numerics), its cost model for `--perf`, and
//! a builder that draws the case's inputs from its own seeded generator and returns a runner
//! that executes the op on any backend under the harness's checks.

use super::harness::{Problem, Ran};
use crate::Op;
use dsv4_core::SplitMix64;
use dsv4_kernels::Backend;
use serde::Serialize;
use std::fmt;

/// Which family of sizes a case belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SizeClass {
    /// The tiny model's sizes.
    Tiny,
    /// Odd sizes: partial blocks, lengths that are not multiples of vector widths, edge counts.
    Odd,
    /// The real DeepSeek-V4-Flash sizes.
    Flash,
}

impl fmt::Display for SizeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SizeClass::Tiny => "tiny",
            SizeClass::Odd => "odd",
            SizeClass::Flash => "flash",
        })
    }
}

/// Runs a prepared case on one backend.
pub(crate) type Runner = Box<dyn Fn(&dyn Backend) -> Result<Ran, Problem>>;
/// Draws a case's inputs and returns its runner (or why the inputs could not be built).
pub(crate) type Build = Box<dyn Fn(&mut SplitMix64) -> Result<Runner, String>>;

/// What a case is, independent of any run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseMeta {
    /// `op/class/shape[/numerics]`, what `-p` matches.
    pub name: String,
    /// The op.
    pub op: Op,
    /// Size family.
    pub class: SizeClass,
    /// The shape, e.g. `1x4096->1024.fp8`.
    pub shape: String,
    /// The numerics knob the case exercises, e.g. `act=fp8`, if any.
    pub numerics: Option<String>,
    /// Floating-point operations of one call (0 when not meaningful).
    pub flops: f64,
    /// Bytes one call must read and write at least.
    pub bytes: f64,
    /// Only run with `--full` (too slow for the default sweep on the reference backend).
    #[serde(skip)]
    pub full_only: bool,
}

/// A case of the catalog.
pub(crate) struct Case {
    /// Description.
    pub meta: CaseMeta,
    /// Input builder.
    pub build: Build,
}

impl Case {
    /// A case; the name is derived from op, class, shape and numerics.
    pub fn new(
        op: Op,
        class: SizeClass,
        shape: String,
        numerics: Option<String>,
        cost: (f64, f64),
        build: Build,
    ) -> Self {
        let mut name = format!("{op}/{class}/{shape}");
        if let Some(n) = &numerics {
            name.push('/');
            name.push_str(n);
        }
        Case {
            meta: CaseMeta {
                name,
                op,
                class,
                shape,
                numerics,
                flops: cost.0,
                bytes: cost.1,
                full_only: false,
            },
            build,
        }
    }

    /// Mark the case as `--full` only.
    pub fn full_only(mut self) -> Self {
        self.meta.full_only = true;
        self
    }
}

/// `n` values uniform in [−a, a).
pub(crate) fn uniform(rng: &mut SplitMix64, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform_sym(a)).collect()
}

/// `n` values uniform with standard deviation `std`.
pub(crate) fn uniform_std(rng: &mut SplitMix64, n: usize, std: f32) -> Vec<f32> {
    uniform(rng, n, std * 3f32.sqrt())
}

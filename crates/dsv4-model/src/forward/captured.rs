//! Captured plans: one decode plan per batch-size bucket (up to `exec.cuda_graph_max_bs`),
//! built once, its transient buffers placed in one arena by the liveness allocator and
//! checked by the verifier when it is built, then replayed with only the inputs changing.
//! The arena persists between replays, as a CUDA graph's memory pool does.

use super::build::{PlanSpec, StepKind, build_plan_under};
use super::exec::{ExecOptions, Fault};
use super::op::Op;
use super::resident::DeviceArena;
use super::resident_ops::host_last_order;
use super::{ForwardError, Model};
use dsv4_kernels::Backend;
use dsv4_plan::{Lifetimes, Placement, Plan, PlanError, Verdict, place_for_order, render, verify};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What identifies a captured plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CaptureKey {
    /// Rows (the bucket).
    pub bucket: usize,
    /// Side streams.
    pub overlap: bool,
    /// How the arena computed lifetimes.
    pub lifetimes: Lifetimes,
    /// The plan lacks the shared-expert waits (`Fault::MissingStreamEvent`).
    pub missing_event: bool,
}

/// A captured plan with its arena.
pub struct Captured {
    /// The plan (arena placement).
    pub plan: Plan<Op>,
    /// The verifier's verdict at capture.
    pub verdict: Verdict,
    /// The order the serial executor runs the plan in on a device ([`host_last_order`]),
    /// computed once for every replay.
    pub device_order: Vec<usize>,
    /// The arena (f32 words).
    pub(crate) arena: Mutex<Vec<f32>>,
    /// Held for the whole of a replay (one replay of an arena at a time).
    pub(crate) replay: Mutex<()>,
    /// The arena in device memory, allocated at the first device-resident replay.
    pub(crate) device_arena: Mutex<Option<Arc<DeviceArena>>>,
}

impl Captured {
    /// The arena's words.
    fn words(&self) -> usize {
        match &self.plan.placement {
            Placement::Arena { bytes, .. } => *bytes as usize / 4,
            Placement::Fresh => 0,
        }
    }

    /// The plan's arena in `backend`'s device memory (one allocation, made on first use and
    /// kept for every later replay).
    pub(crate) fn device_arena(
        &self,
        backend: &Arc<dyn Backend>,
    ) -> Result<Arc<DeviceArena>, ForwardError> {
        let mut slot = self.device_arena.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = slot.as_ref() {
            return Ok(Arc::clone(a));
        }
        let a = Arc::new(DeviceArena::new(Arc::clone(backend), self.words())?);
        *slot = Some(Arc::clone(&a));
        Ok(a)
    }
}

/// The captured plans of one model.
pub(crate) type CaptureCache = Mutex<HashMap<CaptureKey, Arc<Captured>>>;

/// The arena placement of a plan under `exec` (stream-aware unless the arena fault is on).
pub fn lifetimes_for(exec: &ExecOptions) -> Lifetimes {
    if exec.has(Fault::ArenaIgnoresStreams) {
        Lifetimes::IgnoreStreams
    } else {
        Lifetimes::StreamAware
    }
}

/// `plan` placed in one arena under `exec`: stream-aware lifetimes, the arena valid as well
/// for the order the serial executor runs it in on a device (its host launches last, so no
/// buffer takes bytes a host launch run later still reads); under the arena fault, list-order
/// lifetimes alone (the incident's allocator).
pub fn place_captured(plan: Plan<Op>, exec: &ExecOptions) -> Result<Plan<Op>, PlanError> {
    let lifetimes = lifetimes_for(exec);
    let order = match lifetimes {
        Lifetimes::StreamAware => host_last_order(&plan)?,
        Lifetimes::IgnoreStreams => Vec::new(),
    };
    place_for_order(plan, lifetimes, &order)
}

/// Build, place and verify a captured decode plan of `bucket` rows.
pub fn capture(
    model_cfg: &crate::ModelConfig,
    bucket: usize,
    exec: &ExecOptions,
) -> Result<Captured, ForwardError> {
    let spec = PlanSpec {
        kind: StepKind::Decode,
        rows: bucket,
        head_rows: bucket,
        overlap: exec.overlap,
        mtp: false,
    };
    let plan = place_captured(build_plan_under(model_cfg, spec, exec), exec).map_err(|e| {
        ForwardError::Plan {
            message: e.to_string(),
        }
    })?;
    let plan_err = |e: PlanError| ForwardError::Plan {
        message: e.to_string(),
    };
    let verdict = verify(&plan).map_err(plan_err)?;
    let device_order = host_last_order(&plan).map_err(plan_err)?;
    let words = match &plan.placement {
        Placement::Arena { bytes, .. } => *bytes as usize / 4,
        Placement::Fresh => 0,
    };
    if let Some(f) = verdict.findings.first() {
        tracing::error!(
            bucket,
            findings = verdict.findings.len(),
            first = %render::finding(f),
            "captured plan fails verification"
        );
    } else {
        tracing::info!(bucket, arena_bytes = words * 4, "captured plan verified");
    }
    Ok(Captured {
        plan,
        verdict,
        device_order,
        arena: Mutex::new(vec![0f32; words]),
        replay: Mutex::new(()),
        device_arena: Mutex::new(None),
    })
}

impl Model {
    /// The captured decode plan for `bucket` rows under `exec`, capturing it on first use.
    pub fn captured_plan(
        &self,
        bucket: usize,
        exec: &ExecOptions,
    ) -> Result<Arc<Captured>, ForwardError> {
        let key = CaptureKey {
            bucket,
            overlap: exec.overlap,
            lifetimes: lifetimes_for(exec),
            missing_event: exec.has(Fault::MissingStreamEvent),
        };
        let mut cache = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.get(&key) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(capture(&self.cfg, bucket, exec)?);
        cache.insert(key, Arc::clone(&c));
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelConfig;

    /// The arena of a captured plan takes no bytes from a buffer a deferred host launch still
    /// reads, so on a device the captured plan runs its host launches as late as the eager
    /// plan does; under the arena fault the placement is the incident's, unconstrained.
    #[test]
    fn a_captured_arena_lets_host_launches_run_last() {
        for overlap in [false, true] {
            let exec = ExecOptions {
                captured: true,
                overlap,
                ..ExecOptions::default()
            };
            let spec = PlanSpec {
                kind: StepKind::Decode,
                rows: 4,
                head_rows: 4,
                overlap,
                mtp: false,
            };
            let fresh = build_plan_under(&ModelConfig::tiny(), spec, &exec);
            let wanted = host_last_order(&fresh).unwrap();
            assert_ne!(
                wanted,
                dsv4_plan::serial(&fresh),
                "the order defers something"
            );
            let placed = place_captured(fresh.clone(), &exec).unwrap();
            assert_eq!(
                host_last_order(&placed).unwrap(),
                wanted,
                "overlap {overlap}"
            );
            assert!(verify(&placed).unwrap().findings.is_empty());
            // List-order placement alone would have blocked some of it.
            let plain = dsv4_plan::place(fresh, lifetimes_for(&exec)).unwrap();
            if !overlap {
                assert_ne!(host_last_order(&plain).unwrap(), wanted);
            }
        }
        let faulty = ExecOptions {
            faults: [Fault::ArenaIgnoresStreams].into(),
            ..ExecOptions::default()
        };
        let spec = PlanSpec {
            kind: StepKind::Decode,
            rows: 4,
            head_rows: 4,
            overlap: true,
            mtp: false,
        };
        let fresh = build_plan_under(&ModelConfig::tiny(), spec, &faulty);
        assert_eq!(
            place_captured(fresh.clone(), &faulty).unwrap(),
            dsv4_plan::place(fresh, Lifetimes::IgnoreStreams).unwrap()
        );
    }
}

//! How steps are executed: [`ExecOptions`] (captured or eager plans, multi-stream overlap, the
//! executor, injected faults) and what a step reports besides its outputs ([`StepReport`]).

use super::build::StepKind;
use dsv4_kernels::DeviceStats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Largest batch with a captured plan when `captured_max_bs` is 0 ("the backend chooses").
pub const DEFAULT_CAPTURE_MAX_BS: usize = 64;

/// Which executor runs a plan's launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Executor {
    /// One launch at a time in issue order.
    #[default]
    Serial,
    /// One launch at a time in a seeded order that respects only stream order and events;
    /// each step draws its order from `seed` and the step's number.
    Interleaved {
        /// Base seed.
        seed: u64,
    },
    /// One thread per stream, synchronised only by events; runs only plans the verifier
    /// passed.
    Threaded,
}

/// A named fault that rehearses one incident class (`debug.inject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The arena allocator computes lifetimes as if all streams were one, so a side stream's
    /// scratch may alias buffers still in use on another stream.
    ArenaIgnoresStreams,
    /// Host-tier load-back skips the wait on the index-K read path.
    SkipIndexKTransferWait,
    /// The overlap scheduler frees pages one step early.
    StalePageReuse,
    /// Overlap plans drop the MoE sum's wait for the shared-expert stream.
    MissingStreamEvent,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 4] = [
        Fault::ArenaIgnoresStreams,
        Fault::SkipIndexKTransferWait,
        Fault::StalePageReuse,
        Fault::MissingStreamEvent,
    ];

    /// Its name in `debug.inject`.
    pub fn name(self) -> &'static str {
        match self {
            Fault::ArenaIgnoresStreams => "arena-ignores-streams",
            Fault::SkipIndexKTransferWait => "skip-index-k-transfer-wait",
            Fault::StalePageReuse => "stale-page-reuse",
            Fault::MissingStreamEvent => "missing-stream-event",
        }
    }

    /// The fault of a name (as `debug.inject` spells it).
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// Execution options of a model's steps (`[exec]` and `debug.inject` of a profile).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExecOptions {
    /// Decode steps replay captured plans (`exec.cuda_graph`): one plan per batch-size bucket,
    /// transient buffers at fixed offsets of one arena, verified when built.
    pub captured: bool,
    /// Largest batch with a captured plan (`exec.cuda_graph_max_bs`; 0: 64).
    pub captured_max_bs: usize,
    /// KV, compressor, indexer and shared-expert chains on side streams
    /// (`exec.multi_stream_overlap`).
    pub overlap: bool,
    /// Activations stay in host memory even when the backend has device memory
    /// (`exec.host_activations`).
    pub host_activations: bool,
    /// The executor.
    pub executor: Executor,
    /// Injected faults.
    pub faults: BTreeSet<Fault>,
}

impl ExecOptions {
    /// Whether `fault` is injected.
    pub fn has(&self, fault: Fault) -> bool {
        self.faults.contains(&fault)
    }

    /// The largest captured batch.
    pub fn max_bs(&self) -> usize {
        if self.captured_max_bs == 0 {
            DEFAULT_CAPTURE_MAX_BS
        } else {
            self.captured_max_bs
        }
    }

    /// The captured buckets: powers of two below the largest, then the largest.
    pub fn buckets(&self) -> Vec<usize> {
        let max = self.max_bs();
        let mut out: Vec<usize> = (0..usize::BITS)
            .map(|i| 1usize << i)
            .take_while(|&b| b < max)
            .collect();
        out.push(max);
        out
    }

    /// The bucket a decode batch of `batch` sequences replays, if it is captured.
    pub fn bucket_for(&self, batch: usize) -> Option<usize> {
        if !self.captured {
            return None;
        }
        self.buckets().into_iter().find(|&b| b >= batch)
    }
}

/// A page a step declares it writes: the store (pool name), the block and the page id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PageWrite {
    /// The store's name (e.g. "c4_index_k").
    pub store: String,
    /// Main layer index (None for the MTP layer).
    pub layer: Option<usize>,
    /// The page id in the store.
    pub page: u32,
}

/// What a step reports besides its outputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepReport {
    /// Prefill or decode.
    pub kind: StepKind,
    /// Rows computed.
    pub rows: usize,
    /// Rows of the plan's buffers (the bucket for a captured plan).
    pub plan_rows: usize,
    /// Rows the head computed logits for (fewer than `plan_rows` when the step asked for
    /// fewer rows' logits than it computes).
    pub logit_rows: usize,
    /// Whether a captured plan was replayed.
    pub captured: bool,
    /// Launches run.
    pub launches: usize,
    /// The pages the step's store launches were given (its declared write set).
    pub writes: BTreeSet<PageWrite>,
    /// The step's device traffic, on a backend with device memory (either mode).
    pub device: Option<DeviceStats>,
}

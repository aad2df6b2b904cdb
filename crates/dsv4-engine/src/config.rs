//! Engine options ([`EngineConfig`]): cache budget, prefix cache, scheduler limits. Plain values,
//! so the engine does not depend on how a profile spells them; the CLI maps profile keys here.

use crate::error::EngineError;
use crate::pool::PoolKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How much cache the pools hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheBudget {
    /// Tokens of compressed cache across all sequences (`cache.max_total_tokens`), plus one
    /// partial page per store for every sequence slot.
    Tokens(usize),
    /// The largest token budget whose pools fit in this many bytes.
    Bytes(u64),
    /// A quarter of the memory available now (Linux `MemAvailable`, else 1 GiB) as a byte
    /// budget, capped at max_running_requests full-length sequences.
    Auto,
    /// Explicit page counts per pool (pools not named get the [`CacheBudget::Tokens`] sizing of
    /// one full-length sequence per slot); for tests and experiments.
    Pages(BTreeMap<PoolKind, usize>),
}

/// Which waiting request is admitted next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchedulePolicy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// Longest cached prefix first (ties: first come).
    Lpm,
}

impl SchedulePolicy {
    /// From a profile value ("fcfs" or "lpm").
    pub fn parse(name: &str) -> Result<Self, EngineError> {
        match name {
            "fcfs" => Ok(Self::Fcfs),
            "lpm" => Ok(Self::Lpm),
            other => Err(EngineError::Config {
                option: "scheduler.schedule_policy",
                message: format!("unknown policy {other:?}; use fcfs or lpm"),
            }),
        }
    }
}

/// How the host tier's transfer worker paces a load-back (see docs/engine.md, "Host tier").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferPace {
    /// Once a load-back's first reader arrives, copy every layer as fast as possible, layer
    /// by layer, ahead of the forward pass.
    #[default]
    Eager,
    /// Debug: copy a pool's layer only when a reader waits for it (or when the round ends),
    /// so the transfer always lags the forward pass: a read that skips its wait deterministically
    /// sees the page before its data arrived. For tests of the load-back synchronisation.
    Lagged,
}

/// The host cache tier (`cache.hicache`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HostTierConfig {
    /// Host pages of each pool as a multiple of its device pages (`cache.hicache_ratio`).
    pub ratio: f64,
    /// How the transfer worker paces load-backs.
    pub pace: TransferPace,
}

impl Default for HostTierConfig {
    fn default() -> Self {
        Self {
            ratio: 2.0,
            pace: TransferPace::Eager,
        }
    }
}

/// Everything the engine is configured with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// Pool sizing.
    pub cache: CacheBudget,
    /// Tokens per prefix-cache page (`cache.page_size`, a power of two): the radix tree's unit
    /// and the spacing of state snapshots.
    pub page_size: usize,
    /// Reuse cached prefixes across requests (`cache.prefix_cache`).
    pub prefix_cache: bool,
    /// Most requests running at once (`scheduler.max_running_requests`, at least 1).
    pub max_running_requests: usize,
    /// Most prompt tokens prefilled in one step, over all requests
    /// (`scheduler.chunked_prefill_size`); None: whole prompts in one step.
    pub chunked_prefill_size: Option<usize>,
    /// Admission order (`scheduler.schedule_policy`).
    pub schedule_policy: SchedulePolicy,
    /// Hold back a waiting request while a running one is still prefilling whole pages of
    /// prompt the two share and the prefix cache lacks, so it reuses that request's snapshots
    /// instead of computing them again (`scheduler.in_batch_prefix_caching`; SGLang's in-batch
    /// prefix caching). Needs the prefix cache.
    #[serde(default = "on")]
    pub in_batch_prefix_caching: bool,
    /// Evicted prefix snapshots spill to a host tier and load back from it (`cache.hicache`);
    /// None: they are dropped.
    pub hicache: Option<HostTierConfig>,
    /// Prepare step N+1 on the scheduler thread while step N runs on a worker thread
    /// (`exec.overlap_schedule`; see docs/engine.md, "Overlap scheduling").
    #[serde(default)]
    pub overlap_schedule: bool,
    /// Threads that choose a step's tokens and score its log-probabilities (0: by the work,
    /// one per 131,072 logits, at most the cores). Results do not depend on it.
    #[serde(default)]
    pub choice_threads: usize,
    /// Preempt a running request to admit a waiting one whose priority exceeds its own by more
    /// than this (`scheduler.priority_preemption_threshold` with
    /// `scheduler.priority_preemption`; SGLang's priority preemption); None: a running request
    /// is never preempted for priority.
    #[serde(default)]
    pub priority_preemption: Option<u32>,
}

/// `true`, the default of the options that are on unless turned off.
fn on() -> bool {
    true
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            cache: CacheBudget::Tokens(16384),
            page_size: 64,
            prefix_cache: true,
            max_running_requests: 32,
            chunked_prefill_size: Some(8192),
            schedule_policy: SchedulePolicy::Fcfs,
            in_batch_prefix_caching: true,
            hicache: None,
            overlap_schedule: false,
            choice_threads: 0,
            priority_preemption: None,
        }
    }
}

impl EngineConfig {
    /// Sequence slots the fixed-size pools (SWA rings, compressor rings) and the partial pages
    /// are sized for: running requests, plus as many prefix snapshots when the cache is on.
    pub fn sequence_slots(&self) -> usize {
        self.max_running_requests * if self.prefix_cache { 2 } else { 1 }
    }

    /// Check the options, naming the first bad one.
    pub fn validate(&self) -> Result<(), EngineError> {
        if !self.page_size.is_power_of_two() {
            return Err(EngineError::Config {
                option: "cache.page_size",
                message: format!("{} is not a power of two; use e.g. 64", self.page_size),
            });
        }
        if self.max_running_requests == 0 {
            return Err(EngineError::Config {
                option: "scheduler.max_running_requests",
                message: "must be at least 1".into(),
            });
        }
        if self.chunked_prefill_size == Some(0) {
            return Err(EngineError::Config {
                option: "scheduler.chunked_prefill_size",
                message: "must be at least 1 token (or unset for whole prompts)".into(),
            });
        }
        if let Some(h) = &self.hicache {
            if !self.prefix_cache {
                return Err(EngineError::Config {
                    option: "cache.hicache",
                    message: "the host tier keeps evicted prefix snapshots; turn on \
                              cache.prefix_cache or turn off cache.hicache"
                        .into(),
                });
            }
            if !(h.ratio.is_finite() && h.ratio > 0.0) {
                return Err(EngineError::Config {
                    option: "cache.hicache_ratio",
                    message: format!(
                        "{} is not a positive multiple of the device pool; use e.g. 2.0",
                        h.ratio
                    ),
                });
            }
        }
        Ok(())
    }
}

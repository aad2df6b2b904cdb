//! dsv4-engine: serves many concurrent requests on one [`dsv4_model::Model`].
//!
//! - [`pool`], [`pools`]: one fixed arena per cache kind of spec §4 (SWA KV, C4/C128 KV, C4
//!   index-K, compressor rings), pages with reference counts; the forward pass reads and writes
//!   rows in the arenas in the exact byte layouts.
//! - [`prefix`]: radix tree over token pages holding whole-state snapshots at page boundaries.
//! - [`scheduler`]: admission, continuous batching, chunked prefill, preemption, sampling and
//!   stop conditions, one synchronous step at a time; with `overlap_schedule`, step N runs on a
//!   worker thread while step N+1 is prepared (docs/engine.md, "Overlap scheduling").
//! - [`sampler`]: a request's sampling state and the step's token choices, made on several
//!   threads when the vocabulary makes them worth it.
//! - [`engine`]: the step loop on its own thread behind [`EngineHandle`].
//! - [`hicache`]: the host tier — evicted prefix snapshots spill to host pools and load back
//!   layer by layer on a transfer worker; every page read waits on its layer's counter.
//! - [`canary`]: per-round checksums of pool pages against the round's declared write set, and
//!   the ownership check of overlapped steps.
//! - [`mod@bench`]: serving throughput at several concurrency levels; exposed scheduling time with
//!   overlap off and on.
//!
//! Batch invariance: a request's tokens and logits do not depend on what else runs, because
//! every row of a batched step reads only its own sequence's pages and samples from its own
//! seeded generator.

pub mod bench;
pub mod canary;
pub mod config;
pub mod constraint;
pub mod engine;
pub mod error;
pub mod hicache;
pub mod limits;
pub mod metrics;
mod parallel;
pub mod pool;
pub mod pools;
pub mod prefix;
pub mod request;
pub mod sampler;
pub mod sampling;
pub mod scheduler;
pub mod sequence;

pub use canary::{CanaryCheck, CanaryConfig, CanaryFinding, CanaryPools, DebugOptions};
pub use config::{CacheBudget, EngineConfig, HostTierConfig, SchedulePolicy, TransferPace};
pub use constraint::{CONSTRAINT_FAILED, Constraint, ConstraintState, TokenConstraint};
pub use engine::{Engine, EngineHandle, StallGuard};
pub use error::EngineError;
pub use hicache::HostTierStats;
pub use metrics::EngineMetrics;
pub use pool::PoolKind;
pub use pools::{HostTierReport, PoolReport, PoolUsage};
pub use request::{
    Completion, Event, FinishReason, Finished, MAX_LOGPROB_TOKEN_IDS, MAX_TOP_LOGPROBS, Request,
    RequestId, RequestStream, SamplingParams, Timing, TokenEvent, TokenLogprob, Usage,
};
pub use scheduler::{QUEUE_FULL, Scheduler, StepTiming};
pub use sequence::{Detokenizer, stop_string_ends};

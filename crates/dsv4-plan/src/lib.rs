//! dsv4-plan: the plan of one engine step as data, and the checks that run on it before it runs.
//!
//! - [`ir`]: a [`Plan`] is a list of launches (an op, the stream it runs on, the byte slices of
//!   buffers it reads and writes, the events it waits for and records) over buffers that are
//!   persistent (weights, cache pools) or transient (activations, placed in an arena).
//! - [`mod@defer`]: an execution order that runs chosen launches (host ops) as late as their
//!   dependents allow, so they run back to back.
//! - [`hb`]: happens-before from stream order and events.
//! - [`alloc`]: the liveness-based arena allocator of captured plans (and its deliberately
//!   faulty twin that computes lifetimes as if all streams were one).
//! - [`mod@verify`]: cross-stream hazards, clobbered and uninitialised reads, event misuse.
//! - [`schedule`]: the serial order and seeded interleavings that respect only stream order
//!   and events (what the CPU executors run).
//! - [`render`]: the plan and verifier reports as text tables.
//!
//! The op type is a parameter: this crate knows nothing about DSV4; `dsv4-model` builds DSV4
//! plans and executes them.

#![warn(missing_docs)]

pub mod alloc;
pub mod builder;
pub mod defer;
pub mod error;
pub mod hb;
pub mod ir;
pub mod render;
pub mod schedule;
pub mod verify;

pub use alloc::{Lifetimes, place, place_for_order};
pub use builder::PlanBuilder;
pub use defer::deferred;
pub use error::PlanError;
pub use hb::HappensBefore;
pub use ir::{Buffer, BufferClass, BufferId, EventId, Launch, Placement, Plan, Slice, StreamId};
pub use schedule::{interleaved, serial};
pub use verify::{Finding, FindingKind, LaunchRef, Verdict, verify};

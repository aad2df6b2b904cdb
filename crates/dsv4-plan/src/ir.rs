//! The plan IR: streams, events, buffers (persistent or transient), byte slices and launches.
//!
//! A plan's launch list is in issue order: launches on one stream run in list order, and a
//! launch that waits for an event runs after the launch that records it (which must come
//! earlier in the list). Nothing else orders two launches — that is what the verifier checks
//! and what the interleaving executor exploits.

use crate::error::PlanError;
use serde::Serialize;
use std::fmt;

/// A stream (an in-order queue of launches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct StreamId(pub u8);

/// An event: recorded by one launch, waited for by others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct EventId(pub u32);

/// A buffer of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct BufferId(pub u32);

/// What kind of memory a buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferClass {
    /// Step-local activations and scratch: placed by the allocator.
    Transient,
    /// Model weights (read-only, outside the arena).
    Weight,
    /// A region of a cache pool (outside the arena, lives across steps).
    Pool,
}

impl BufferClass {
    /// Whether the allocator places this buffer in the arena.
    pub fn is_transient(self) -> bool {
        self == BufferClass::Transient
    }
}

/// One buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Buffer {
    /// Name, e.g. "q" or "layers.2.attn.wq_a" or "c4_index_k".
    pub name: String,
    /// Scope it belongs to (e.g. "layers.2"; "" for step-wide buffers).
    pub scope: String,
    /// Memory class.
    pub class: BufferClass,
    /// Size in bytes (for pools: a nominal size covering the scope's pages).
    pub bytes: u64,
    /// The host reads it after the step (it stays live until the end).
    pub host_read: bool,
}

impl Buffer {
    /// "scope.name" (or the name alone for step-wide buffers).
    pub fn label(&self) -> String {
        if self.scope.is_empty() {
            self.name.clone()
        } else {
            format!("{}.{}", self.scope, self.name)
        }
    }
}

/// Bytes `start..start + len` of one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Slice {
    /// The buffer.
    pub buffer: BufferId,
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Slice {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// One launch: an op on a stream with its declared memory accesses and events.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Launch<O> {
    /// What runs (interpreted by the executor).
    pub op: O,
    /// Scope, e.g. "layers.3" ("" for step-wide launches).
    pub scope: String,
    /// Short op name, e.g. "indexer.q".
    pub name: String,
    /// Stream it runs on.
    pub stream: StreamId,
    /// Slices read (transient operands first, in operand order).
    pub reads: Vec<Slice>,
    /// Slices written (transient results first, in result order).
    pub writes: Vec<Slice>,
    /// Events waited for before it starts.
    pub waits: Vec<EventId>,
    /// Events recorded when it finishes.
    pub records: Vec<EventId>,
}

impl<O> Launch<O> {
    /// "scope op" for messages.
    pub fn label(&self) -> String {
        if self.scope.is_empty() {
            self.name.clone()
        } else {
            format!("{} {}", self.scope, self.name)
        }
    }
}

/// Where transient buffers live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Placement {
    /// Eager: every transient buffer is a fresh allocation of its own.
    Fresh,
    /// Captured: transient buffers at fixed offsets of one arena.
    Arena {
        /// Byte offset of each buffer (None for persistent buffers).
        offsets: Vec<Option<u64>>,
        /// Arena size in bytes.
        bytes: u64,
        /// How the allocator computed lifetimes.
        lifetimes: crate::alloc::Lifetimes,
    },
}

/// One engine step as data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan<O> {
    /// Stream names, indexed by [`StreamId`] (stream 0 is the main stream).
    pub streams: Vec<String>,
    /// Event names, indexed by [`EventId`].
    pub events: Vec<String>,
    /// Buffers, indexed by [`BufferId`].
    pub buffers: Vec<Buffer>,
    /// Launches in issue order.
    pub launches: Vec<Launch<O>>,
    /// Where transient buffers live.
    pub placement: Placement,
}

impl<O> Plan<O> {
    /// The buffer `id`.
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id.0 as usize]
    }

    /// The name of stream `s`.
    pub fn stream_name(&self, s: StreamId) -> &str {
        self.streams.get(s.0 as usize).map_or("?", String::as_str)
    }

    /// The arena offset of a transient buffer (None when buffers are fresh allocations).
    pub fn offset(&self, id: BufferId) -> Option<u64> {
        match &self.placement {
            Placement::Fresh => None,
            Placement::Arena { offsets, .. } => offsets.get(id.0 as usize).copied().flatten(),
        }
    }

    /// Bytes of all transient buffers together (what eager execution allocates).
    pub fn transient_bytes(&self) -> u64 {
        self.buffers
            .iter()
            .filter(|b| b.class.is_transient())
            .map(|b| b.bytes)
            .sum()
    }

    /// Where a slice lives: (memory, first byte, end). Memory is `Arena` for transient
    /// buffers of an arena-placed plan, else the buffer itself.
    pub fn locate(&self, s: &Slice) -> (Memory, u64, u64) {
        match self.offset(s.buffer) {
            Some(off) => (Memory::Arena, off + s.start, off + s.end()),
            None => (Memory::Buffer(s.buffer), s.start, s.end()),
        }
    }

    /// Check that every id a launch uses is declared, every slice is in bounds, and every
    /// event is recorded once, before anything waits for it.
    pub fn validate(&self) -> Result<(), PlanError> {
        let mut recorder: Vec<Option<usize>> = vec![None; self.events.len()];
        for (i, l) in self.launches.iter().enumerate() {
            let undeclared = |what, id| PlanError::Undeclared {
                launch: i,
                name: l.label(),
                what,
                id,
            };
            if l.stream.0 as usize >= self.streams.len() {
                return Err(undeclared("stream", u32::from(l.stream.0)));
            }
            for s in l.reads.iter().chain(&l.writes) {
                let Some(b) = self.buffers.get(s.buffer.0 as usize) else {
                    return Err(undeclared("buffer", s.buffer.0));
                };
                if s.end() > b.bytes {
                    return Err(PlanError::OutOfBounds {
                        launch: i,
                        name: l.label(),
                        buffer: b.label(),
                        start: s.start,
                        end: s.end(),
                        bytes: b.bytes,
                    });
                }
            }
            for e in &l.waits {
                match recorder.get(e.0 as usize) {
                    None => return Err(undeclared("event", e.0)),
                    Some(None) => {
                        return Err(PlanError::WaitBeforeRecord {
                            launch: i,
                            name: l.label(),
                            event: self.events[e.0 as usize].clone(),
                        });
                    }
                    Some(Some(_)) => {}
                }
            }
            for e in &l.records {
                match recorder.get_mut(e.0 as usize) {
                    None => return Err(undeclared("event", e.0)),
                    Some(Some(first)) => {
                        return Err(PlanError::RecordedTwice {
                            event: self.events[e.0 as usize].clone(),
                            first: *first,
                            second: i,
                        });
                    }
                    Some(slot) => *slot = Some(i),
                }
            }
        }
        Ok(())
    }
}

/// The memory a slice lives in, for overlap tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Memory {
    /// The transient arena.
    Arena,
    /// A buffer of its own (persistent, or transient in a fresh-allocation plan).
    Buffer(BufferId),
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

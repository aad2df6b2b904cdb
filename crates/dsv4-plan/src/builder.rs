//! [`PlanBuilder`]: declare streams, events and buffers, then append launches in issue order.

use crate::ir::{Buffer, BufferClass, BufferId, EventId, Launch, Placement, Plan, Slice, StreamId};

/// Builds a [`Plan`] with fresh (eager) placement; see [`crate::place`] for arenas.
#[derive(Debug, Clone)]
pub struct PlanBuilder<O> {
    plan: Plan<O>,
}

impl<O> Default for PlanBuilder<O> {
    fn default() -> Self {
        Self::new()
    }
}

impl<O> PlanBuilder<O> {
    /// An empty plan with only the main stream ("main", stream 0).
    pub fn new() -> Self {
        Self {
            plan: Plan {
                streams: vec!["main".into()],
                events: Vec::new(),
                buffers: Vec::new(),
                launches: Vec::new(),
                placement: Placement::Fresh,
            },
        }
    }

    /// The stream named `name`, declared on first use.
    pub fn stream(&mut self, name: &str) -> StreamId {
        if let Some(i) = self.plan.streams.iter().position(|s| s == name) {
            return StreamId(i as u8);
        }
        self.plan.streams.push(name.to_string());
        StreamId((self.plan.streams.len() - 1) as u8)
    }

    /// A new event.
    pub fn event(&mut self, name: impl Into<String>) -> EventId {
        self.plan.events.push(name.into());
        EventId((self.plan.events.len() - 1) as u32)
    }

    /// A new buffer.
    pub fn buffer(&mut self, class: BufferClass, scope: &str, name: &str, bytes: u64) -> BufferId {
        self.plan.buffers.push(Buffer {
            name: name.to_string(),
            scope: scope.to_string(),
            class,
            bytes,
            host_read: false,
        });
        BufferId((self.plan.buffers.len() - 1) as u32)
    }

    /// The persistent buffer of this class, scope and name, declared on first use.
    pub fn persistent(
        &mut self,
        class: BufferClass,
        scope: &str,
        name: &str,
        bytes: u64,
    ) -> BufferId {
        let found = self
            .plan
            .buffers
            .iter()
            .position(|b| b.class == class && b.scope == scope && b.name == name);
        match found {
            Some(i) => BufferId(i as u32),
            None => self.buffer(class, scope, name, bytes),
        }
    }

    /// Mark a buffer as read by the host after the step.
    pub fn host_read(&mut self, id: BufferId) {
        self.plan.buffers[id.0 as usize].host_read = true;
    }

    /// The whole of buffer `id` as a slice.
    pub fn all(&self, id: BufferId) -> Slice {
        Slice {
            buffer: id,
            start: 0,
            len: self.plan.buffers[id.0 as usize].bytes,
        }
    }

    /// Append a launch.
    pub fn push(&mut self, launch: Launch<O>) -> usize {
        self.plan.launches.push(launch);
        self.plan.launches.len() - 1
    }

    /// The plan so far.
    pub fn plan(&self) -> &Plan<O> {
        &self.plan
    }

    /// The finished plan (fresh placement).
    pub fn finish(self) -> Plan<O> {
        self.plan
    }
}

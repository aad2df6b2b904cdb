//! [`PlanBuilder`]: declare streams, events and buffers, then append launches in issue order.

use std::collections::HashMap;

use crate::ir::{Buffer, BufferClass, BufferId, EventId, Launch, Placement, Plan, Slice, StreamId};

/// Builds a [`Plan`] with fresh (eager) placement; see [`crate::place`] for arenas.
#[derive(Debug, Clone)]
pub struct PlanBuilder<O> {
    plan: Plan<O>,
    /// The first buffer of each (class, scope, name), so [`Self::persistent`] is a lookup
    /// rather than a scan (a 4096-layer model's plan has hundreds of thousands of buffers).
    by_name: HashMap<(BufferClass, String, String), BufferId>,
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
            by_name: HashMap::new(),
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
        let id = BufferId((self.plan.buffers.len() - 1) as u32);
        self.by_name
            .entry((class, scope.to_string(), name.to_string()))
            .or_insert(id);
        id
    }

    /// The persistent buffer of this class, scope and name, declared on first use.
    pub fn persistent(
        &mut self,
        class: BufferClass,
        scope: &str,
        name: &str,
        bytes: u64,
    ) -> BufferId {
        match self
            .by_name
            .get(&(class, scope.to_string(), name.to_string()))
        {
            Some(&id) => id,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistent_declares_each_class_scope_and_name_once() {
        let mut pb = PlanBuilder::<()>::new();
        let w = pb.persistent(BufferClass::Weight, "layers.0", "wq", 0);
        assert_eq!(pb.persistent(BufferClass::Weight, "layers.0", "wq", 0), w);
        let others = [
            pb.persistent(BufferClass::Pool, "layers.0", "wq", 8),
            pb.persistent(BufferClass::Weight, "layers.1", "wq", 0),
            pb.persistent(BufferClass::Weight, "layers.0", "wk", 0),
        ];
        assert!(others.iter().all(|&b| b != w));
        assert_eq!(pb.plan().buffers.len(), 4);
        // A buffer declared with `buffer` is found by name too (the first of that name wins).
        let t = pb.buffer(BufferClass::Transient, "layers.0", "x", 16);
        pb.buffer(BufferClass::Transient, "layers.0", "x", 32);
        assert_eq!(
            pb.persistent(BufferClass::Transient, "layers.0", "x", 64),
            t
        );
        assert_eq!(pb.plan().buffers.len(), 6);
    }
}

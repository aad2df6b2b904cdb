//! The emulator's streams and events. Work on a stream — the default stream (the legacy stream,
//! which like CUDA's does not order work with the non-blocking streams a plan's streams are) or a
//! created one — waits in that stream's queue until something needs it — a download or
//! synchronisation of the stream, a device-wide synchronisation, a free — and queued work then
//! runs in an adversarial order.
//! Waiting for one stream runs that stream's work and, of the other streams, only the work up to
//! the event records it waits for: everything else stays queued as long as it can. Waiting for
//! everything runs the most recently issued item that may run first. So work on another stream
//! that no event orders before a consumer runs after it, and a missing event shows up as a wrong
//! result here, as it might on a GPU, instead of being hidden by a CPU that runs everything in
//! issue order.

use crate::CudaError;
use crate::device::{DEFAULT_STREAM, Dim3, StreamHandle};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// One piece of queued work.
#[derive(Debug)]
pub(super) enum Item {
    /// A kernel launch with its parameter values (one 8-byte slot each).
    Launch {
        name: String,
        grid: Dim3,
        block: Dim3,
        params: Vec<u64>,
    },
    /// A host-to-device copy of bytes staged when it was issued.
    Upload { ptr: u64, data: Vec<u8> },
    /// Zeroing `len` bytes at `ptr` (a memset).
    Zero { ptr: u64, len: usize },
    /// A copy of host memory at `src` (read when the item runs) to `dst`.
    CopyHost { dst: u64, src: u64, len: usize },
    /// A graph's launches, run in order as one item.
    Graph(std::sync::Arc<Vec<crate::graphs::GraphLaunch>>),
    /// Event `event` reaches its `n`-th record.
    Record { event: u64, n: u64 },
    /// Wait until event `event` has reached its `n`-th record.
    Wait { event: u64, n: u64 },
}

/// Records of one event: issued so far, and the last one that ran.
#[derive(Debug, Default, Clone, Copy)]
struct Event {
    issued: u64,
    reached: u64,
}

/// What runs a queued launch or copy.
pub(super) type Exec<'a> = dyn FnMut(&Item) -> Result<(), CudaError> + 'a;

/// Every stream's queue and every event, of one emulated device.
#[derive(Debug, Default)]
pub(super) struct Streams {
    next_handle: u64,
    next_seq: u64,
    /// Created streams' queues: (issue number, item), oldest first.
    queues: BTreeMap<StreamHandle, VecDeque<(u64, Item)>>,
    events: HashMap<u64, Event>,
    /// The first error of queued work that nobody has been told about yet.
    failed: Option<CudaError>,
}

impl Streams {
    /// A new stream handle (never [`DEFAULT_STREAM`]).
    pub fn create_stream(&mut self) -> StreamHandle {
        self.next_handle += 1;
        self.queues.insert(self.next_handle, VecDeque::new());
        self.next_handle
    }

    /// Forget a stream (its queue must have been run).
    pub fn destroy_stream(&mut self, s: StreamHandle) {
        self.queues.remove(&s);
    }

    /// A new event handle.
    pub fn create_event(&mut self) -> u64 {
        self.next_handle += 1;
        self.events.insert(self.next_handle, Event::default());
        self.next_handle
    }

    /// Forget an event.
    pub fn destroy_event(&mut self, e: u64) {
        self.events.remove(&e);
    }

    /// Whether `s` is a stream of this device (the default stream is).
    pub fn knows(&self, s: StreamHandle) -> Result<(), CudaError> {
        if s == DEFAULT_STREAM || self.queues.contains_key(&s) {
            Ok(())
        } else {
            Err(CudaError::BadOperands(format!(
                "cuda-emu: stream {s:#x} is not a stream of this device"
            )))
        }
    }

    fn event(&mut self, e: u64) -> Result<&mut Event, CudaError> {
        self.events.get_mut(&e).ok_or_else(|| {
            CudaError::BadOperands(format!(
                "cuda-emu: event {e:#x} is not an event of this device"
            ))
        })
    }

    /// Queue `item` on stream `s`.
    pub fn push(&mut self, s: StreamHandle, item: Item) -> Result<(), CudaError> {
        self.knows(s)?;
        self.next_seq += 1;
        let seq = self.next_seq;
        self.queues.entry(s).or_default().push_back((seq, item));
        Ok(())
    }

    /// Record event `e` on `s` (queued).
    pub fn record(&mut self, e: u64, s: StreamHandle) -> Result<(), CudaError> {
        self.knows(s)?;
        let ev = self.event(e)?;
        ev.issued += 1;
        let n = ev.issued;
        self.push(s, Item::Record { event: e, n })
    }

    /// Make `s` wait for the last record of `e` issued so far (queued).
    pub fn wait(&mut self, s: StreamHandle, e: u64) -> Result<(), CudaError> {
        self.knows(s)?;
        let n = self.event(e)?.issued;
        self.push(s, Item::Wait { event: e, n })
    }

    /// Keep `e` for the next wait to report (work that failed where nobody waited).
    pub fn fail(&mut self, e: CudaError) {
        self.failed.get_or_insert(e);
    }

    /// Whether event `e` has reached its `n`-th record (a destroyed event has).
    pub fn reached(&self, e: u64, n: u64) -> bool {
        self.events.get(&e).is_none_or(|ev| ev.reached >= n)
    }

    /// Whether stream `s` has nothing queued.
    pub fn idle(&self, s: StreamHandle) -> bool {
        self.queues.get(&s).is_none_or(VecDeque::is_empty)
    }

    /// Whether no stream has anything queued.
    pub fn all_idle(&self) -> bool {
        self.queues.values().all(VecDeque::is_empty)
    }

    /// The stream whose head is the most recently issued item that may run.
    fn pick(&self) -> Option<StreamHandle> {
        self.queues
            .iter()
            .filter_map(|(&s, q)| q.front().map(|(seq, item)| (s, *seq, item)))
            .filter(|(_, _, item)| match item {
                Item::Wait { event, n } => self.reached(*event, *n),
                _ => true,
            })
            .max_by_key(|&(_, seq, _)| seq)
            .map(|(s, _, _)| s)
    }

    /// The stream holding the queued `n`-th record of event `e`.
    fn holder(&self, e: u64, n: u64) -> Option<StreamHandle> {
        self.queues.iter().find_map(|(&s, q)| {
            q.iter()
                .any(|(_, it)| matches!(it, Item::Record { event, n: m } if *event == e && *m == n))
                .then_some(s)
        })
    }

    /// Run the head of stream `s`, first running (one item at a time, on whichever stream holds
    /// it) the record its head waits for. False when `s` is idle or its wait can never end.
    fn advance(&mut self, exec: &mut Exec<'_>, s: StreamHandle) -> bool {
        let mut t = s;
        // Waits bind to records issued before them, so the chain ends within as many hops as
        // there are streams.
        for _ in 0..=self.queues.len() {
            let blocked = match self.queues.get(&t).and_then(VecDeque::front) {
                None => return false,
                Some((_, Item::Wait { event, n })) if !self.reached(*event, *n) => {
                    Some((*event, *n))
                }
                Some(_) => None,
            };
            match blocked {
                Some((e, n)) => match self.holder(e, n) {
                    Some(u) => t = u,
                    None => return false,
                },
                None => {
                    self.run_head(exec, t);
                    return true;
                }
            }
        }
        false
    }

    /// Pop and run the head of stream `s`.
    fn run_head(&mut self, exec: &mut Exec<'_>, s: StreamHandle) {
        let Some((_, item)) = self.queues.get_mut(&s).and_then(VecDeque::pop_front) else {
            return;
        };
        match &item {
            Item::Record { event, n } => {
                if let Some(ev) = self.events.get_mut(event) {
                    ev.reached = ev.reached.max(*n);
                }
            }
            Item::Wait { .. } => {}
            Item::Launch { .. }
            | Item::Upload { .. }
            | Item::Zero { .. }
            | Item::CopyHost { .. }
            | Item::Graph(_) => {
                if let Err(e) = exec(&item) {
                    self.failed.get_or_insert(e);
                }
            }
        }
    }

    /// Clear every queue with an error: some wait can never end.
    fn stuck(&mut self) {
        self.queues.values_mut().for_each(VecDeque::clear);
        self.failed.get_or_insert(CudaError::Driver(
            "cuda-emu: streams wait for event records that are never reached".into(),
        ));
    }

    /// The first error queued work had, if nobody has been told yet.
    fn report(&mut self) -> Result<(), CudaError> {
        self.failed.take().map_or(Ok(()), Err)
    }

    /// Run everything queued, always the most recently issued item that may run first.
    pub fn run_all(&mut self, exec: &mut Exec<'_>) -> Result<(), CudaError> {
        while !self.all_idle() {
            match self.pick() {
                Some(s) => self.run_head(exec, s),
                None => self.stuck(),
            }
        }
        self.report()
    }

    /// Run stream `s`'s queue, and of the other streams only what it waits for: work nobody
    /// waits for stays queued as long as it can, so a missing wait shows up.
    pub fn run_stream(&mut self, exec: &mut Exec<'_>, s: StreamHandle) -> Result<(), CudaError> {
        while !self.idle(s) {
            if !self.advance(exec, s) {
                self.stuck();
            }
        }
        self.report()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run everything, returning the launches' names in the order they ran.
    fn drain(st: &mut Streams) -> Vec<String> {
        let mut ran = Vec::new();
        let mut exec = |item: &Item| {
            if let Item::Launch { name, .. } = item {
                ran.push(name.clone());
            }
            Ok(())
        };
        st.run_all(&mut exec).unwrap();
        ran
    }

    fn launch(name: &str) -> Item {
        Item::Launch {
            name: name.into(),
            grid: (1, 1, 1),
            block: (1, 1, 1),
            params: vec![],
        }
    }

    #[test]
    fn unordered_streams_run_in_reverse_issue_order_and_events_order_them() {
        let mut st = Streams::default();
        let (a, b) = (st.create_stream(), st.create_stream());
        st.push(a, launch("a1")).unwrap();
        st.push(a, launch("a2")).unwrap();
        st.push(b, launch("b1")).unwrap();
        // No event: b1 (issued last) runs first; a's own order holds.
        assert_eq!(drain(&mut st), ["b1", "a1", "a2"]);

        let e = st.create_event();
        st.push(a, launch("a1")).unwrap();
        st.record(e, a).unwrap();
        st.push(a, launch("a2")).unwrap();
        st.wait(b, e).unwrap();
        st.push(b, launch("b1")).unwrap();
        // b1 waits for a1 only: a2 may still run after it.
        assert_eq!(drain(&mut st), ["a1", "b1", "a2"]);
    }

    #[test]
    fn a_wait_binds_the_record_issued_before_it_and_never_recorded_events_do_not_block() {
        let mut st = Streams::default();
        let (a, b) = (st.create_stream(), st.create_stream());
        let e = st.create_event();
        st.wait(b, e).unwrap();
        st.push(b, launch("b0")).unwrap();
        st.push(a, launch("a1")).unwrap();
        st.record(e, a).unwrap();
        assert_eq!(drain(&mut st), ["a1", "b0"]);
        assert!(st.reached(e, 1));
        // The default stream queues its waits like any other stream.
        st.push(a, launch("a2")).unwrap();
        st.record(e, a).unwrap();
        st.wait(DEFAULT_STREAM, e).unwrap();
        st.push(DEFAULT_STREAM, launch("d1")).unwrap();
        st.push(a, launch("a3")).unwrap();
        assert!(!st.reached(e, 2));
        assert_eq!(drain(&mut st), ["a2", "a3", "d1"]);
    }

    #[test]
    fn waiting_for_one_stream_runs_only_what_it_waits_for() {
        let mut st = Streams::default();
        let (a, b, c) = (st.create_stream(), st.create_stream(), st.create_stream());
        let e = st.create_event();
        st.push(b, launch("b1")).unwrap();
        st.record(e, b).unwrap();
        st.push(b, launch("b2")).unwrap();
        st.push(c, launch("c1")).unwrap();
        st.wait(a, e).unwrap();
        st.push(a, launch("a1")).unwrap();
        let mut ran = Vec::new();
        let mut exec = |item: &Item| {
            if let Item::Launch { name, .. } = item {
                ran.push(name.clone());
            }
            Ok(())
        };
        st.run_stream(&mut exec, a).unwrap();
        assert!(
            st.idle(a) && !st.idle(b) && !st.idle(c),
            "b2 and c1 stay queued"
        );
        st.push(a, launch("a2")).unwrap();
        st.record(e, a).unwrap();
        // A default-stream wait, run: only the record it waits for.
        st.wait(DEFAULT_STREAM, e).unwrap();
        st.run_stream(&mut exec, DEFAULT_STREAM).unwrap();
        st.run_all(&mut exec).unwrap();
        assert_eq!(ran, ["b1", "a1", "a2", "c1", "b2"]);
    }

    #[test]
    fn failures_are_reported_once_and_unknown_handles_are_refused() {
        let mut st = Streams::default();
        let a = st.create_stream();
        st.push(a, launch("bad")).unwrap();
        st.push(a, launch("good")).unwrap();
        let mut ran = Vec::new();
        let mut exec = |item: &Item| match item {
            Item::Launch { name, .. } if name == "bad" => {
                Err(CudaError::Driver("bad launch".into()))
            }
            Item::Launch { name, .. } => {
                ran.push(name.clone());
                Ok(())
            }
            _ => Ok(()),
        };
        let e = st.run_all(&mut exec).unwrap_err();
        assert!(e.to_string().contains("bad launch"), "{e}");
        assert!(st.run_all(&mut exec).is_ok());
        assert_eq!(ran, ["good"]);
        assert!(st.push(999, launch("x")).is_err());
        assert!(st.record(12345, a).is_err());
        st.destroy_stream(a);
        assert!(st.knows(a).is_err());
    }
}

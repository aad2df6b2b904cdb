//! Graph recording for captured plans (`exec.cuda_graph`, [`dsv4_kernels::DeviceOps::graphs`]).
//!
//! While a span is open, a [`Device`](crate::Device) holds back each stream's launches (and the
//! per-call parameter copies that feed them, [`Device::stage`](crate::Device::stage)) instead
//! of issuing them. Anything else on that stream — a copy in or out, an event, a wait, a
//! synchronisation, a free — first issues what the stream holds: a *segment*, the run of
//! launches between two host interactions. A segment is identified by what it does exactly
//! (each launch's kernel, grid, block and parameter values — device addresses included — and
//! each staged copy's destination, source and length, not its bytes). The first time a segment is
//! seen its launches are issued one by one; the second time it is built into a graph; from
//! then on its staged copies are issued, then the graph is launched as one unit. A decode step
//! of a captured plan repeats its segments step after step (the plan's arena, scratch buffers
//! and parameter arena sit at the same addresses), so after two steps each runs as graphs.
//!
//! Hoisting the staged copies before the graph is safe because each goes to a parameter-arena
//! chunk handed out since the last wait for the device, which no earlier launch of the segment
//! reads, from the chunk's range of the arena's page-locked host mirror, which nobody rewrites
//! before that wait either. Results are bitwise those of issuing each launch: the same kernels
//! with the same parameters run in the same order on the same stream.
//!
//! Graphs are built node by node (`cuGraphAddKernelNode`, each node after the previous) rather
//! than by stream capture, which the legacy default stream does not allow.

use crate::CudaError;
use crate::device::{Dim3, RawDevice, StreamHandle};
use dsv4_kernels::DeviceStats;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Fewest launches a segment needs to be worth a graph.
const MIN_GRAPH_LAUNCHES: usize = 2;
/// Distinct segments remembered; past this every graph is destroyed and recording starts over.
const MAX_SEGMENTS: usize = 4096;

/// One kernel launch of a graph: the kernel, its shape and its parameter values (one 8-byte
/// slot each, as [`RawDevice::launch_raw`] takes them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GraphLaunch {
    /// Kernel name.
    pub name: String,
    /// Grid shape.
    pub grid: Dim3,
    /// Block shape.
    pub block: Dim3,
    /// Parameter values.
    pub params: Vec<u64>,
}

impl GraphLaunch {
    /// Launch this on `stream` of `raw` now.
    fn issue(&self, raw: &dyn RawDevice, stream: StreamHandle) -> Result<(), CudaError> {
        let mut slots = self.params.clone();
        let mut ptrs = param_ptrs(&mut slots);
        // SAFETY: the values were laid out by `Device::launch` for this kernel, whose caller
        // guaranteed the parameter list; every buffer is alive (frees issue held work first).
        unsafe { raw.launch_raw(stream, &self.name, self.grid, self.block, &mut ptrs) }
    }
}

/// Pointers to each 8-byte slot, as `cuLaunchKernel` and kernel graph nodes take parameters.
pub fn param_ptrs(slots: &mut [u64]) -> Vec<*mut c_void> {
    slots
        .iter_mut()
        .map(|s| s as *mut u64 as *mut c_void)
        .collect()
}

/// Work held back on a stream.
enum Held {
    /// A copy of `len` bytes of page-locked host memory at `src` into a fresh parameter chunk.
    Stage { ptr: u64, src: u64, len: usize },
    /// A kernel launch.
    Launch(GraphLaunch),
}

/// What identifies a held item in a segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Sig {
    Stage { ptr: u64, src: u64, len: usize },
    Launch(GraphLaunch),
}

impl Held {
    fn sig(&self) -> Sig {
        match self {
            Held::Stage { ptr, src, len } => Sig::Stage {
                ptr: *ptr,
                src: *src,
                len: *len,
            },
            Held::Launch(l) => Sig::Launch(l.clone()),
        }
    }

    fn issue(&self, raw: &dyn RawDevice, stream: StreamHandle) -> Result<(), CudaError> {
        match self {
            // SAFETY: `Device::stage` checked both ranges; its caller keeps the source.
            Held::Stage { ptr, src, len } => unsafe {
                raw.upload_from_host(stream, *ptr, *src, *len)
            },
            Held::Launch(l) => l.issue(raw, stream),
        }
    }
}

/// What became of a segment seen before.
enum Built {
    /// Seen once: build it the next time.
    Seen,
    /// An executable graph of its launches.
    Graph(u64),
    /// Building it failed: issue it launch by launch.
    Failed,
}

#[derive(Default)]
struct State {
    held: HashMap<StreamHandle, Vec<Held>>,
    segments: HashMap<Vec<Sig>, Built>,
    stats: DeviceStats,
    /// An error of work issued where nobody could be told (a free), for the next flush.
    failed: Option<CudaError>,
}

/// A device's graph recorder: its open spans, each stream's held work and the segments seen.
pub struct Recorder {
    raw: Arc<dyn RawDevice>,
    spans: AtomicUsize,
    state: Mutex<State>,
}

impl Recorder {
    /// A recorder for `raw` with no span open.
    pub fn new(raw: Arc<dyn RawDevice>) -> Self {
        Self {
            raw,
            spans: AtomicUsize::new(0),
            state: Mutex::default(),
        }
    }

    /// The raw device.
    pub fn raw(&self) -> &dyn RawDevice {
        &*self.raw
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a span may be open (a hint: [`Recorder::launch`] decides under the lock).
    pub fn holding(&self) -> bool {
        self.spans.load(Ordering::Acquire) > 0
    }

    /// Open (`true`) or close (`false`) a span; closing the last issues everything held. The
    /// count changes under the state lock, so no launch is held after the last span closed.
    pub fn span(&self, on: bool) -> Result<(), CudaError> {
        let mut st = self.state();
        let n = self.spans.load(Ordering::Acquire);
        if on {
            self.spans.store(n + 1, Ordering::Release);
            return Ok(());
        }
        let Some(left) = n.checked_sub(1) else {
            return Err(CudaError::BadOperands(
                "graphs(false) without an open graph span".into(),
            ));
        };
        self.spans.store(left, Ordering::Release);
        if left == 0 {
            self.issue_all(&mut st)?;
        }
        Ok(())
    }

    /// Hold `launch` on `stream` while a span is open, else launch it now.
    pub fn launch(&self, stream: StreamHandle, launch: GraphLaunch) -> Result<(), CudaError> {
        match self.hold(stream, Held::Launch(launch)) {
            Some(item) => item.issue(&*self.raw, stream),
            None => Ok(()),
        }
    }

    /// Hold a copy of `len` bytes of page-locked host memory at `src` to `ptr` (a fresh
    /// parameter chunk) on `stream` while a span is open, else copy it now.
    pub fn stage(
        &self,
        stream: StreamHandle,
        ptr: u64,
        src: u64,
        len: usize,
    ) -> Result<(), CudaError> {
        match self.hold(stream, Held::Stage { ptr, src, len }) {
            Some(item) => item.issue(&*self.raw, stream),
            None => Ok(()),
        }
    }

    /// Hold `item` if a span is open; else give it back to be issued.
    fn hold(&self, stream: StreamHandle, item: Held) -> Option<Held> {
        let mut st = self.state();
        if self.spans.load(Ordering::Acquire) == 0 {
            return Some(item);
        }
        st.held.entry(stream).or_default().push(item);
        None
    }

    /// Issue what `stream` holds.
    pub fn flush(&self, stream: StreamHandle) -> Result<(), CudaError> {
        let mut st = self.state();
        let items = st.held.remove(&stream).unwrap_or_default();
        self.issue(&mut st, stream, items)
    }

    /// Issue what every stream holds.
    pub fn flush_all(&self) -> Result<(), CudaError> {
        self.issue_all(&mut self.state())
    }

    fn issue_all(&self, st: &mut State) -> Result<(), CudaError> {
        let held = std::mem::take(&mut st.held);
        let mut first = Ok(());
        for (stream, items) in held {
            let r = self.issue(st, stream, items);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// [`Recorder::flush_all`] where an error cannot be returned (before a free): it is
    /// reported by the next flush instead.
    pub fn flush_all_deferred(&self) {
        if let Err(e) = self.flush_all() {
            self.state().failed.get_or_insert(e);
        }
    }

    /// The graph counters (launches, kernels, graphs built).
    pub fn stats(&self) -> DeviceStats {
        self.state().stats
    }

    /// Issue one segment (the state stays locked, so segments of one stream issue in order).
    fn issue(
        &self,
        st: &mut State,
        stream: StreamHandle,
        items: Vec<Held>,
    ) -> Result<(), CudaError> {
        if let Some(e) = st.failed.take() {
            return Err(e);
        }
        let raw = &*self.raw;
        let launches = items
            .iter()
            .filter(|i| matches!(i, Held::Launch(_)))
            .count();
        let one_by_one = |items: &[Held]| items.iter().try_for_each(|i| i.issue(raw, stream));
        if launches < MIN_GRAPH_LAUNCHES {
            return one_by_one(&items);
        }
        let sig: Vec<Sig> = items.iter().map(Held::sig).collect();
        if !st.segments.contains_key(&sig) && st.segments.len() >= MAX_SEGMENTS {
            self.destroy_graphs(st);
        }
        let built = match st.segments.get_mut(&sig) {
            None => {
                st.segments.insert(sig, Built::Seen);
                return one_by_one(&items);
            }
            Some(b) => b,
        };
        let graph = match *built {
            Built::Graph(g) => g,
            Built::Failed => return one_by_one(&items),
            Built::Seen => {
                let nodes: Vec<GraphLaunch> = items
                    .iter()
                    .filter_map(|i| match i {
                        Held::Launch(l) => Some(l.clone()),
                        Held::Stage { .. } => None,
                    })
                    .collect();
                // SAFETY: each launch's parameters were laid out by `Device::launch` for its
                // kernel; the graph is launched only with the addresses it was built with.
                match unsafe { raw.graph_create(&nodes) } {
                    Ok(g) => {
                        *built = Built::Graph(g);
                        st.stats.graphs_built += 1;
                        g
                    }
                    Err(e) => {
                        tracing::warn!(
                            launches,
                            error = %e,
                            "building a graph failed; its launches are issued one by one"
                        );
                        *built = Built::Failed;
                        return one_by_one(&items);
                    }
                }
            }
        };
        for i in items.iter().filter(|i| matches!(i, Held::Stage { .. })) {
            i.issue(raw, stream)?;
        }
        raw.graph_launch(stream, graph)?;
        st.stats.graph_launches += 1;
        st.stats.graph_kernels += launches as u64;
        Ok(())
    }

    fn destroy_graphs(&self, st: &mut State) {
        for (_, b) in st.segments.drain() {
            if let Built::Graph(g) = b {
                // SAFETY: g came from this device's graph_create and is dropped from the map.
                unsafe { self.raw.graph_destroy(g) };
            }
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let mut st = std::mem::take(&mut *self.state());
        self.destroy_graphs(&mut st);
    }
}

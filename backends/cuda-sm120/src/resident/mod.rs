//! [`DeviceOps`] for the CUDA backend: activations in device buffers for a whole step.
//!
//! Buffers are a slab `id -> DevBuf` (zeroed at allocation); a slice is the buffer's address
//! plus `off·4` bytes. Every op checks its slices, then launches the same `launch_*` functions
//! the host ops of `ops/` use (so results are bitwise the host op's) on the calling thread's
//! stream: the legacy default stream, or the device stream a plan's stream maps to
//! ([`DeviceOps::streams`], `streams.rs`). Nothing waits for the device except
//! [`DeviceOps::read`]: on the default stream it waits for every stream, on a plan stream for
//! that stream only (the plan's events order what it depends on before it); the execution's
//! join waits for every stream.
//!
//! Small per-call parameters (rope positions, swiglu row weights, gather indices, linear's
//! padded inputs) live in a bump arena that is rewound after each synchronisation, written
//! into its page-locked host mirror and copied from there asynchronously; larger ones
//! that come from the model's weights (norm weights, mHC `fn`/`base`/`scale`, rope θ) are
//! uploaded once and cached by address, length and content hash, like linear weights.
//! Buffers freed while work may still use them wait in a pending list until the next
//! synchronisation (a CUDA free would otherwise synchronise the device each time).
//!
//! `stats` counts the resident ops' traffic and adds the host ops' (counted by the host ops'
//! handle of the device: each host op's read-back is one submission).

mod attention;
mod grouped;
mod moe;
mod ops;
mod streams;

use crate::device::HostBuf;
use crate::{Core, CudaError, DevBuf, DevPtr};
use dsv4_kernels::{DevBufId, DevSlice, DeviceStats, KernelError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Byte alignment of slice offsets: linear's kernels load inputs as 16-byte vectors.
pub(crate) const ALIGN: usize = 16;
/// Alignment of arena chunks (what cudaMalloc gives).
const CHUNK_ALIGN: usize = 256;
/// Smallest parameter arena.
const ARENA_MIN: usize = 1 << 20;
/// Pending (freed, maybe still in use) bytes past which the next op synchronises and drops them.
const PENDING_MAX: usize = 256 << 20;
/// Cached parameter bytes past which the parameter cache starts over.
const CACHE_MAX: usize = 1 << 30;

/// A live buffer of the slab.
struct Slot {
    buf: DevBuf,
    words: usize,
}

/// The key of a cached parameter: host address, length and a hash of the contents (all of
/// them up to 64 KiB, 4096 evenly spaced 8-byte words beyond).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct ParamKey {
    ptr: usize,
    bytes: usize,
    hash: u64,
}

impl ParamKey {
    fn of(v: &[u8]) -> Self {
        let words = v.len() / 8;
        let step = if v.len() <= 64 << 10 { 1 } else { words / 4096 };
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |x: u64| h = (h ^ x).wrapping_mul(0x0100_0000_01b3);
        for c in v.chunks_exact(8).step_by(step) {
            mix(u64::from_le_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        for &b in v.chunks_exact(8).remainder() {
            mix(u64::from(b));
        }
        Self {
            ptr: v.as_ptr() as usize,
            bytes: v.len(),
            hash: h,
        }
    }
}

/// Everything the resident ops (and the executions' stream sets) share, behind one lock (an op holds it while it queues its
/// launches, so a synchronisation never rewinds the arena under an op).
#[derive(Default)]
struct State {
    next_id: u64,
    bufs: HashMap<u64, Slot>,
    /// Freed buffers and retired arenas, dropped after the next synchronisation.
    pending: Vec<DevBuf>,
    pending_bytes: usize,
    arena: Option<DevBuf>,
    /// The arena's page-locked host mirror: a parameter is written at its chunk's offset here
    /// and copied from here, asynchronously (same capacity as the arena).
    mirror: Option<HostBuf>,
    /// Retired mirrors, dropped after the next synchronisation (copies may still read them).
    pending_host: Vec<HostBuf>,
    arena_used: usize,
    cache: HashMap<[ParamKey; 2], DevBuf>,
    cache_bytes: usize,
    stats: DeviceStats,
}

/// The device-resident op set of a [`crate::CudaBackend`] (its `Backend::device`).
pub(crate) struct Resident {
    core: Core,
    state: Arc<Mutex<State>>,
    /// The host ops' traffic (counted by their device handle), included in `stats`.
    host_traffic: Arc<Mutex<DeviceStats>>,
    /// Idle stream sets for plan executions ([`DeviceOps::streams`]).
    streams: Arc<streams::StreamPool>,
    /// Whether it offers the routing ops ([`DeviceOps::routes_on_device`]).
    routes: bool,
    /// Whether it offers attention ([`DeviceOps::attends_on_device`]).
    attends: bool,
}

impl Drop for Resident {
    fn drop(&mut self) {
        self.streams.destroy(&self.core.dev);
    }
}

impl Resident {
    /// Share `pages` as the device's page cache (the host ops' one).
    pub(crate) fn set_page_cache(&mut self, pages: Arc<crate::ops::page_cache::PageCache>) {
        self.core.pages = pages;
    }

    /// Offer the routing ops (`on`) or not.
    pub(crate) fn set_routing(&mut self, on: bool) {
        self.routes = on;
    }

    /// Offer attention on device memory (`on`) or not.
    pub(crate) fn set_attention(&mut self, on: bool) {
        self.attends = on;
    }

    /// The op set over `core` (the backend's device and weight cache); `stats` adds
    /// `host_traffic`, what the backend's host ops count.
    pub(crate) fn new(core: Core, host_traffic: Arc<Mutex<DeviceStats>>) -> Self {
        Self {
            core,
            state: Arc::default(),
            host_traffic,
            streams: Arc::default(),
            routes: true,
            attends: true,
        }
    }
}

/// The sum of two sets of counters.
fn sum(a: DeviceStats, b: DeviceStats) -> DeviceStats {
    a.zip(&b, |x, y| x + y)
}

/// A `KernelError::Device` for a device failure of `op`.
fn dev_err(op: &str, e: CudaError) -> KernelError {
    KernelError::Device {
        message: format!("{op}: {e}"),
    }
}

/// A `KernelError::Device` with `message`.
pub(crate) fn op_err(message: String) -> KernelError {
    KernelError::Device { message }
}

/// What an op works with: the device, the locked state, the op's name.
pub(crate) struct Ctx<'a> {
    core: &'a Core,
    st: MutexGuard<'a, State>,
    op: &'static str,
}

impl Ctx<'_> {
    /// The device address range of `s` (`what` names it in errors).
    fn slice(&self, what: &str, s: DevSlice) -> Result<DevPtr, KernelError> {
        let op = self.op;
        let slot = self.st.bufs.get(&s.buf.0).ok_or_else(|| {
            op_err(format!(
                "{op}: {what} is in buffer {}, which is not allocated",
                s.buf.0
            ))
        })?;
        if s.off.checked_add(s.len).is_none_or(|end| end > slot.words) {
            return Err(op_err(format!(
                "{op}: {what} [{}, +{}) is outside its buffer of {} words",
                s.off, s.len, slot.words
            )));
        }
        if !(s.off * 4).is_multiple_of(ALIGN) {
            return Err(op_err(format!(
                "{op}: {what} starts at word {}, not a multiple of {ALIGN} bytes",
                s.off
            )));
        }
        Ok(DevPtr {
            ptr: slot.buf.ptr() + (s.off * 4) as u64,
            bytes: s.len * 4,
        })
    }

    /// Wait for what a read depends on, then copy `out.len()` words at `p` to the host: on the
    /// default stream after every stream's work (rewinding the arena), on a plan stream after
    /// that stream's only (the plan's events order whatever the value depends on before it, so
    /// the other streams keep running; the arena is rewound when the execution joins them).
    fn download(&mut self, p: DevPtr, out: &mut [f32]) -> Result<(), KernelError> {
        if self.core.dev.stream() == crate::device::DEFAULT_STREAM {
            sync_and_drain(&self.core.dev, &mut self.st).map_err(|e| dev_err(self.op, e))?;
        } else {
            self.st.stats.submissions += 1;
        }
        let r = self.core.dev.download_f32_from(p, out);
        self.run(r)?;
        self.st.stats.reads += 1;
        self.st.stats.read_bytes += out.len() as u64 * 4;
        Ok(())
    }

    /// `bytes` bytes of the arena (256-byte aligned), valid until the next wait for every
    /// stream.
    fn scratch(&mut self, bytes: usize) -> Result<DevPtr, KernelError> {
        let need = bytes.max(1).next_multiple_of(CHUNK_ALIGN);
        let st = &mut *self.st;
        let cap = st.arena.as_ref().map_or(0, DevBuf::bytes);
        if cap - st.arena_used < need {
            // Queued launches may still read the old arena, queued copies the old mirror:
            // retire both until the next sync.
            if let Some(old) = st.arena.take() {
                st.pending_bytes += old.bytes();
                st.pending.push(old);
            }
            st.pending_host.extend(st.mirror.take());
            let cap = need.max(2 * cap).max(ARENA_MIN);
            let dev = &self.core.dev;
            st.arena = Some(dev.alloc(cap).map_err(|e| dev_err(self.op, e))?);
            st.mirror = Some(dev.host_alloc(cap).map_err(|e| dev_err(self.op, e))?);
            st.stats.allocs += 1;
            st.arena_used = 0;
        }
        let base = st.arena.as_ref().map_or(0, DevBuf::ptr);
        let p = DevPtr {
            ptr: base + st.arena_used as u64,
            bytes,
        };
        st.arena_used += need;
        Ok(p)
    }

    /// `data` copied into the arena (a per-call parameter): written into the host mirror at
    /// the chunk's offset and copied from there asynchronously, ordered on the calling thread's
    /// stream before the launches that read it. The arena and its mirror are rewound only
    /// after a wait for every stream, so no queued launch can still read a chunk, nor a queued
    /// copy its mirror range, when it is handed out again.
    fn param(&mut self, data: &[u8]) -> Result<DevPtr, KernelError> {
        let p = self.scratch(data.len())?;
        let st = &mut *self.st;
        let off = st.arena.as_ref().map_or(0, |a| (p.ptr - a.ptr()) as usize);
        let mirror = st
            .mirror
            .as_mut()
            .ok_or_else(|| op_err(format!("{}: the parameter arena has no mirror", self.op)))?;
        let r = mirror
            .write(off, data)
            .and_then(|()| self.core.dev.stage(p, mirror, off, data.len()));
        r.map_err(|e| dev_err(self.op, e))?;
        self.st.stats.writes += 1;
        self.st.stats.write_bytes += data.len() as u64;
        Ok(p)
    }

    /// `v` on the device, uploaded once per distinct host array (see [`ParamKey`]).
    fn cached(&mut self, v: &[u8]) -> Result<DevPtr, KernelError> {
        self.cached_as([ParamKey::of(v), ParamKey::default()], || v.to_vec())
    }

    /// The concatenation of `a` and `b` on the device, uploaded once per distinct pair.
    fn cached_pair(&mut self, a: &[u8], b: &[u8]) -> Result<DevPtr, KernelError> {
        self.cached_as([ParamKey::of(a), ParamKey::of(b)], || [a, b].concat())
    }

    fn cached_as(
        &mut self,
        key: [ParamKey; 2],
        data: impl FnOnce() -> Vec<u8>,
    ) -> Result<DevPtr, KernelError> {
        if let Some(b) = self.st.cache.get(&key) {
            return Ok(b.at());
        }
        let v = data();
        let st = &mut *self.st;
        if st.cache_bytes + v.len() > CACHE_MAX {
            for (_, b) in st.cache.drain() {
                st.pending_bytes += b.bytes();
                st.pending.push(b);
            }
            st.cache_bytes = 0;
        }
        let b = self.core.dev.upload(&v).map_err(|e| dev_err(self.op, e))?;
        st.stats.allocs += 1;
        st.stats.writes += 1;
        st.stats.write_bytes += v.len() as u64;
        st.cache_bytes += v.len();
        let p = b.at();
        st.cache.insert(key, b);
        Ok(p)
    }

    /// Count `n` queued kernel launches.
    fn dispatched(&mut self, n: u64) {
        self.st.stats.dispatches += n;
    }

    /// A device result of this op as the trait's error.
    fn run(&self, r: Result<(), CudaError>) -> Result<(), KernelError> {
        r.map_err(|e| dev_err(self.op, e))
    }
}

/// Whether two device ranges overlap.
fn overlap(a: DevPtr, b: DevPtr) -> bool {
    a.bytes > 0 && b.bytes > 0 && a.ptr < b.ptr + b.bytes as u64 && b.ptr < a.ptr + a.bytes as u64
}

impl Resident {
    /// Run resident op `op` with the state locked.
    fn resident_op(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Ctx<'_>) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut cx = Ctx {
            core: &self.core,
            st,
            op,
        };
        if cx.st.pending_bytes > PENDING_MAX {
            sync_and_drain(&self.core.dev, &mut cx.st).map_err(|e| dev_err(op, e))?;
        }
        f(&mut cx)
    }
}

/// An error for routing op `op` on a backend set to route on the host.
fn routing_offered(on: bool, op: &str) -> Result<(), KernelError> {
    if on {
        Ok(())
    } else {
        Err(op_err(format!(
            "{op}: this backend routes on the host (backend.cuda_routing = host)"
        )))
    }
}

/// Wait for every stream of the device (one submission), then drop what waited for it and
/// rewind the arena.
fn sync_and_drain(dev: &crate::Device, st: &mut State) -> Result<(), CudaError> {
    st.stats.submissions += 1;
    dev.synchronize()?;
    st.pending.clear();
    st.pending_host.clear();
    st.pending_bytes = 0;
    st.arena_used = 0;
    Ok(())
}

impl dsv4_kernels::DeviceOps for Resident {
    fn offset_alignment(&self) -> usize {
        ALIGN
    }

    fn alloc(&self, words: usize) -> Result<DevBufId, KernelError> {
        if words == 0 {
            return Err(op_err("alloc: a buffer of 0 words".into()));
        }
        let bytes = words
            .checked_mul(4)
            .ok_or_else(|| op_err(format!("alloc: {words} words")))?;
        let buf = self
            .core
            .dev
            .alloc(bytes)
            .map_err(|e| dev_err("alloc", e))?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.next_id += 1;
        let id = st.next_id;
        st.bufs.insert(id, Slot { buf, words });
        st.stats.allocs += 1;
        Ok(DevBufId(id))
    }

    fn free(&self, buf: DevBufId) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = st.bufs.remove(&buf.0) {
            st.pending_bytes += slot.buf.bytes();
            st.pending.push(slot.buf);
        }
    }

    fn write(&self, dst: DevSlice, src: &[f32]) -> Result<(), KernelError> {
        self.resident_op("write", |cx| {
            dsv4_kernels::device::check_len("write", "dst", dst, src.len())?;
            let p = cx.slice("dst", dst)?;
            // Ordered after the work issued on the calling thread's stream; work on other
            // streams that uses dst is ordered by the plan's events.
            let r = cx.core.dev.upload_to(p, crate::device::f32_bytes(src));
            cx.run(r)?;
            cx.st.stats.writes += 1;
            cx.st.stats.write_bytes += src.len() as u64 * 4;
            Ok(())
        })
    }

    fn read(&self, src: DevSlice) -> Result<Vec<f32>, KernelError> {
        let mut out = vec![0f32; src.len];
        self.resident_op("read", |cx| {
            let p = cx.slice("src", src)?;
            cx.download(p, &mut out)
        })?;
        Ok(out)
    }

    fn read_many(&self, srcs: &[DevSlice]) -> Result<Vec<Vec<f32>>, KernelError> {
        if srcs.len() < 2 {
            return srcs.iter().map(|&s| self.read(s)).collect();
        }
        let mut all = vec![0f32; srcs.iter().map(|s| s.len).sum()];
        self.resident_op("read", |cx| ops::read_many(cx, srcs, &mut all))?;
        let mut rest = &all[..];
        let mut out = Vec::with_capacity(srcs.len());
        for s in srcs {
            let (v, tail) = rest.split_at(s.len);
            out.push(v.to_vec());
            rest = tail;
        }
        Ok(out)
    }

    fn flush(&self) -> Result<(), KernelError> {
        // Launches are submitted as they are queued (cuLaunchKernel); nothing is batched.
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        let own = self.state.lock().unwrap_or_else(|e| e.into_inner()).stats;
        let host = *self.host_traffic.lock().unwrap_or_else(|e| e.into_inner());
        sum(sum(own, host), self.core.dev.graph_stats())
    }

    fn graphs(&self, on: bool) -> Result<(), KernelError> {
        self.core.dev.graphs(on).map_err(|e| dev_err("graphs", e))
    }

    fn streams(
        &self,
        streams: usize,
        events: usize,
    ) -> Result<Option<Arc<dyn dsv4_kernels::DeviceStreams>>, KernelError> {
        // Joining counts as submissions, with the host ops' traffic.
        let dev = self.core.dev.counted(Arc::clone(&self.host_traffic));
        let set = self
            .streams
            .take(&dev, Arc::clone(&self.state), streams, events)?;
        Ok(Some(Arc::new(set)))
    }

    fn copy2d(
        &self,
        src: DevSlice,
        dst: DevSlice,
        shape: dsv4_kernels::device::Copy2d,
    ) -> Result<(), KernelError> {
        self.resident_op("copy2d", |cx| ops::copy2d(cx, src, dst, shape))
    }

    fn gather_rows(
        &self,
        src: DevSlice,
        idx: &[u32],
        width: usize,
        dst: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("gather_rows", |cx| {
            ops::by_index(cx, false, src, idx, width, dst)
        })
    }

    fn scatter_add_rows(
        &self,
        src: DevSlice,
        idx: &[u32],
        width: usize,
        dst: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("scatter_add_rows", |cx| {
            ops::by_index(cx, true, src, idx, width, dst)
        })
    }

    fn add(&self, a: DevSlice, b: DevSlice, out: DevSlice) -> Result<(), KernelError> {
        self.resident_op("add", |cx| ops::add(cx, a, b, out))
    }

    fn router_scores(&self, logits: DevSlice, out: DevSlice) -> Result<(), KernelError> {
        self.resident_op("router_scores", |cx| ops::router_scores(cx, logits, out))
    }

    fn scale(&self, x: DevSlice, s: f64) -> Result<(), KernelError> {
        self.resident_op("scale", |cx| ops::scale(cx, x, s))
    }

    fn linear(
        &self,
        w: &dsv4_kernels::Linear,
        x: DevSlice,
        rows: usize,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("linear", |cx| ops::linear(cx, w, x, rows, out))
    }

    fn grouped_linear(
        &self,
        weights: &[&dsv4_kernels::Linear],
        x: DevSlice,
        starts: &[usize],
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("grouped_linear", |cx| {
            grouped::grouped_linear(cx, weights, x, starts, out)
        })
    }

    fn scatter_add_groups(
        &self,
        src: DevSlice,
        idx: &[u32],
        starts: &[usize],
        width: usize,
        dst: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("scatter_add_groups", |cx| {
            grouped::scatter_add_groups(cx, src, idx, starts, width, dst)
        })
    }

    fn act_quant_fp8(&self, x: DevSlice, dim: usize) -> Result<(), KernelError> {
        self.resident_op("act_quant_fp8", |cx| ops::act_quant_fp8(cx, x, dim))
    }

    fn rms_norm(
        &self,
        x: DevSlice,
        weight: Option<&[f32]>,
        dim: usize,
        eps: f32,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("rms_norm", |cx| ops::rms_norm(cx, x, weight, dim, eps, out))
    }

    fn rope(
        &self,
        x: DevSlice,
        dim: usize,
        positions: &[usize],
        table: &dsv4_kernels::RopeTable,
        inverse: bool,
    ) -> Result<(), KernelError> {
        self.resident_op("rope", |cx| {
            ops::rope(cx, x, dim, positions, table, inverse)
        })
    }

    fn hadamard(&self, x: DevSlice, dim: usize) -> Result<(), KernelError> {
        self.resident_op("hadamard", |cx| ops::hadamard(cx, x, dim))
    }

    fn round_index_rows(
        &self,
        dtype: dsv4_core::IndexKDtype,
        x: DevSlice,
        dim: usize,
    ) -> Result<(), KernelError> {
        self.resident_op("round_index_rows", |cx| {
            ops::round_index_rows(cx, dtype, x, dim)
        })
    }

    fn mhc_pre(
        &self,
        p: &dsv4_kernels::HcParams<'_>,
        x: DevSlice,
        t: usize,
        u: DevSlice,
        post: DevSlice,
        comb: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("mhc_pre", |cx| ops::mhc_pre(cx, p, x, t, u, post, comb))
    }

    fn mhc_post(
        &self,
        x: DevSlice,
        y: DevSlice,
        post: DevSlice,
        comb: DevSlice,
        m: usize,
        d: usize,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("mhc_post", |cx| {
            ops::mhc_post(cx, x, y, post, comb, m, d, out)
        })
    }

    fn hc_head(
        &self,
        p: &dsv4_kernels::HcParams<'_>,
        x: DevSlice,
        t: usize,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("hc_head", |cx| ops::hc_head(cx, p, x, t, out))
    }

    fn swiglu_rows(
        &self,
        g: DevSlice,
        u: DevSlice,
        limit: f32,
        weights: &[f32],
        width: usize,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("swiglu_rows", |cx| {
            ops::swiglu_rows(cx, g, u, limit, weights, width, out)
        })
    }

    fn routes_on_device(&self) -> bool {
        self.routes
    }

    fn route_experts(
        &self,
        scores: DevSlice,
        experts: usize,
        k: usize,
        choice: dsv4_kernels::RouteChoice<'_>,
        scale: f64,
        routes: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("route_experts", |cx| {
            routing_offered(self.routes, "route_experts")?;
            moe::route_experts(cx, scores, experts, k, choice, scale, routes)
        })
    }

    fn routed_experts(
        &self,
        experts: &dsv4_kernels::RoutedExperts<'_>,
        x: DevSlice,
        routes: DevSlice,
        work: DevSlice,
        y: DevSlice,
    ) -> Result<(), KernelError> {
        self.resident_op("routed_experts", |cx| {
            routing_offered(self.routes, "routed_experts")?;
            moe::routed_experts(cx, experts, x, routes, work, y)
        })
    }

    fn attends_on_device(&self) -> bool {
        self.attends
    }

    fn paged_attention(
        &self,
        keys: &dsv4_kernels::PagedAttention<'_>,
        q: DevSlice,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.attend(keys, q, out)
    }

    fn paged_indexer_topk(
        &self,
        keys: &dsv4_kernels::PagedIndexer<'_>,
        q: DevSlice,
        w: DevSlice,
    ) -> Result<Vec<Vec<usize>>, KernelError> {
        self.select(keys, q, w)
    }

    fn cache_encode_into(
        &self,
        fmt: &dsv4_kernels::RowFormat,
        x: DevSlice,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.encode_into(fmt, x, out)
    }

    fn softmax_pool_rows(
        &self,
        a: DevSlice,
        z: DevSlice,
        windows: usize,
        rows: usize,
        width: usize,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        self.pool((a, z, out), windows, rows, width)
    }
}

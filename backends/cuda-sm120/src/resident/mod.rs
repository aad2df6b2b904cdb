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
mod ctx;
mod grouped;
mod moe;
mod ops;
mod streams;

pub(crate) use ctx::{ALIGN, Ctx, op_err};
use ctx::{PENDING_MAX, ParamKey, Slot, State, dev_err, overlap, sum, sync_and_drain};

use crate::Core;
use dsv4_kernels::{DevBufId, DevSlice, DeviceStats, KernelError};
use std::sync::{Arc, Mutex};

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

    /// Launch the one-row linear kernels of `shapes`.
    pub(crate) fn set_decode_shapes(&mut self, shapes: crate::DecodeShapes) {
        self.core.decode = shapes;
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

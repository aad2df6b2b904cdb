//! [`HostResident`]: any host backend with a [`DeviceOps`] whose "device" buffers live in host
//! memory. Every device op copies its operands out, runs the wrapped backend's host op of the
//! same name and writes the result back, so this is the executable specification of each
//! device op, and lets the resident executor be tested on CPU bit for bit against the host path.
//!
//! Counters: every op is one dispatch; a read is one submission and one read; a flush with
//! dispatches queued since the last submission is one submission; a write is one write; an
//! alloc is one alloc. Failed calls count nothing.

use crate::device::{
    Copy2d, DevBufId, DevSlice, DeviceOps, DeviceStats, check_len, check_mhc_post, check_mhc_pre,
    check_rope, ensure, rows_of,
};
use crate::{
    Backend, HcParams, KernelError, Linear, MhcPre, PagedAttention, PagedIndexer, RopeTable,
    RouteChoice, RoutedExperts, RowFormat,
};
use dsv4_core::IndexKDtype;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

mod attention;
mod resident;
mod routing;

pub use resident::HostResident;

/// Offset alignment of [`HostDevice`] slices, in bytes (as strict as wgpu).
pub const HOST_DEVICE_ALIGNMENT: usize = 256;

/// The [`DeviceOps`] of a [`HostResident`]: buffers are `Vec<f32>` in a map by id.
pub struct HostDevice {
    be: Arc<dyn Backend>,
    bufs: Mutex<HashMap<u64, Vec<f32>>>,
    next: AtomicU64,
    stats: Mutex<DeviceStats>,
    /// Dispatches queued since the last submission.
    pending: AtomicU64,
    /// Whether it offers the routing ops ([`DeviceOps::routes_on_device`]).
    routes: bool,
    /// Whether it offers attention ([`DeviceOps::attends_on_device`]).
    attends: bool,
}

type R<T> = Result<T, KernelError>;

fn err(message: String) -> KernelError {
    KernelError::Device { message }
}

impl HostDevice {
    /// A device running `be`'s host ops.
    pub fn new(be: Arc<dyn Backend>) -> Self {
        Self {
            be,
            bufs: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            stats: Mutex::new(DeviceStats::default()),
            pending: AtomicU64::new(0),
            routes: false,
            attends: false,
        }
    }

    /// The same device offering the routing ops.
    pub fn with_device_routing(self) -> Self {
        Self {
            routes: true,
            ..self
        }
    }

    /// The same device offering attention.
    pub fn with_device_attention(self) -> Self {
        Self {
            attends: true,
            ..self
        }
    }

    fn lock_bufs(&self) -> MutexGuard<'_, HashMap<u64, Vec<f32>>> {
        self.bufs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut DeviceStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Check `s` is aligned and inside its (live) buffer.
    fn check(&self, op: &str, what: &str, s: DevSlice, bufs: &HashMap<u64, Vec<f32>>) -> R<()> {
        let b = bufs
            .get(&s.buf.0)
            .ok_or_else(|| err(format!("{op}: {what}: unknown buffer {}", s.buf.0)))?;
        ensure(
            (s.off * 4).is_multiple_of(HOST_DEVICE_ALIGNMENT),
            op,
            || {
                format!(
                    "{what}: offset {} words is not a multiple of 256 bytes",
                    s.off
                )
            },
        )?;
        ensure(
            s.off.checked_add(s.len).is_some_and(|e| e <= b.len()),
            op,
            || {
                format!(
                    "{what}: words [{}, {}) outside a buffer of {}",
                    s.off,
                    s.off.saturating_add(s.len),
                    b.len()
                )
            },
        )
    }

    /// Copies of the operands (each checked).
    fn load<const N: usize>(&self, op: &str, ops: [(&str, DevSlice); N]) -> R<[Vec<f32>; N]> {
        let bufs = self.lock_bufs();
        for (what, s) in ops {
            self.check(op, what, s, &bufs)?;
        }
        Ok(ops.map(|(_, s)| bufs[&s.buf.0][s.off..s.off + s.len].to_vec()))
    }

    /// Check every output slice before running anything.
    fn check_out(&self, op: &str, outs: &[(&str, DevSlice)]) -> R<()> {
        let bufs = self.lock_bufs();
        outs.iter()
            .try_for_each(|&(what, s)| self.check(op, what, s, &bufs))
    }

    /// Write an op's results back (slices re-checked) and count its one dispatch.
    fn store(&self, op: &str, outs: &[(DevSlice, &[f32])]) -> R<()> {
        let mut bufs = self.lock_bufs();
        for &(s, v) in outs {
            self.check(op, "output", s, &bufs)?;
            ensure(v.len() == s.len, op, || "result length mismatch".into())?;
            bufs.get_mut(&s.buf.0).expect("checked")[s.off..s.off + s.len].copy_from_slice(v);
        }
        drop(bufs);
        self.count(|st| st.dispatches += 1);
        self.pending.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Run a host op; a panic (an input the checks missed) becomes an error.
    fn host<T>(&self, op: &str, f: impl FnOnce(&dyn Backend) -> T) -> R<T> {
        catch_unwind(AssertUnwindSafe(|| f(self.be.as_ref())))
            .map_err(|_| err(format!("{op}: the host op rejected its inputs (panicked)")))
    }

    /// An in-place row op on `x` with rows of `dim`.
    fn in_place(
        &self,
        op: &str,
        x: DevSlice,
        dim: usize,
        f: impl FnOnce(&dyn Backend, &mut [f32]),
    ) -> R<()> {
        rows_of(op, "x", x, dim)?;
        let [mut v] = self.load(op, [("x", x)])?;
        self.host(op, |be| f(be, &mut v))?;
        self.store(op, &[(x, &v)])
    }

    fn check_hc(op: &str, p: &HcParams<'_>, n_out: usize, n_scale: usize) -> R<()> {
        ensure(
            p.m > 0
                && p.d > 0
                && p.fn_w.len() == n_out * p.m * p.d
                && p.base.len() == n_out
                && p.scale.len() == n_scale,
            op,
            || {
                format!(
                    "HcParams M={} D={}: fn_w {} base {} scale {} words, want {}, {n_out}, {n_scale}",
                    p.m,
                    p.d,
                    p.fn_w.len(),
                    p.base.len(),
                    p.scale.len(),
                    n_out * p.m * p.d
                )
            },
        )
    }
}

impl DeviceOps for HostDevice {
    fn offset_alignment(&self) -> usize {
        HOST_DEVICE_ALIGNMENT
    }

    fn alloc(&self, words: usize) -> R<DevBufId> {
        let mut v = Vec::new();
        v.try_reserve_exact(words.max(1))
            .map_err(|e| err(format!("alloc of {words} words: {e}")))?;
        v.resize(words.max(1), 0f32);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock_bufs().insert(id, v);
        self.count(|st| st.allocs += 1);
        Ok(DevBufId(id))
    }

    fn free(&self, buf: DevBufId) {
        self.lock_bufs().remove(&buf.0);
    }

    fn write(&self, dst: DevSlice, src: &[f32]) -> R<()> {
        ensure(src.len() == dst.len, "write", || {
            format!("{} host words into a slice of {}", src.len(), dst.len)
        })?;
        let mut bufs = self.lock_bufs();
        self.check("write", "dst", dst, &bufs)?;
        bufs.get_mut(&dst.buf.0).expect("checked")[dst.off..dst.off + dst.len].copy_from_slice(src);
        drop(bufs);
        self.count(|st| {
            st.writes += 1;
            st.write_bytes += 4 * src.len() as u64;
        });
        Ok(())
    }

    fn read(&self, src: DevSlice) -> R<Vec<f32>> {
        let [v] = self.load("read", [("src", src)])?;
        self.pending.store(0, Ordering::Relaxed);
        self.count(|st| {
            st.submissions += 1;
            st.reads += 1;
            st.read_bytes += 4 * v.len() as u64;
        });
        Ok(v)
    }

    fn read_many(&self, srcs: &[DevSlice]) -> R<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(srcs.len());
        for &s in srcs {
            let [v] = self.load("read", [("src", s)])?;
            out.push(v);
        }
        self.pending.store(0, Ordering::Relaxed);
        self.count(|st| {
            st.submissions += 1;
            st.reads += srcs.len() as u64;
            st.read_bytes += 4 * out.iter().map(Vec::len).sum::<usize>() as u64;
        });
        Ok(out)
    }

    fn flush(&self) -> R<()> {
        if self.pending.swap(0, Ordering::Relaxed) > 0 {
            self.count(|st| st.submissions += 1);
        }
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn copy2d(&self, src: DevSlice, dst: DevSlice, sh: Copy2d) -> R<()> {
        ensure(sh.fits(src.len, dst.len), "copy2d", || {
            format!(
                "{sh:?} does not fit a source of {} and a destination of {} words",
                src.len, dst.len
            )
        })?;
        let [s, mut d] = self.load("copy2d", [("src", src), ("dst", dst)])?;
        for r in 0..sh.rows {
            let (s0, d0) = (
                r * sh.src_stride + sh.src_col,
                r * sh.dst_stride + sh.dst_col,
            );
            d[d0..d0 + sh.width].copy_from_slice(&s[s0..s0 + sh.width]);
        }
        self.store("copy2d", &[(dst, &d)])
    }

    fn gather_rows(&self, src: DevSlice, idx: &[u32], width: usize, dst: DevSlice) -> R<()> {
        let op = "gather_rows";
        let n = rows_of(op, "src", src, width)?;
        check_len(op, "dst", dst, idx.len() * width)?;
        ensure(idx.iter().all(|&i| (i as usize) < n), op, || {
            format!("an index is past the {n} source rows")
        })?;
        let [s] = self.load(op, [("src", src)])?;
        self.check_out(op, &[("dst", dst)])?;
        let d: Vec<f32> = idx
            .iter()
            .flat_map(|&i| &s[i as usize * width..(i as usize + 1) * width])
            .copied()
            .collect();
        self.store(op, &[(dst, &d)])
    }

    fn scatter_add_rows(&self, src: DevSlice, idx: &[u32], width: usize, dst: DevSlice) -> R<()> {
        let op = "scatter_add_rows";
        let n = rows_of(op, "dst", dst, width)?;
        check_len(op, "src", src, idx.len() * width)?;
        ensure(idx.iter().all(|&i| (i as usize) < n), op, || {
            format!("an index is past the {n} destination rows")
        })?;
        let [s, mut d] = self.load(op, [("src", src), ("dst", dst)])?;
        for (r, &i) in idx.iter().enumerate() {
            let row = &mut d[i as usize * width..(i as usize + 1) * width];
            for (o, v) in row.iter_mut().zip(&s[r * width..(r + 1) * width]) {
                *o += v;
            }
        }
        self.store(op, &[(dst, &d)])
    }

    fn add(&self, a: DevSlice, b: DevSlice, out: DevSlice) -> R<()> {
        check_len("add", "b", b, a.len)?;
        check_len("add", "out", out, a.len)?;
        let [x, y] = self.load("add", [("a", a), ("b", b)])?;
        self.check_out("add", &[("out", out)])?;
        let o: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
        self.store("add", &[(out, &o)])
    }

    fn router_scores(&self, logits: DevSlice, out: DevSlice) -> R<()> {
        check_len("router_scores", "out", out, logits.len)?;
        let [x] = self.load("router_scores", [("logits", logits)])?;
        self.check_out("router_scores", &[("out", out)])?;
        let mut o = vec![0f32; out.len];
        self.host("router_scores", |be| be.router_scores(&x, &mut o))?;
        self.store("router_scores", &[(out, &o)])
    }

    fn scale(&self, x: DevSlice, s: f64) -> R<()> {
        let [mut v] = self.load("scale", [("x", x)])?;
        v.iter_mut().for_each(|e| *e = (f64::from(*e) * s) as f32);
        self.store("scale", &[(x, &v)])
    }

    fn linear(&self, w: &Linear, x: DevSlice, rows: usize, out: DevSlice) -> R<()> {
        check_len("linear", "x", x, rows * w.in_dim)?;
        check_len("linear", "out", out, rows * w.out_dim)?;
        let [v] = self.load("linear", [("x", x)])?;
        self.check_out("linear", &[("out", out)])?;
        let mut o = vec![0f32; out.len];
        self.host("linear", |be| be.linear(w, &v, rows, &mut o))?;
        self.store("linear", &[(out, &o)])
    }

    fn act_quant_fp8(&self, x: DevSlice, dim: usize) -> R<()> {
        self.in_place("act_quant_fp8", x, dim, |be, v| be.act_quant_fp8(v, dim))
    }

    fn rms_norm(
        &self,
        x: DevSlice,
        weight: Option<&[f32]>,
        dim: usize,
        eps: f32,
        out: DevSlice,
    ) -> R<()> {
        let op = "rms_norm";
        rows_of(op, "x", x, dim)?;
        check_len(op, "out", out, x.len)?;
        ensure(weight.is_none_or(|w| w.len() == dim), op, || {
            format!(
                "weight has {} words, dim {dim}",
                weight.map_or(0, <[f32]>::len)
            )
        })?;
        let [v] = self.load(op, [("x", x)])?;
        self.check_out(op, &[("out", out)])?;
        let mut o = vec![0f32; out.len];
        self.host(op, |be| be.rms_norm(&v, weight, dim, eps, &mut o))?;
        self.store(op, &[(out, &o)])
    }

    fn rope(
        &self,
        x: DevSlice,
        dim: usize,
        positions: &[usize],
        table: &RopeTable,
        inverse: bool,
    ) -> R<()> {
        check_rope(x, dim, positions, table)?;
        self.in_place("rope", x, dim, |be, v| {
            be.rope(v, dim, positions, table, inverse)
        })
    }

    fn hadamard(&self, x: DevSlice, dim: usize) -> R<()> {
        ensure(dim.is_power_of_two(), "hadamard", || {
            format!("dim {dim} is not a power of two")
        })?;
        self.in_place("hadamard", x, dim, |be, v| be.hadamard(v, dim))
    }

    fn round_index_rows(&self, dtype: IndexKDtype, x: DevSlice, dim: usize) -> R<()> {
        self.in_place("round_index_rows", x, dim, |be, v| {
            be.round_index_rows(dtype, v, dim)
        })
    }

    fn mhc_pre(
        &self,
        p: &HcParams<'_>,
        x: DevSlice,
        t: usize,
        u: DevSlice,
        post: DevSlice,
        comb: DevSlice,
    ) -> R<()> {
        let (op, m, d) = ("mhc_pre", p.m, p.d);
        Self::check_hc(op, p, (2 + m) * m, 3)?;
        check_mhc_pre(x, t, (m, d), u, post, comb)?;
        let [v] = self.load(op, [("x", x)])?;
        self.check_out(op, &[("u", u), ("post", post), ("comb", comb)])?;
        let r = self.host(op, |be| be.mhc_pre(p, &v, t))?;
        ensure(
            r.u.len() == u.len && r.post.len() == post.len && r.comb.len() == comb.len,
            op,
            || "the host op returned results of unexpected sizes".into(),
        )?;
        self.store(op, &[(u, &r.u), (post, &r.post), (comb, &r.comb)])
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
    ) -> R<()> {
        let op = "mhc_post";
        check_mhc_post((x, y, post, comb), m, d, out)?;
        let [xv, yv, pv, cv] =
            self.load(op, [("x", x), ("y", y), ("post", post), ("comb", comb)])?;
        self.check_out(op, &[("out", out)])?;
        let pre = MhcPre {
            u: vec![],
            post: pv,
            comb: cv,
        };
        let mut o = vec![0f32; out.len];
        self.host(op, |be| be.mhc_post(&xv, &yv, &pre, m, d, &mut o))?;
        self.store(op, &[(out, &o)])
    }

    fn hc_head(&self, p: &HcParams<'_>, x: DevSlice, t: usize, out: DevSlice) -> R<()> {
        let op = "hc_head";
        Self::check_hc(op, p, p.m, 1)?;
        check_len(op, "x", x, t * p.m * p.d)?;
        check_len(op, "out", out, t * p.d)?;
        let [v] = self.load(op, [("x", x)])?;
        self.check_out(op, &[("out", out)])?;
        let mut o = vec![0f32; out.len];
        self.host(op, |be| be.hc_head(p, &v, t, &mut o))?;
        self.store(op, &[(out, &o)])
    }

    fn swiglu_rows(
        &self,
        g: DevSlice,
        u: DevSlice,
        limit: f32,
        weights: &[f32],
        width: usize,
        out: DevSlice,
    ) -> R<()> {
        let op = "swiglu_rows";
        check_len(op, "g", g, weights.len() * width)?;
        check_len(op, "u", u, weights.len() * width)?;
        check_len(op, "out", out, weights.len() * width)?;
        let [gv, uv] = self.load(op, [("g", g), ("u", u)])?;
        self.check_out(op, &[("out", out)])?;
        let mut o = vec![0f32; out.len];
        self.host(op, |be| {
            for (r, &w) in weights.iter().enumerate() {
                let s = r * width..(r + 1) * width;
                be.swiglu(&gv[s.clone()], &uv[s.clone()], limit, w, &mut o[s]);
            }
        })?;
        self.store(op, &[(out, &o)])
    }

    fn routes_on_device(&self) -> bool {
        self.routes
    }

    fn route_experts(
        &self,
        scores: DevSlice,
        experts: usize,
        k: usize,
        choice: RouteChoice<'_>,
        scale: f64,
        routes: DevSlice,
    ) -> R<()> {
        routing::route_experts(self, scores, experts, k, choice, scale, routes)
    }

    fn routed_experts(
        &self,
        experts: &RoutedExperts<'_>,
        x: DevSlice,
        routes: DevSlice,
        work: DevSlice,
        y: DevSlice,
    ) -> R<()> {
        routing::routed_experts(self, experts, x, routes, work, y)
    }

    fn attends_on_device(&self) -> bool {
        self.attends
    }

    fn paged_attention(&self, keys: &PagedAttention<'_>, q: DevSlice, out: DevSlice) -> R<()> {
        attention::paged_attention(self, keys, q, out)
    }

    fn paged_indexer_topk(
        &self,
        keys: &PagedIndexer<'_>,
        q: DevSlice,
        w: DevSlice,
    ) -> R<Vec<Vec<usize>>> {
        attention::paged_indexer_topk(self, keys, q, w)
    }

    fn cache_encode_into(&self, fmt: &RowFormat, x: DevSlice, out: DevSlice) -> R<()> {
        attention::cache_encode_into(self, fmt, x, out)
    }

    fn softmax_pool_rows(
        &self,
        a: DevSlice,
        z: DevSlice,
        windows: usize,
        rows: usize,
        width: usize,
        out: DevSlice,
    ) -> R<()> {
        attention::softmax_pool_rows(self, (a, z, out), windows, rows, width)
    }
}

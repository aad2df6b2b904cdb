//! Device-resident activations: the op set a GPU backend offers over its own buffers
//! ([`DeviceOps`], reached through [`crate::Backend::device`]), so that a plan's transient
//! buffers stay on the device for a whole step and only the host-side ops (cache pages,
//! routing, top-k) read anything back.
//!
//! Every op computes exactly what the host op of the same name computes on the same backend
//! (same kernels, same reduction order), so a step run resident is bitwise equal to the same
//! step run through host slices. Ops are queued: nothing waits for the device until
//! [`DeviceOps::read`] (which completes everything queued before it).
//!
//! Slices are f32 words. Their offsets must be multiples of [`DeviceOps::offset_alignment`]
//! bytes (every plan arena offset is a multiple of 256, the most any wgpu device asks for).

use crate::{
    HcParams, KernelError, Linear, PagedAttention, PagedIndexer, RopeTable, RouteChoice,
    RoutedExperts, RowFormat,
};
use dsv4_core::IndexKDtype;
use serde::Serialize;

mod checks;
mod staging;

pub use checks::{
    check_groups, check_len, check_mhc_post, check_mhc_pre, check_rope, check_scatter_groups,
    check_starts, ensure, rows_of,
};
use staging::Staging;

/// A buffer of a backend's [`DeviceOps`], by id (ids are never reused while a backend lives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevBufId(pub u64);

/// A range of f32 words of a device buffer: `len` words from word `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevSlice {
    /// The buffer.
    pub buf: DevBufId,
    /// First word.
    pub off: usize,
    /// Words.
    pub len: usize,
}

impl DevSlice {
    /// The first `len` words of `buf`.
    pub fn whole(buf: DevBufId, len: usize) -> Self {
        Self { buf, off: 0, len }
    }

    /// Words `[start, start + len)` of this slice.
    ///
    /// # Panics
    /// If the range is not inside the slice (a bug in the caller's shapes).
    pub fn sub(self, start: usize, len: usize) -> Self {
        assert!(
            start + len <= self.len,
            "device slice [{start}, {}) outside a slice of {} words",
            start + len,
            self.len
        );
        Self {
            buf: self.buf,
            off: self.off + start,
            len,
        }
    }

    /// The first `len` words of this slice.
    pub fn prefix(self, len: usize) -> Self {
        self.sub(0, len)
    }
}

/// The shape of a [`DeviceOps::copy2d`]: `rows` rows of `width` words, read at column `src_col`
/// of rows `src_stride` words apart and written at column `dst_col` of rows `dst_stride` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Copy2d {
    /// Rows copied.
    pub rows: usize,
    /// Words per row copied.
    pub width: usize,
    /// Distance between source rows, in words.
    pub src_stride: usize,
    /// First source column.
    pub src_col: usize,
    /// Distance between destination rows, in words.
    pub dst_stride: usize,
    /// First destination column.
    pub dst_col: usize,
}

impl Copy2d {
    /// A plain copy of `words` contiguous words (one row).
    pub fn contiguous(words: usize) -> Self {
        Copy2d {
            rows: 1,
            width: words,
            src_stride: words,
            src_col: 0,
            dst_stride: words,
            dst_col: 0,
        }
    }

    /// Whether every element read lies inside `src_len` words and every element written
    /// inside `dst_len` words.
    pub fn fits(&self, src_len: usize, dst_len: usize) -> bool {
        let end = |stride: usize, col: usize| {
            if self.rows == 0 || self.width == 0 {
                0
            } else {
                (self.rows - 1) * stride + col + self.width
            }
        };
        end(self.src_stride, self.src_col) <= src_len
            && end(self.dst_stride, self.dst_col) <= dst_len
    }
}

/// Counters of a device's traffic since it was opened: what a step cost in submissions and
/// host↔device copies (reported by `dsv4 bench` and step reports as differences).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceStats {
    /// Command submissions (wgpu queue submits; CUDA synchronisations).
    pub submissions: u64,
    /// Kernel dispatches queued.
    pub dispatches: u64,
    /// Reads back to the host.
    pub reads: u64,
    /// Bytes read back.
    pub read_bytes: u64,
    /// Host-to-device writes (activations and per-call parameters).
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Buffers allocated.
    pub allocs: u64,
    /// Dispatch setups (wgpu bind groups) reused from an earlier dispatch instead of created.
    pub setups_reused: u64,
    /// Dispatch setups created.
    pub setups_created: u64,
    /// Recorded graphs launched (CUDA graphs of captured plans; each one submission's worth of
    /// launches issued at once).
    pub graph_launches: u64,
    /// Kernels those graph launches ran (also counted in `dispatches`).
    pub graph_kernels: u64,
    /// Graphs built (instantiated) from recorded launches.
    pub graphs_built: u64,
}

impl DeviceStats {
    /// Every counter by name, in declaration order.
    pub fn named(&self) -> [(&'static str, u64); 12] {
        [
            ("submissions", self.submissions),
            ("dispatches", self.dispatches),
            ("reads", self.reads),
            ("read_bytes", self.read_bytes),
            ("writes", self.writes),
            ("write_bytes", self.write_bytes),
            ("allocs", self.allocs),
            ("setups_reused", self.setups_reused),
            ("setups_created", self.setups_created),
            ("graph_launches", self.graph_launches),
            ("graph_kernels", self.graph_kernels),
            ("graphs_built", self.graphs_built),
        ]
    }

    /// `f` applied to each pair of counters of `self` and `other`.
    pub fn zip(&self, other: &DeviceStats, f: impl Fn(u64, u64) -> u64) -> DeviceStats {
        DeviceStats {
            submissions: f(self.submissions, other.submissions),
            dispatches: f(self.dispatches, other.dispatches),
            reads: f(self.reads, other.reads),
            read_bytes: f(self.read_bytes, other.read_bytes),
            writes: f(self.writes, other.writes),
            write_bytes: f(self.write_bytes, other.write_bytes),
            allocs: f(self.allocs, other.allocs),
            setups_reused: f(self.setups_reused, other.setups_reused),
            setups_created: f(self.setups_created, other.setups_created),
            graph_launches: f(self.graph_launches, other.graph_launches),
            graph_kernels: f(self.graph_kernels, other.graph_kernels),
            graphs_built: f(self.graphs_built, other.graphs_built),
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &DeviceStats) -> DeviceStats {
        self.zip(earlier, |a, b| a - b)
    }
}

/// A plan's streams and events on a device with several queues (CUDA streams and events).
/// Which stream a thread's device work goes to is per thread: the executor enters a launch's
/// stream on the thread that issues the launch, makes it wait for the launch's events, issues
/// the launch, records the events it records, and at the end of the execution leaves on every
/// issuing thread and joins once. Work issued on different streams runs in any order unless an
/// event orders it; [`DeviceOps::read`] still completes everything issued before it, on every
/// stream.
pub trait DeviceStreams: Send + Sync {
    /// Issue the calling thread's later device work on stream `stream` (< the count asked for).
    /// Entered from outside the plan's streams, that work comes after what the thread issued
    /// before (a buffer's zeroing, a write).
    fn enter(&self, stream: usize) -> Result<(), KernelError>;
    /// Record event `event` on the calling thread's stream, after the work issued there so far.
    fn record(&self, event: usize) -> Result<(), KernelError>;
    /// Make the calling thread's stream wait for the last record of event `event` issued so
    /// far (no wait when it was never recorded).
    fn wait(&self, event: usize) -> Result<(), KernelError>;
    /// Make the calling thread's stream wait for the work issued so far on every stream of
    /// the set: what it issues next (a read) comes after all of it.
    fn wait_for_all(&self) -> Result<(), KernelError>;
    /// Issue the calling thread's later work on the device's default queue again.
    fn leave(&self);
    /// Wait until the work of every stream has finished.
    fn join(&self) -> Result<(), KernelError>;
}

/// The op set over device-resident f32 buffers. Shapes follow the host ops of
/// [`crate::Backend`]; `x`/`out` slices hold exactly `rows × width` words. In-place ops take
/// one slice. An op's output slices must not overlap its input slices (a backend may refuse
/// them: a wgpu binding cannot be both read and written). An op whose inputs are inconsistent (a slice of the wrong length) returns
/// [`KernelError::Device`] rather than panicking.
pub trait DeviceOps: Send + Sync {
    /// Byte alignment every slice offset must have.
    fn offset_alignment(&self) -> usize;

    /// A zeroed buffer of `words` f32 words (at least one).
    fn alloc(&self, words: usize) -> Result<DevBufId, KernelError>;

    /// Release a buffer (after the work queued on it completes).
    fn free(&self, buf: DevBufId);

    /// Queue a copy of `src` (host) into `dst`; `src.len() == dst.len`.
    fn write(&self, dst: DevSlice, src: &[f32]) -> Result<(), KernelError>;

    /// Complete everything queued, then copy `src` to the host.
    fn read(&self, src: DevSlice) -> Result<Vec<f32>, KernelError>;

    /// [`DeviceOps::read`] of several slices at once, in order, waiting for the device once
    /// (one submission) for all of them; the default is the one-by-one loop.
    fn read_many(&self, srcs: &[DevSlice]) -> Result<Vec<Vec<f32>>, KernelError> {
        srcs.iter().map(|&s| self.read(s)).collect()
    }

    /// Submit queued work without waiting for it.
    fn flush(&self) -> Result<(), KernelError>;

    /// The traffic counters.
    fn stats(&self) -> DeviceStats;

    /// `streams` device streams and `events` events onto which a plan's streams and events
    /// map for one execution (see [`DeviceStreams`]), or `None` when the device runs all work
    /// in one in-order queue (then a plan's streams and events need nothing from it). The
    /// default is `None`.
    fn streams(
        &self,
        streams: usize,
        events: usize,
    ) -> Result<Option<std::sync::Arc<dyn DeviceStreams>>, KernelError> {
        let _ = (streams, events);
        Ok(None)
    }

    /// Begin (`true`) or end (`false`) a span in which the device may record runs of launches
    /// into graphs and replay them (CUDA graphs for captured plans, `exec.cuda_graph`): a run
    /// of launches between two host interactions (a read, a write, an event, a wait) that
    /// repeats exactly — kernels, shapes, addresses, scalars — is built into a graph the second
    /// time it is seen and launched as one graph after that. Results are bitwise those of
    /// launching each kernel. Spans nest; ending the outermost issues whatever is still held
    /// back. The default does nothing (the device launches as it goes).
    fn graphs(&self, on: bool) -> Result<(), KernelError> {
        let _ = on;
        Ok(())
    }

    /// Strided copy of a block of columns (see [`Copy2d`]): for r < rows and c < width,
    /// `dst[r·dst_stride + dst_col + c] = src[r·src_stride + src_col + c]`. Column offsets need
    /// no alignment (they are not slice offsets).
    fn copy2d(&self, src: DevSlice, dst: DevSlice, shape: Copy2d) -> Result<(), KernelError>;

    /// Gather rows: `dst[r] = src[idx[r]]` for rows of `width` words.
    fn gather_rows(
        &self,
        src: DevSlice,
        idx: &[u32],
        width: usize,
        dst: DevSlice,
    ) -> Result<(), KernelError>;

    /// Scatter-add rows: `dst[idx[r]] += src[r]` (f32 adds) for rows of `width` words; the
    /// indices are distinct.
    fn scatter_add_rows(
        &self,
        src: DevSlice,
        idx: &[u32],
        width: usize,
        dst: DevSlice,
    ) -> Result<(), KernelError>;

    /// Element-wise f32 sum `out = a + b`.
    fn add(&self, a: DevSlice, b: DevSlice, out: DevSlice) -> Result<(), KernelError>;

    /// In place `x = (f64(x) · s) as f32`.
    fn scale(&self, x: DevSlice, s: f64) -> Result<(), KernelError>;

    /// Router scores sqrt(softplus(x)) of `logits` into `out` (same length), as
    /// [`crate::Backend::router_scores`] computes them.
    fn router_scores(&self, logits: DevSlice, out: DevSlice) -> Result<(), KernelError>;

    /// [`crate::Backend::linear`]: x [rows, in] → out [rows, out].
    fn linear(
        &self,
        w: &Linear,
        x: DevSlice,
        rows: usize,
        out: DevSlice,
    ) -> Result<(), KernelError>;

    /// Several weights of one shape and format over consecutive row groups of one input (a
    /// layer's routed experts): rows `starts[g] .. starts[g+1]` of x [rows, in] go through
    /// `weights[g]` into the same rows of out [rows, out]. `starts` has one more entry than
    /// `weights`, begins at 0, never decreases and ends at `rows`; a group may be empty. Row for
    /// row [`DeviceOps::linear`] of each group, which is its default (a group whose rows do not
    /// start at an aligned offset goes through scratch buffers); a GPU backend runs every
    /// group in one launch.
    fn grouped_linear(
        &self,
        weights: &[&Linear],
        x: DevSlice,
        starts: &[usize],
        out: DevSlice,
    ) -> Result<(), KernelError> {
        let (_, i, o) = check_groups(weights, x, starts, out)?;
        let mut staging = Staging::new(self, starts);
        let r = weights.iter().enumerate().try_for_each(|(g, w)| {
            let (s, n) = (starts[g], starts[g + 1] - starts[g]);
            if n == 0 {
                return Ok(());
            }
            let xs = staging.rows(x, s, n, i, 0)?;
            let os = out.sub(s * o, n * o);
            if staging.aligned(os) {
                return self.linear(w, xs, n, os);
            }
            let to = staging.rows_out(n, o)?;
            self.linear(w, xs, n, to)?;
            let back = Copy2d {
                dst_col: s * o,
                ..Copy2d::contiguous(n * o)
            };
            self.copy2d(to, out, back)
        });
        staging.free();
        r
    }

    /// [`DeviceOps::scatter_add_rows`] of row groups in turn: rows `starts[g] .. starts[g+1]`
    /// of src [rows, width] are added into the dst rows `idx[starts[g] .. starts[g+1]]`
    /// (distinct within a group) after every earlier group's, so a dst row several groups name
    /// gets their rows added in group order (a token's routed experts, ascending). `starts`
    /// as [`DeviceOps::grouped_linear`] takes them, ending at `idx.len()`. Its default is one
    /// `scatter_add_rows` per group (through scratch when a group's rows are not at an
    /// aligned offset); a GPU backend runs one launch.
    fn scatter_add_groups(
        &self,
        src: DevSlice,
        idx: &[u32],
        starts: &[usize],
        width: usize,
        dst: DevSlice,
    ) -> Result<(), KernelError> {
        check_scatter_groups(src, idx, starts, width)?;
        let mut staging = Staging::new(self, starts);
        let r = starts.windows(2).try_for_each(|k| {
            let n = k[1] - k[0];
            if n == 0 {
                return Ok(());
            }
            let rows = staging.rows(src, k[0], n, width, 0)?;
            self.scatter_add_rows(rows, &idx[k[0]..k[1]], width, dst)
        });
        staging.free();
        r
    }

    /// [`crate::Backend::act_quant_fp8`], in place.
    fn act_quant_fp8(&self, x: DevSlice, dim: usize) -> Result<(), KernelError>;

    /// [`crate::Backend::rms_norm`].
    fn rms_norm(
        &self,
        x: DevSlice,
        weight: Option<&[f32]>,
        dim: usize,
        eps: f32,
        out: DevSlice,
    ) -> Result<(), KernelError>;

    /// [`crate::Backend::rope`], in place; `positions` has one entry per row.
    fn rope(
        &self,
        x: DevSlice,
        dim: usize,
        positions: &[usize],
        table: &RopeTable,
        inverse: bool,
    ) -> Result<(), KernelError>;

    /// [`crate::Backend::hadamard`], in place.
    fn hadamard(&self, x: DevSlice, dim: usize) -> Result<(), KernelError>;

    /// [`crate::Backend::round_index_rows`], in place.
    fn round_index_rows(
        &self,
        dtype: IndexKDtype,
        x: DevSlice,
        dim: usize,
    ) -> Result<(), KernelError>;

    /// [`crate::Backend::mhc_pre`] of `t` tokens: x [t, M, D] → u [t, D], post [t, M],
    /// comb [t, M, M].
    fn mhc_pre(
        &self,
        p: &HcParams<'_>,
        x: DevSlice,
        t: usize,
        u: DevSlice,
        post: DevSlice,
        comb: DevSlice,
    ) -> Result<(), KernelError>;

    /// [`crate::Backend::mhc_post`] with the pre step's `post` [t, M] and `comb` [t, M, M].
    #[allow(clippy::too_many_arguments)]
    fn mhc_post(
        &self,
        x: DevSlice,
        y: DevSlice,
        post: DevSlice,
        comb: DevSlice,
        m: usize,
        d: usize,
        out: DevSlice,
    ) -> Result<(), KernelError>;

    /// [`crate::Backend::hc_head`].
    fn hc_head(
        &self,
        p: &HcParams<'_>,
        x: DevSlice,
        t: usize,
        out: DevSlice,
    ) -> Result<(), KernelError>;

    /// [`crate::Backend::swiglu`] row by row: rows of `width` words, row r scaled by
    /// `weights[r]` (rows = `weights.len()`).
    fn swiglu_rows(
        &self,
        g: DevSlice,
        u: DevSlice,
        limit: f32,
        weights: &[f32],
        width: usize,
        out: DevSlice,
    ) -> Result<(), KernelError>;

    /// Whether [`DeviceOps::route_experts`] and [`DeviceOps::routed_experts`] are supported:
    /// then a layer's routing needs no read-back (false by default: the caller reads the
    /// router's scores back and routes on the host).
    fn routes_on_device(&self) -> bool {
        false
    }

    /// Routes [rows, 2k] of router scores [rows, experts]: per row, k expert ids (as f32 bits;
    /// chosen as `choice` says) then their weights `s_j / Σ s · scale` (summed and divided in
    /// f64 over the ids in order, rounded to f32): what the model's host routing writes. Only
    /// where [`DeviceOps::routes_on_device`] (else an error).
    fn route_experts(
        &self,
        scores: DevSlice,
        experts: usize,
        k: usize,
        choice: RouteChoice<'_>,
        scale: f64,
        routes: DevSlice,
    ) -> Result<(), KernelError> {
        let _ = (scores, experts, k, choice, scale, routes);
        Err(unsupported("route_experts", "routes_on_device"))
    }

    /// The routed experts' sum y [rows, dim] (overwritten) of x [rows, dim] under `routes`
    /// (as [`DeviceOps::route_experts`] writes them, rows = routes.len / 2k): each token's
    /// experts in ascending id order added from zero, expert j giving
    /// `W2·(swiglu(W1·x, W3·x, L)·w_j)` — bitwise what [`DeviceOps::grouped_linear`],
    /// [`DeviceOps::swiglu_rows`] and [`DeviceOps::scatter_add_groups`] give on host-built
    /// groups. `work` is scratch of [`RoutedExperts::work_words`] words. Only where
    /// [`DeviceOps::routes_on_device`] (else an error).
    fn routed_experts(
        &self,
        experts: &RoutedExperts<'_>,
        x: DevSlice,
        routes: DevSlice,
        work: DevSlice,
        y: DevSlice,
    ) -> Result<(), KernelError> {
        let _ = (experts, x, routes, work, y);
        Err(unsupported("routed_experts", "routes_on_device"))
    }

    /// Whether the attention-side ops on device memory are supported —
    /// [`DeviceOps::paged_attention`], [`DeviceOps::paged_indexer_topk`],
    /// [`DeviceOps::cache_encode_into`] and [`DeviceOps::softmax_pool_rows`]: then attention
    /// reads its queries and writes its output in device memory, the indexer reads its queries
    /// there, and cache rows are encoded and compressor windows pooled where their values are
    /// (false by default: the caller reads the operands back and runs the host ops).
    fn attends_on_device(&self) -> bool {
        false
    }

    /// [`crate::Backend::paged_attention_indexed`] of the queries `q` [queries, heads, dim]
    /// into `out` (same shape), both in device memory, the keys in their cache pages as
    /// `keys` gives them: bitwise the host op's output. The operands are checked as
    /// [`PagedAttention::check_call`] says before anything runs. Only where
    /// [`DeviceOps::attends_on_device`] (else an error).
    fn paged_attention(
        &self,
        keys: &PagedAttention<'_>,
        q: DevSlice,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        let _ = (keys, q, out);
        Err(unsupported("paged_attention", "attends_on_device"))
    }

    /// [`crate::Backend::paged_indexer_topk_ranges`] of the queries `q` [queries, heads, dim]
    /// and head weights `w` [queries, heads], both in device memory, the keys in their cache
    /// pages as `keys` gives them: each query's chosen ids, read back (one wait). The operands
    /// are checked as [`PagedIndexer::check_call`] says before anything runs. Only where
    /// [`DeviceOps::attends_on_device`] (else an error).
    fn paged_indexer_topk(
        &self,
        keys: &PagedIndexer<'_>,
        q: DevSlice,
        w: DevSlice,
    ) -> Result<Vec<Vec<usize>>, KernelError> {
        let _ = (keys, q, w);
        Err(unsupported("paged_indexer_topk", "attends_on_device"))
    }

    /// [`crate::Backend::cache_encode_rows`] of `x` (rows of `fmt.width()` values) into `out`,
    /// both in device memory: the entries' bytes packed little-endian into `out`'s words
    /// ([`crate::attention_device::encoded_words`] of them; the last word's bytes past the
    /// entries are unspecified), for the caller to read back when it reads other things
    /// ([`crate::attention_device::words_bytes`] unpacks them). The operands are checked as
    /// [`crate::attention_device::check_encode`] says. Only where
    /// [`DeviceOps::attends_on_device`] (else an error).
    fn cache_encode_into(
        &self,
        fmt: &RowFormat,
        x: DevSlice,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        let _ = (fmt, x, out);
        Err(unsupported("cache_encode_into", "attends_on_device"))
    }

    /// [`crate::Backend::softmax_pool_rows`] in device memory: window w pools rows
    /// `w·rows .. (w+1)·rows` of `a` and `z` ([windows·rows, width] each) into row w of `out`
    /// [windows, width]. Only where [`DeviceOps::attends_on_device`] (else an error).
    fn softmax_pool_rows(
        &self,
        a: DevSlice,
        z: DevSlice,
        windows: usize,
        rows: usize,
        width: usize,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        let _ = (a, z, windows, rows, width, out);
        Err(unsupported("softmax_pool_rows", "attends_on_device"))
    }
}

/// The error of an op a backend's device does not offer.
fn unsupported(op: &str, flag: &str) -> KernelError {
    KernelError::Device {
        message: format!("{op}: not supported on this device ({flag} is false)"),
    }
}

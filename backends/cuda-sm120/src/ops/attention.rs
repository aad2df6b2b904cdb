//! Attention-side ops of `kernels/attention.cu` (the indexer's are in `indexer.rs`):
//! compressor softmax pooling, and sparse attention with a sink as three launches (logits,
//! per-head max and weights, weighted sum with its denominator), for one query or a batch of
//! them, each over its own keys, which may still be in their cache pages.

use super::cache::{CheckedRows, Keys};
use super::indexer::u32_words;
use super::mhc::{need, u32_arg};
use crate::device::blocks_for;
use crate::{Core, CudaError, DevBuf, DevPtr, KArg};
use dsv4_core::cache::CacheLayoutError;
use dsv4_kernels::{AttentionRows, EntryOrigin, PageTag, RowFormat};

/// Threads per block of the element-wise kernels.
const THREADS: u32 = 256;
/// Keys (threads) per block of the thread-per-key kernels.
pub(super) const KEY_THREADS: u32 = 128;
/// Heads one thread of `attn_logits` and `attn_out` handles (`ATTN_HT` in attention.cu).
const HEADS_PER_THREAD: usize = 8;
/// Largest grid y and z dimension (heads and queries of sparse attention and the indexer).
pub(super) const MAX_GRID_Y: usize = 65_535;

/// Compressor pooling: out[c] = Σ_r softmax_r(z[·, c])·a[r, c]; a, z are [rows, width].
pub fn softmax_pool(
    c: &Core,
    a: &[f32],
    z: &[f32],
    rows: usize,
    width: usize,
    out: &mut [f32],
) -> Result<(), CudaError> {
    softmax_pool_rows(c, a, z, 1, rows, width, out)
}

/// [`softmax_pool`] of `windows` windows at once — window w pools `a`, `z` rows
/// `w·rows .. (w+1)·rows` into `out[w·width ..]` — in one upload of each operand, one launch
/// and one read-back. Operands shorter than the windows need are `BadOperands`.
pub fn softmax_pool_rows(
    c: &Core,
    a: &[f32],
    z: &[f32],
    windows: usize,
    rows: usize,
    width: usize,
    out: &mut [f32],
) -> Result<(), CudaError> {
    let cols = windows * width;
    let n = rows * cols;
    need("softmax_pool values", a.len(), n)?;
    need("softmax_pool logits", z.len(), n)?;
    need("softmax_pool output", out.len(), cols)?;
    if cols == 0 {
        return Ok(());
    }
    let dev = &c.dev;
    let ab = dev.temp_f32(&a[..n])?;
    let zb = dev.temp_f32(&z[..n])?;
    let ob = dev.temp(cols * 4)?;
    launch_pool(c, ab.at(), zb.at(), ob.at(), windows, rows, width)?;
    dev.download_f32(&ob, &mut out[..cols])
}

/// The pooling launch over device memory (`DeviceOps::softmax_pool_rows` runs it alone): `a`
/// and `z` hold windows·rows·width f32, `out` windows·width.
pub(crate) fn launch_pool(
    c: &Core,
    a: DevPtr,
    z: DevPtr,
    out: DevPtr,
    windows: usize,
    rows: usize,
    width: usize,
) -> Result<(), CudaError> {
    let (n, cols) = (windows * rows * width, windows * width);
    if a.bytes < n * 4 || z.bytes < n * 4 || out.bytes < cols * 4 {
        return Err(CudaError::BadOperands(format!(
            "softmax_pool_rows of {windows} windows of {rows} × {width}: a, z, out hold {}, {}, {} \
             bytes",
            a.bytes, z.bytes, out.bytes
        )));
    }
    if cols == 0 {
        return Ok(());
    }
    let args = [
        KArg::Ptr(a),
        KArg::Ptr(z),
        KArg::Ptr(out),
        KArg::U32(u32_arg("rows", rows)?),
        KArg::U32(u32_arg("width", width)?),
        KArg::U32(u32_arg("windows", windows)?),
    ];
    let grid = (blocks_for(cols, THREADS as usize), 1, 1);
    // SAFETY: a and z hold windows·rows·width floats, out windows·width (checked above).
    unsafe {
        c.dev
            .launch("attn_softmax_pool", grid, (THREADS, 1, 1), &args)
    }
}

/// Attention of one query over `keys` [n, dim] (K = V) with a per-head sink; q, out [heads, dim].
pub fn sparse_attention(
    c: &Core,
    q: &[f32],
    dim: usize,
    keys: &[f32],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) -> Result<(), CudaError> {
    let heads = sink.len();
    if heads == 0 || dim == 0 {
        return Ok(());
    }
    let n = keys.len() / dim;
    need("attention queries", q.len(), heads * dim)?;
    need("attention output", out.len(), heads * dim)?;
    let hd = heads * dim;
    attend(
        c,
        &q[..hd],
        dim,
        &keys[..n * dim],
        &[0, n],
        sink,
        scale,
        &mut out[..hd],
    )
}

/// Several queries at once, query r (`q[r·heads·dim ..]`) over key rows `key_starts[r] ..
/// key_starts[r+1]` of `keys` [n, dim], into `out[r·heads·dim ..]`: row for row
/// [`sparse_attention`], in one upload of each operand, three launches and one read-back.
/// Operands the row-by-row definition would slice out of range (decreasing `key_starts`, a
/// start past `keys`, a short `q` or `out`) are `BadOperands`.
#[allow(clippy::too_many_arguments)]
pub fn sparse_attention_rows(
    c: &Core,
    q: &[f32],
    dim: usize,
    keys: &[f32],
    key_starts: &[usize],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) -> Result<(), CudaError> {
    let hd = sink.len() * dim;
    let what = "sparse_attention_rows";
    let Some(r) = attention_operands(what, q, out, keys.len(), dim, hd, key_starts)? else {
        return Ok(());
    };
    let len = (r.starts.len() - 1) * hd;
    let keys = &keys[r.first * dim..r.last * dim];
    attend(
        c,
        &q[..len],
        dim,
        keys,
        &r.starts,
        sink,
        scale,
        &mut out[..len],
    )
}

/// [`AttentionRows::cut`], its refusal as `BadOperands`.
fn attention_operands(
    what: &str,
    q: &[f32],
    out: &[f32],
    key_values: usize,
    dim: usize,
    hd: usize,
    key_starts: &[usize],
) -> Result<Option<AttentionRows>, CudaError> {
    AttentionRows::cut(what, q.len(), out.len(), key_values, dim, hd, key_starts)
        .map_err(CudaError::BadOperands)
}

/// [`sparse_attention_rows`] over keys still in their cache pages (`Backend::paged_attention_rows`):
/// the shared codec's checks, then the used rows' entries uploaded once and read in place by the
/// attention launches (`attn_logits_<format>`, `attn_out_<format>`: each value through the cache
/// decoder's own reader, so bitwise the decoded keys' result, with no decoded copy), and only
/// the output read back (one submission).
/// The keys' layout error is the inner `Err`; operands attention rejects are `BadOperands`.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_rows(
    c: &Core,
    q: &[f32],
    fmt: &RowFormat,
    pages: &[&[u8]],
    rows: &[(usize, usize)],
    key_starts: &[usize],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    // Each key its own row, in order: ids that count the rows (no page is tagged).
    let ids: Vec<usize> = (0..rows.len()).collect();
    let what = "paged_attention_rows";
    let paged = PagedKeys {
        pages,
        tags: &[],
        origins: &[],
    };
    paged_attention(
        c, what, q, fmt, &paged, rows, &ids, key_starts, sink, scale, out,
    )
}

/// A paged attention call's cache pages: their bytes, their content tags (empty: none) and
/// the origins of packed pages' entries (empty: none), as `Backend::paged_attention_indexed`
/// takes them.
pub struct PagedKeys<'a> {
    /// The pages' bytes.
    pub pages: &'a [&'a [u8]],
    /// Each page's content tag, or empty.
    pub tags: &'a [PageTag],
    /// Each page's entries' origins (empty for a page not packed from others), or empty.
    pub origins: &'a [&'a [EntryOrigin]],
}

/// [`paged_attention_rows`] with key rows shared between queries
/// (`Backend::paged_attention_indexed`): every row's layout checked, each used row's entry
/// uploaded once however many queries read it, and key i read as row `key_ids[i]` by the
/// attention launches (their `ids`), so bitwise the rows laid out id by id; only the output
/// comes back (one submission). With tags, the pages come from the device's page cache
/// (`page_cache`), which uploads only the entries it does not hold, and reads the entries of
/// packed pages from its copies of their source pages where it holds them. An id past the rows is
/// `BadOperands`, as are operands attention rejects; the layout error is the inner `Err`.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_indexed(
    c: &Core,
    q: &[f32],
    fmt: &RowFormat,
    paged: &PagedKeys<'_>,
    rows: &[(usize, usize)],
    key_ids: &[usize],
    key_starts: &[usize],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    let what = "paged_attention_indexed";
    paged_attention(
        c, what, q, fmt, paged, rows, key_ids, key_starts, sink, scale, out,
    )
}

/// Where a paged attention call's queries come from and where its output goes.
pub(crate) enum QueryIo<'a> {
    /// Host slices: the queries go up, the output comes back (one submission).
    Host {
        /// The queries.
        q: &'a [f32],
        /// The output.
        out: &'a mut [f32],
    },
    /// Device memory (`DeviceOps::paged_attention`): read and written in place, nothing comes
    /// back and nothing waits for the device.
    Device {
        /// The queries.
        q: DevPtr,
        /// The output.
        out: DevPtr,
    },
}

impl QueryIo<'_> {
    /// (query words, output words).
    fn lens(&self) -> (usize, usize) {
        match self {
            QueryIo::Host { q, out } => (q.len(), out.len()),
            QueryIo::Device { q, out } => (q.bytes / 4, out.bytes / 4),
        }
    }

    /// The first `len` query words on the device (uploaded from the host if need be) and the
    /// device output they are written to; `finish` then brings host output back.
    fn on_device(&self, c: &Core, len: usize) -> Result<(Operand, Operand), CudaError> {
        match self {
            QueryIo::Host { q, .. } => Ok((
                Operand::Own(c.dev.temp_f32(&q[..len])?),
                Operand::Own(c.dev.temp(len * 4)?),
            )),
            QueryIo::Device { q, out } => {
                Ok((Operand::At(prefix(*q, len)), Operand::At(prefix(*out, len))))
            }
        }
    }

    /// Bring the output of [`QueryIo::on_device`] back to a host output (nothing for device
    /// memory, where it already is).
    fn finish(self, c: &Core, ob: &Operand) -> Result<(), CudaError> {
        match (self, ob) {
            (QueryIo::Host { out, .. }, Operand::Own(b)) => {
                let n = b.bytes() / 4;
                c.dev.download_f32(b, &mut out[..n])
            }
            _ => Ok(()),
        }
    }

    fn on_host(&self) -> bool {
        matches!(self, QueryIo::Host { .. })
    }
}

/// A device operand: a temporary of the call's, or memory the caller holds.
pub(crate) enum Operand {
    /// A temporary.
    Own(DevBuf),
    /// The caller's.
    At(DevPtr),
}

impl Operand {
    fn ptr(&self) -> DevPtr {
        match self {
            Operand::Own(b) => b.at(),
            Operand::At(p) => *p,
        }
    }
}

/// The first `words` f32 of `p`.
fn prefix(p: DevPtr, words: usize) -> DevPtr {
    DevPtr {
        ptr: p.ptr,
        bytes: (words * 4).min(p.bytes),
    }
}

/// [`paged_attention_indexed`], its errors naming `what` (the op called).
#[allow(clippy::too_many_arguments)]
fn paged_attention(
    c: &Core,
    what: &str,
    q: &[f32],
    fmt: &RowFormat,
    paged: &PagedKeys<'_>,
    rows: &[(usize, usize)],
    key_ids: &[usize],
    key_starts: &[usize],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    let io = QueryIo::Host { q, out };
    let keys = PagedSelection {
        fmt,
        paged,
        rows,
        key_ids,
        key_starts,
    };
    paged_attention_io(c, what, &keys, sink, scale, io)
}

/// The keys of a paged attention call: the pages, their rows, and each query's keys as row ids.
pub(crate) struct PagedSelection<'a> {
    /// The pages' entry format.
    pub fmt: &'a RowFormat,
    /// The pages.
    pub paged: &'a PagedKeys<'a>,
    /// The key rows, (page, slot).
    pub rows: &'a [(usize, usize)],
    /// Key i is row `key_ids[i]`.
    pub key_ids: &'a [usize],
    /// Query r's keys are `key_starts[r] .. key_starts[r+1]`.
    pub key_starts: &'a [usize],
}

/// Paged attention with the queries and output where `io` says: the checks of
/// [`paged_attention_indexed`], the used rows placed in the page cache (or uploaded), the
/// three launches. With device memory nothing waits: the page cache's slots the launches read
/// are marked read by the calling stream (`Placed::release_after_reads`), so another stream's
/// call that reuses them waits for these launches first.
pub(crate) fn paged_attention_io(
    c: &Core,
    what: &str,
    k: &PagedSelection<'_>,
    sink: &[f32],
    scale: f32,
    io: QueryIo<'_>,
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    let (fmt, rows, key_ids) = (k.fmt, k.rows, k.key_ids);
    let dim = fmt.width();
    let pages = k.paged.pages;
    let checked = match CheckedRows::new(fmt, pages, rows, rows.len() * dim) {
        Ok(c) => c,
        Err(e) => return Ok(Err(e)),
    };
    if let Some((i, &id)) = key_ids
        .iter()
        .enumerate()
        .find(|&(_, &id)| id >= rows.len())
    {
        return Err(CudaError::BadOperands(format!(
            "{what}: key {i} is row {id} of {} rows",
            rows.len()
        )));
    }
    let hd = sink.len() * dim;
    let key_values = key_ids.len() * dim;
    let (q_len, out_len) = io.lens();
    let Some(r) = AttentionRows::cut(what, q_len, out_len, key_values, dim, hd, k.key_starts)
        .map_err(CudaError::BadOperands)?
    else {
        return Ok(Ok(()));
    };
    let len = (r.starts.len() - 1) * hd;
    let (qb, ob) = io.on_device(c, len)?;
    let used = &key_ids[r.first..r.last];
    let (Some(&lo), Some(&hi)) = (used.iter().min(), used.iter().max()) else {
        // No keys at all: attention over the sink alone, as the composition computes it.
        let kb = c.dev.temp_f32(&[])?;
        let (q, o) = (qb.ptr(), ob.ptr());
        attend_on_device(c, q, dim, &kb, Keys::F32, &r.starts, None, sink, scale, o)?;
        io.finish(c, &ob)?;
        return Ok(Ok(()));
    };
    let keys = Keys::entries(fmt)?;
    // The keys' rows, placed in the page cache's arena (locked until the output is back, or
    // with device output until the launches are marked as reading it).
    let picks: Vec<(usize, usize)> = used.iter().map(|&id| rows[id]).collect();
    let placed = c
        .pages
        .place(c, fmt, pages, k.paged.tags, k.paged.origins, &picks)?;
    if let Some(placed) = placed {
        let ids = Some(&placed.rows[..]);
        let (q, o) = (qb.ptr(), ob.ptr());
        attend_on_device(
            c,
            q,
            dim,
            placed.keys(),
            keys,
            &r.starts,
            ids,
            sink,
            scale,
            o,
        )?;
        if io.on_host() {
            io.finish(c, &ob)?;
            drop(placed);
        } else {
            placed.release_after_reads(c)?;
        }
        return Ok(Ok(()));
    }
    // Only the rows from the first to the last used one are uploaded; ids count from there.
    let kb = c.dev.temp_upload(&checked.entries(lo..hi + 1))?;
    let ids: Vec<usize> = used.iter().map(|&id| id - lo).collect();
    // Ids that read every uploaded row once, in order, are left out (a decode batch: each
    // query its own rows): key i is then row i.
    let identity = ids.iter().enumerate().all(|(i, &id)| id == i);
    let ids = (!identity).then_some(&ids[..]);
    let (q, o) = (qb.ptr(), ob.ptr());
    attend_on_device(c, q, dim, &kb, keys, &r.starts, ids, sink, scale, o)?;
    io.finish(c, &ob)?;
    Ok(Ok(()))
}

/// The three launches of sparse attention over `starts.len() − 1` queries (q, out [rows,
/// heads, dim]), query r over key rows `starts[r] .. starts[r+1]` of `keys` (starts from 0,
/// nondecreasing, the last = keys.len() / dim), then one read-back; heads, dim > 0.
#[allow(clippy::too_many_arguments)]
fn attend(
    c: &Core,
    q: &[f32],
    dim: usize,
    keys: &[f32],
    starts: &[usize],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) -> Result<(), CudaError> {
    let kb = c.dev.temp_f32(keys)?;
    let qb = c.dev.temp_f32(q)?;
    let ob = c.dev.temp(q.len() * 4)?;
    let (qp, op) = (qb.at(), ob.at());
    attend_on_device(c, qp, dim, &kb, Keys::F32, starts, None, sink, scale, op)?;
    c.dev.download_f32(&ob, out)
}

/// [`attend`]'s launches over keys already on the device (`kb` holds `starts[rows]` keys as
/// `keys` says: rows of `dim` f32, or cache entries the kernels read in place; with `ids`, key
/// i is row `ids[i]` of `kb`), from the queries at `q` into the output at `out` (rows · heads
/// · dim f32 each).
#[allow(clippy::too_many_arguments)]
fn attend_on_device(
    c: &Core,
    q: DevPtr,
    dim: usize,
    kb: &DevBuf,
    keys: Keys,
    starts: &[usize],
    ids: Option<&[usize]>,
    sink: &[f32],
    scale: f32,
    out: DevPtr,
) -> Result<(), CudaError> {
    let heads = sink.len();
    if heads > MAX_GRID_Y {
        return Err(CudaError::BadOperands(format!(
            "sparse_attention with {heads} heads; the kernels take up to {MAX_GRID_Y}"
        )));
    }
    let rows = starts.len() - 1;
    let n = starts[rows];
    let max_n = starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let dev = &c.dev;
    let words = rows * heads * dim;
    if q.bytes < words * 4 || out.bytes < words * 4 {
        return Err(CudaError::BadOperands(format!(
            "sparse_attention of {rows} queries of {heads}×{dim}: q holds {} bytes, out {}",
            q.bytes, out.bytes
        )));
    }
    let idb = match ids {
        Some(ids) => Some(dev.temp_upload(&u32_words("key ids", ids)?)?),
        None => None,
    };
    let ops = AttendOperands {
        q,
        keys: kb,
        starts: &dev.temp_upload(&u32_words("keys", starts)?)?,
        ids: idb.as_ref(),
        sink: &dev.temp_f32(sink)?,
        logits: &dev.temp(heads * n * 8)?,
        sinkw: &dev.temp(rows * heads * 8)?,
        out,
    };
    launch_attention(c, &ops, keys, dim, heads, rows, max_n, scale)
}

/// The device buffers of sparse attention over `rows` queries: q [rows, heads, dim], the keys,
/// starts [rows + 1] (u32 from 0, nondecreasing, ending at the key count n), the keys' row ids
/// (n u32; None: key i is row i), sink [heads], the logits/weights scratch (heads·n f64),
/// sinkw (rows·heads f64), out [rows, heads, dim].
struct AttendOperands<'a> {
    q: DevPtr,
    keys: &'a DevBuf,
    starts: &'a DevBuf,
    ids: Option<&'a DevBuf>,
    sink: &'a DevBuf,
    logits: &'a DevBuf,
    sinkw: &'a DevBuf,
    out: DevPtr,
}

/// The three attention launches per ≤ 65535 queries over device-resident operands; `max_n` is
/// the longest query range; heads ≤ 65535 (checked by the caller).
#[allow(clippy::too_many_arguments)]
fn launch_attention(
    c: &Core,
    o: &AttendOperands<'_>,
    keys: Keys,
    dim: usize,
    heads: usize,
    rows: usize,
    max_n: usize,
    scale: f32,
) -> Result<(), CudaError> {
    let dev = &c.dev;
    let dim32 = u32_arg("dim", dim)?;
    let h32 = u32_arg("heads", heads)?;
    let (logits_kernel, out_kernel) = (keys.kernel("attn_logits"), keys.kernel("attn_out"));
    // A null `ids`: key i is row i.
    let ids = o
        .ids
        .map_or(KArg::Ptr(DevPtr { ptr: 0, bytes: 0 }), KArg::Buf);
    for row0 in (0..rows).step_by(MAX_GRID_Y) {
        let nr = (rows - row0).min(MAX_GRID_Y) as u32;
        let r0 = row0 as u32;
        // SAFETY (all three): q holds rows·heads·dim floats, keys n·dim f32 (or n entries of
        // `stride` bytes in the format the variants read, with its sizes a, b), starts rows + 1
        // nondecreasing u32 ending at n, ids null or n row ids below the keys' rows, sink heads; the logits/weights scratch heads·n
        // doubles, sinkw rows·heads doubles, out rows·heads·dim floats; the launches cover
        // queries row0 .. row0 + nr ≤ rows.
        unsafe {
            let mut args = vec![
                KArg::Ptr(o.q),
                KArg::Buf(o.keys),
                KArg::Buf(o.starts),
                ids,
                KArg::Buf(o.logits),
                KArg::U32(dim32),
                KArg::U32(h32),
                KArg::F32(scale),
                KArg::U32(r0),
            ];
            args.extend(keys.args());
            dev.launch(
                &logits_kernel,
                (
                    blocks_for(max_n, KEY_THREADS as usize),
                    blocks_for(heads, HEADS_PER_THREAD),
                    nr,
                ),
                (KEY_THREADS, 1, 1),
                &args,
            )?;
            dev.launch(
                "attn_softmax",
                (h32, nr, 1),
                (THREADS, 1, 1),
                &[
                    KArg::Buf(o.logits),
                    KArg::Buf(o.starts),
                    KArg::Buf(o.sink),
                    KArg::Buf(o.sinkw),
                    KArg::U32(h32),
                    KArg::U32(r0),
                ],
            )?;
            let mut args = vec![
                KArg::Buf(o.logits),
                KArg::Buf(o.sinkw),
                KArg::Buf(o.keys),
                KArg::Buf(o.starts),
                ids,
                KArg::Ptr(o.out),
                KArg::U32(dim32),
                KArg::U32(h32),
                KArg::U32(r0),
            ];
            args.extend(keys.args());
            dev.launch(
                &out_kernel,
                (
                    blocks_for(dim, THREADS as usize),
                    blocks_for(heads, HEADS_PER_THREAD),
                    nr,
                ),
                (THREADS, 1, 1),
                &args,
            )?;
        }
    }
    Ok(())
}

/// Median seconds of paged sparse attention's three launches (`attn_logits_kv_fp8`,
/// `attn_softmax`, `attn_out_kv_fp8`: the keys read in place) on device-resident operands:
/// `queries` queries of `heads` × (nd + rd), each over its own `keys` fp8 KV entries (encoded by
/// the backend from seeded values), for the device bench.
pub fn time_paged_attention(
    backend: &crate::CudaBackend,
    queries: usize,
    keys: usize,
    heads: usize,
    (nd, rd): (usize, usize),
    batches: usize,
) -> Result<f64, CudaError> {
    use crate::bench::{encoded_entries, seeded};
    let c = &backend.core;
    let layout =
        dsv4_core::cache::KvLayout::from_head_dims(dsv4_core::KvCacheDtype::Fp8, nd + rd, rd, 64)
            .map_err(|e| CudaError::BadOperands(e.to_string()))?;
    let fmt = RowFormat::Kv(layout);
    let dim = fmt.width();
    let g = &mut dsv4_core::SplitMix64::new(0xa77e);
    let n = queries * keys;
    let entries = encoded_entries(backend, &fmt, &seeded(g, n * dim))?;
    let starts: Vec<u8> = (0..=queries)
        .flat_map(|r| u32_arg("keys", r * keys).map(u32::to_le_bytes))
        .flatten()
        .collect();
    let dev = &c.dev;
    let (qb, ob) = (
        dev.upload_f32(&seeded(g, queries * heads * dim))?,
        dev.alloc(queries * heads * dim * 4)?,
    );
    let ops = AttendOperands {
        q: qb.at(),
        keys: &dev.upload(&entries)?,
        starts: &dev.upload(&starts)?,
        ids: None,
        sink: &dev.upload_f32(&seeded(g, heads))?,
        logits: &dev.alloc(heads * n * 8)?,
        sinkw: &dev.alloc(queries * heads * 8)?,
        out: ob.at(),
    };
    let keys_fmt = Keys::entries(&fmt)?;
    let scale = 1.0 / (dim as f32).sqrt();
    crate::bench::time_op(dev, batches, || {
        launch_attention(c, &ops, keys_fmt, dim, heads, queries, keys, scale)
    })
}

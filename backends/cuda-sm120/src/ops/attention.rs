//! Attention-side ops of `kernels/attention.cu` (the indexer's are in `indexer.rs`):
//! compressor softmax pooling, and sparse attention with a sink as three launches (logits,
//! per-head max and weights, weighted sum with its denominator), for one query or a batch of
//! them, each over its own keys, which may still be in their cache pages (the paged callers
//! are in `paged_attention.rs`).

use super::cache::Keys;
use super::indexer::u32_words;
use super::mhc::{need, u32_arg};
use crate::device::blocks_for;
use crate::{Core, CudaError, DevBuf, DevPtr, KArg};
use dsv4_kernels::{AttentionRows, RowFormat};

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
pub(super) fn attend_on_device(
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

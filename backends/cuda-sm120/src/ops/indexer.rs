//! The lightning indexer's ops (`attn_indexer_scores` in `kernels/attention.cu`,
//! `kernels/topk.cu`): indexer scores of queries over their key ranges, top-k by radix select in
//! one block per score range, and both in one call with the scores left on the device (the keys
//! too, when they come as cache rows, which the scores launch then reads in place).

use super::attention::{KEY_THREADS, MAX_GRID_Y};
use super::cache::{CheckedRows, Keys};
use super::mhc::{need, u32_arg};
use crate::device::blocks_for;
use crate::{Core, CudaError, DevBuf, DevPtr, KArg};
use dsv4_core::cache::CacheLayoutError;
use dsv4_kernels::{IndexerRows, PageTag, PagedIndexer, RowFormat};

/// Threads of each `topk_select` block (`TOPK_THREADS` in topk.cu).
const TOPK_THREADS: u32 = 512;
/// Most scores `topk_select` takes (its u32 index arithmetic stays below 2^32).
const MAX_TOPK: usize = 1 << 31;

/// Indexer scores of one query: out[j] = Σ_h w[h]·ReLU(q[h]·K[j]); q [heads, dim], keys [n, dim].
pub fn indexer_scores(
    c: &Core,
    q: &[f32],
    w: &[f32],
    dim: usize,
    keys: &[f32],
    out: &mut [f32],
) -> Result<(), CudaError> {
    let n = keys.len().checked_div(dim).unwrap_or(0);
    if n == 0 {
        return Ok(());
    }
    let heads = w.len();
    need("indexer queries", q.len(), heads * dim)?;
    need("indexer output", out.len(), n)?;
    score(
        c,
        &q[..heads * dim],
        w,
        dim,
        &keys[..n * dim],
        &[0, n],
        &mut out[..n],
    )
}

/// Several queries at once, query r (`q[r·heads·dim ..]`, weights `w[r·heads ..]`, heads =
/// `w.len()` / queries) over key rows `key_starts[r] .. key_starts[r+1]` of `keys` [n, dim],
/// into the same range of `out`: row for row [`indexer_scores`], in one upload of each operand,
/// one launch and one read-back. Operands the row-by-row definition would slice out of range
/// (decreasing `key_starts`, a start past `keys` or `out`, a short `q`) are `BadOperands`.
pub fn indexer_scores_rows(
    c: &Core,
    q: &[f32],
    w: &[f32],
    dim: usize,
    keys: &[f32],
    key_starts: &[usize],
    out: &mut [f32],
) -> Result<(), CudaError> {
    let Some(r) = indexer_operands("indexer_scores_rows", q, w, dim, keys.len(), key_starts)?
    else {
        return Ok(());
    };
    need("indexer_scores_rows output", out.len(), r.last)?;
    // A row of no keys (or of zero-width keys, which the per-row op skips) writes nothing.
    if dim == 0 || r.first == r.last {
        return Ok(());
    }
    score(
        c,
        r.q,
        r.w,
        dim,
        r.keys(keys, dim),
        &r.starts,
        &mut out[r.first..r.last],
    )
}

/// [`IndexerRows::cut`], its refusal as `BadOperands`.
fn indexer_operands<'a>(
    what: &str,
    q: &'a [f32],
    w: &'a [f32],
    dim: usize,
    key_values: usize,
    key_starts: &[usize],
) -> Result<Option<IndexerRows<'a>>, CudaError> {
    IndexerRows::cut(what, q, w, dim, key_values, key_starts, None).map_err(CudaError::BadOperands)
}

/// [`indexer_scores_rows`] then [`topk_rows`] over the same ranges, the scores left on the
/// device: two launches and one read-back of the chosen indices (relative to each range).
/// Operands either op would refuse are `BadOperands`.
pub fn indexer_topk_rows(
    c: &Core,
    q: &[f32],
    w: &[f32],
    dim: usize,
    keys: &[f32],
    key_starts: &[usize],
    k: usize,
) -> Result<Vec<Vec<usize>>, CudaError> {
    let Some(r) = indexer_operands("indexer_topk_rows", q, w, dim, keys.len(), key_starts)? else {
        return Ok(Vec::new());
    };
    topk_fits(key_starts, k)?;
    if dim == 0 || r.first == r.last || k == 0 {
        // Nothing to score on the device (zero scores, or no keys) or nothing to choose.
        let mut scores = vec![0f32; r.last];
        indexer_scores_rows(c, q, w, dim, keys, key_starts, &mut scores)?;
        return topk_rows(c, &scores, key_starts, k);
    }
    let kb = c.dev.temp_f32(r.keys(keys, dim))?;
    let (qb, wb) = (c.dev.temp_f32(r.q)?, c.dev.temp_f32(r.w)?);
    let qw = QueryWeights::of(&qb, &wb, r.starts.len() - 1);
    let sb = score_on_device(c, qw, dim, &kb, Keys::F32, &r.starts, None, None)?;
    topk_on_device(c, &sb, &r.starts, k)
}

/// [`indexer_topk_rows`] over keys still in their cache pages (`Backend::paged_indexer_topk_rows`):
/// the shared codec's checks, then the used rows' entries uploaded once and read in place by the
/// scores launch (the format's `attn_indexer_scores_<format>` variant decodes each value through
/// the cache decoder's own reader, so the scores are those of decoded keys, with no decoded copy
/// of the keys); the scores stay on the device too, and only the chosen indices come back (one
/// submission). The keys' layout error is the inner `Err`;
/// operands the indexer rejects are `BadOperands`.
#[allow(clippy::too_many_arguments)]
pub fn paged_indexer_topk_rows(
    c: &Core,
    q: &[f32],
    w: &[f32],
    fmt: &RowFormat,
    pages: &[&[u8]],
    rows: &[(usize, usize)],
    key_starts: &[usize],
    k: usize,
) -> Result<Result<Vec<Vec<usize>>, CacheLayoutError>, CudaError> {
    // Each query's own keys: the ranges of a partition.
    let ranges: Vec<(usize, usize)> = key_starts.windows(2).map(|s| (s[0], s[1])).collect();
    paged_indexer_topk_ranges(c, q, w, fmt, pages, &[], rows, &ranges, k)
}

/// [`paged_indexer_topk_rows`] with keys shared between queries
/// (`Backend::paged_indexer_topk_ranges`): every row's layout checked, each row's entry
/// uploaded once however many ranges read it, and query r scored over rows
/// `key_ranges[r].0 ..` in place (the scores launch's `bases`); the scores stay on the device
/// and only the chosen indices come back (one submission). With `page_tags`, the pages come
/// from the device's page cache (`page_cache`), which uploads only the entries it lacks.
/// A range past the rows, or decreasing, is `BadOperands`; the layout error is the inner `Err`.
#[allow(clippy::too_many_arguments)]
pub fn paged_indexer_topk_ranges(
    c: &Core,
    q: &[f32],
    w: &[f32],
    fmt: &RowFormat,
    pages: &[&[u8]],
    page_tags: &[PageTag],
    rows: &[(usize, usize)],
    key_ranges: &[(usize, usize)],
    k: usize,
) -> Result<Result<Vec<Vec<usize>>, CacheLayoutError>, CudaError> {
    let keys = PagedIndexer {
        fmt,
        pages,
        tags: page_tags,
        rows,
        key_ranges,
        k,
    };
    paged_indexer_io(
        c,
        "paged_indexer_topk_ranges",
        &keys,
        IndexerInput::Host { q, w },
    )
}

/// Where a paged indexer call's queries and head weights are.
pub(crate) enum IndexerInput<'a> {
    /// Host slices (uploaded for the call).
    Host {
        /// The queries.
        q: &'a [f32],
        /// The head weights.
        w: &'a [f32],
    },
    /// Device memory (`DeviceOps::paged_indexer_topk`; the caller checked that `q` holds
    /// queries · heads · dim f32 and `w` queries · heads).
    Device {
        /// The queries.
        q: DevPtr,
        /// The head weights.
        w: DevPtr,
    },
}

/// [`paged_indexer_topk_ranges`] with the queries and head weights where `input` says; errors
/// name `what`.
pub(crate) fn paged_indexer_io(
    c: &Core,
    what: &str,
    ix: &PagedIndexer<'_>,
    input: IndexerInput<'_>,
) -> Result<Result<Vec<Vec<usize>>, CacheLayoutError>, CudaError> {
    let (fmt, pages, rows, key_ranges, k) = (ix.fmt, ix.pages, ix.rows, ix.key_ranges, ix.k);
    let dim = fmt.width();
    let checked = match CheckedRows::new(fmt, pages, rows, rows.len() * dim) {
        Ok(c) => c,
        Err(e) => return Ok(Err(e)),
    };
    if let Some((r, &(lo, hi))) = key_ranges
        .iter()
        .enumerate()
        .find(|(_, r)| r.0 > r.1 || r.1 > rows.len())
    {
        return Err(CudaError::BadOperands(format!(
            "{what}: key range {r} is {lo}..{hi} of {} rows",
            rows.len()
        )));
    }
    let mut starts = vec![0usize];
    starts.extend(key_ranges.iter().scan(0, |n, &(lo, hi)| {
        *n += hi - lo;
        Some(*n)
    }));
    let total = starts[starts.len() - 1];
    let queries = key_ranges.len();
    if queries == 0 {
        return Ok(Ok(Vec::new()));
    }
    // The queries and weights on the device (the host's cut to what the queries use).
    let (owned, qw) = match input {
        IndexerInput::Host { q, w } => {
            let Some(r) = indexer_operands(what, q, w, dim, total * dim, &starts)? else {
                return Ok(Ok(Vec::new()));
            };
            topk_fits(&starts, k)?;
            if dim == 0 || total == 0 || k == 0 {
                // No key is scored (or none chosen): the selection does not depend on the key
                // values.
                let zeros = vec![0f32; total * dim];
                return indexer_topk_rows(c, q, w, dim, &zeros, &starts, k).map(Ok);
            }
            let (qb, wb) = (c.dev.temp_f32(r.q)?, c.dev.temp_f32(r.w)?);
            let qw = QueryWeights::of(&qb, &wb, queries);
            (Some((qb, wb)), qw)
        }
        IndexerInput::Device { q, w } => {
            topk_fits(&starts, k)?;
            if dim == 0 || total == 0 || k == 0 {
                // As above, on host copies (a read-back on a path no model takes).
                let mut qv = vec![0f32; q.bytes / 4];
                let mut wv = vec![0f32; w.bytes / 4];
                c.dev.download_f32_from(q, &mut qv)?;
                c.dev.download_f32_from(w, &mut wv)?;
                let zeros = vec![0f32; total * dim];
                return indexer_topk_rows(c, &qv, &wv, dim, &zeros, &starts, k).map(Ok);
            }
            let heads = w.bytes / 4 / queries;
            (None, QueryWeights { q, w, heads })
        }
    };
    let keys = Keys::entries(fmt)?;
    // Only the rows some range reads are uploaded.
    let first = key_ranges
        .iter()
        .filter(|(lo, hi)| lo < hi)
        .map(|r| r.0)
        .min();
    let first = first.unwrap_or(0);
    let last = key_ranges.iter().map(|r| r.1).max().unwrap_or(0);
    // A partition (each query its own keys, in order) reads from its score starts: no bases.
    let partition = key_ranges.windows(2).all(|p| p[0].1 == p[1].0);
    let bases: Vec<usize> = key_ranges
        .iter()
        .map(|&(lo, _)| lo.max(first) - first)
        .collect();
    let bases = (!partition).then_some(&bases[..]);
    // The arena stays locked until the indices are read back.
    if let Some(placed) = c
        .pages
        .place(c, fmt, pages, ix.tags, &[], &rows[first..last])?
    {
        let keys_at = Some(&placed.rows[..]);
        let sb = score_on_device(c, qw, dim, placed.keys(), keys, &starts, bases, keys_at)?;
        let chosen = topk_on_device(c, &sb, &starts, k).map(Ok);
        drop((placed, owned));
        return chosen;
    }
    let kb = c.dev.temp_upload(&checked.entries(first..last))?;
    let sb = score_on_device(c, qw, dim, &kb, keys, &starts, bases, None)?;
    let chosen = topk_on_device(c, &sb, &starts, k).map(Ok);
    drop(owned);
    chosen
}

/// An indexer call's queries [rows, heads, dim] and head weights [rows, heads] on the device.
#[derive(Clone, Copy)]
pub(crate) struct QueryWeights {
    q: DevPtr,
    w: DevPtr,
    heads: usize,
}

impl QueryWeights {
    /// Temporaries holding `rows` queries' values.
    fn of(q: &DevBuf, w: &DevBuf, rows: usize) -> Self {
        Self {
            q: q.at(),
            w: w.at(),
            heads: (w.bytes() / 4).checked_div(rows).unwrap_or(0),
        }
    }
}

/// Check that `starts` (two entries at least) never decreases; its first and last entries.
fn ranges(what: &str, starts: &[usize]) -> Result<(usize, usize), CudaError> {
    if let Some(w) = starts.windows(2).find(|w| w[0] > w[1]) {
        return Err(CudaError::BadOperands(format!(
            "{what}: starts decrease ({} then {})",
            w[0], w[1]
        )));
    }
    Ok((starts[0], starts[starts.len() - 1]))
}

/// The indexer launch over `starts.len() − 1` queries (q [rows, heads, dim], w [rows, heads]),
/// query r over key rows `starts[r] .. starts[r+1]` of the keys in `kb` (starts from 0,
/// nondecreasing, the last > 0, `kb` holding that many keys as `keys` says: rows of `dim` f32
/// or cache entries), into a device buffer of `starts[rows]` scores; dim > 0.
/// `bases` (query r's first key row of `kb`) lets queries share keys; None: `starts`. With
/// `ids`, key row i is row `ids[i]` of `kb` (keys in the page cache's arena).
#[allow(clippy::too_many_arguments)]
fn score_on_device(
    c: &Core,
    qw: QueryWeights,
    dim: usize,
    kb: &DevBuf,
    keys: Keys,
    starts: &[usize],
    bases: Option<&[usize]>,
    ids: Option<&[usize]>,
) -> Result<DevBuf, CudaError> {
    let rows = starts.len() - 1;
    let n = starts[rows];
    let heads = qw.heads;
    let max_n = starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let starts32 = u32_words("keys", starts)?;
    let dim32 = u32_arg("dim", dim)?;
    let h32 = u32_arg("heads", heads)?;
    let dev = &c.dev;
    if qw.q.bytes < rows * heads * dim * 4 || qw.w.bytes < rows * heads * 4 {
        return Err(CudaError::BadOperands(format!(
            "indexer scores of {rows} queries of {heads}×{dim}: q holds {} bytes, w {}",
            qw.q.bytes, qw.w.bytes
        )));
    }
    let stb = dev.temp_upload(&starts32)?;
    let bb = match bases {
        Some(b) => Some(dev.temp_upload(&u32_words("key bases", b)?)?),
        None => None,
    };
    let idb = match ids {
        Some(ids) => Some(dev.temp_upload(&u32_words("key ids", ids)?)?),
        None => None,
    };
    let ob = dev.temp(n * 4)?;
    let ops = ScoreOperands {
        q: qw.q,
        w: qw.w,
        keys: kb,
        starts: &stb,
        bases: bb.as_ref().unwrap_or(&stb),
        ids: idb.as_ref(),
        out: &ob,
    };
    launch_scores(c, &ops, keys, dim32, h32, rows, max_n)?;
    Ok(ob)
}

/// The device buffers of an indexer launch: q [rows, heads, dim], w [rows, heads], the keys,
/// starts [rows + 1] (u32, from 0, nondecreasing, ending at the score count n), bases [rows]
/// (query r's first key row; `starts` itself when every query has its own keys), the key rows'
/// ids in `keys` (None: key row i is row i), out [n].
struct ScoreOperands<'a> {
    q: DevPtr,
    w: DevPtr,
    keys: &'a DevBuf,
    starts: &'a DevBuf,
    bases: &'a DevBuf,
    ids: Option<&'a DevBuf>,
    out: &'a DevBuf,
}

/// The indexer launches (a few past 65535 queries) over device-resident operands; `max_n` is
/// the longest query range.
fn launch_scores(
    c: &Core,
    o: &ScoreOperands<'_>,
    keys: Keys,
    dim: u32,
    heads: u32,
    rows: usize,
    max_n: usize,
) -> Result<(), CudaError> {
    let kernel = keys.kernel("attn_indexer_scores");
    for row0 in (0..rows).step_by(MAX_GRID_Y) {
        let nr = (rows - row0).min(MAX_GRID_Y) as u32;
        let mut args = vec![
            KArg::Ptr(o.q),
            KArg::Ptr(o.w),
            KArg::Buf(o.keys),
            KArg::Buf(o.starts),
            KArg::Buf(o.bases),
            o.ids
                .map_or(KArg::Ptr(DevPtr { ptr: 0, bytes: 0 }), KArg::Buf),
            KArg::Buf(o.out),
            KArg::U32(dim),
            KArg::U32(heads),
            KArg::U32(row0 as u32),
        ];
        args.extend(keys.args());
        let grid = (blocks_for(max_n, KEY_THREADS as usize), nr, 1);
        // SAFETY: q holds rows·heads·dim floats, w rows·heads, keys the rows of dim f32 (or
        // entries of `stride` bytes in the format the variant reads, with its sizes a, b) that
        // each query's bases[r] + (0 .. starts[r+1] − starts[r]) names, starts rows + 1
        // nondecreasing u32 ending at n, out n; the launch covers queries row0 .. row0 + nr.
        unsafe { c.dev.launch(&kernel, grid, (KEY_THREADS, 1, 1), &args)? };
    }
    Ok(())
}

/// Median seconds of the paged indexer's scores launch (`attn_indexer_scores_index_fp8`, the
/// keys read in place) on device-resident operands: `queries` queries of `heads` × `dim`, each
/// over its own `keys` fp8 index-K entries (encoded by the backend from seeded values), for the
/// device bench.
pub fn time_paged_scores(
    backend: &crate::CudaBackend,
    queries: usize,
    keys: usize,
    heads: usize,
    dim: usize,
    batches: usize,
) -> Result<f64, CudaError> {
    use crate::bench::{encoded_entries, seeded};
    let c = &backend.core;
    let layout = dsv4_core::cache::IndexKLayout::new(dsv4_core::IndexKDtype::Fp8, dim, 64)
        .map_err(|e| CudaError::BadOperands(e.to_string()))?;
    let fmt = RowFormat::IndexK(layout);
    let g = &mut dsv4_core::SplitMix64::new(0x1dec);
    let n = queries * keys;
    let entries = encoded_entries(backend, &fmt, &seeded(g, n * dim))?;
    let starts: Vec<usize> = (0..=queries).map(|r| r * keys).collect();
    let qb = c.dev.upload_f32(&seeded(g, queries * heads * dim))?;
    let wb = c.dev.upload_f32(&seeded(g, queries * heads))?;
    let kb = c.dev.upload(&entries)?;
    let stb = c.dev.upload(&u32_words("keys", &starts)?)?;
    let ob = c.dev.alloc(n * 4)?;
    let ops = ScoreOperands {
        q: qb.at(),
        w: wb.at(),
        keys: &kb,
        starts: &stb,
        bases: &stb,
        ids: None,
        out: &ob,
    };
    let (dim32, h32) = (u32_arg("dim", dim)?, u32_arg("heads", heads)?);
    crate::bench::time_op(&c.dev, batches, || {
        launch_scores(c, &ops, Keys::entries(&fmt)?, dim32, h32, queries, keys)
    })
}

/// [`score_on_device`], then one read-back into `out` [starts[rows]].
fn score(
    c: &Core,
    q: &[f32],
    w: &[f32],
    dim: usize,
    keys: &[f32],
    starts: &[usize],
    out: &mut [f32],
) -> Result<(), CudaError> {
    let n = starts[starts.len() - 1];
    let kb = c.dev.temp_f32(keys)?;
    let (qb, wb) = (c.dev.temp_f32(q)?, c.dev.temp_f32(w)?);
    let qw = QueryWeights::of(&qb, &wb, starts.len() - 1);
    let ob = score_on_device(c, qw, dim, &kb, Keys::F32, starts, None, None)?;
    c.dev.download_f32(&ob, &mut out[..n])
}

/// `v` as little-endian u32 words (a kernel's index array), or `Err(BadOperands)` naming `what`.
pub(super) fn u32_words(what: &str, v: &[usize]) -> Result<Vec<u8>, CudaError> {
    let mut bytes = Vec::with_capacity(v.len() * 4);
    for &x in v {
        bytes.extend(u32_arg(what, x)?.to_le_bytes());
    }
    Ok(bytes)
}

/// Indices of the `k` largest scores (ties to the lower index, NaN last), ascending.
pub fn topk(c: &Core, s: &[f32], k: usize) -> Result<Vec<usize>, CudaError> {
    let mut all = topk_rows(c, s, &[0, s.len()], k)?;
    Ok(all.pop().unwrap_or_default())
}

/// [`topk`] of each range `scores[starts[r] .. starts[r+1]]`, all in one upload, one launch (a
/// block per range) and one read-back. Ranges the per-range definition would slice out of range
/// (decreasing `starts`, past `scores`) are `BadOperands`.
pub fn topk_rows(
    c: &Core,
    scores: &[f32],
    starts: &[usize],
    k: usize,
) -> Result<Vec<Vec<usize>>, CudaError> {
    let rows = starts.len().saturating_sub(1);
    if rows == 0 {
        return Ok(Vec::new());
    }
    let (first, last) = ranges("topk_rows", starts)?;
    need("topk_rows scores", scores.len(), last)?;
    topk_fits(starts, k)?;
    if k == 0 || first == last {
        return Ok(vec![Vec::new(); rows]);
    }
    let rel: Vec<usize> = starts.iter().map(|&s| s - first).collect();
    let sb = c.dev.temp_f32(&scores[first..last])?;
    topk_on_device(c, &sb, &rel, k)
}

/// Err when a range of `starts` is longer than the top-k kernel takes (and k > 0).
fn topk_fits(starts: &[usize], k: usize) -> Result<(), CudaError> {
    match starts
        .windows(2)
        .map(|w| w[1] - w[0])
        .find(|&n| n > MAX_TOPK && k > 0)
    {
        Some(n) => Err(CudaError::BadOperands(format!(
            "topk over {n} scores; the kernel takes up to {MAX_TOPK}"
        ))),
        None => Ok(()),
    }
}

/// Top-k of each range `starts[r] .. starts[r+1]` of the device scores `sb` (starts from 0,
/// nondecreasing, each range at most [`MAX_TOPK`] when k > 0), indices relative to the range:
/// one launch (a block per range) and one read-back (none when nothing is selected).
fn topk_on_device(
    c: &Core,
    sb: &DevBuf,
    starts: &[usize],
    k: usize,
) -> Result<Vec<Vec<usize>>, CudaError> {
    let rows = starts.len() - 1;
    let counts: Vec<usize> = starts.windows(2).map(|w| (w[1] - w[0]).min(k)).collect();
    let total: usize = counts.iter().sum();
    if total == 0 {
        return Ok(vec![Vec::new(); rows]);
    }
    let mut offs = Vec::with_capacity(rows + 1);
    offs.push(0);
    for n in &counts {
        offs.push(offs[offs.len() - 1] + n);
    }
    let k32 = u32::try_from(k).unwrap_or(u32::MAX);
    let dev = &c.dev;
    let stb = dev.temp_upload(&u32_words("scores", starts)?)?;
    let offb = dev.temp_upload(&u32_words("selected", &offs)?)?;
    let ob = dev.temp(total * 4)?;
    let args = [
        KArg::Buf(sb),
        KArg::Buf(&stb),
        KArg::Buf(&offb),
        KArg::Buf(&ob),
        KArg::U32(k32),
    ];
    let grid = (u32_arg("topk ranges", rows)?, 1, 1);
    // SAFETY: scores holds the last start's count of floats, starts and offs rows + 1
    // nondecreasing u32 (offs[r+1] − offs[r] = min(k, n_r) ≤ n_r ≤ 2^31), out offs[rows] u32;
    // one block per range.
    unsafe { dev.launch("topk_select", grid, (TOPK_THREADS, 1, 1), &args)? };
    let mut bytes = vec![0u8; total * 4];
    dev.download(&ob, &mut bytes)?;
    let idx: Vec<usize> = bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect();
    Ok(offs.windows(2).map(|o| idx[o[0]..o[1]].to_vec()).collect())
}

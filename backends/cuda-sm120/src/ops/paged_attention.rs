//! Sparse attention over keys still in their cache pages (`Backend::paged_attention_rows` and
//! `paged_attention_indexed`, and `DeviceOps::paged_attention` through [`QueryIo::Device`]):
//! the keys' layout checked, their rows placed in the page cache (or uploaded), and
//! `ops::attention`'s three launches reading them in place.

use super::attention::attend_on_device;
use super::cache::{CheckedRows, Keys};
use crate::{Core, CudaError, DevBuf, DevPtr};
use dsv4_core::cache::CacheLayoutError;
use dsv4_kernels::{AttentionRows, PagedAttention, RowFormat};

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
    let keys = PagedAttention {
        fmt,
        pages,
        tags: &[],
        origins: &[],
        rows,
        key_ids: &ids,
        key_starts,
        sink,
        scale,
    };
    let io = QueryIo::Host { q, out };
    paged_attention_io(c, "paged_attention_rows", &keys, io)
}

/// [`paged_attention_rows`] with key rows shared between queries
/// (`Backend::paged_attention_indexed`): every row's layout checked, each used row's entry
/// uploaded once however many queries read it, and key i read as row `key_ids[i]` by the
/// attention launches (their `ids`), so bitwise the rows laid out id by id; only the output
/// comes back (one submission). With tags, the pages come from the device's page cache
/// (`page_cache`), which uploads only the entries it does not hold, and reads the entries of
/// packed pages from its copies of their source pages where it holds them. An id past the rows is
/// `BadOperands`, as are operands attention rejects; the layout error is the inner `Err`.
pub fn paged_attention_indexed(
    c: &Core,
    q: &[f32],
    keys: &PagedAttention<'_>,
    out: &mut [f32],
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    let io = QueryIo::Host { q, out };
    paged_attention_io(c, "paged_attention_indexed", keys, io)
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

/// Paged attention with the queries and output where `io` says: the checks of
/// [`paged_attention_indexed`], the used rows placed in the page cache (or uploaded), the
/// three launches. With device memory nothing waits: the page cache's slots the launches read
/// are marked read by the calling stream (`Placed::release_after_reads`), so another stream's
/// call that reuses them waits for these launches first.
pub(crate) fn paged_attention_io(
    c: &Core,
    what: &str,
    k: &PagedAttention<'_>,
    io: QueryIo<'_>,
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    let (fmt, rows, key_ids, sink, scale) = (k.fmt, k.rows, k.key_ids, k.sink, k.scale);
    let dim = fmt.width();
    let pages = k.pages;
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
    let placed = c.pages.place(c, fmt, pages, k.tags, k.origins, &picks)?;
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

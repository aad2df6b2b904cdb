//! `cache_store` / `cache_load` on the device (kernels/cache.cu). The page lives in host memory
//! behind the trait: the host validates the access exactly as the shared codec does (same
//! errors, same order), the device encodes the entry's data and scale bytes (or decodes them),
//! and the host copies only that slot's bytes into (or out of) the page. `cache_load_rows`
//! gathers many slots' bytes and decodes them in one launch; `cache_encode_rows` encodes many
//! rows' entries in one launch (a few past 65535 rows).

use super::mhc::u32_arg;
use crate::device::{DevBuf, DevPtr, KArg, blocks_for};
use crate::{Core, CudaError};
use dsv4_core::cache::CacheLayoutError;
use dsv4_core::{IndexKDtype, KvCacheDtype};
use dsv4_kernels::RowFormat;

/// Threads per block of the per-value kernels and of the fp8 KV encoder.
const THREADS: u32 = 256;
/// Rows per encoder launch (the grid's y limit).
const MAX_GRID_Y: usize = 65_535;

/// The kernels' view of a row format.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// bf16 values (KV bf16 and index-K bf16).
    Bf16 { n: u32 },
    /// fp8 KV: nd e4m3 values in 64-blocks, then rd bf16.
    KvFp8 { nd: u32, rd: u32 },
    /// fp8 index-K: dim e4m3 values and one f32 scale.
    IndexFp8 { dim: u32 },
    /// fp4 index-K: dim e2m1 values with a ue8m0 scale per 32.
    IndexFp4 { dim: u32 },
}

fn kind(fmt: &RowFormat) -> Result<Kind, CudaError> {
    let n = |v: usize| {
        u32::try_from(v).map_err(|_| CudaError::BadOperands(format!("cache row of {v} values")))
    };
    Ok(match fmt {
        RowFormat::Kv(l) => match l.dtype() {
            KvCacheDtype::Bf16 => Kind::Bf16 {
                n: n(l.head_dim())?,
            },
            KvCacheDtype::Fp8 => Kind::KvFp8 {
                nd: n(l.nd())?,
                rd: n(l.rd())?,
            },
        },
        RowFormat::IndexK(l) => match l.dtype() {
            IndexKDtype::Bf16 => Kind::Bf16 { n: n(l.dim())? },
            IndexKDtype::Fp8 => Kind::IndexFp8 { dim: n(l.dim())? },
            IndexKDtype::Fp4 => Kind::IndexFp4 { dim: n(l.dim())? },
        },
    })
}

/// Quantize `values` into `slot` of `page` in the format's spec §4 byte layout; only that
/// slot's bytes change. The inner error is the layout's, exactly as the reference returns it.
pub fn cache_store(
    c: &Core,
    fmt: &RowFormat,
    page: &mut [u8],
    slot: usize,
    values: &[f32],
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    let at = match fmt.checked_slot(page.len(), values.len(), slot) {
        Ok(at) => at,
        Err(e) => return Ok(Err(e)),
    };
    let total = at.data.len() + at.scale.len();
    let vb = c.dev.temp_f32(values)?;
    let ob = c.dev.temp(total)?;
    encode(c, fmt, vb.at(), ob.at(), 1, total)?;
    let mut bytes = vec![0u8; total];
    c.dev.download(&ob, &mut bytes)?;
    let (d, s) = bytes.split_at(at.data.len());
    page[at.data].copy_from_slice(d);
    page[at.scale].copy_from_slice(s);
    Ok(Ok(()))
}

/// Quantize whole rows of `values` (rows of the format's width) into their entries, end to end
/// (each its data bytes then its scale bytes, as `cache_store` writes a slot): one upload, one
/// launch per [`MAX_GRID_Y`] rows and one read-back. The inner error is the row-by-row
/// definition's (`Backend::cache_encode_rows`): a partial row; no rows is an empty result with
/// nothing submitted.
pub fn cache_encode_rows(
    c: &Core,
    fmt: &RowFormat,
    values: &[f32],
) -> Result<Result<Vec<u8>, CacheLayoutError>, CudaError> {
    let (rows, at) = match fmt.checked_encode(values.len()) {
        Ok(checked) => checked,
        Err(e) => return Ok(Err(e)),
    };
    let entry = at.data.len() + at.scale.len();
    let mut bytes = vec![0u8; rows * entry];
    if rows == 0 {
        return Ok(Ok(bytes));
    }
    let vb = c.dev.temp_f32(values)?;
    let ob = c.dev.temp(bytes.len())?;
    encode(c, fmt, vb.at(), ob.at(), rows, entry)?;
    c.dev.download(&ob, &mut bytes)?;
    Ok(Ok(bytes))
}

/// The encoder over `words` values at `values` into `out`, both in device memory
/// (`DeviceOps::cache_encode_into`): the entries end to end from `out`'s first byte; nothing
/// read back. `Ok(Err)` is the format's layout error for a length that is not whole rows.
pub(crate) fn encode_at(
    c: &Core,
    fmt: &RowFormat,
    values: DevPtr,
    words: usize,
    out: DevPtr,
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    let (rows, at) = match fmt.checked_encode(words) {
        Ok(checked) => checked,
        Err(e) => return Ok(Err(e)),
    };
    let entry = at.data.len() + at.scale.len();
    if values.bytes < words * 4 || out.bytes < rows * entry {
        return Err(CudaError::BadOperands(format!(
            "cache_encode_into: {rows} rows of {entry}-byte entries from {} bytes of values into \
             {} bytes",
            values.bytes, out.bytes
        )));
    }
    if rows > 0 {
        encode(c, fmt, values, out, rows, entry)?;
    }
    Ok(Ok(()))
}

/// Launch the format's encoder over `rows` rows: row r's values at `vb[r·width ..]` (f32), its
/// entry (`entry` bytes: data then scale bytes) to `ob[r·entry ..]`; a launch per
/// [`MAX_GRID_Y`] rows, the row on the grid's y axis.
fn encode(
    c: &Core,
    fmt: &RowFormat,
    vb: DevPtr,
    ob: DevPtr,
    rows: usize,
    entry: usize,
) -> Result<(), CudaError> {
    let stride = u32_arg("cache entry bytes", entry)?;
    u32_arg("cache rows", rows)?;
    let (kernel, grid, block, scalars) = match kind(fmt)? {
        Kind::Bf16 { n } => (
            "cache_encode_bf16",
            blocks_for(n as usize, THREADS as usize),
            THREADS,
            vec![KArg::U32(n)],
        ),
        Kind::KvFp8 { nd, rd } => (
            "cache_encode_kv_fp8",
            1,
            THREADS,
            vec![KArg::U32(nd), KArg::U32(rd)],
        ),
        Kind::IndexFp8 { dim } => ("cache_encode_index_fp8", 1, 32, vec![KArg::U32(dim)]),
        Kind::IndexFp4 { dim } => (
            "cache_encode_index_fp4",
            blocks_for(dim as usize / 32, 4),
            128,
            vec![KArg::U32(dim)],
        ),
    };
    for row0 in (0..rows).step_by(MAX_GRID_Y) {
        let nr = (rows - row0).min(MAX_GRID_Y) as u32;
        let mut args = vec![KArg::Ptr(vb), KArg::Ptr(ob)];
        args.extend(scalars.iter().copied());
        args.extend([KArg::U32(row0 as u32), KArg::U32(stride)]);
        // SAFETY: parameter order of the encoder; the launch covers rows row0 .. row0 + nr ≤
        // rows, whose values `vb` holds (rows × width f32) and whose entries `ob` holds (rows ×
        // `entry` bytes), which is exactly what the encoder reads and writes.
        unsafe { c.dev.launch(kernel, (grid, nr, 1), (block, 1, 1), &args)? };
    }
    Ok(())
}

/// Dequantize `slot` of `page` exactly into `out`.
pub fn cache_load(
    c: &Core,
    fmt: &RowFormat,
    page: &[u8],
    slot: usize,
    out: &mut [f32],
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    let at = match fmt.checked_slot(page.len(), out.len(), slot) {
        Ok(at) => at,
        Err(e) => return Ok(Err(e)),
    };
    let mut entry = page[at.data].to_vec();
    entry.extend_from_slice(&page[at.scale]);
    decode(c, fmt, &entry, 1, out)?;
    Ok(Ok(()))
}

/// Dequantize many rows in one upload, one launch and one read-back: row r is slot
/// `rows[r].1` of `pages[rows[r].0]`, into `out[r·width ..]`. Every row is checked first, in
/// the order `Backend::cache_load_rows`'s row-by-row definition checks them (the output
/// length, then per row the page index and `cache_load`'s checks), so a bad row returns that
/// definition's error and nothing is written. The host gathers just the rows' entry bytes
/// (data then scale row, as `cache_load` uploads one), so no more than the distinct pages'
/// bytes cross to the device.
pub fn cache_load_rows(
    c: &Core,
    fmt: &RowFormat,
    pages: &[&[u8]],
    rows: &[(usize, usize)],
    out: &mut [f32],
) -> Result<Result<(), CacheLayoutError>, CudaError> {
    let entries = match gathered_entries(fmt, pages, rows, out.len()) {
        Ok(e) => e,
        Err(e) => return Ok(Err(e)),
    };
    decode(c, fmt, &entries, rows.len(), out)?;
    Ok(Ok(()))
}

/// The entries (data then scale bytes) of `rows` (page, slot) of `pages`, laid end to end, after
/// the shared codec's checks of every access and of an output of `out_len` values.
pub(crate) fn gathered_entries(
    fmt: &RowFormat,
    pages: &[&[u8]],
    rows: &[(usize, usize)],
    out_len: usize,
) -> Result<Vec<u8>, CacheLayoutError> {
    Ok(CheckedRows::new(fmt, pages, rows, out_len)?.entries(0..rows.len()))
}

/// Rows (page, slot) of pages that passed the shared codec's checks, their entries gathered only
/// when asked for (a call the page cache serves needs none of them).
pub(crate) struct CheckedRows<'a> {
    pages: &'a [&'a [u8]],
    rows: &'a [(usize, usize)],
    at: Vec<dsv4_core::cache::SlotBytes>,
    entry: usize,
}

impl<'a> CheckedRows<'a> {
    /// Check every access of `rows` and an output of `out_len` values.
    pub fn new(
        fmt: &RowFormat,
        pages: &'a [&'a [u8]],
        rows: &'a [(usize, usize)],
        out_len: usize,
    ) -> Result<Self, CacheLayoutError> {
        Ok(Self {
            at: fmt.checked_rows(pages, rows, out_len)?,
            pages,
            rows,
            entry: fmt.entry_bytes(),
        })
    }

    /// The entries of rows `range`, laid end to end.
    pub fn entries(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        let mut entries = Vec::with_capacity(range.len() * self.entry);
        for (&(page, _), at) in self.rows[range.clone()].iter().zip(&self.at[range]) {
            entries.extend_from_slice(&self.pages[page][at.data.clone()]);
            entries.extend_from_slice(&self.pages[page][at.scale.clone()]);
        }
        entries
    }
}

/// Decode `rows` entries laid end to end in `entries` (equal sizes) into `out` (rows × the
/// format's width): one upload, one launch of the format's decoder, one read-back.
fn decode(
    c: &Core,
    fmt: &RowFormat,
    entries: &[u8],
    rows: usize,
    out: &mut [f32],
) -> Result<(), CudaError> {
    if rows == 0 || out.is_empty() {
        return Ok(());
    }
    let ob = decode_on_device(c, fmt, entries, rows)?;
    c.dev.download_f32(&ob, out)
}

/// How a kernel that takes keys (the indexer, attention) reads them: rows of f32, or cache
/// entries laid end to end, read in place by the kernel's `<name>_<format>` variant through
/// cache.cu's entry reader of that format (the decoders' own), so the values are bitwise the
/// decoded ones.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Keys {
    /// Rows of the key width in f32: the kernel itself.
    F32,
    /// Entries of `stride` bytes; the variant's suffix and the format's sizes a, b.
    Entries {
        suffix: &'static str,
        stride: u32,
        a: u32,
        b: u32,
    },
}

impl Keys {
    /// Entries of `fmt`, read in place.
    pub(crate) fn entries(fmt: &RowFormat) -> Result<Self, CudaError> {
        let (suffix, a, b) = match kind(fmt)? {
            Kind::Bf16 { n } => ("bf16", n, 0),
            Kind::KvFp8 { nd, rd } => ("kv_fp8", nd, rd),
            Kind::IndexFp8 { dim } => ("index_fp8", dim, 0),
            Kind::IndexFp4 { dim } => ("index_fp4", dim, 0),
        };
        let stride = u32_arg("cache entry bytes", fmt.entry_bytes())?;
        Ok(Keys::Entries {
            suffix,
            stride,
            a,
            b,
        })
    }

    /// The variant of kernel `base` that reads these keys.
    pub(crate) fn kernel(&self, base: &str) -> String {
        match self {
            Keys::F32 => base.to_string(),
            Keys::Entries { suffix, .. } => format!("{base}_{suffix}"),
        }
    }

    /// The parameters the entry variants take after the kernel's own: stride, a, b.
    pub(crate) fn args(&self) -> Vec<KArg<'static>> {
        match *self {
            Keys::F32 => Vec::new(),
            Keys::Entries { stride, a, b, .. } => {
                vec![KArg::U32(stride), KArg::U32(a), KArg::U32(b)]
            }
        }
    }
}

/// Upload `rows` entries laid end to end in `entries` (equal sizes) and launch the format's
/// decoder into a device buffer of rows × the format's width f32, which is returned; rows > 0
/// and a nonzero width.
fn decode_on_device(
    c: &Core,
    fmt: &RowFormat,
    entries: &[u8],
    rows: usize,
) -> Result<DevBuf, CudaError> {
    let values = rows * fmt.width();
    let stride = u32_arg("cache entry bytes", entries.len() / rows)?;
    let eb = c.dev.temp_upload(entries)?;
    let ob = c.dev.temp(values * 4)?;
    let (kernel, scalars) = match kind(fmt)? {
        Kind::Bf16 { n } => ("cache_decode_bf16", vec![KArg::U32(n)]),
        Kind::KvFp8 { nd, rd } => ("cache_decode_kv_fp8", vec![KArg::U32(nd), KArg::U32(rd)]),
        Kind::IndexFp8 { dim } => ("cache_decode_index_fp8", vec![KArg::U32(dim)]),
        Kind::IndexFp4 { dim } => ("cache_decode_index_fp4", vec![KArg::U32(dim)]),
    };
    let mut args = vec![KArg::Buf(&eb), KArg::Buf(&ob)];
    args.extend(scalars);
    args.extend([KArg::U32(u32_arg("cache rows", rows)?), KArg::U32(stride)]);
    let grid = blocks_for(values, THREADS as usize);
    // SAFETY: parameter order of the decoder; `eb` holds `rows` entries of `stride` bytes
    // (data and scale bytes each) and `ob` rows × width f32, one value per thread.
    unsafe { c.dev.launch(kernel, (grid, 1, 1), (THREADS, 1, 1), &args)? };
    Ok(ob)
}

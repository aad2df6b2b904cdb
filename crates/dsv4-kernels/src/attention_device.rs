//! The attention-side ops on device-resident queries: sparse attention
//! ([`crate::DeviceOps::paged_attention`]: the keys still in their cache pages, as
//! [`Backend::paged_attention_indexed`] takes them, the queries and the output in device
//! memory, so a layer's attention reads nothing back and its output goes on to the next launch
//! where it is) and the indexer's selection ([`crate::DeviceOps::paged_indexer_topk`]: its
//! queries and head weights in device memory, only the chosen ids coming back); also the
//! checks of the cache encoder and the compressor's pooling on device memory
//! ([`check_encode`], [`check_pool`]), and the packing of encoded entries into words.

use crate::device::{DevSlice, check_len, ensure};
use crate::{Backend, EntryOrigin, KernelError, PageTag, RowFormat};

/// The keys and parameters of one [`crate::DeviceOps::paged_attention`] call: what
/// [`Backend::paged_attention_indexed`] takes besides the queries and the output.
#[derive(Debug, Clone, Copy)]
pub struct PagedAttention<'a> {
    /// The pages' entry format (its width is the head dim).
    pub fmt: &'a RowFormat,
    /// The pages' bytes.
    pub pages: &'a [&'a [u8]],
    /// Each page's content tag, or empty (no page kept across calls).
    pub tags: &'a [PageTag],
    /// Each packed page's entries' origins (empty for a page not packed), or empty.
    pub origins: &'a [&'a [EntryOrigin]],
    /// The key rows, (page, slot) of `pages`.
    pub rows: &'a [(usize, usize)],
    /// Key i is row `key_ids[i]`.
    pub key_ids: &'a [usize],
    /// Query r attends over keys `key_starts[r] .. key_starts[r+1]` (one more than queries).
    pub key_starts: &'a [usize],
    /// The per-head sink logits (its length is the head count).
    pub sink: &'a [f32],
    /// The logits' scale.
    pub scale: f32,
}

impl PagedAttention<'_> {
    /// Queries of the call (one fewer than `key_starts`).
    pub fn queries(&self) -> usize {
        self.key_starts.len().saturating_sub(1)
    }

    /// Words of the queries, and of the output: queries · heads · dim.
    pub fn words(&self) -> usize {
        self.queries() * self.sink.len() * self.fmt.width()
    }

    /// Check a call's device operands before anything runs: `q` and `out` each
    /// [`Self::words`] words, `key_starts` not empty, and `out` not overlapping `q` (the
    /// queries are read while the output is written). What the keys hold is checked as
    /// [`Backend::paged_attention_indexed`] checks it.
    pub fn check_call(&self, q: DevSlice, out: DevSlice) -> Result<(), KernelError> {
        let op = "paged_attention";
        ensure(!self.key_starts.is_empty(), op, || {
            "key_starts is empty (it has one entry more than queries)".into()
        })?;
        check_len(op, "q", q, self.words())?;
        check_len(op, "out", out, self.words())?;
        let overlap = q.buf == out.buf && q.off < out.off + out.len && out.off < q.off + q.len;
        ensure(!overlap || q.len == 0, op, || {
            "out overlaps q (the queries are read while the output is written)".into()
        })
    }

    /// The host form: [`Backend::paged_attention_indexed`] of the queries' host copy `q`, its
    /// output; a cache layout error is the op's error.
    pub fn host(&self, be: &dyn Backend, q: &[f32]) -> Result<Vec<f32>, KernelError> {
        let mut out = vec![0f32; self.words()];
        be.paged_attention_indexed(
            q,
            self.fmt,
            self.pages,
            self.tags,
            self.origins,
            self.rows,
            self.key_ids,
            self.key_starts,
            self.sink,
            self.scale,
            &mut out,
        )
        .map_err(|e| layout_error(&e))?;
        Ok(out)
    }
}

/// A cache layout error of the keys as [`crate::DeviceOps::paged_attention`]'s error.
pub fn layout_error(e: &dyn std::fmt::Display) -> KernelError {
    KernelError::Device {
        message: format!("paged_attention: the keys' pages: {e}"),
    }
}

/// The keys of one [`crate::DeviceOps::paged_indexer_topk`] call: what
/// [`Backend::paged_indexer_topk_ranges`] takes besides the queries and head weights.
#[derive(Debug, Clone, Copy)]
pub struct PagedIndexer<'a> {
    /// The pages' entry format (its width is the indexer's head dim).
    pub fmt: &'a RowFormat,
    /// The pages' bytes.
    pub pages: &'a [&'a [u8]],
    /// Each page's content tag, or empty.
    pub tags: &'a [PageTag],
    /// The key rows, (page, slot) of `pages`.
    pub rows: &'a [(usize, usize)],
    /// Query r scores rows `key_ranges[r].0 .. key_ranges[r].1` (ranges may overlap).
    pub key_ranges: &'a [(usize, usize)],
    /// How many ids each query keeps.
    pub k: usize,
}

impl PagedIndexer<'_> {
    /// Check a call's device operands before anything runs: at least one query's head
    /// weights in `w` (queries · heads words) and `q` holding queries · heads · dim words.
    /// Returns the heads. What the keys hold is checked as
    /// [`Backend::paged_indexer_topk_ranges`] checks it.
    pub fn check_call(&self, q: DevSlice, w: DevSlice) -> Result<usize, KernelError> {
        let op = "paged_indexer_topk";
        let queries = self.key_ranges.len();
        ensure(queries > 0, op, || {
            "no queries (key_ranges is empty)".into()
        })?;
        ensure(w.len.is_multiple_of(queries), op, || {
            format!(
                "w has {} words, not heads for each of {queries} queries",
                w.len
            )
        })?;
        let heads = w.len / queries;
        check_len(op, "q", q, queries * heads * self.fmt.width())?;
        Ok(heads)
    }

    /// The host form: [`Backend::paged_indexer_topk_ranges`] of the host copies `q` and `w`;
    /// a cache layout error is the op's error.
    pub fn host(
        &self,
        be: &dyn Backend,
        q: &[f32],
        w: &[f32],
    ) -> Result<Vec<Vec<usize>>, KernelError> {
        be.paged_indexer_topk_ranges(
            q,
            w,
            self.fmt,
            self.pages,
            self.tags,
            self.rows,
            self.key_ranges,
            self.k,
        )
        .map_err(|e| KernelError::Device {
            message: format!("paged_indexer_topk: the keys' pages: {e}"),
        })
    }
}

/// Words of device memory holding `rows` entries of `fmt` packed end to end
/// ([`crate::DeviceOps::cache_encode_into`]).
pub fn encoded_words(fmt: &RowFormat, rows: usize) -> usize {
    (rows * fmt.entry_bytes()).div_ceil(4)
}

/// The first `bytes` bytes packed little-endian in `words` (what
/// [`crate::DeviceOps::cache_encode_into`] wrote, read back).
pub fn words_bytes(words: &[f32], bytes: usize) -> Vec<u8> {
    let mut out: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_bits().to_le_bytes())
        .collect();
    out.truncate(bytes);
    out
}

/// `bytes` packed little-endian into words, the last one padded with zero bytes.
pub fn bytes_words(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            f32::from_bits(u32::from_le_bytes(w))
        })
        .collect()
}

/// Check a [`crate::DeviceOps::cache_encode_into`] call before anything runs: `x` holds whole
/// rows of `fmt` (as the host op's layout check says), `out` [`encoded_words`] of them, and
/// the two do not overlap. Returns the rows.
pub fn check_encode(fmt: &RowFormat, x: DevSlice, out: DevSlice) -> Result<usize, KernelError> {
    let op = "cache_encode_into";
    let rows = fmt
        .checked_encode(x.len)
        .map(|(rows, _)| rows)
        .map_err(|e| KernelError::Device {
            message: format!("{op}: {e}"),
        })?;
    check_len(op, "out", out, encoded_words(fmt, rows))?;
    let overlap = x.buf == out.buf && x.off < out.off + out.len && out.off < x.off + x.len;
    ensure(!overlap || out.len == 0 || x.len == 0, op, || {
        "out overlaps x".into()
    })?;
    Ok(rows)
}

/// Check a [`crate::DeviceOps::softmax_pool_rows`] call before anything runs: `a` and `z`
/// each `windows · rows · width` words, `out` `windows · width` and overlapping neither.
pub fn check_pool(
    a: DevSlice,
    z: DevSlice,
    windows: usize,
    rows: usize,
    width: usize,
    out: DevSlice,
) -> Result<(), KernelError> {
    let op = "softmax_pool_rows";
    let n = windows
        .checked_mul(rows)
        .and_then(|r| r.checked_mul(width))
        .ok_or_else(|| KernelError::Device {
            message: format!("{op}: {windows} windows of {rows} × {width} overflow"),
        })?;
    check_len(op, "a", a, n)?;
    check_len(op, "z", z, n)?;
    check_len(op, "out", out, windows * width)?;
    let overlaps =
        |s: DevSlice| s.buf == out.buf && s.off < out.off + out.len && out.off < s.off + s.len;
    ensure(!(overlaps(a) || overlaps(z)) || out.len == 0, op, || {
        "out overlaps a or z".into()
    })
}

//! Rows of several sequences' paged stores decoded together ([`RowGather`]): on a backend with
//! device memory each row's pages are copied out when the row is added (so a later write to
//! the store — the next row's SWA store into a ring slot — cannot change what this row reads;
//! rows scattered over more pages than they fill are packed into fresh pages instead)
//! and every row added is decoded in one [`dsv4_kernels::Backend::cache_load_rows`] call, one
//! submission instead of one per sequence; on a host backend rows are decoded as they are
//! added, without copies. Either way the values are bitwise what each store's own
//! `load_rows` gives (the batched decode is row for row the single one).
//!
//! A sharing gather ([`RowGather::sharing`], attention's) copies or decodes each row of a store
//! once however many times it is added, and keeps which copy each added row reads: a prefill
//! chunk's rows of one sequence read mostly the same window rows and, on ratio-128 layers,
//! nested prefixes of the same compressed entries, and a GPU backend then uploads each once
//! ([`dsv4_kernels::Backend::paged_attention_indexed`]), a host backend decodes each once
//! ([`dsv4_kernels::Backend::sparse_attention_indexed`]).

use super::ForwardError;
use super::state::{CopiedPages, PagedRows};
use dsv4_kernels::{Backend, DevSlice, DeviceOps, PagedAttention, PagedIndexer, RowFormat};
use std::collections::HashMap;

/// Where a sharing gather copied each row: (the store's address, row) → its pick.
type Copied = HashMap<(usize, usize), usize>;

/// Rows gathered from [`PagedRows`] stores of one format, in the order added.
pub(crate) struct RowGather<'b> {
    backend: &'b dyn Backend,
    /// The rows' format and width (once a row is added); in snapshot mode also the copied
    /// pages (with their content tags) and each row's (page, slot).
    layout: Option<(RowFormat, usize)>,
    pages: CopiedPages,
    picks: Vec<(usize, usize)>,
    /// Direct mode (no device memory): the rows decoded so far (in a sharing gather, each
    /// (store, row) once).
    direct: Option<Vec<f32>>,
    /// Sharing mode: the pick (snapshot) or decoded row (direct) each (store address, row)
    /// went to, and the one each row added reads, in the order added.
    shared: Option<(Copied, Vec<usize>)>,
    /// Rows added so far.
    rows: usize,
}

impl<'b> RowGather<'b> {
    /// An empty gather decoding with `backend`.
    pub fn new(backend: &'b dyn Backend) -> Self {
        Self {
            backend,
            layout: None,
            pages: CopiedPages::default(),
            picks: Vec::new(),
            direct: backend.device().is_none().then(Vec::new),
            shared: None,
            rows: 0,
        }
    }

    /// An empty gather that copies (on a backend with device memory) or decodes (on a host
    /// backend) each row of a store once however often it is added. A row added again reads
    /// what was copied or decoded the first time, so the rows added must not change while the
    /// gather lives: an append-only store's written rows, or a ring's rows within its window (a
    /// later store into their slot must come after the last row reading them).
    pub fn sharing(backend: &'b dyn Backend) -> Self {
        let mut g = Self::new(backend);
        g.shared = Some(Default::default());
        g
    }

    /// Add rows `rows` of `store`, after its load-back wait unless `unsynced` (the faulty read
    /// path); the number of rows added.
    pub fn add(
        &mut self,
        store: &PagedRows,
        rows: impl Iterator<Item = usize>,
        unsynced: bool,
    ) -> Result<usize, ForwardError> {
        if !unsynced {
            store.wait_loaded();
        }
        let fmt = (*store.layout(), store.width());
        match self.layout {
            None => self.layout = Some(fmt),
            Some(l) if l != fmt => {
                return Err(ForwardError::Plan {
                    message: format!(
                        "rows of stores of different formats gathered together ({:?} and {:?})",
                        l.0, fmt.0
                    ),
                });
            }
            Some(_) => {}
        }
        let Some((copied, ids)) = &mut self.shared else {
            if let Some(out) = &mut self.direct {
                let rows: Vec<usize> = rows.collect();
                out.extend(store.load_rows_unsynced(self.backend, rows.iter().copied())?);
                self.rows += rows.len();
                return Ok(rows.len());
            }
            let before = self.picks.len();
            store.copy_rows(rows, &mut self.pages, &mut self.picks)?;
            self.rows = self.picks.len();
            return Ok(self.picks.len() - before);
        };
        // Each (store, row) is copied or decoded the first time it is added, as the next pick
        // or decoded row (one per (store, row) so far); ids name what each row added reads.
        let (at, base, added) = (std::ptr::from_ref(store) as usize, copied.len(), ids.len());
        let mut fresh = Vec::new();
        for r in rows {
            let next = base + fresh.len();
            ids.push(*copied.entry((at, r)).or_insert_with(|| {
                fresh.push(r);
                next
            }));
        }
        match &mut self.direct {
            Some(out) => out.extend(store.load_rows_unsynced(self.backend, fresh.into_iter())?),
            None => store.copy_rows(fresh.into_iter(), &mut self.pages, &mut self.picks)?,
        }
        self.rows = ids.len();
        Ok(ids.len() - added)
    }

    /// Each row added's (page, slot) in the copied pages, in the order added.
    fn laid_out(&self) -> std::borrow::Cow<'_, [(usize, usize)]> {
        match &self.shared {
            Some((_, ids)) => ids.iter().map(|&i| self.picks[i]).collect(),
            None => std::borrow::Cow::Borrowed(&self.picks),
        }
    }

    /// Sparse attention of queries `q` over the rows added as keys (`dim` wide), query r over
    /// rows `key_starts[r] .. key_starts[r+1]`, into `out`: on a backend with device memory one
    /// [`Backend::paged_attention_rows`] call over the copied pages (the keys are decoded where
    /// the attention runs), else `sparse_attention_rows` over the rows decoded so far.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        self,
        q: &[f32],
        dim: usize,
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) -> Result<(), ForwardError> {
        let be = self.backend;
        match (&self.direct, self.layout) {
            (None, Some((fmt, width))) => {
                self.same_width(width, dim)?;
                let refs: Vec<&[u8]> = self.pages.bytes.iter().map(Vec::as_slice).collect();
                let origins: Vec<&[_]> = self.pages.origins.iter().map(Vec::as_slice).collect();
                let picks = &self.picks;
                match &self.shared {
                    Some((_, ids)) => be.paged_attention_indexed(
                        q,
                        &fmt,
                        &refs,
                        &self.pages.tags,
                        &origins,
                        picks,
                        ids,
                        key_starts,
                        sink,
                        scale,
                        out,
                    )?,
                    None => be.paged_attention_rows(
                        q, &fmt, &refs, picks, key_starts, sink, scale, out,
                    )?,
                }
            }
            (Some(keys), Some((_, width))) if self.shared.is_some() => {
                self.same_width(width, dim)?;
                let ids = self
                    .shared
                    .as_ref()
                    .map_or(&[][..], |(_, ids)| ids.as_slice());
                be.sparse_attention_indexed(q, dim, keys, ids, key_starts, sink, scale, out);
            }
            _ => {
                let keys = self.finish()?;
                be.sparse_attention_rows(q, dim, &keys, key_starts, sink, scale, out);
            }
        }
        Ok(())
    }

    /// [`Self::attend`] with the queries `q` and the output `out` in `dev`'s memory: one
    /// [`DeviceOps::paged_attention`] over the copied pages (a sharing gather's, which every
    /// gather on a backend with a device is). A gather of no rows (it has no pages to name
    /// their format) attends from host copies: the queries read back, the output written.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_on(
        self,
        dev: &dyn DeviceOps,
        q: DevSlice,
        dim: usize,
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: DevSlice,
    ) -> Result<(), ForwardError> {
        match (&self.direct, self.layout, &self.shared) {
            (None, Some((fmt, width)), Some((_, ids))) => {
                self.same_width(width, dim)?;
                let refs: Vec<&[u8]> = self.pages.bytes.iter().map(Vec::as_slice).collect();
                let origins: Vec<&[_]> = self.pages.origins.iter().map(Vec::as_slice).collect();
                let keys = PagedAttention {
                    fmt: &fmt,
                    pages: &refs,
                    tags: &self.pages.tags,
                    origins: &origins,
                    rows: &self.picks,
                    key_ids: ids,
                    key_starts,
                    sink,
                    scale,
                };
                Ok(dev.paged_attention(&keys, q, out)?)
            }
            _ => {
                let qv = dev.read(q)?;
                let mut o = vec![0f32; out.len];
                self.attend(&qv, dim, key_starts, sink, scale, &mut o)?;
                Ok(dev.write(out, &o)?)
            }
        }
    }

    /// The indexer's selection of queries `q` (head weights `w`) over the rows added as keys
    /// (`dim` wide), query r over rows `key_ranges[r].0 .. key_ranges[r].1` (ranges may
    /// overlap: a chunk's rows of one sequence share their keys), its `k` best: on a backend
    /// with device memory one [`Backend::paged_indexer_topk_ranges`] call over the copied
    /// pages (each row uploaded once), else `indexer_topk_ranges` over the rows decoded so far.
    pub fn indexer_topk(
        self,
        q: &[f32],
        w: &[f32],
        dim: usize,
        key_ranges: &[(usize, usize)],
        k: usize,
    ) -> Result<Vec<Vec<usize>>, ForwardError> {
        let be = self.backend;
        match (&self.direct, self.layout) {
            (None, Some((fmt, width))) => {
                self.same_width(width, dim)?;
                let refs: Vec<&[u8]> = self.pages.bytes.iter().map(Vec::as_slice).collect();
                let picks = self.laid_out();
                let tags = &self.pages.tags;
                Ok(be.paged_indexer_topk_ranges(q, w, &fmt, &refs, tags, &picks, key_ranges, k)?)
            }
            _ => {
                if let Some((_, width)) = self.layout {
                    self.same_width(width, dim)?;
                }
                let keys = self.finish()?;
                Ok(be.indexer_topk_ranges(q, w, dim, &keys, key_ranges, k))
            }
        }
    }

    /// [`Self::indexer_topk`] with the queries `q` and head weights `w` in `dev`'s memory: one
    /// [`DeviceOps::paged_indexer_topk`] over the copied pages (every gather on a backend with
    /// a device copies them). A gather of no rows chooses nothing for every query, as the
    /// host op does over no keys; a direct gather reads the queries back.
    pub fn indexer_topk_on(
        self,
        dev: &dyn DeviceOps,
        q: DevSlice,
        w: DevSlice,
        dim: usize,
        key_ranges: &[(usize, usize)],
        k: usize,
    ) -> Result<Vec<Vec<usize>>, ForwardError> {
        match (&self.direct, self.layout) {
            (None, Some((fmt, width))) => {
                self.same_width(width, dim)?;
                let refs: Vec<&[u8]> = self.pages.bytes.iter().map(Vec::as_slice).collect();
                let picks = self.laid_out();
                let keys = PagedIndexer {
                    fmt: &fmt,
                    pages: &refs,
                    tags: &self.pages.tags,
                    rows: &picks,
                    key_ranges,
                    k,
                };
                Ok(dev.paged_indexer_topk(&keys, q, w)?)
            }
            (None, None) if self.rows == 0 => Ok(vec![Vec::new(); key_ranges.len()]),
            _ => {
                let (qv, wv) = (dev.read(q)?, dev.read(w)?);
                self.indexer_topk(&qv, &wv, dim, key_ranges, k)
            }
        }
    }

    /// The indexer's scores of queries `q` (head weights `w`) over the rows added as keys
    /// (`dim` wide), query r over rows `key_ranges[r].0 .. key_ranges[r].1`, in one
    /// `indexer_scores_rows` call over the decoded rows laid out range after range (the path
    /// `dsv4 diff` reads scores from; [`Self::indexer_topk`]'s selection is the backend's
    /// `topk_rows` of exactly these). Returns the scores and query r's range of them,
    /// `starts[r] .. starts[r+1]`.
    pub fn indexer_scores(
        self,
        q: &[f32],
        w: &[f32],
        dim: usize,
        key_ranges: &[(usize, usize)],
    ) -> Result<(Vec<f32>, Vec<usize>), ForwardError> {
        let be = self.backend;
        let (keys, starts) = self.expanded(dim, key_ranges)?;
        let mut scores = vec![0f32; starts.last().copied().unwrap_or(0)];
        be.indexer_scores_rows(q, w, dim, &keys, &starts, &mut scores);
        Ok((scores, starts))
    }

    /// The rows added, decoded and laid out range after range as `dim`-wide keys, and the
    /// partition of them by range.
    fn expanded(
        self,
        dim: usize,
        key_ranges: &[(usize, usize)],
    ) -> Result<(Vec<f32>, Vec<usize>), ForwardError> {
        if let Some((_, width)) = self.layout {
            self.same_width(width, dim)?;
        }
        let rows = self.rows;
        let keys = self.finish()?;
        let all: Vec<usize> = (0..rows).collect();
        let (order, starts) = dsv4_kernels::operands::expand_ranges(&all, key_ranges);
        let mut out = Vec::with_capacity(order.len() * dim);
        for r in order {
            out.extend_from_slice(&keys[r * dim..(r + 1) * dim]);
        }
        Ok((out, starts))
    }

    /// Rows added so far (the index the next row added will have).
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Err unless the rows gathered (`width` wide) are the `dim`-wide keys an op expects.
    fn same_width(&self, width: usize, dim: usize) -> Result<(), ForwardError> {
        if width == dim {
            return Ok(());
        }
        Err(ForwardError::Plan {
            message: format!("{width}-wide rows gathered as {dim}-wide keys"),
        })
    }

    /// Every row added, decoded, in order: [rows, width].
    pub fn finish(self) -> Result<Vec<f32>, ForwardError> {
        if let Some(out) = self.direct {
            let (Some((_, ids)), Some((_, width))) = (&self.shared, self.layout) else {
                return Ok(out);
            };
            let mut laid = Vec::new();
            dsv4_kernels::operands::extend_rows_by_id(&mut laid, &out, width, ids);
            return Ok(laid);
        }
        let Some((fmt, width)) = self.layout else {
            return Ok(Vec::new());
        };
        let refs: Vec<&[u8]> = self.pages.bytes.iter().map(Vec::as_slice).collect();
        let picks = self.laid_out();
        let mut out = vec![0f32; picks.len() * width];
        self.backend
            .cache_load_rows(&fmt, &refs, &picks, &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_backend_reference::ReferenceBackend;
    use dsv4_core::KvCacheDtype;
    use dsv4_core::cache::KvLayout;
    use dsv4_kernels::HostResident;
    use std::sync::Arc;

    fn row(v: f32) -> Vec<f32> {
        vec![v; 8]
    }

    /// A 4-row ring of 8-wide bf16 rows holding rows 0..6 (rows 2..6 are kept).
    fn ring(be: &dyn Backend) -> PagedRows {
        let kv = KvLayout::new(KvCacheDtype::Bf16, 0, 8, 2).unwrap();
        let mut r = PagedRows::ring(RowFormat::Kv(kv), 8, 4);
        (0..6).for_each(|i| r.push(be, &row(i as f32)).unwrap());
        r
    }

    #[test]
    fn rows_read_what_the_store_held_when_they_were_added() {
        let device = HostResident::new(Arc::new(ReferenceBackend));
        let host = ReferenceBackend;
        for be in [&device as &dyn Backend, &host] {
            let mut r = ring(be);
            let mut g = RowGather::new(be);
            assert_eq!(g.add(&r, 2..=5, false).unwrap(), 4);
            // Row 6 overwrites row 2's ring slot after row 2 was gathered.
            r.push(be, &row(6.0)).unwrap();
            assert_eq!(g.add(&r, [6, 5].into_iter(), false).unwrap(), 2);
            let want: Vec<f32> = [2.0, 3.0, 4.0, 5.0, 6.0, 5.0]
                .iter()
                .flat_map(|&v| row(v))
                .collect();
            assert_eq!(g.finish().unwrap(), want);
            assert!(RowGather::new(be).finish().unwrap().is_empty());
        }
    }

    #[test]
    fn attention_and_selection_over_the_gather_equal_the_decoded_rows() {
        let device = HostResident::new(Arc::new(ReferenceBackend));
        let host = ReferenceBackend;
        let q: Vec<f32> = (0..2 * 2 * 8)
            .map(|i| (i % 5) as f32 * 0.25 - 0.5)
            .collect();
        let (sink, starts) = ([0.5f32, -0.25], [0usize, 3, 5]);
        let mut results = Vec::new();
        for be in [&device as &dyn Backend, &host] {
            let r = ring(be);
            let gather = |rows: std::ops::RangeInclusive<usize>| {
                let mut g = RowGather::new(be);
                g.add(&r, rows, false).unwrap();
                g
            };
            let keys = gather(2..=5).finish().unwrap();
            let keys: Vec<f32> = keys.iter().chain(&keys[8..16]).copied().collect();
            let mut want = vec![0f32; q.len()];
            be.sparse_attention_rows(&q, 8, &keys, &starts, &sink, 0.5, &mut want);
            let mut got = vec![0f32; q.len()];
            let mut g = gather(2..=5);
            g.add(&r, 3..=3, false).unwrap();
            g.attend(&q, 8, &starts, &sink, 0.5, &mut got).unwrap();
            assert_eq!(got, want, "{}", be.name());
            let w = [1.0f32, 0.5, -0.5, 1.0];
            let mut g = gather(2..=5);
            g.add(&r, 3..=3, false).unwrap();
            let chosen = g.indexer_topk(&q, &w, 8, &[(0, 3), (3, 5)], 2).unwrap();
            assert_eq!(chosen, be.indexer_topk_rows(&q, &w, 8, &keys, &starts, 2));
            results.push((got, chosen));
            // Rows of another width are refused on the device path (the host path has no
            // layout to compare).
            if be.device().is_some() {
                let e = gather(2..=5).attend(&q, 4, &starts, &sink, 0.5, &mut [0f32; 16]);
                assert!(e.unwrap_err().to_string().contains("8-wide rows"));
            }
        }
        assert_eq!(results[0], results[1], "device and host paths agree");
    }

    /// Rows 0..10 of 8-wide bf16 rows, two a page (five pages), owned or in a page store.
    fn five_pages(be: &dyn Backend, pooled: bool) -> PagedRows {
        let kv = KvLayout::new(KvCacheDtype::Bf16, 0, 8, 2).unwrap();
        let mut r = PagedRows::growing(RowFormat::Kv(kv), 8);
        if pooled {
            let store = super::super::pages::HeapStore::new("kv", kv.page_bytes());
            r = r.in_store(Arc::new(store));
        }
        (0..10).for_each(|i| r.push(be, &row(i as f32)).unwrap());
        r
    }

    #[test]
    fn scattered_rows_are_packed_and_dense_rows_copy_whole_pages() {
        let be = HostResident::new(Arc::new(ReferenceBackend));
        for pooled in [false, true] {
            let r = five_pages(&be, pooled);
            // Rows 9, 1, 5 and 8 sit on three pages and fill two: they are packed, in order.
            let mut g = RowGather::new(&be);
            assert_eq!(g.add(&r, [9, 1, 5, 8].into_iter(), false).unwrap(), 4);
            assert_eq!(g.pages.bytes.len(), 2, "pooled {pooled}");
            assert_eq!(g.picks, [(0, 0), (0, 1), (1, 0), (1, 1)]);
            // Each packed entry names its source page's tag (pooled pages have one; owned
            // pages none) and its slot there, for a backend that keeps pages.
            let slots: Vec<Vec<u32>> = g
                .pages
                .origins
                .iter()
                .map(|o| o.iter().map(|e| e.slot).collect())
                .collect();
            assert_eq!(slots, [vec![1, 1], vec![1, 0]], "pooled {pooled}");
            let tagged = g.pages.origins.iter().flatten().all(|o| o.tag.is_tagged());
            assert_eq!(tagged, pooled);
            // A second store's rows go after the first's pages: rows 0..6 fill their 3 pages.
            assert_eq!(g.add(&r, 0..6, false).unwrap(), 6);
            assert_eq!(g.pages.bytes.len(), 5, "pooled {pooled}");
            assert_eq!(g.pages.origins.len(), 5, "whole pages have no origins");
            assert!(g.pages.origins[2..].iter().all(Vec::is_empty));
            assert_eq!(
                g.picks[4..],
                [(2, 0), (2, 1), (3, 0), (3, 1), (4, 0), (4, 1)]
            );
            let want: Vec<f32> = [9, 1, 5, 8, 0, 1, 2, 3, 4, 5]
                .iter()
                .flat_map(|&v| row(v as f32))
                .collect();
            assert_eq!(g.finish().unwrap(), want, "pooled {pooled}");
            // A row twice, and rows of one page: nothing to pack.
            let mut g = RowGather::new(&be);
            g.add(&r, [3, 3, 2].into_iter(), false).unwrap();
            assert_eq!(
                (g.pages.bytes.len(), &g.picks[..]),
                (1, &[(0, 1), (0, 1), (0, 0)][..])
            );
            let want: Vec<f32> = [3, 3, 2].iter().flat_map(|&v| row(v as f32)).collect();
            assert_eq!(g.finish().unwrap(), want);
        }
    }

    #[test]
    fn a_sharing_gather_copies_each_row_once_and_reads_as_the_plain_one() {
        let device = HostResident::new(Arc::new(ReferenceBackend));
        let host = ReferenceBackend;
        let q: Vec<f32> = (0..3 * 2 * 8)
            .map(|i| (i % 7) as f32 * 0.25 - 0.75)
            .collect();
        let (sink, starts) = ([0.5f32, -0.25], [0usize, 4, 8, 11]);
        for be in [&device as &dyn Backend, &host] {
            let (r, other) = (five_pages(be, true), five_pages(be, false));
            // Overlapping windows, a row twice in one add, and a second store's row 0.
            let fill = |g: &mut RowGather| {
                assert_eq!(g.add(&r, 0..4, false).unwrap(), 4);
                assert_eq!(g.add(&r, 2..6, false).unwrap(), 4);
                assert_eq!(g.add(&r, [5, 5].into_iter(), false).unwrap(), 2);
                assert_eq!(g.add(&other, 0..1, false).unwrap(), 1);
                assert_eq!(g.len(), 11);
            };
            let (mut shared, mut plain) = (RowGather::sharing(be), RowGather::new(be));
            fill(&mut shared);
            fill(&mut plain);
            if be.device().is_some() {
                // Rows 0..6 of the first store and row 0 of the second, each copied once.
                assert_eq!(shared.picks.len(), 7);
                assert_eq!(plain.picks.len(), 11);
            } else {
                // The same 7 rows, each decoded once.
                let decoded = |g: &RowGather| g.direct.as_ref().map_or(0, Vec::len) / 8;
                assert_eq!((decoded(&shared), decoded(&plain)), (7, 11));
            }
            let (mut got, mut want) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            shared.attend(&q, 8, &starts, &sink, 0.5, &mut got).unwrap();
            plain.attend(&q, 8, &starts, &sink, 0.5, &mut want).unwrap();
            assert_eq!(got, want, "{}", be.name());
            let (mut shared, mut plain) = (RowGather::sharing(be), RowGather::new(be));
            fill(&mut shared);
            fill(&mut plain);
            let want: Vec<f32> = [0, 1, 2, 3, 2, 3, 4, 5, 5, 5, 0]
                .iter()
                .flat_map(|&v| row(v as f32))
                .collect();
            assert_eq!(shared.finish().unwrap(), want, "{}", be.name());
            assert_eq!(plain.finish().unwrap(), want, "{}", be.name());
        }
    }

    #[test]
    fn stores_of_different_formats_are_refused_not_mixed() {
        let be = HostResident::new(Arc::new(ReferenceBackend));
        let a = ring(&be);
        let kv = KvLayout::new(KvCacheDtype::Bf16, 0, 16, 2).unwrap();
        let mut b = PagedRows::growing(RowFormat::Kv(kv), 16);
        b.push(&be, &[1.0; 16]).unwrap();
        let mut g = RowGather::new(&be);
        g.add(&a, 2..3, false).unwrap();
        let e = g.add(&b, 0..1, false).unwrap_err();
        assert!(e.to_string().contains("different formats"), "{e}");
    }
}

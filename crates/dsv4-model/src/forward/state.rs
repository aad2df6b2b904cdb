//! Per-request decode state of one sequence: the SWA ring, compressed-entry stores, compressor
//! rings and index-K stores, all in the exact byte layouts of spec §4. Each store either owns
//! its pages or keeps page ids into an engine's [`PageStore`] (see [`super::pages`]).

use super::ForwardError;
use super::pages::{CacheStores, PageStore, PageTag, PooledPages};
pub use super::ring::{CompressorRing, ring_read_row, ring_write_row};
use dsv4_core::cache::{IndexKLayout, KvLayout};
use dsv4_kernels::{Backend, EntryOrigin, RowFormat};
use std::sync::Arc;

/// Entries per page of every KV store (SWA ring, C4 and C128 entries).
pub const KV_PAGE_ENTRIES: usize = 64;

/// The location word of "no row is written here".
pub const NO_LOCATION: u32 = u32::MAX;

/// A row location as one 32-bit word (plans carry locations in f32-sized slots).
fn location(loc: u64, store: &str) -> Result<u32, ForwardError> {
    u32::try_from(loc)
        .ok()
        .filter(|&l| l != NO_LOCATION)
        .ok_or_else(|| ForwardError::Plan {
            message: format!(
                "cache store `{store}` is too large for 32-bit row locations; size the pools \
                 smaller (cache.max_total_tokens)"
            ),
        })
}

/// Where a store's pages live.
#[derive(Debug, Clone)]
enum Pages {
    /// Owned byte pages.
    Owned(Vec<Vec<u8>>),
    /// Page ids in an engine's store.
    Pooled(PooledPages),
}

/// Page bytes copied out of stores ([`PagedRows::copy_rows`]), each with its content tag
/// ([`PageTag::UNTAGGED`] for packed pages and owned ones): the snapshot a device backend decodes.
#[derive(Debug, Default)]
pub struct CopiedPages {
    /// The copied bytes, one page each.
    pub bytes: Vec<Vec<u8>>,
    /// Each page's content tag.
    pub tags: Vec<PageTag>,
    /// Each page's entries' origins: empty for a page copied whole, the source page's tag and
    /// slot of each entry for a packed one.
    pub origins: Vec<Vec<EntryOrigin>>,
}

/// Rows stored in pages of a [`RowFormat`]; either append-only or a ring over the last
/// `capacity` row indices. Rows are quantized and dequantized by the backend's cache ops.
#[derive(Debug, Clone)]
pub struct PagedRows {
    layout: RowFormat,
    width: usize,
    pages: Pages,
    ring_capacity: Option<usize>,
    len: usize,
}

impl PagedRows {
    /// An append-only store of rows of `width` values.
    pub fn growing(layout: RowFormat, width: usize) -> Self {
        Self {
            layout,
            width,
            pages: Pages::Owned(Vec::new()),
            ring_capacity: None,
            len: 0,
        }
    }

    /// A ring that keeps at least the last `keep` rows (rounded up to whole pages).
    pub fn ring(layout: RowFormat, width: usize, keep: usize) -> Self {
        let per = layout.page_entries();
        let cap = keep.div_ceil(per).max(1) * per;
        Self {
            ring_capacity: Some(cap),
            ..Self::growing(layout, width)
        }
    }

    /// The same store with its pages in `store` (whose pages must be `layout.page_bytes()` long).
    pub fn in_store(mut self, store: Arc<dyn PageStore>) -> Self {
        self.pages = Pages::Pooled(PooledPages::new(store));
        self
    }

    /// Rows written so far (row indices 0..len).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The row format.
    pub fn layout(&self) -> &RowFormat {
        &self.layout
    }

    /// Rows a ring keeps (None for an append-only store).
    pub fn ring_capacity(&self) -> Option<usize> {
        self.ring_capacity
    }

    /// Copies of the byte pages, in logical order (for golden tests and the canary).
    pub fn pages(&self) -> Vec<Vec<u8>> {
        match &self.pages {
            Pages::Owned(p) => p.clone(),
            Pages::Pooled(p) => (0..p.ids().len())
                .map(|i| p.page_bytes(i).unwrap_or_default())
                .collect(),
        }
    }

    /// The page ids for changing where they live (a host tier's spill and load-back); None
    /// when the pages are owned.
    pub fn pooled_pages_mut(&mut self) -> Option<&mut PooledPages> {
        match &mut self.pages {
            Pages::Owned(_) => None,
            Pages::Pooled(p) => Some(p),
        }
    }

    /// Block until a pending load-back of the pages is done (at once when none is).
    pub fn wait_loaded(&self) {
        if let Pages::Pooled(p) = &self.pages {
            p.wait_loaded();
        }
    }

    /// The page ids when the pages live in a store (None when they are owned).
    pub fn pooled_pages(&self) -> Option<&PooledPages> {
        match &self.pages {
            Pages::Owned(_) => None,
            Pages::Pooled(p) => Some(p),
        }
    }

    /// Reserve rows `len..len + n` for writing by a plan's store launches: their pages are
    /// allocated (or copied first when shared) and `len` advances. Returns each row's location,
    /// `page id × page_entries + slot`, in the store the pages live in.
    pub fn reserve(&mut self, n: usize) -> Result<Vec<u32>, ForwardError> {
        let per = self.layout.page_entries() as u64;
        let mut out = Vec::with_capacity(n);
        for row in self.len..self.len + n {
            let (page, slot) = self.place(row);
            let Pages::Pooled(p) = &mut self.pages else {
                return Err(ForwardError::Plan {
                    message: "a cache store owns its pages; plans write rows into page \
                              stores (make sequences with Model::new_sequence)"
                        .into(),
                });
            };
            let id = p.writable(page)?;
            out.push(location(
                u64::from(id) * per + slot as u64,
                p.store().name(),
            )?);
        }
        self.len += n;
        Ok(out)
    }

    /// The store holding the pages (None when they are owned).
    pub fn store(&self) -> Option<&Arc<dyn PageStore>> {
        self.pooled_pages().map(PooledPages::store)
    }

    /// Dequantize row `row` into `out`, where the row may have been reserved ahead of rows
    /// still to be written in the same step (no ring-eviction check). Waits for a pending
    /// load-back of the pages first.
    pub fn load_row(
        &self,
        backend: &dyn Backend,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), ForwardError> {
        self.wait_loaded();
        self.load_row_unsynced(backend, row, out)
    }

    /// [`Self::load_row`] without the load-back wait: reads whatever the pages hold now (the
    /// read path of the `skip-index-k-transfer-wait` fault).
    pub fn load_row_unsynced(
        &self,
        backend: &dyn Backend,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), ForwardError> {
        let (page, slot) = self.place(row);
        match &self.pages {
            Pages::Owned(pages) => backend.cache_load(&self.layout, &pages[page], slot, out)?,
            Pages::Pooled(p) => {
                let id = p.readable(page)?;
                let mut r = Ok(());
                p.store().read(id, &mut |b| {
                    r = backend.cache_load(&self.layout, b, slot, out)
                });
                r?;
            }
        }
        Ok(())
    }

    /// Rows `rows` dequantized with [`Self::load_row`] into one [n, width] buffer (one wait
    /// for a pending load-back first, even for no rows).
    pub fn load_rows(
        &self,
        backend: &dyn Backend,
        rows: impl Iterator<Item = usize>,
    ) -> Result<Vec<f32>, ForwardError> {
        self.wait_loaded();
        self.load_rows_unsynced(backend, rows)
    }

    /// [`Self::load_rows`] without the load-back wait (the faulty read path). Owned pages, and
    /// pooled pages on a backend with device memory, are decoded in one
    /// [`Backend::cache_load_rows`] call (one submission on a GPU; pooled pages are copied out
    /// first); pooled pages on a host backend row by row, without copies.
    pub fn load_rows_unsynced(
        &self,
        backend: &dyn Backend,
        rows: impl Iterator<Item = usize>,
    ) -> Result<Vec<f32>, ForwardError> {
        if let (Pages::Pooled(_), None) = (&self.pages, backend.device()) {
            let mut out = Vec::new();
            let mut buf = vec![0f32; self.width];
            for r in rows {
                self.load_row_unsynced(backend, r, &mut buf)?;
                out.extend_from_slice(&buf);
            }
            return Ok(out);
        }
        let mut out = Vec::new();
        match &self.pages {
            Pages::Owned(pages) => {
                let (order, picks) = self.picks(rows, 0);
                let refs: Vec<&[u8]> = order.iter().map(|&p| pages[p].as_slice()).collect();
                out.resize(picks.len() * self.width, 0.0);
                backend.cache_load_rows(&self.layout, &refs, &picks, &mut out)?;
            }
            Pages::Pooled(_) => {
                // A device backend (the host one returned above): copies, one decode.
                let mut g = super::gather::RowGather::new(backend);
                g.add(self, rows, true)?;
                out = g.finish()?;
            }
        }
        Ok(out)
    }

    /// The distinct pages of `rows` in first-use order, and each row's (`base` + index of its
    /// page in that order, slot). Linear in the rows: a long context's indexer gathers every
    /// compressed entry, thousands of pages.
    fn picks(
        &self,
        rows: impl Iterator<Item = usize>,
        base: usize,
    ) -> (Vec<usize>, Vec<(usize, usize)>) {
        const NONE: usize = usize::MAX;
        let (mut order, mut picks, mut seen) = (Vec::new(), Vec::new(), Vec::<usize>::new());
        for r in rows {
            let (page, slot) = self.place(r);
            if page >= seen.len() {
                seen.resize(page + 1, NONE);
            }
            if seen[page] == NONE {
                seen[page] = order.len();
                order.push(page);
            }
            picks.push((base + seen[page], slot));
        }
        (order, picks)
    }

    /// Run `f` on the bytes of logical page `page` and their content tag (without the
    /// load-back wait); owned pages are untagged.
    fn with_page(
        &self,
        page: usize,
        f: &mut dyn FnMut(&[u8], PageTag),
    ) -> Result<(), ForwardError> {
        match &self.pages {
            Pages::Owned(own) => f(
                own.get(page).map_or(&[][..], Vec::as_slice),
                PageTag::UNTAGGED,
            ),
            Pages::Pooled(p) => p.store().read_tagged(p.readable(page)?, f),
        }
        Ok(())
    }

    /// Copy the bytes holding `rows` onto `pages` now (without the load-back wait) and append
    /// each row's (index in `pages`, slot) to `picks`: a snapshot that a later
    /// [`Backend::cache_load_rows`] decodes, whatever is written to the store in between.
    /// Whole pages are copied when the rows fill them well enough, with their content tags;
    /// rows scattered over more pages than they would fill (a top-k selection over a long
    /// context) are packed, in order, into fresh, untagged pages instead, so the copy is the
    /// size of the rows, not of the pages they sit in; each packed entry's origin (its page's
    /// tag and slot) is recorded, so a backend that keeps pages can read it from its copy.
    pub fn copy_rows(
        &self,
        rows: impl Iterator<Item = usize>,
        pages: &mut CopiedPages,
        picks: &mut Vec<(usize, usize)>,
    ) -> Result<(), ForwardError> {
        let base = pages.bytes.len();
        let (order, mine) = self.picks(rows, 0);
        let per = self.layout.page_entries();
        let packed = mine.len().div_ceil(per);
        if packed >= order.len() {
            for &page in &order {
                let (mut bytes, mut tag) = (Vec::new(), PageTag::UNTAGGED);
                self.with_page(page, &mut |b, t| (bytes, tag) = (b.to_vec(), t))?;
                pages.bytes.push(bytes);
                pages.tags.push(tag);
                pages.origins.push(Vec::new());
            }
            picks.extend(mine.into_iter().map(|(p, slot)| (base + p, slot)));
            return Ok(());
        }
        let mut out = vec![vec![0u8; self.layout.page_bytes()]; packed];
        let mut origins = vec![EntryOrigin::default(); mine.len()];
        let mut on_page: Vec<Vec<usize>> = vec![Vec::new(); order.len()];
        for (r, &(p, _)) in mine.iter().enumerate() {
            on_page[p].push(r);
        }
        for (&page, rows) in order.iter().zip(&on_page) {
            let mut copied = Ok(());
            self.with_page(page, &mut |src, tag| {
                copied = rows.iter().try_for_each(|&r| {
                    origins[r] = EntryOrigin {
                        tag,
                        slot: mine[r].1 as u32,
                    };
                    self.layout
                        .copy_entry(src, mine[r].1, &mut out[r / per], r % per)
                });
            })?;
            copied?;
        }
        pages
            .tags
            .extend(std::iter::repeat_n(PageTag::UNTAGGED, out.len()));
        pages.bytes.extend(out);
        pages
            .origins
            .extend(origins.chunks(per.max(1)).map(<[EntryOrigin]>::to_vec));
        picks.extend((0..mine.len()).map(|r| (base + r / per, r % per)));
        Ok(())
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.width
    }

    fn place(&self, row: usize) -> (usize, usize) {
        let r = self.ring_capacity.map_or(row, |c| row % c);
        let per = self.layout.page_entries();
        (r / per, r % per)
    }

    /// Pages of the store that appending `extra` rows would take (new pages, and copies of
    /// pages shared with another holder); 0 for owned pages.
    pub fn fresh_pages_for(&self, extra: usize) -> usize {
        let Pages::Pooled(p) = &self.pages else {
            return 0;
        };
        let extra = self.ring_capacity.map_or(extra, |c| extra.min(c));
        let mut count = 0;
        let mut last = None;
        for row in self.len..self.len + extra {
            let (page, _) = self.place(row);
            if last != Some(page) {
                last = Some(page);
                count += usize::from(p.needs_fresh(page));
            }
        }
        count
    }

    /// Append row `len` (quantized to the layout's format).
    pub fn push(&mut self, backend: &dyn Backend, values: &[f32]) -> Result<(), ForwardError> {
        let (page, slot) = self.place(self.len);
        let layout = self.layout;
        match &mut self.pages {
            Pages::Owned(pages) => {
                while pages.len() <= page {
                    pages.push(vec![0u8; layout.page_bytes()]);
                }
                backend.cache_store(&layout, &mut pages[page], slot, values)?;
            }
            Pages::Pooled(p) => {
                let id = p.writable(page)?;
                let mut r = Ok(());
                p.store().write_entry(id, slot, &mut |b| {
                    r = backend.cache_store(&layout, b, slot, values)
                });
                r?;
            }
        }
        self.len += 1;
        Ok(())
    }

    /// Dequantize row `row` (must be among the kept rows) into `out`.
    pub fn get(
        &self,
        backend: &dyn Backend,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), ForwardError> {
        debug_assert!(row < self.len);
        if let Some(c) = self.ring_capacity {
            debug_assert!(row + c >= self.len, "row {row} was evicted from the ring");
        }
        let (page, slot) = self.place(row);
        match &self.pages {
            Pages::Owned(pages) => {
                backend.cache_load(&self.layout, &pages[page], slot, out)?;
            }
            Pages::Pooled(p) => {
                let id = p.readable(page)?;
                p.wait_loaded();
                let mut r = Ok(());
                p.store().read(id, &mut |b| {
                    r = backend.cache_load(&self.layout, b, slot, out)
                });
                r?;
            }
        }
        Ok(())
    }

    /// The given rows dequantized into one contiguous [n, width] buffer.
    pub fn gather(
        &self,
        backend: &dyn Backend,
        rows: impl Iterator<Item = usize>,
    ) -> Result<Vec<f32>, ForwardError> {
        let mut out = Vec::new();
        let mut buf = vec![0f32; self.width];
        for r in rows {
            self.get(backend, r, &mut buf)?;
            out.extend_from_slice(&buf);
        }
        Ok(out)
    }
}

/// A compressor's state: its ring and the store of finished entries.
#[derive(Debug, Clone)]
pub struct CompressorState {
    /// The unfinished window(s).
    pub ring: CompressorRing,
    /// Finished entries (C4/C128 KV entries, or index-K rows).
    pub entries: PagedRows,
}

/// The cache state of one layer of one sequence.
#[derive(Debug, Clone)]
pub struct LayerState {
    /// SWA entries, a ring over the last `sliding_window` positions.
    pub swa: PagedRows,
    /// The attention compressor (ratio 4 and 128).
    pub compressor: Option<CompressorState>,
    /// The indexer's compressor with its index-K store (ratio 4).
    pub indexer: Option<CompressorState>,
}

/// Rows of a compressor ring for `ratio`: 2·ratio for ratio 4 (overlapping windows), else ratio.
pub fn ring_rows(ratio: usize) -> usize {
    if ratio == 4 { 8 } else { ratio }
}

/// The coff of a compressor of `ratio` (spec §2): 2 for ratio 4, else 1.
pub fn ring_coff(ratio: usize) -> usize {
    if ratio == 4 { 2 } else { 1 }
}

impl LayerState {
    /// Every list of pooled page ids of the layer (SWA, compressor entries and ring, indexer
    /// entries and ring), for a host tier to move.
    pub fn pooled_pages_mut(&mut self) -> Vec<&mut PooledPages> {
        let mut out = Vec::new();
        out.extend(self.swa.pooled_pages_mut());
        for c in [self.compressor.as_mut(), self.indexer.as_mut()]
            .into_iter()
            .flatten()
        {
            out.extend(c.entries.pooled_pages_mut());
            out.extend(c.ring.pooled_pages_mut());
        }
        out
    }

    /// Empty state for a layer of the given ratio, with the sequence's cache layouts.
    pub fn new(
        ratio: usize,
        head_dim: usize,
        window: usize,
        kv: &KvLayout,
        ik: &IndexKLayout,
    ) -> Self {
        let compressor = (ratio > 0).then(|| CompressorState {
            ring: CompressorRing::new(ring_rows(ratio), ring_coff(ratio) * head_dim),
            entries: PagedRows::growing(RowFormat::Kv(*kv), head_dim),
        });
        let indexer = (ratio == 4).then(|| CompressorState {
            ring: CompressorRing::new(8, 2 * ik.dim()),
            entries: PagedRows::growing(RowFormat::IndexK(*ik), ik.dim()),
        });
        Self {
            swa: PagedRows::ring(RowFormat::Kv(*kv), head_dim, window),
            compressor,
            indexer,
        }
    }

    /// Empty state like [`Self::new`], with every page in `stores` (the rings' pages are taken
    /// now; KV and index-K pages as rows arrive).
    pub fn new_in(
        ratio: usize,
        head_dim: usize,
        window: usize,
        kv: &KvLayout,
        ik: &IndexKLayout,
        stores: &CacheStores,
    ) -> Result<Self, ForwardError> {
        let compressor = match ratio {
            0 => None,
            _ => {
                let (entries, ring) = if ratio == 4 {
                    (&stores.c4, &stores.c4_ring)
                } else {
                    (&stores.c128, &stores.c128_ring)
                };
                Some(CompressorState {
                    ring: CompressorRing::in_store(
                        ring_rows(ratio),
                        ring_coff(ratio) * head_dim,
                        Arc::clone(ring),
                    )?,
                    entries: PagedRows::growing(RowFormat::Kv(*kv), head_dim)
                        .in_store(Arc::clone(entries)),
                })
            }
        };
        let indexer = if ratio == 4 {
            Some(CompressorState {
                ring: CompressorRing::in_store(8, 2 * ik.dim(), Arc::clone(&stores.index_ring))?,
                entries: PagedRows::growing(RowFormat::IndexK(*ik), ik.dim())
                    .in_store(Arc::clone(&stores.index_k)),
            })
        } else {
            None
        };
        Ok(Self {
            swa: PagedRows::ring(RowFormat::Kv(*kv), head_dim, window)
                .in_store(Arc::clone(&stores.swa)),
            compressor,
            indexer,
        })
    }
}

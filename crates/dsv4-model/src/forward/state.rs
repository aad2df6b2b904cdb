//! Per-request decode state of one sequence: the SWA ring, compressed-entry stores, compressor
//! rings and index-K stores, all in the exact byte layouts of spec §4. Each store either owns
//! its pages or keeps page ids into an engine's [`PageStore`] (see [`super::pages`]).

use super::ForwardError;
use super::pages::{CacheStores, PageStore, PooledPages};
use dsv4_core::cache::{IndexKLayout, KvLayout};
use dsv4_kernels::{Backend, RowFormat};
use std::borrow::Cow;
use std::sync::Arc;

/// Entries per page of every KV store (SWA ring, C4 and C128 entries).
pub const KV_PAGE_ENTRIES: usize = 64;

/// Where a store's pages live.
#[derive(Debug, Clone)]
enum Pages {
    /// Owned byte pages.
    Owned(Vec<Vec<u8>>),
    /// Page ids in an engine's store.
    Pooled(PooledPages),
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
            Pages::Pooled(p) => p
                .ids()
                .iter()
                .map(|&id| {
                    let mut v = Vec::new();
                    p.store().read(id, &mut |b| v = b.to_vec());
                    v
                })
                .collect(),
        }
    }

    /// The page ids when the pages live in a store (None when they are owned).
    pub fn pooled_pages(&self) -> Option<&PooledPages> {
        match &self.pages {
            Pages::Owned(_) => None,
            Pages::Pooled(p) => Some(p),
        }
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
                p.store().write(id, &mut |b| {
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

/// Where a ring's rows live.
#[derive(Debug, Clone)]
enum RingData {
    /// Owned a and z values, [rows, width] each.
    Owned { a: Vec<f32>, z: Vec<f32> },
    /// One page of a store holding rows [a | z] of f32 little-endian (spec §4).
    Pooled(PooledPages),
}

/// The unfinished window of a compressor: a ring of f32 rows [a | z] (spec §4), z starting at −∞.
#[derive(Debug, Clone)]
pub struct CompressorRing {
    /// Width of a and of z (coff·d).
    pub width: usize,
    /// Rows kept: 2·ratio for ratio 4, ratio for 128.
    pub rows: usize,
    data: RingData,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl CompressorRing {
    /// An empty ring.
    pub fn new(rows: usize, width: usize) -> Self {
        Self {
            width,
            rows,
            data: RingData::Owned {
                a: vec![0.0; rows * width],
                z: vec![f32::NEG_INFINITY; rows * width],
            },
        }
    }

    /// Bytes of a ring of `rows` rows of [a | z], each `width` f32 values wide.
    pub fn page_bytes(rows: usize, width: usize) -> usize {
        rows * 2 * width * 4
    }

    /// An empty ring in one page of `store` (whose pages must be [`Self::page_bytes`] long).
    pub fn in_store(
        rows: usize,
        width: usize,
        store: Arc<dyn PageStore>,
    ) -> Result<Self, ForwardError> {
        let mut pages = PooledPages::new(store);
        let id = pages.writable(0)?;
        let row_bytes = 2 * width * 4;
        pages.store().write(id, &mut |b| {
            for row in b.chunks_exact_mut(row_bytes) {
                let (a, z) = row.split_at_mut(width * 4);
                a.fill(0);
                for c in z.chunks_exact_mut(4) {
                    c.copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
                }
            }
        });
        Ok(Self {
            width,
            rows,
            data: RingData::Pooled(pages),
        })
    }

    /// The page id when the ring lives in a store (None when it is owned).
    pub fn pooled_pages(&self) -> Option<&PooledPages> {
        match &self.data {
            RingData::Owned { .. } => None,
            RingData::Pooled(p) => Some(p),
        }
    }

    /// Pages of the store that the next write would take (1 when the ring's page is shared).
    pub fn fresh_pages(&self) -> usize {
        self.pooled_pages()
            .map_or(0, |p| usize::from(p.needs_fresh(0)))
    }

    /// Make the ring's page exclusively this ring's (copying it when it is shared), so that
    /// [`Self::put`] cannot need a page. The forward pass calls it before every write.
    pub fn make_exclusive(&mut self) -> Result<(), ForwardError> {
        if let RingData::Pooled(p) = &mut self.data {
            p.writable(0)?;
        }
        Ok(())
    }

    /// Store token position `pos`'s (a, z) rows.
    ///
    /// # Panics
    /// When the ring lives in a store, shares its page and the store has no free page for the
    /// copy; call [`Self::make_exclusive`] first (as the forward pass does).
    pub fn put(&mut self, pos: usize, a: &[f32], z: &[f32]) {
        let r = pos % self.rows;
        let w = self.width;
        match &mut self.data {
            RingData::Owned { a: ra, z: rz } => {
                ra[r * w..(r + 1) * w].copy_from_slice(a);
                rz[r * w..(r + 1) * w].copy_from_slice(z);
            }
            RingData::Pooled(p) => {
                let id = p
                    .writable(0)
                    .expect("CompressorRing::make_exclusive is called before put");
                p.store().write(id, &mut |b| {
                    let row = &mut b[r * 2 * w * 4..(r + 1) * 2 * w * 4];
                    for (dst, v) in row.chunks_exact_mut(4).zip(a.iter().chain(z)) {
                        dst.copy_from_slice(&v.to_le_bytes());
                    }
                });
            }
        }
    }

    /// The (a, z) row of position `pos` (which must still be in the ring).
    pub fn row(&self, pos: usize) -> (Cow<'_, [f32]>, Cow<'_, [f32]>) {
        let r = pos % self.rows;
        let w = self.width;
        match &self.data {
            RingData::Owned { a, z } => (
                Cow::Borrowed(&a[r * w..(r + 1) * w]),
                Cow::Borrowed(&z[r * w..(r + 1) * w]),
            ),
            RingData::Pooled(p) => {
                let mut row = Vec::new();
                if let Some(&id) = p.ids().first() {
                    p.store().read(id, &mut |b| {
                        row = f32s(&b[r * 2 * w * 4..(r + 1) * 2 * w * 4]);
                    });
                }
                row.resize(2 * w, 0.0);
                let z = row.split_off(w);
                (Cow::Owned(row), Cow::Owned(z))
            }
        }
    }

    /// All rows' a and z values, [rows, width] each (slot = position mod rows).
    pub fn window(&self) -> (Cow<'_, [f32]>, Cow<'_, [f32]>) {
        match &self.data {
            RingData::Owned { a, z } => (Cow::Borrowed(a), Cow::Borrowed(z)),
            RingData::Pooled(_) => {
                let (mut a, mut z) = (Vec::new(), Vec::new());
                for r in 0..self.rows {
                    let (ra, rz) = self.row(r);
                    a.extend_from_slice(&ra);
                    z.extend_from_slice(&rz);
                }
                (Cow::Owned(a), Cow::Owned(z))
            }
        }
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

//! Per-request decode state of one sequence: the SWA ring, compressed-entry stores, compressor
//! rings and index-K stores, all in the exact byte layouts of spec §4.

use dsv4_core::cache::{CacheLayoutError, IndexKLayout, KvLayout};

/// Entries per page of every KV store (SWA ring, C4 and C128 entries).
pub const KV_PAGE_ENTRIES: usize = 64;

/// A row codec with a paged byte layout (KV entries or index-K rows).
pub trait RowLayout {
    /// Entries per page.
    fn entries_per_page(&self) -> usize;
    /// Bytes per page.
    fn bytes_per_page(&self) -> usize;
    /// Quantize `values` into `slot` of `page`.
    fn store(&self, page: &mut [u8], slot: usize, values: &[f32]) -> Result<(), CacheLayoutError>;
    /// Dequantize `slot` of `page` into `out`.
    fn load(&self, page: &[u8], slot: usize, out: &mut [f32]) -> Result<(), CacheLayoutError>;
}

impl RowLayout for KvLayout {
    fn entries_per_page(&self) -> usize {
        self.page_entries()
    }
    fn bytes_per_page(&self) -> usize {
        self.page_bytes()
    }
    fn store(&self, page: &mut [u8], slot: usize, values: &[f32]) -> Result<(), CacheLayoutError> {
        self.write(page, slot, values)
    }
    fn load(&self, page: &[u8], slot: usize, out: &mut [f32]) -> Result<(), CacheLayoutError> {
        self.read(page, slot, out)
    }
}

impl RowLayout for IndexKLayout {
    fn entries_per_page(&self) -> usize {
        self.page_entries()
    }
    fn bytes_per_page(&self) -> usize {
        self.page_bytes()
    }
    fn store(&self, page: &mut [u8], slot: usize, values: &[f32]) -> Result<(), CacheLayoutError> {
        self.write(page, slot, values)
    }
    fn load(&self, page: &[u8], slot: usize, out: &mut [f32]) -> Result<(), CacheLayoutError> {
        self.read(page, slot, out)
    }
}

/// Rows stored in pages of a [`RowLayout`]; either append-only or a ring over the last
/// `capacity` row indices.
#[derive(Debug, Clone)]
pub struct PagedRows<L> {
    layout: L,
    width: usize,
    pages: Vec<Vec<u8>>,
    ring_capacity: Option<usize>,
    len: usize,
}

impl<L: RowLayout> PagedRows<L> {
    /// An append-only store of rows of `width` values.
    pub fn growing(layout: L, width: usize) -> Self {
        Self {
            layout,
            width,
            pages: Vec::new(),
            ring_capacity: None,
            len: 0,
        }
    }

    /// A ring that keeps at least the last `keep` rows (rounded up to whole pages).
    pub fn ring(layout: L, width: usize, keep: usize) -> Self {
        let per = layout.entries_per_page();
        let cap = keep.div_ceil(per).max(1) * per;
        Self {
            layout,
            width,
            pages: Vec::new(),
            ring_capacity: Some(cap),
            len: 0,
        }
    }

    /// Rows written so far (row indices 0..len).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The byte pages (for golden tests and the canary).
    pub fn pages(&self) -> &[Vec<u8>] {
        &self.pages
    }

    fn place(&self, row: usize) -> (usize, usize) {
        let r = self.ring_capacity.map_or(row, |c| row % c);
        let per = self.layout.entries_per_page();
        (r / per, r % per)
    }

    /// Append row `len` (quantized to the layout's format).
    pub fn push(&mut self, values: &[f32]) -> Result<(), CacheLayoutError> {
        let (page, slot) = self.place(self.len);
        while self.pages.len() <= page {
            self.pages.push(vec![0u8; self.layout.bytes_per_page()]);
        }
        self.layout.store(&mut self.pages[page], slot, values)?;
        self.len += 1;
        Ok(())
    }

    /// Dequantize row `row` (must be among the kept rows) into `out`.
    pub fn get(&self, row: usize, out: &mut [f32]) -> Result<(), CacheLayoutError> {
        debug_assert!(row < self.len);
        if let Some(c) = self.ring_capacity {
            debug_assert!(row + c >= self.len, "row {row} was evicted from the ring");
        }
        let (page, slot) = self.place(row);
        self.layout.load(&self.pages[page], slot, out)
    }

    /// Rows `range` dequantized into one contiguous [n, width] buffer.
    pub fn gather(&self, rows: impl Iterator<Item = usize>) -> Result<Vec<f32>, CacheLayoutError> {
        let mut out = Vec::new();
        let mut buf = vec![0f32; self.width];
        for r in rows {
            self.get(r, &mut buf)?;
            out.extend_from_slice(&buf);
        }
        Ok(out)
    }
}

/// The unfinished window of a compressor: a ring of f32 rows [a | z] (spec §4), z starting at −∞.
#[derive(Debug, Clone)]
pub struct CompressorRing {
    /// Width of a and of z (coff·d).
    pub width: usize,
    /// Rows kept: 2·ratio for ratio 4, ratio for 128.
    pub rows: usize,
    /// a values, [rows, width].
    pub a: Vec<f32>,
    /// z values, [rows, width], −∞ where never written.
    pub z: Vec<f32>,
}

impl CompressorRing {
    /// An empty ring.
    pub fn new(rows: usize, width: usize) -> Self {
        Self {
            width,
            rows,
            a: vec![0.0; rows * width],
            z: vec![f32::NEG_INFINITY; rows * width],
        }
    }

    /// Store token position `pos`'s (a, z) rows.
    pub fn put(&mut self, pos: usize, a: &[f32], z: &[f32]) {
        let r = pos % self.rows;
        self.a[r * self.width..(r + 1) * self.width].copy_from_slice(a);
        self.z[r * self.width..(r + 1) * self.width].copy_from_slice(z);
    }

    /// The (a, z) row of position `pos` (which must still be in the ring).
    pub fn row(&self, pos: usize) -> (&[f32], &[f32]) {
        let r = pos % self.rows;
        (
            &self.a[r * self.width..(r + 1) * self.width],
            &self.z[r * self.width..(r + 1) * self.width],
        )
    }
}

/// A compressor's state: its ring and the store of finished entries.
#[derive(Debug, Clone)]
pub struct CompressorState<L> {
    /// The unfinished window(s).
    pub ring: CompressorRing,
    /// Finished entries (C4/C128 KV entries, or index-K rows).
    pub entries: PagedRows<L>,
}

/// The cache state of one layer of one sequence.
#[derive(Debug, Clone)]
pub struct LayerState {
    /// SWA entries, a ring over the last `sliding_window` positions.
    pub swa: PagedRows<KvLayout>,
    /// The attention compressor (ratio 4 and 128).
    pub compressor: Option<CompressorState<KvLayout>>,
    /// The indexer's compressor with its index-K store (ratio 4).
    pub indexer: Option<CompressorState<IndexKLayout>>,
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
        let ring_rows = |r: usize| if r == 4 { 8 } else { r };
        let coff = |r: usize| if r == 4 { 2 } else { 1 };
        let compressor = (ratio > 0).then(|| CompressorState {
            ring: CompressorRing::new(ring_rows(ratio), coff(ratio) * head_dim),
            entries: PagedRows::growing(*kv, head_dim),
        });
        let indexer = (ratio == 4).then(|| CompressorState {
            ring: CompressorRing::new(8, 2 * ik.dim()),
            entries: PagedRows::growing(*ik, ik.dim()),
        });
        Self {
            swa: PagedRows::ring(*kv, head_dim, window),
            compressor,
            indexer,
        }
    }
}

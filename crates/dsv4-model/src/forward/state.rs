//! Per-request decode state of one sequence: the SWA ring, compressed-entry stores, compressor
//! rings and index-K stores, all in the exact byte layouts of spec §4.

use dsv4_core::cache::{CacheLayoutError, IndexKLayout, KvLayout};
use dsv4_kernels::{Backend, RowFormat};

/// Entries per page of every KV store (SWA ring, C4 and C128 entries).
pub const KV_PAGE_ENTRIES: usize = 64;

/// Rows stored in pages of a [`RowFormat`]; either append-only or a ring over the last
/// `capacity` row indices. Rows are quantized and dequantized by the backend's cache ops.
#[derive(Debug, Clone)]
pub struct PagedRows {
    layout: RowFormat,
    width: usize,
    pages: Vec<Vec<u8>>,
    ring_capacity: Option<usize>,
    len: usize,
}

impl PagedRows {
    /// An append-only store of rows of `width` values.
    pub fn growing(layout: RowFormat, width: usize) -> Self {
        Self {
            layout,
            width,
            pages: Vec::new(),
            ring_capacity: None,
            len: 0,
        }
    }

    /// A ring that keeps at least the last `keep` rows (rounded up to whole pages).
    pub fn ring(layout: RowFormat, width: usize, keep: usize) -> Self {
        let per = layout.page_entries();
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
        let per = self.layout.page_entries();
        (r / per, r % per)
    }

    /// Append row `len` (quantized to the layout's format).
    pub fn push(&mut self, backend: &dyn Backend, values: &[f32]) -> Result<(), CacheLayoutError> {
        let (page, slot) = self.place(self.len);
        while self.pages.len() <= page {
            self.pages.push(vec![0u8; self.layout.page_bytes()]);
        }
        backend.cache_store(&self.layout, &mut self.pages[page], slot, values)?;
        self.len += 1;
        Ok(())
    }

    /// Dequantize row `row` (must be among the kept rows) into `out`.
    pub fn get(
        &self,
        backend: &dyn Backend,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        debug_assert!(row < self.len);
        if let Some(c) = self.ring_capacity {
            debug_assert!(row + c >= self.len, "row {row} was evicted from the ring");
        }
        let (page, slot) = self.place(row);
        backend.cache_load(&self.layout, &self.pages[page], slot, out)
    }

    /// The given rows dequantized into one contiguous [n, width] buffer.
    pub fn gather(
        &self,
        backend: &dyn Backend,
        rows: impl Iterator<Item = usize>,
    ) -> Result<Vec<f32>, CacheLayoutError> {
        let mut out = Vec::new();
        let mut buf = vec![0f32; self.width];
        for r in rows {
            self.get(backend, r, &mut buf)?;
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
}

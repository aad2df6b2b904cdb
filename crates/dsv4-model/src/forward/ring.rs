//! The unfinished window of a compressor (spec §3.4, §4): a ring of f32 rows `[a | z]`, z
//! starting at −∞, owned or in one page of a [`PageStore`]; and the byte helpers a plan's
//! compressor launch uses to read and write ring pages directly.

use super::ForwardError;
use super::pages::{PageId, PageStore, PooledPages};
use std::borrow::Cow;
use std::sync::Arc;

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

/// Write ring row `r` (a, then z; f32 little-endian) into a ring page of rows `width` wide.
pub fn ring_write_row(page: &mut [u8], r: usize, width: usize, a: &[f32], z: &[f32]) {
    if let Some(row) = page.get_mut(r * 2 * width * 4..(r + 1) * 2 * width * 4) {
        for (dst, v) in row.chunks_exact_mut(4).zip(a.iter().chain(z)) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Ring row `r` (a, z) of a ring page; zeros for a page too short to hold it.
pub fn ring_read_row(page: &[u8], r: usize, width: usize) -> (Vec<f32>, Vec<f32>) {
    let mut row: Vec<f32> = page
        .get(r * 2 * width * 4..(r + 1) * 2 * width * 4)
        .unwrap_or(&[])
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    row.resize(2 * width, 0.0);
    let z = row.split_off(width);
    (row, z)
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

    /// The page id for changing where it lives (a host tier); None when the ring is owned.
    pub fn pooled_pages_mut(&mut self) -> Option<&mut PooledPages> {
        match &mut self.data {
            RingData::Owned { .. } => None,
            RingData::Pooled(p) => Some(p),
        }
    }

    /// Pages of the store that the next write would take (1 when the ring's page is shared).
    pub fn fresh_pages(&self) -> usize {
        self.pooled_pages()
            .map_or(0, |p| usize::from(p.needs_fresh(0)))
    }

    /// Make the ring's page exclusively this ring's and return its id in the store (the ring
    /// location a plan's compressor launch writes); an error for an owned ring.
    pub fn prepare_page(&mut self) -> Result<PageId, ForwardError> {
        match &mut self.data {
            RingData::Pooled(p) => p.writable(0),
            RingData::Owned { .. } => Err(ForwardError::Plan {
                message: "a compressor ring owns its rows; plans write rings in page stores \
                          (make sequences with Model::new_sequence)"
                    .into(),
            }),
        }
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
                p.store().write(id, &mut |b| ring_write_row(b, r, w, a, z));
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
                let mut row = (Vec::new(), Vec::new());
                if let Some(&id) = p.ids().first() {
                    p.wait_loaded();
                    p.store().read(id, &mut |b| row = ring_read_row(b, r, w));
                }
                (Cow::Owned(row.0), Cow::Owned(row.1))
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

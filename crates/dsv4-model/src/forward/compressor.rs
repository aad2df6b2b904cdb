//! The compressor (spec §3.4): per-token (a, z) rows pooled into one entry per window of `ratio`
//! tokens; overlapping windows for ratio 4. The pooling runs over any [`RingRows`]: a
//! sequence's [`CompressorRing`], or a [`PhysicalRing`] page a plan's launch addresses directly.

use super::pages::{PageId, PageStore};
use super::state::{CompressorRing, ring_read_row, ring_rows, ring_write_row};
use dsv4_kernels::Backend;
use std::borrow::Cow;

/// A ring of (a, z) rows, slot = position mod rows.
pub trait RingRows {
    /// Store token position `pos`'s rows.
    fn put(&mut self, pos: usize, a: &[f32], z: &[f32]);
    /// The (a, z) rows of position `pos`.
    fn row(&self, pos: usize) -> (Cow<'_, [f32]>, Cow<'_, [f32]>);
    /// All rows' a and z values, [rows, width] each.
    fn window(&self) -> (Cow<'_, [f32]>, Cow<'_, [f32]>);
}

impl RingRows for CompressorRing {
    fn put(&mut self, pos: usize, a: &[f32], z: &[f32]) {
        CompressorRing::put(self, pos, a, z);
    }

    fn row(&self, pos: usize) -> (Cow<'_, [f32]>, Cow<'_, [f32]>) {
        CompressorRing::row(self, pos)
    }

    fn window(&self) -> (Cow<'_, [f32]>, Cow<'_, [f32]>) {
        CompressorRing::window(self)
    }
}

/// A ring addressed by its page in a store (the location a plan's launch was given).
pub struct PhysicalRing<'a> {
    /// The store of ring pages.
    pub store: &'a dyn PageStore,
    /// The ring's page.
    pub page: PageId,
    /// Rows in the ring.
    pub rows: usize,
    /// Width of a and of z.
    pub width: usize,
}

impl RingRows for PhysicalRing<'_> {
    fn put(&mut self, pos: usize, a: &[f32], z: &[f32]) {
        let (r, w) = (pos % self.rows, self.width);
        self.store
            .write(self.page, &mut |b| ring_write_row(b, r, w, a, z));
    }

    fn row(&self, pos: usize) -> (Cow<'_, [f32]>, Cow<'_, [f32]>) {
        let (r, w) = (pos % self.rows, self.width);
        let mut row = (Vec::new(), Vec::new());
        self.store
            .read(self.page, &mut |b| row = ring_read_row(b, r, w));
        (Cow::Owned(row.0), Cow::Owned(row.1))
    }

    fn window(&self) -> (Cow<'_, [f32]>, Cow<'_, [f32]>) {
        let (mut a, mut z) = (Vec::new(), Vec::new());
        for r in 0..self.rows {
            let (ra, rz) = self.row(r);
            a.extend_from_slice(&ra);
            z.extend_from_slice(&rz);
        }
        (Cow::Owned(a), Cow::Owned(z))
    }
}

/// The windows a step completes, pooled in one [`Backend::softmax_pool_rows`] call: each
/// completed window's rows are copied out of its ring when its last token is pushed (a later
/// push of the same step may overwrite them), and [`WindowPool::finish`] pools them all.
pub struct WindowPool {
    ratio: usize,
    dim: usize,
    /// Each window's a and z, [rows, dim] per window.
    a: Vec<f32>,
    z: Vec<f32>,
    windows: usize,
}

impl WindowPool {
    /// No windows yet, for a compressor of `ratio` whose entries are `dim` wide.
    pub fn new(ratio: usize, dim: usize) -> Self {
        WindowPool {
            ratio,
            dim,
            a: Vec::new(),
            z: Vec::new(),
            windows: 0,
        }
    }

    /// Rows one window pools — as many as its ring holds: 8 for ratio 4 (the previous
    /// window's first halves and this window's second halves), else `ratio`.
    fn rows(&self) -> usize {
        ring_rows(self.ratio)
    }

    /// Store token `pos`'s rows (`a`, `z`, each coff·dim wide, z already including `ape`) in
    /// `ring`; when `pos` completes window w = pos / ratio, take w's rows and return w.
    pub fn push(
        &mut self,
        ring: &mut dyn RingRows,
        pos: usize,
        a: &[f32],
        z: &[f32],
    ) -> Option<usize> {
        ring.put(pos, a, z);
        if !(pos + 1).is_multiple_of(self.ratio) {
            return None;
        }
        let (w, dim) = (pos / self.ratio, self.dim);
        if self.ratio == 4 {
            // Rows 0..3: the previous window's first halves (absent for w = 0: a = 0, z = −∞);
            // rows 4..7: the current window's second halves.
            let at = self.a.len();
            self.a.resize(at + 8 * dim, 0.0);
            self.z.resize(at + 8 * dim, f32::NEG_INFINITY);
            let (pa, pz) = (&mut self.a[at..], &mut self.z[at..]);
            for r in 0..4 {
                if w > 0 {
                    let (ra, rz) = ring.row(4 * (w - 1) + r);
                    pa[r * dim..(r + 1) * dim].copy_from_slice(&ra[..dim]);
                    pz[r * dim..(r + 1) * dim].copy_from_slice(&rz[..dim]);
                }
                let (ra, rz) = ring.row(4 * w + r);
                pa[(4 + r) * dim..(5 + r) * dim].copy_from_slice(&ra[dim..]);
                pz[(4 + r) * dim..(5 + r) * dim].copy_from_slice(&rz[dim..]);
            }
        } else {
            // The ring holds exactly this window's `ratio` rows, slot = position mod ratio.
            let (ra, rz) = ring.window();
            self.a.extend_from_slice(&ra);
            self.z.extend_from_slice(&rz);
        }
        self.windows += 1;
        Some(w)
    }

    /// The windows' rows — a and z, [windows · rows, dim] each — the windows, and the rows
    /// each pools: what [`Backend::softmax_pool_rows`] (or its device form) takes.
    pub fn into_parts(self) -> (Vec<f32>, Vec<f32>, usize, usize) {
        let rows = self.rows();
        (self.a, self.z, self.windows, rows)
    }

    /// The pooled entries (`dim` wide, before norm and RoPE) of the windows in the order they
    /// completed, in one call.
    pub fn finish(self, backend: &dyn Backend) -> Vec<f32> {
        let mut out = vec![0f32; self.windows * self.dim];
        if self.windows > 0 {
            let rows = self.rows();
            backend.softmax_pool_rows(&self.a, &self.z, self.windows, rows, self.dim, &mut out);
        }
        out
    }
}

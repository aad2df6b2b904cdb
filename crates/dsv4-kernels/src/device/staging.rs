//! Scratch rows for the default row-group ops of [`DeviceOps`] (`grouped_linear` and
//! `scatter_add_groups` over slices whose groups start at unaligned offsets).

use super::{Copy2d, DevBufId, DevSlice, DeviceOps};
use crate::KernelError;

/// Scratch for the default row-group ops: a group's rows as an aligned slice (the rows
/// themselves when they start at an aligned offset, else a copy), buffers allocated on first
/// need for the largest group and freed by [`Staging::free`].
pub(super) struct Staging<'a, D: DeviceOps + ?Sized> {
    dev: &'a D,
    /// Alignment of slice offsets, in words.
    align: usize,
    /// Rows of the largest group.
    most: usize,
    /// (input, output) scratch buffers.
    bufs: [Option<DevBufId>; 2],
}

impl<'a, D: DeviceOps + ?Sized> Staging<'a, D> {
    /// Scratch for groups `starts` (as the row-group ops take them) on `dev`; nothing allocated yet.
    pub(super) fn new(dev: &'a D, starts: &[usize]) -> Self {
        Self {
            dev,
            align: (dev.offset_alignment() / 4).max(1),
            most: starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0),
            bufs: [None, None],
        }
    }

    /// Whether `s` starts at an offset the device's ops accept.
    pub(super) fn aligned(&self, s: DevSlice) -> bool {
        s.off.is_multiple_of(self.align)
    }

    fn buf(&mut self, which: usize, width: usize) -> Result<DevBufId, KernelError> {
        if let Some(b) = self.bufs[which] {
            return Ok(b);
        }
        let b = self.dev.alloc(self.most * width)?;
        self.bufs[which] = Some(b);
        Ok(b)
    }

    /// Rows `first .. first + n` of `src` (rows of `width`) as an aligned slice.
    pub(super) fn rows(
        &mut self,
        src: DevSlice,
        first: usize,
        n: usize,
        width: usize,
        which: usize,
    ) -> Result<DevSlice, KernelError> {
        let rows = src.sub(first * width, n * width);
        if self.aligned(rows) {
            return Ok(rows);
        }
        let tmp = DevSlice::whole(self.buf(which, width)?, n * width);
        let shape = Copy2d {
            src_col: first * width,
            ..Copy2d::contiguous(n * width)
        };
        self.dev.copy2d(src, tmp, shape)?;
        Ok(tmp)
    }

    /// An aligned output slice of `n` rows of `width` in the second scratch buffer.
    pub(super) fn rows_out(&mut self, n: usize, width: usize) -> Result<DevSlice, KernelError> {
        Ok(DevSlice::whole(self.buf(1, width)?, n * width))
    }

    /// Free the scratch buffers allocated so far.
    pub(super) fn free(self) {
        for b in self.bufs.into_iter().flatten() {
            self.dev.free(b);
        }
    }
}

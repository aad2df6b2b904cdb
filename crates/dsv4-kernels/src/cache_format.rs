//! Cache row formats as the op set sees them: KV entries (SWA, C4, C128) and index-K rows, each
//! with its spec §4 paged byte layout from `dsv4_core::cache`.

use dsv4_core::cache::{CacheLayoutError, IndexKLayout, KvLayout, SlotBytes};

/// The byte layout of one kind of cache row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowFormat {
    /// SWA / C4 / C128 KV entries.
    Kv(KvLayout),
    /// Indexer key rows of C4 layers.
    IndexK(IndexKLayout),
}

impl RowFormat {
    /// Entries per page.
    pub fn page_entries(&self) -> usize {
        match self {
            RowFormat::Kv(l) => l.page_entries(),
            RowFormat::IndexK(l) => l.page_entries(),
        }
    }

    /// Bytes per page.
    pub fn page_bytes(&self) -> usize {
        match self {
            RowFormat::Kv(l) => l.page_bytes(),
            RowFormat::IndexK(l) => l.page_bytes(),
        }
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        match self {
            RowFormat::Kv(l) => l.head_dim(),
            RowFormat::IndexK(l) => l.dim(),
        }
    }

    /// Logical bytes of one entry (data plus scales).
    pub fn entry_bytes(&self) -> usize {
        match self {
            RowFormat::Kv(l) => l.entry_bytes(),
            RowFormat::IndexK(l) => l.entry_bytes(),
        }
    }

    /// Quantize `values` into `slot` of `page` with the row's exact byte layout (the host codec
    /// every host backend uses for `Backend::cache_store`).
    pub fn write(
        &self,
        page: &mut [u8],
        slot: usize,
        values: &[f32],
    ) -> Result<(), CacheLayoutError> {
        match self {
            RowFormat::Kv(l) => l.write(page, slot, values),
            RowFormat::IndexK(l) => l.write(page, slot, values),
        }
    }

    /// The byte ranges of `slot` in a page (an error when the slot is past the page's entries).
    pub fn slot_bytes(&self, slot: usize) -> Result<SlotBytes, CacheLayoutError> {
        match self {
            RowFormat::Kv(l) => l.slot_bytes(slot),
            RowFormat::IndexK(l) => l.slot_bytes(slot),
        }
    }

    /// The byte ranges of `slot` after the checks the codec makes before it writes or reads a
    /// slot, in its order: the page size, the value count, the slot.
    pub fn checked_slot(
        &self,
        page_len: usize,
        values: usize,
        slot: usize,
    ) -> Result<SlotBytes, CacheLayoutError> {
        if page_len != self.page_bytes() {
            return Err(CacheLayoutError::WrongPageSize {
                expected: self.page_bytes(),
                got: page_len,
            });
        }
        if values != self.width() {
            return Err(CacheLayoutError::WrongValueCount {
                expected: self.width(),
                got: values,
            });
        }
        self.slot_bytes(slot)
    }

    /// The rows of a batched encode of `values` values and slot 0's byte ranges (where an
    /// entry's data and scale bytes lie), after the checks `Backend::cache_encode_rows` makes:
    /// a positive whole number of rows (else [`CacheLayoutError::PartialRow`]), then slot 0.
    pub fn checked_encode(&self, values: usize) -> Result<(usize, SlotBytes), CacheLayoutError> {
        let width = self.width();
        if width == 0 || !values.is_multiple_of(width) {
            return Err(CacheLayoutError::PartialRow { width, got: values });
        }
        Ok((values / width, self.slot_bytes(0)?))
    }

    /// The byte ranges of each row of a batched load (row r is slot `rows[r].1` of page
    /// `pages[rows[r].0]`, into an output of `out_len` values), after the checks the per-row
    /// loop of `Backend::cache_load_rows` makes, in its order: the output length, then per row
    /// the page, then [`RowFormat::checked_slot`]. No row is visited when the width is 0.
    pub fn checked_rows(
        &self,
        pages: &[&[u8]],
        rows: &[(usize, usize)],
        out_len: usize,
    ) -> Result<Vec<SlotBytes>, CacheLayoutError> {
        let width = self.width();
        if out_len != rows.len() * width {
            return Err(CacheLayoutError::WrongValueCount {
                expected: rows.len() * width,
                got: out_len,
            });
        }
        if width == 0 {
            return Ok(Vec::new());
        }
        rows.iter()
            .enumerate()
            .map(|(r, &(page, slot))| {
                let bytes = pages.get(page).ok_or(CacheLayoutError::PageOutOfRange {
                    row: r,
                    page,
                    pages: pages.len(),
                })?;
                self.checked_slot(bytes.len(), width, slot)
            })
            .collect()
    }

    /// Copy one entry's bytes (its data bytes, then its scale bytes, as
    /// `Backend::cache_encode_rows` returns them) into `slot` of `page`; only that slot's bytes
    /// change. Errors as [`RowFormat::write`]'s: the page size, then the slot.
    pub fn put_entry(
        &self,
        page: &mut [u8],
        slot: usize,
        entry: &[u8],
    ) -> Result<(), CacheLayoutError> {
        if page.len() != self.page_bytes() {
            return Err(CacheLayoutError::WrongPageSize {
                expected: self.page_bytes(),
                got: page.len(),
            });
        }
        let at = self.slot_bytes(slot)?;
        let (data, scale) = entry.split_at(at.data.len().min(entry.len()));
        if data.len() != at.data.len() || scale.len() != at.scale.len() {
            return Err(CacheLayoutError::WrongEntrySize {
                expected: self.entry_bytes(),
                got: entry.len(),
            });
        }
        page[at.data].copy_from_slice(data);
        page[at.scale].copy_from_slice(scale);
        Ok(())
    }

    /// Copy the bytes of slot `from_slot` of page `from` into slot `to_slot` of page `to` (its
    /// data and scale bytes; nothing else of `to` changes), so that the slot decodes to the same
    /// values. Errors: a page of the wrong size (`from` first), then a slot past the page.
    pub fn copy_entry(
        &self,
        from: &[u8],
        from_slot: usize,
        to: &mut [u8],
        to_slot: usize,
    ) -> Result<(), CacheLayoutError> {
        for len in [from.len(), to.len()] {
            if len != self.page_bytes() {
                return Err(CacheLayoutError::WrongPageSize {
                    expected: self.page_bytes(),
                    got: len,
                });
            }
        }
        let (src, dst) = (self.slot_bytes(from_slot)?, self.slot_bytes(to_slot)?);
        to[dst.data].copy_from_slice(&from[src.data]);
        to[dst.scale].copy_from_slice(&from[src.scale]);
        Ok(())
    }

    /// Dequantize `slot` of `page` exactly into `out` (the host codec behind `Backend::cache_load`).
    pub fn read(&self, page: &[u8], slot: usize, out: &mut [f32]) -> Result<(), CacheLayoutError> {
        match self {
            RowFormat::Kv(l) => l.read(page, slot, out),
            RowFormat::IndexK(l) => l.read(page, slot, out),
        }
    }
}

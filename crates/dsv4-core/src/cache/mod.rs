//! Byte layouts of the KV caches (SWA, C4, C128) and of the indexer's key cache (spec §4, §6),
//! as pure codecs that every backend shares: a layout knows its page size, where each slot's
//! bytes live, how an entry is quantized into them and how it is read back.
//!
//! Pages are plain byte slices owned by the caller (a pool, a test, a device buffer mirror).

mod error;
mod index_k;
mod kv;

#[cfg(test)]
mod index_k_tests;
#[cfg(test)]
mod kv_tests;

use std::ops::Range;

pub mod checksum;

pub use checksum::page_checksum;
pub use error::CacheLayoutError;
pub use index_k::{INDEX_K_PAGE_ENTRIES, IndexKLayout, round_index_vector};
pub use kv::KvLayout;

/// Where one slot's bytes live inside its page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotBytes {
    /// The slot's data row.
    pub data: Range<usize>,
    /// The slot's scale row (empty for formats without scale rows).
    pub scale: Range<usize>,
}

impl SlotBytes {
    /// Whether byte offset `byte` of the page belongs to this slot.
    pub fn contains(&self, byte: usize) -> bool {
        self.data.contains(&byte) || self.scale.contains(&byte)
    }
}

/// The sizes every paged layout shares: rows of data for all slots, then rows of scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PageGeometry {
    page_entries: usize,
    data_row: usize,
    scale_row: usize,
    page_bytes: usize,
}

impl PageGeometry {
    /// Data rows, then scale rows, then padding up to a multiple of `pad_to` (1: none).
    fn new(
        page_entries: usize,
        data_row: usize,
        scale_row: usize,
        pad_to: usize,
    ) -> Result<Self, CacheLayoutError> {
        if page_entries == 0 {
            return Err(CacheLayoutError::ZeroPageEntries);
        }
        let too_large = CacheLayoutError::TooLarge { page_entries };
        let used = data_row
            .checked_add(scale_row)
            .and_then(|e| e.checked_mul(page_entries))
            .ok_or(too_large.clone())?;
        let pad_to = pad_to.max(1);
        let page_bytes = used.checked_next_multiple_of(pad_to).ok_or(too_large)?;
        Ok(Self {
            page_entries,
            data_row,
            scale_row,
            page_bytes,
        })
    }

    fn slot_bytes(&self, slot: usize) -> Result<SlotBytes, CacheLayoutError> {
        if slot >= self.page_entries {
            return Err(CacheLayoutError::SlotOutOfRange {
                slot,
                page_entries: self.page_entries,
            });
        }
        let data = slot * self.data_row;
        let scale = self.page_entries * self.data_row + slot * self.scale_row;
        Ok(SlotBytes {
            data: data..data + self.data_row,
            scale: scale..scale + self.scale_row,
        })
    }

    /// Checks the page and value lengths and returns the slot's byte ranges.
    fn access(
        &self,
        page_len: usize,
        slot: usize,
        values_expected: usize,
        values_len: usize,
    ) -> Result<SlotBytes, CacheLayoutError> {
        if page_len != self.page_bytes {
            return Err(CacheLayoutError::WrongPageSize {
                expected: self.page_bytes,
                got: page_len,
            });
        }
        if values_len != values_expected {
            return Err(CacheLayoutError::WrongValueCount {
                expected: values_expected,
                got: values_len,
            });
        }
        self.slot_bytes(slot)
    }
}

/// Splits a page into the slot's data row and scale row (data rows precede scale rows).
fn split_rows<'a>(page: &'a mut [u8], at: &SlotBytes) -> (&'a mut [u8], &'a mut [u8]) {
    let (head, tail) = page.split_at_mut(at.scale.start);
    (&mut head[at.data.clone()], &mut tail[..at.scale.len()])
}

/// Writes bf16 values little-endian.
fn write_bf16(dst: &mut [u8], values: &[f32]) {
    for (d, &v) in dst.chunks_exact_mut(2).zip(values) {
        d.copy_from_slice(&crate::codec::f32_to_bf16(v).to_le_bytes());
    }
}

/// Reads little-endian bf16 values.
fn read_bf16(src: &[u8], out: &mut [f32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = crate::codec::bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

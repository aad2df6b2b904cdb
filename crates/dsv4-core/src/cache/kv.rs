//! The SWA / C4 / C128 KV entry layout (spec §4, §6): bf16, or fp8 pages of
//! [P data rows: nd e4m3 bytes + rd bf16 values][P scale rows: nd/64 ue8m0 bytes + 1 pad byte],
//! padded to a multiple of nd + 2·rd bytes.

use super::{CacheLayoutError, PageGeometry, SlotBytes, read_bf16, split_rows, write_bf16};
use crate::KvCacheDtype;
use crate::quant::{KV_NOPE_BLOCK, dequantize_e4m3_pow2, quantize_e4m3_pow2};

/// The byte layout of one KV cache page: format, head split and entries per page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    dtype: KvCacheDtype,
    nd: usize,
    rd: usize,
    geometry: PageGeometry,
}

impl KvLayout {
    /// A layout for entries of `nd` "nope" values followed by `rd` rope values, `page_entries`
    /// entries per page. fp8 needs nd to be a multiple of 64.
    pub fn new(
        dtype: KvCacheDtype,
        nd: usize,
        rd: usize,
        page_entries: usize,
    ) -> Result<Self, CacheLayoutError> {
        let hd = nd
            .checked_add(rd)
            .ok_or(CacheLayoutError::TooLarge { page_entries })?;
        if hd == 0 {
            return Err(CacheLayoutError::EmptyEntry);
        }
        let too_large = CacheLayoutError::TooLarge { page_entries };
        let geometry = match dtype {
            KvCacheDtype::Bf16 => {
                let row = hd.checked_mul(2).ok_or(too_large)?;
                PageGeometry::new(page_entries, row, 0, 1)?
            }
            KvCacheDtype::Fp8 => {
                if !nd.is_multiple_of(KV_NOPE_BLOCK) {
                    return Err(CacheLayoutError::NopeNotMultipleOf64 { nd });
                }
                let row = rd
                    .checked_mul(2)
                    .and_then(|r| r.checked_add(nd))
                    .ok_or(too_large)?;
                PageGeometry::new(page_entries, row, nd / KV_NOPE_BLOCK + 1, row)?
            }
        };
        Ok(Self {
            dtype,
            nd,
            rd,
            geometry,
        })
    }

    /// A layout from config sizes: `head_dim` values of which the last `rope_dim` are rope.
    pub fn from_head_dims(
        dtype: KvCacheDtype,
        head_dim: usize,
        rope_dim: usize,
        page_entries: usize,
    ) -> Result<Self, CacheLayoutError> {
        let nd = head_dim
            .checked_sub(rope_dim)
            .ok_or(CacheLayoutError::RopeExceedsHead { head_dim, rope_dim })?;
        Self::new(dtype, nd, rope_dim, page_entries)
    }

    /// The storage format.
    pub fn dtype(&self) -> KvCacheDtype {
        self.dtype
    }

    /// Width of the "nope" part (stored e4m3 in fp8).
    pub fn nd(&self) -> usize {
        self.nd
    }

    /// Width of the rope part (stored bf16 in both formats).
    pub fn rd(&self) -> usize {
        self.rd
    }

    /// Values per entry: nd + rd.
    pub fn head_dim(&self) -> usize {
        self.nd + self.rd
    }

    /// Entries per page.
    pub fn page_entries(&self) -> usize {
        self.geometry.page_entries
    }

    /// Logical bytes per entry: 2·hd (bf16) or nd + 2·rd + nd/64 + 1 (fp8; 584 at hd 512).
    pub fn entry_bytes(&self) -> usize {
        self.geometry.data_row + self.geometry.scale_row
    }

    /// Bytes of one entry's data row.
    pub fn data_row_bytes(&self) -> usize {
        self.geometry.data_row
    }

    /// Bytes of one entry's scale row (0 for bf16).
    pub fn scale_row_bytes(&self) -> usize {
        self.geometry.scale_row
    }

    /// Bytes per page, padding included.
    pub fn page_bytes(&self) -> usize {
        self.geometry.page_bytes
    }

    /// Where slot `slot`'s bytes live inside a page.
    pub fn slot_bytes(&self, slot: usize) -> Result<SlotBytes, CacheLayoutError> {
        self.geometry.slot_bytes(slot)
    }

    /// Quantizes one entry (hd values) into slot `slot` of `page`; only that slot's bytes change.
    pub fn write(
        &self,
        page: &mut [u8],
        slot: usize,
        values: &[f32],
    ) -> Result<(), CacheLayoutError> {
        let at = self
            .geometry
            .access(page.len(), slot, self.head_dim(), values.len())?;
        let (data, scales) = split_rows(page, &at);
        match self.dtype {
            KvCacheDtype::Bf16 => write_bf16(data, values),
            KvCacheDtype::Fp8 => {
                let (nope, rope) = values.split_at(self.nd);
                let (codes, rope_bytes) = data.split_at_mut(self.nd);
                for ((block, out), scale) in nope
                    .chunks(KV_NOPE_BLOCK)
                    .zip(codes.chunks_mut(KV_NOPE_BLOCK))
                    .zip(scales.iter_mut())
                {
                    *scale = quantize_e4m3_pow2(block, out);
                }
                scales[self.nd / KV_NOPE_BLOCK] = 0;
                write_bf16(rope_bytes, rope);
            }
        }
        Ok(())
    }

    /// Reads slot `slot` of `page` back into `out` (hd values), dequantized exactly.
    pub fn read(&self, page: &[u8], slot: usize, out: &mut [f32]) -> Result<(), CacheLayoutError> {
        let at = self
            .geometry
            .access(page.len(), slot, self.head_dim(), out.len())?;
        let data = &page[at.data];
        match self.dtype {
            KvCacheDtype::Bf16 => read_bf16(data, out),
            KvCacheDtype::Fp8 => {
                let scales = &page[at.scale];
                let (nope, rope) = out.split_at_mut(self.nd);
                let (codes, rope_bytes) = data.split_at(self.nd);
                for ((out, block), &scale) in nope
                    .chunks_mut(KV_NOPE_BLOCK)
                    .zip(codes.chunks(KV_NOPE_BLOCK))
                    .zip(scales)
                {
                    dequantize_e4m3_pow2(block, scale, out);
                }
                read_bf16(rope_bytes, rope);
            }
        }
        Ok(())
    }

    /// What a reader gets back after `values` is written: quantize, store, dequantize.
    pub fn round_trip(&self, values: &[f32]) -> Result<Vec<f32>, CacheLayoutError> {
        // Entries are quantized independently, so a one-entry page gives the same values.
        let one = Self::new(self.dtype, self.nd, self.rd, 1)?;
        let mut page = vec![0u8; one.page_bytes()];
        one.write(&mut page, 0, values)?;
        let mut out = vec![0.0; values.len()];
        one.read(&page, 0, &mut out)?;
        Ok(out)
    }
}

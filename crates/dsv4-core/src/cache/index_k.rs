//! The indexer key layout of C4 layers (spec §4, §6) and the matching rounding of indexer
//! queries. Pages hold data rows for all entries, then scale rows:
//! - bf16: dim bf16 values per entry, no scale rows;
//! - fp8: dim e4m3 bytes, then one f32 scale (little-endian) per entry, scale = max(amax, 1e-4)/448;
//! - fp4: dim/2 bytes of packed e2m1 (low nibble first), then dim/32 ue8m0 scales per entry.
//!
//! SGLang stores one fp8 scale per 128 values; at index_head_dim 128 (every DSV4 config) that is
//! the one scale per entry of the spec.

use super::{CacheLayoutError, PageGeometry, SlotBytes, read_bf16, split_rows, write_bf16};
use crate::IndexKDtype;
use crate::codec::{
    E2M1_MAX, E4M3_MAX, e2m1_to_f32, e4m3_to_f32, f32_to_e2m1, f32_to_e4m3, round_bf16,
    ue8m0_to_f32,
};
use crate::quant::{
    E2M1_AMAX_FLOOR, E2M1_BLOCK, E4M3_AMAX_FLOOR, block_amax, pow2_f32, pow2_scale_exponent,
};

/// Entries per index-K page (spec §4).
pub const INDEX_K_PAGE_ENTRIES: usize = 64;

/// The ue8m0 code written for an fp4 block that contains NaN: every value reads back as NaN.
const NAN_SCALE: u8 = 255;

/// The byte layout of one index-K cache page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndexKLayout {
    dtype: IndexKDtype,
    dim: usize,
    geometry: PageGeometry,
}

impl IndexKLayout {
    /// A layout for `dim`-wide keys (index_head_dim), `page_entries` per page (64 in DSV4).
    /// fp4 needs dim to be a multiple of 32.
    pub fn new(
        dtype: IndexKDtype,
        dim: usize,
        page_entries: usize,
    ) -> Result<Self, CacheLayoutError> {
        let too_large = CacheLayoutError::TooLarge { page_entries };
        let (data_row, scale_row) = match dtype {
            IndexKDtype::Bf16 | IndexKDtype::Fp8 if dim == 0 => {
                return Err(CacheLayoutError::EmptyEntry);
            }
            IndexKDtype::Bf16 => (dim.checked_mul(2).ok_or(too_large)?, 0),
            IndexKDtype::Fp8 => (dim, 4),
            IndexKDtype::Fp4 => {
                if dim == 0 || !dim.is_multiple_of(E2M1_BLOCK) {
                    return Err(CacheLayoutError::IndexDimNotMultiple {
                        dtype: "fp4",
                        dim,
                        multiple: E2M1_BLOCK,
                    });
                }
                (dim / 2, dim / E2M1_BLOCK)
            }
        };
        Ok(Self {
            dtype,
            dim,
            geometry: PageGeometry::new(page_entries, data_row, scale_row, 1)?,
        })
    }

    /// The storage format.
    pub fn dtype(&self) -> IndexKDtype {
        self.dtype
    }

    /// Values per entry (index_head_dim).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Entries per page.
    pub fn page_entries(&self) -> usize {
        self.geometry.page_entries
    }

    /// Bytes per entry: 2·dim (bf16), dim + 4 (fp8), dim/2 + dim/32 (fp4).
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

    /// Bytes per page (no padding).
    pub fn page_bytes(&self) -> usize {
        self.geometry.page_bytes
    }

    /// Where slot `slot`'s bytes live inside a page.
    pub fn slot_bytes(&self, slot: usize) -> Result<SlotBytes, CacheLayoutError> {
        self.geometry.slot_bytes(slot)
    }

    /// Quantizes one key (dim values) into slot `slot` of `page`; only that slot's bytes change.
    pub fn write(
        &self,
        page: &mut [u8],
        slot: usize,
        values: &[f32],
    ) -> Result<(), CacheLayoutError> {
        let at = self
            .geometry
            .access(page.len(), slot, self.dim, values.len())?;
        let (data, scales) = split_rows(page, &at);
        match self.dtype {
            IndexKDtype::Bf16 => write_bf16(data, values),
            IndexKDtype::Fp8 => {
                let scale = fp8_entry_scale(values);
                for (d, &x) in data.iter_mut().zip(values) {
                    *d = f32_to_e4m3(x / scale);
                }
                scales.copy_from_slice(&scale.to_le_bytes());
            }
            IndexKDtype::Fp4 => {
                let mut codes = [0u8; E2M1_BLOCK];
                for ((block, packed), scale) in values
                    .chunks(E2M1_BLOCK)
                    .zip(data.chunks_mut(E2M1_BLOCK / 2))
                    .zip(scales.iter_mut())
                {
                    *scale = quantize_e2m1_block(block, &mut codes);
                    for (p, pair) in packed.iter_mut().zip(codes.chunks_exact(2)) {
                        *p = pair[0] | (pair[1] << 4);
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads slot `slot` of `page` back into `out` (dim values), dequantized.
    pub fn read(&self, page: &[u8], slot: usize, out: &mut [f32]) -> Result<(), CacheLayoutError> {
        let at = self
            .geometry
            .access(page.len(), slot, self.dim, out.len())?;
        let data = &page[at.data];
        let scales = &page[at.scale];
        match self.dtype {
            IndexKDtype::Bf16 => read_bf16(data, out),
            IndexKDtype::Fp8 => {
                let scale = f32::from_le_bytes([scales[0], scales[1], scales[2], scales[3]]);
                for (o, &c) in out.iter_mut().zip(data) {
                    *o = e4m3_to_f32(c) * scale;
                }
            }
            IndexKDtype::Fp4 => {
                for ((block, packed), &scale) in out
                    .chunks_mut(E2M1_BLOCK)
                    .zip(data.chunks(E2M1_BLOCK / 2))
                    .zip(scales)
                {
                    let s = ue8m0_to_f32(scale);
                    for (pair, &p) in block.chunks_exact_mut(2).zip(packed) {
                        pair[0] = e2m1_to_f32(p & 0xF) * s;
                        pair[1] = e2m1_to_f32(p >> 4) * s;
                    }
                }
            }
        }
        Ok(())
    }

    /// What a reader gets back after `values` is written: quantize, store, dequantize.
    pub fn round_trip(&self, values: &[f32]) -> Result<Vec<f32>, CacheLayoutError> {
        let one = Self::new(self.dtype, self.dim, 1)?;
        let mut page = vec![0u8; one.page_bytes()];
        one.write(&mut page, 0, values)?;
        let mut out = vec![0.0; values.len()];
        one.read(&page, 0, &mut out)?;
        Ok(out)
    }
}

/// The fp8 per-entry (or per query vector) scale: max(amax, 1e-4) / 448 in f32.
fn fp8_entry_scale(values: &[f32]) -> f32 {
    block_amax(values).max(E4M3_AMAX_FLOOR) / E4M3_MAX
}

/// Quantizes up to 32 values to e2m1 codes with a power-of-two scale and returns its ue8m0 code
/// (255, NaN, when the block holds a NaN, which e2m1 cannot store). Unused codes are zeroed.
fn quantize_e2m1_block(values: &[f32], codes: &mut [u8; E2M1_BLOCK]) -> u8 {
    codes.fill(0);
    if values.iter().any(|x| x.is_nan()) {
        return NAN_SCALE;
    }
    let e = pow2_scale_exponent(block_amax(values), E2M1_AMAX_FLOOR, E2M1_MAX);
    let scale = pow2_f32(e);
    for (c, &x) in codes.iter_mut().zip(values) {
        *c = f32_to_e2m1(x / scale);
    }
    (e + 127) as u8
}

/// Applies the index-K rounding of `dtype` to a vector and returns the dequantized values:
/// bf16 per value; fp8 with one scale for the whole vector (an indexer query gets one per
/// (token, head)); fp4 per block of 32 (a shorter last block is its own block). For a key of
/// index_head_dim values this equals [`IndexKLayout::round_trip`].
pub fn round_index_vector(dtype: IndexKDtype, values: &[f32]) -> Vec<f32> {
    match dtype {
        IndexKDtype::Bf16 => values.iter().map(|&x| round_bf16(x)).collect(),
        IndexKDtype::Fp8 => {
            let scale = fp8_entry_scale(values);
            values
                .iter()
                .map(|&x| e4m3_to_f32(f32_to_e4m3(x / scale)) * scale)
                .collect()
        }
        IndexKDtype::Fp4 => {
            let mut codes = [0u8; E2M1_BLOCK];
            let mut out = Vec::with_capacity(values.len());
            for block in values.chunks(E2M1_BLOCK) {
                let s = ue8m0_to_f32(quantize_e2m1_block(block, &mut codes));
                out.extend(codes[..block.len()].iter().map(|&c| e2m1_to_f32(c) * s));
            }
            out
        }
    }
}

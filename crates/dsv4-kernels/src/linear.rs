//! Weights of a linear layer `y = W·x` in their checkpoint format, with exact dequantization.

use crate::KernelError;
use dsv4_core::DType;
use dsv4_core::codec::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, ue8m0_to_f32};
use std::sync::OnceLock;

/// Block size of fp8 weight scales (both dims) and of fp8 activation quantization.
pub const FP8_BLOCK: usize = 128;
/// Elements per ue8m0 scale in MXFP4 weights.
pub const MXFP4_BLOCK: usize = 32;

/// How a weight is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// f32 elements.
    F32,
    /// bf16 elements.
    Bf16,
    /// e4m3 elements with one ue8m0 scale per 128×128 block.
    Fp8Block,
    /// e2m1 pairs packed in bytes (low nibble first) with one ue8m0 scale per 32 elements of a row.
    Mxfp4,
}

impl WeightFormat {
    /// True for the quantized formats whose inputs `act_quant = fp8` quantizes.
    pub fn is_low_precision(self) -> bool {
        matches!(self, WeightFormat::Fp8Block | WeightFormat::Mxfp4)
    }
}

/// A linear layer's weight `W: [out, in]` as stored, plus what is derived from it once, on first
/// use: the exact f32 form and the fp8 NaN-block flags. Edit `data` or `scale` (tests that plant
/// NaN codes do) only before the weight's first product; the derived forms are not recomputed.
#[derive(Debug)]
pub struct Linear {
    /// Checkpoint name (without `.weight`), for errors and reports.
    pub name: String,
    /// Output features.
    pub out_dim: usize,
    /// Input features.
    pub in_dim: usize,
    /// Storage format.
    pub format: WeightFormat,
    /// Element bytes as in the checkpoint.
    pub data: Vec<u8>,
    /// Scale bytes (ue8m0) for Fp8Block and Mxfp4; empty otherwise.
    pub scale: Vec<u8>,
    dense: OnceLock<Vec<f32>>,
    nan_blocks: OnceLock<Vec<bool>>,
}

impl Linear {
    /// A weight from checkpoint bytes; sizes are checked against the format.
    pub fn new(
        name: impl Into<String>,
        out_dim: usize,
        in_dim: usize,
        format: WeightFormat,
        data: Vec<u8>,
        scale: Vec<u8>,
    ) -> Result<Self, KernelError> {
        let name = name.into();
        let (want_data, want_scale) = match format {
            WeightFormat::F32 => (out_dim * in_dim * 4, 0),
            WeightFormat::Bf16 => (out_dim * in_dim * 2, 0),
            WeightFormat::Fp8Block => (
                out_dim * in_dim,
                out_dim.div_ceil(FP8_BLOCK) * in_dim.div_ceil(FP8_BLOCK),
            ),
            WeightFormat::Mxfp4 => {
                if !in_dim.is_multiple_of(MXFP4_BLOCK) {
                    return Err(KernelError::BadWeight {
                        name,
                        what: format!("MXFP4 input width {in_dim} is not a multiple of 32"),
                    });
                }
                (out_dim * in_dim / 2, out_dim * in_dim / MXFP4_BLOCK)
            }
        };
        if data.len() != want_data || scale.len() != want_scale {
            return Err(KernelError::BadWeight {
                name,
                what: format!(
                    "{format:?} [{out_dim}, {in_dim}] needs {want_data} data and {want_scale} scale bytes, got {} and {}",
                    data.len(),
                    scale.len()
                ),
            });
        }
        Ok(Self {
            name,
            out_dim,
            in_dim,
            format,
            data,
            scale,
            dense: OnceLock::new(),
            nan_blocks: OnceLock::new(),
        })
    }

    /// A dense f32 weight (tests, generated inputs).
    pub fn from_f32(
        name: impl Into<String>,
        out_dim: usize,
        in_dim: usize,
        w: &[f32],
    ) -> Result<Self, KernelError> {
        let data = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::new(name, out_dim, in_dim, WeightFormat::F32, data, Vec::new())
    }

    /// The format a checkpoint dtype pair stands for: (weight dtype, has scale).
    pub fn format_of(weight: DType, scale: Option<DType>) -> Option<WeightFormat> {
        match (weight, scale) {
            (DType::F32, None) => Some(WeightFormat::F32),
            (DType::BF16, None) => Some(WeightFormat::Bf16),
            (DType::F8E4M3, Some(DType::F8E8M0)) => Some(WeightFormat::Fp8Block),
            (DType::I8, Some(DType::F8E8M0)) => Some(WeightFormat::Mxfp4),
            _ => None,
        }
    }

    /// Rows `start..start+count` as their own weight (the scale blocks must align: fp8 row
    /// blocks of 128). Used to split `wo_a` into its output groups.
    pub fn rows(&self, start: usize, count: usize) -> Result<Linear, KernelError> {
        let bad = |what: String| KernelError::BadWeight {
            name: self.name.clone(),
            what,
        };
        if start + count > self.out_dim {
            return Err(bad(format!(
                "rows {start}..{} beyond {}",
                start + count,
                self.out_dim
            )));
        }
        let name = format!("{}[{start}..{}]", self.name, start + count);
        let (data, scale) = match self.format {
            WeightFormat::F32 | WeightFormat::Bf16 => {
                let es = if self.format == WeightFormat::F32 {
                    4
                } else {
                    2
                };
                let row = self.in_dim * es;
                (
                    self.data[start * row..(start + count) * row].to_vec(),
                    Vec::new(),
                )
            }
            WeightFormat::Fp8Block => {
                if !start.is_multiple_of(FP8_BLOCK) || !count.is_multiple_of(FP8_BLOCK) {
                    return Err(bad(format!(
                        "row split {start}+{count} is not aligned to 128-row scale blocks"
                    )));
                }
                let sc = self.in_dim.div_ceil(FP8_BLOCK);
                (
                    self.data[start * self.in_dim..(start + count) * self.in_dim].to_vec(),
                    self.scale[start / FP8_BLOCK * sc..(start + count) / FP8_BLOCK * sc].to_vec(),
                )
            }
            WeightFormat::Mxfp4 => {
                let row = self.in_dim / 2;
                let srow = self.in_dim / MXFP4_BLOCK;
                (
                    self.data[start * row..(start + count) * row].to_vec(),
                    self.scale[start * srow..(start + count) * srow].to_vec(),
                )
            }
        };
        Linear::new(name, count, self.in_dim, self.format, data, scale)
    }

    /// The exact f32 value of every element, row-major [out, in] (computed once).
    pub fn dequantized(&self) -> &[f32] {
        self.dense.get_or_init(|| self.dequantize())
    }

    /// For an Fp8Block weight, which 128×128 scale blocks hold an e4m3 NaN code, row-major
    /// over the scale grid (computed once, like [`Self::dequantized`]); empty otherwise.
    pub fn fp8_nan_blocks(&self) -> &[bool] {
        self.nan_blocks.get_or_init(|| match self.format {
            WeightFormat::Fp8Block => e4m3_nan_blocks(&self.data, self.out_dim, self.in_dim),
            _ => Vec::new(),
        })
    }

    /// Bytes of weight data and scales read by one full pass over this weight.
    pub fn stored_bytes(&self) -> usize {
        self.data.len() + self.scale.len()
    }

    fn dequantize(&self) -> Vec<f32> {
        let (o, i) = (self.out_dim, self.in_dim);
        match self.format {
            WeightFormat::F32 => self
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            WeightFormat::Bf16 => self
                .data
                .chunks_exact(2)
                .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            WeightFormat::Fp8Block => {
                let sc = i.div_ceil(FP8_BLOCK);
                let mut w = Vec::with_capacity(o * i);
                for r in 0..o {
                    for c in 0..i {
                        let s = ue8m0_to_f32(self.scale[(r / FP8_BLOCK) * sc + c / FP8_BLOCK]);
                        w.push(e4m3_to_f32(self.data[r * i + c]) * s);
                    }
                }
                w
            }
            WeightFormat::Mxfp4 => {
                let mut w = Vec::with_capacity(o * i);
                for r in 0..o {
                    for c in 0..i {
                        let byte = self.data[r * (i / 2) + c / 2];
                        let code = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
                        let s = ue8m0_to_f32(self.scale[r * (i / MXFP4_BLOCK) + c / MXFP4_BLOCK]);
                        w.push(e2m1_to_f32(code) * s);
                    }
                }
                w
            }
        }
    }
}

/// Which 128×128 blocks of e4m3 elements `[out_dim, in_dim]` hold a NaN code (0x7F or 0xFF),
/// row-major over the `[⌈out/128⌉, ⌈in/128⌉]` scale grid.
pub fn e4m3_nan_blocks(data: &[u8], out_dim: usize, in_dim: usize) -> Vec<bool> {
    let cols = in_dim.div_ceil(FP8_BLOCK);
    let mut nan = vec![false; out_dim.div_ceil(FP8_BLOCK) * cols];
    if in_dim == 0 {
        return nan;
    }
    for (r, row) in data.chunks_exact(in_dim).take(out_dim).enumerate() {
        for (c, seg) in row.chunks(FP8_BLOCK).enumerate() {
            // No early exit, so the fold vectorizes.
            let hit = seg.iter().fold(false, |a, &b| a | (b & 0x7F == 0x7F));
            nan[(r / FP8_BLOCK) * cols + c] |= hit;
        }
    }
    nan
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_core::codec::{f32_to_e2m1, f32_to_e4m3, pack_e2m1};

    #[test]
    fn fp8_block_dequantization_uses_the_block_scale() {
        // 130 × 2: two row blocks; block 0 scale 2^1, block 1 scale 2^-2.
        let (o, i) = (130, 2);
        let data: Vec<u8> = (0..o * i).map(|_| f32_to_e4m3(1.5)).collect();
        let scale = vec![128, 125];
        let l = Linear::new("w", o, i, WeightFormat::Fp8Block, data, scale).unwrap();
        let w = l.dequantized();
        assert_eq!(w[0], 3.0);
        assert_eq!(w[127 * 2 + 1], 3.0);
        assert_eq!(w[128 * 2], 0.375);
    }

    #[test]
    fn mxfp4_low_nibble_first_and_row_scales() {
        let codes: Vec<u8> = [0.5f32, -6.0]
            .iter()
            .cycle()
            .take(64)
            .map(|&v| f32_to_e2m1(v))
            .collect();
        let data = pack_e2m1(&codes);
        let l = Linear::new("e", 1, 64, WeightFormat::Mxfp4, data, vec![127, 128]).unwrap();
        let w = l.dequantized();
        assert_eq!(&w[..2], &[0.5, -6.0]);
        assert_eq!(&w[32..34], &[1.0, -12.0]);
    }

    #[test]
    fn wrong_sizes_and_misaligned_splits_are_errors() {
        let e = Linear::new("x", 2, 2, WeightFormat::Bf16, vec![0; 7], vec![]).unwrap_err();
        assert!(e.to_string().contains("`x`"), "{e}");
        let l = Linear::new(
            "f",
            256,
            128,
            WeightFormat::Fp8Block,
            vec![0; 256 * 128],
            vec![127; 2],
        )
        .unwrap();
        assert!(l.rows(128, 128).is_ok());
        assert!(l.rows(64, 128).is_err());
    }

    #[test]
    fn nan_blocks_name_the_scale_blocks_holding_nan_codes() {
        // 200 × 300: a 2 × 3 scale grid, the last row and column blocks partial.
        let (o, i) = (200, 300);
        let mut data = vec![0x38u8; o * i];
        data[5 * i + 130] = 0x7F; // block (0, 1)
        data[199 * i + 299] = 0xFF; // block (1, 2), the last element
        data[150 * i + 10] = 0x7E; // the largest finite code: not NaN
        let l = Linear::new("f", o, i, WeightFormat::Fp8Block, data, vec![127; 6]).unwrap();
        assert_eq!(
            l.fp8_nan_blocks(),
            &[false, true, false, false, false, true]
        );
        let m = Linear::new(
            "m",
            1,
            64,
            WeightFormat::Mxfp4,
            vec![0xFF; 32],
            vec![127; 2],
        );
        assert!(m.unwrap().fp8_nan_blocks().is_empty());
    }
}

/// Identity of a [`Linear`] for a device backend's resident-weight cache: where its bytes live,
/// its shape and format, and a sample of its contents (so a new weight allocated where a dropped
/// one lived is not mistaken for it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WeightKey {
    data_ptr: usize,
    scale_ptr: usize,
    shape: (usize, usize, usize, usize),
    format: WeightFormat,
    sample: u64,
}

impl WeightKey {
    /// The key of `w`.
    pub fn of(w: &Linear) -> Self {
        // FNV-1a over up to 256 evenly spaced bytes of data and of scales.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for bytes in [&w.data, &w.scale] {
            let step = (bytes.len() / 256).max(1);
            for b in bytes.iter().step_by(step) {
                h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        Self {
            data_ptr: w.data.as_ptr() as usize,
            scale_ptr: w.scale.as_ptr() as usize,
            shape: (w.out_dim, w.in_dim, w.data.len(), w.scale.len()),
            format: w.format,
            sample: h,
        }
    }
}

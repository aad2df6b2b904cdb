//! The host tensor: a shape, a dtype and contiguous little-endian bytes.

use crate::codec;
use crate::{CoreError, DType};

/// A contiguous, row-major, little-endian host tensor of any [`DType`].
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    data: Vec<u8>,
}

impl Tensor {
    /// A tensor from raw bytes; the length must equal numel × dtype size.
    pub fn new(shape: Vec<usize>, dtype: DType, data: Vec<u8>) -> Result<Self, CoreError> {
        let expected = shape.iter().product::<usize>() * dtype.size();
        if expected != data.len() {
            return Err(CoreError::SizeMismatch {
                shape,
                dtype,
                expected,
                got: data.len(),
            });
        }
        Ok(Self { shape, dtype, data })
    }

    /// An all-zero-bytes tensor.
    pub fn zeros(shape: Vec<usize>, dtype: DType) -> Self {
        let n = shape.iter().product::<usize>() * dtype.size();
        Self {
            shape,
            dtype,
            data: vec![0; n],
        }
    }

    /// An F32 tensor from values (shape must match the value count).
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Result<Self, CoreError> {
        Self::new(
            shape,
            DType::F32,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// A BF16 tensor from f32 values, each rounded to nearest even.
    pub fn from_f32_as_bf16(shape: Vec<usize>, values: &[f32]) -> Result<Self, CoreError> {
        let data = values
            .iter()
            .flat_map(|v| codec::f32_to_bf16(*v).to_le_bytes())
            .collect();
        Self::new(shape, DType::BF16, data)
    }

    /// An I64 tensor from values.
    pub fn from_i64(shape: Vec<usize>, values: &[i64]) -> Result<Self, CoreError> {
        Self::new(
            shape,
            DType::I64,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The raw little-endian bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Decode a floating-point tensor (F32, F16, BF16, F8_E4M3, F8_E8M0) to f32 values.
    pub fn to_f32(&self) -> Result<Vec<f32>, CoreError> {
        decode_f32(self.dtype, &self.data)
    }

    /// Decode an integer tensor (I8, U8, I32, I64) to i64 values.
    pub fn to_i64(&self) -> Result<Vec<i64>, CoreError> {
        decode_i64(self.dtype, &self.data)
    }
}

/// Decode little-endian bytes of a floating dtype into f32 values (exact for every format).
pub fn decode_f32(dtype: DType, data: &[u8]) -> Result<Vec<f32>, CoreError> {
    Ok(match dtype {
        DType::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::BF16 => data
            .chunks_exact(2)
            .map(|c| codec::bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::F16 => data
            .chunks_exact(2)
            .map(|c| codec::f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::F8E4M3 => data.iter().map(|&b| codec::e4m3_to_f32(b)).collect(),
        DType::F8E8M0 => data.iter().map(|&b| codec::ue8m0_to_f32(b)).collect(),
        other => {
            return Err(CoreError::WrongDType {
                expected: "a floating dtype".into(),
                found: other,
            });
        }
    })
}

/// Decode little-endian bytes of an integer dtype into i64 values.
pub fn decode_i64(dtype: DType, data: &[u8]) -> Result<Vec<i64>, CoreError> {
    Ok(match dtype {
        DType::I64 => data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        DType::I32 => data
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        DType::I8 => data.iter().map(|&b| i64::from(b as i8)).collect(),
        DType::U8 => data.iter().map(|&b| i64::from(b)).collect(),
        other => {
            return Err(CoreError::WrongDType {
                expected: "an integer dtype".into(),
                found: other,
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_is_checked() {
        let err = Tensor::new(vec![2, 3], DType::BF16, vec![0; 11]).unwrap_err();
        assert_eq!(
            err,
            CoreError::SizeMismatch {
                shape: vec![2, 3],
                dtype: DType::BF16,
                expected: 12,
                got: 11
            }
        );
    }

    #[test]
    fn f32_and_bf16_round_trip() {
        let t = Tensor::from_f32(vec![3], &[1.0, -2.5, 3.0e-3]).unwrap();
        assert_eq!(t.to_f32().unwrap(), vec![1.0, -2.5, 3.0e-3]);
        let b = Tensor::from_f32_as_bf16(vec![2], &[1.0, 1.0 + 1.0 / 256.0]).unwrap();
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0).
        assert_eq!(b.to_f32().unwrap(), vec![1.0, 1.0]);
        assert!(t.to_i64().is_err());
        assert_eq!(
            Tensor::from_i64(vec![2], &[-3, 9])
                .unwrap()
                .to_i64()
                .unwrap(),
            vec![-3, 9]
        );
    }
}

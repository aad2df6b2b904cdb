//! Element types of checkpoint tensors and caches, with their safetensors names.

use std::fmt;

/// The element type of a [`crate::Tensor`]; names follow safetensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (upper half of an f32).
    BF16,
    /// OCP FP8 e4m3 ("fn": bias 7, max ±448, no infinities).
    F8E4M3,
    /// Unsigned power-of-two scale, value 2^(b−127).
    F8E8M0,
    /// Signed byte (also carries packed e2m1 pairs in MXFP4 weights).
    I8,
    /// Unsigned byte.
    U8,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E8M0,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 | DType::F8E8M0 | DType::I8 | DType::U8 => 1,
            DType::I64 => 8,
        }
    }

    /// The dtype's name in a safetensors header.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E8M0 => "F8_E8M0",
            DType::I8 => "I8",
            DType::U8 => "U8",
            DType::I32 => "I32",
            DType::I64 => "I64",
        }
    }

    /// Parse a safetensors dtype name.
    pub fn from_safetensors_name(name: &str) -> Result<DType, crate::CoreError> {
        DType::ALL
            .into_iter()
            .find(|d| d.safetensors_name() == name)
            .ok_or_else(|| crate::CoreError::UnknownDType(name.to_string()))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for d in DType::ALL {
            assert_eq!(DType::from_safetensors_name(d.safetensors_name()), Ok(d));
        }
        assert!(matches!(
            DType::from_safetensors_name("F8_E5M2"),
            Err(crate::CoreError::UnknownDType(_))
        ));
    }
}

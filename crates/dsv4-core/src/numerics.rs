//! The numerics knobs of spec §5, shared by profiles, kernels and the model.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Storage format of SWA / C4 / C128 KV cache entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// Every value as bf16 (2·hd bytes per entry).
    #[default]
    Bf16,
    /// nope part e4m3 with ue8m0 scales per 64, rope part bf16 (spec §4 page layout).
    Fp8,
}

/// Storage format of indexer keys (and the rounding applied to indexer queries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IndexKDtype {
    /// bf16 keys and queries.
    #[default]
    Bf16,
    /// e4m3 with one f32 scale per entry (per (token, head) for queries).
    Fp8,
    /// e2m1 with a ue8m0 scale per 32 values.
    Fp4,
}

/// Activation quantization in front of fp8/fp4-weight linears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ActQuant {
    /// Activations stay f32.
    #[default]
    None,
    /// Per 1×128 block, power-of-two scale, e4m3.
    Fp8,
}

/// The three numerics knobs together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Numerics {
    /// KV cache storage format.
    pub kv_cache_dtype: KvCacheDtype,
    /// Indexer key/query format.
    pub index_k_dtype: IndexKDtype,
    /// Activation quantization.
    pub act_quant: ActQuant,
}

impl Numerics {
    /// Every combination of the knobs (2 × 3 × 2 = 12), in a fixed order.
    pub fn all() -> Vec<Numerics> {
        let mut v = Vec::new();
        for kv in [KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
            for ik in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
                for aq in [ActQuant::None, ActQuant::Fp8] {
                    v.push(Numerics {
                        kv_cache_dtype: kv,
                        index_k_dtype: ik,
                        act_quant: aq,
                    });
                }
            }
        }
        v
    }
}

macro_rules! knob_text {
    ($ty:ty, $what:literal, $($variant:ident => $text:literal),+) => {
        impl $ty {
            /// The accepted spellings, for error messages.
            pub const NAMES: &'static [&'static str] = &[$($text),+];
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $(Self::$variant => $text),+ })
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err(format!(
                        "unknown {} `{}` (allowed: {})", $what, other, Self::NAMES.join(", ")
                    )),
                }
            }
        }
    };
}

knob_text!(KvCacheDtype, "kv_cache_dtype", Bf16 => "bf16", Fp8 => "fp8");
knob_text!(IndexKDtype, "index_k_dtype", Bf16 => "bf16", Fp8 => "fp8", Fp4 => "fp4");
knob_text!(ActQuant, "act_quant", None => "none", Fp8 => "fp8");

impl fmt::Display for Numerics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kv={} index_k={} act={}",
            self.kv_cache_dtype, self.index_k_dtype, self.act_quant
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_display_and_errors() {
        assert_eq!("fp4".parse::<IndexKDtype>(), Ok(IndexKDtype::Fp4));
        assert_eq!(KvCacheDtype::Fp8.to_string(), "fp8");
        let e = "int8".parse::<ActQuant>().unwrap_err();
        assert!(e.contains("act_quant") && e.contains("none, fp8"), "{e}");
        assert_eq!(Numerics::all().len(), 12);
    }
}

//! Helpers shared by the integration tests: the published Flash config, independent random
//! checkpoint tensors and a stable hash.
#![allow(dead_code)]

use std::path::PathBuf;

use dsv4_core::codec::f32_to_bf16;
use dsv4_core::{DType, SplitMix64, Tensor};
use dsv4_model::{ModelConfig, TensorSpec, checkpoint_manifest};

/// Path of a file under tests/data.
pub fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The published DeepSeek-V4-Flash config.json.
pub fn flash() -> ModelConfig {
    ModelConfig::from_file(&data_path("flash-config.json")).expect("flash config parses")
}

/// FNV-1a 64 over bytes, continuing from `h`.
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// FNV-1a offset basis.
pub const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// Hash of a tensor list: names, dtypes, shapes and bytes, in order.
pub fn hash_tensors(tensors: &[(String, Tensor)]) -> u64 {
    let mut h = FNV_BASIS;
    for (name, t) in tensors {
        h = fnv1a(h, name.as_bytes());
        h = fnv1a(h, t.dtype().safetensors_name().as_bytes());
        for d in t.shape() {
            h = fnv1a(h, &(*d as u64).to_le_bytes());
        }
        h = fnv1a(h, t.data());
    }
    h
}

/// One tensor of `spec` filled with SplitMix64 bytes valid for its dtype (not via the tiny
/// generator): e4m3 codes without NaN, ue8m0 codes near 127, finite floats, ids below 8.
pub fn random_tensor(spec: &TensorSpec, seed: u64) -> Tensor {
    let mut rng = SplitMix64::for_name(seed, &spec.name);
    let n = spec.numel();
    let data: Vec<u8> = match spec.dtype {
        DType::F32 => (0..n)
            .flat_map(|_| rng.uniform_sym(2.0).to_le_bytes())
            .collect(),
        DType::BF16 => (0..n)
            .flat_map(|_| f32_to_bf16(rng.uniform_sym(2.0)).to_le_bytes())
            .collect(),
        DType::F8E4M3 => (0..n)
            .map(|_| {
                loop {
                    let b = rng.next_u64() as u8;
                    if b & 0x7F != 0x7F {
                        break b;
                    }
                }
            })
            .collect(),
        DType::F8E8M0 => (0..n).map(|_| 120 + rng.below(15) as u8).collect(),
        DType::I8 | DType::U8 => (0..n).map(|_| rng.next_u64() as u8).collect(),
        DType::I64 => (0..n)
            .flat_map(|_| (rng.below(8) as i64).to_le_bytes())
            .collect(),
        other => panic!("manifest has no {other} tensors"),
    };
    Tensor::new(spec.shape.clone(), spec.dtype, data).expect("size matches spec")
}

/// Every manifest tensor of `cfg`, independently random.
pub fn random_checkpoint(cfg: &ModelConfig, seed: u64) -> Vec<(String, Tensor)> {
    checkpoint_manifest(cfg)
        .iter()
        .map(|s| (s.name.clone(), random_tensor(s, seed)))
        .collect()
}

//! The tiny model's weights: every manifest tensor generated from a seed, bit-for-bit the same on
//! every machine (SplitMix64 streams per tensor name, only exactly rounded arithmetic: no
//! ln/exp/trig), scaled so activations stay O(1), and quantized as the real checkpoint is.

use std::path::Path;

use dsv4_core::codec::{
    E2M1_MAX, E4M3_MAX, f32_to_e2m1, f32_to_e4m3, f32_to_ue8m0, pack_e2m1, pow2_ceil_exponent,
};
use dsv4_core::{DType, SplitMix64, Tensor};

use crate::checkpoint::write_checkpoint;
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::manifest::{FP8_BLOCK, MXFP4_BLOCK, TensorSpec, checkpoint_manifest};

/// Generate every manifest tensor of `cfg` (validated first) from `seed`, in manifest order.
pub fn generate_weights(cfg: &ModelConfig, seed: u64) -> Result<Vec<(String, Tensor)>, ModelError> {
    cfg.validate()?;
    let manifest = checkpoint_manifest(cfg);
    let mut out = Vec::with_capacity(manifest.len());
    for spec in &manifest {
        let name = spec.name.as_str();
        let mut rng = SplitMix64::for_name(seed, name);
        let built: Vec<(String, Tensor)> = match spec.dtype {
            // Scales are produced together with their weight.
            DType::F8E8M0 => continue,
            DType::F8E4M3 => fp8_linear(name, &spec.shape, &mut rng)?,
            DType::I8 => mxfp4_linear(name, &spec.shape, &mut rng)?,
            DType::I64 => vec![tid2eid(spec, cfg.n_routed_experts, &mut rng)?],
            DType::BF16 => vec![bf16_tensor(spec, &mut rng)?],
            _ => vec![f32_tensor(spec, cfg.hc_mult, &mut rng)?],
        };
        out.extend(built);
    }
    Ok(out)
}

/// Write the tiny model (embedded config, weights from `seed`) to `dir` as config.json and
/// model.safetensors.
pub fn init_tiny(dir: &Path, seed: u64) -> Result<(), ModelError> {
    init_random(dir, &ModelConfig::tiny(), seed)
}

/// Write a checkpoint of any valid config with weights generated from `seed` (as the tiny
/// model's are) to `dir`: config.json and model.safetensors. A config whose weights would not
/// fit in the memory available now is refused before anything is allocated or written.
pub fn init_random(dir: &Path, cfg: &ModelConfig, seed: u64) -> Result<(), ModelError> {
    cfg.validate()?;
    check_generation_fits(cfg, dsv4_core::sys::mem_available())?;
    let tensors = generate_weights(cfg, seed)?;
    write_checkpoint(dir, cfg, &tensors, None)
}

/// Bytes [`generate_weights`] holds at its peak: every stored tensor, plus the f32 values of
/// the largest matrix while it is quantized (an MXFP4 byte packs two values).
pub fn generation_bytes(cfg: &ModelConfig) -> (u64, u64) {
    let manifest = checkpoint_manifest(cfg);
    let stored = manifest
        .iter()
        .fold(0u64, |a, s| a.saturating_add(s.byte_len() as u64));
    let transient = manifest
        .iter()
        .map(|s| {
            let values = if s.dtype == DType::I8 { 2 } else { 1 };
            (s.numel() as u64).saturating_mul(values * 4)
        })
        .max()
        .unwrap_or(0);
    (stored, stored.saturating_add(transient))
}

/// Refuse a config whose generated weights need more than `available` bytes (unknown: allowed).
fn check_generation_fits(cfg: &ModelConfig, available: Option<u64>) -> Result<(), ModelError> {
    let (stored, peak) = generation_bytes(cfg);
    match available {
        Some(free) if peak > free => {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            Err(ModelError::InvalidArgument {
                what: "config".into(),
                message: format!(
                    "generating its weights needs about {:.1} GiB of memory (the checkpoint \
                     alone is {:.1} GiB) but {:.1} GiB is available; use a smaller config",
                    gib(peak),
                    gib(stored),
                    gib(free)
                ),
            })
        }
        _ => Ok(()),
    }
}

/// Quantize a row-major `[out, in]` matrix to e4m3 codes with one ue8m0 scale per 128×128
/// block (scale 2^ceil(log2(amax/448))); returns (codes, scale codes `[⌈out/128⌉, ⌈in/128⌉]`).
pub fn quantize_fp8_blocks(
    values: &[f32],
    out: usize,
    inp: usize,
) -> Result<(Vec<u8>, Vec<u8>), ModelError> {
    check_len(values, out, inp)?;
    let (rb, cb) = (out.div_ceil(FP8_BLOCK), inp.div_ceil(FP8_BLOCK));
    let mut codes = vec![0u8; out * inp];
    let mut scales = vec![0u8; rb * cb];
    for br in 0..rb {
        for bc in 0..cb {
            let rows = br * FP8_BLOCK..((br + 1) * FP8_BLOCK).min(out);
            let cols = bc * FP8_BLOCK..((bc + 1) * FP8_BLOCK).min(inp);
            let amax = rows
                .clone()
                .flat_map(|r| values[r * inp..][cols.clone()].iter())
                .fold(0f32, |m, v| m.max(v.abs()));
            let (code, inv) = pow2_scale(amax, E4M3_MAX);
            scales[br * cb + bc] = code;
            for r in rows {
                for c in cols.clone() {
                    codes[r * inp + c] = f32_to_e4m3(values[r * inp + c] * inv);
                }
            }
        }
    }
    Ok((codes, scales))
}

/// Quantize a row-major `[out, in]` matrix to MXFP4: e2m1 codes packed two per byte (low
/// nibble first) and one ue8m0 scale per 32 values of a row (2^ceil(log2(amax/6)));
/// returns (packed `[out, in/2]`, scale codes `[out, in/32]`). `in` must be a multiple of 32.
pub fn quantize_mxfp4(
    values: &[f32],
    out: usize,
    inp: usize,
) -> Result<(Vec<u8>, Vec<u8>), ModelError> {
    check_len(values, out, inp)?;
    if !inp.is_multiple_of(MXFP4_BLOCK) {
        return Err(ModelError::InvalidArgument {
            what: "inp".into(),
            message: format!("MXFP4 input width {inp} is not a multiple of {MXFP4_BLOCK}"),
        });
    }
    let mut codes = Vec::with_capacity(out * inp);
    let mut scales = Vec::with_capacity(out * inp / MXFP4_BLOCK);
    for block in values.chunks(MXFP4_BLOCK) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (code, inv) = pow2_scale(amax, E2M1_MAX);
        scales.push(code);
        codes.extend(block.iter().map(|v| f32_to_e2m1(v * inv)));
    }
    Ok((pack_e2m1(&codes), scales))
}

fn check_len(values: &[f32], out: usize, inp: usize) -> Result<(), ModelError> {
    if Some(values.len()) != out.checked_mul(inp) {
        return Err(ModelError::InvalidArgument {
            what: "values".into(),
            message: format!("{} values for a [{out}, {inp}] matrix", values.len()),
        });
    }
    Ok(())
}

/// The ue8m0 code of 2^ceil(log2(amax/max)) and the exact reciprocal of that scale.
/// amax is floored at max·2⁻¹²⁶ (spec §6), so an all-zero block still gets a finite scale.
fn pow2_scale(amax: f32, max: f32) -> (u8, f32) {
    let two_pow_m126 = f64::from_bits(((1023 - 126) as u64) << 52);
    let ratio = f64::from(amax).max(f64::from(max) * two_pow_m126) / f64::from(max);
    let exp = if ratio.is_finite() {
        pow2_ceil_exponent(ratio).clamp(-126, 126)
    } else {
        126
    };
    let code = f32_to_ue8m0(exp).unwrap_or(127);
    // 2^-exp built from its bits: exact, and normal for exp in [-126, 126].
    (code, f32::from_bits(((127 - exp) as u32) << 23))
}

/// Uniform values with standard deviation `std` (uniform on ±std·√3).
fn uniform(rng: &mut SplitMix64, n: usize, std: f64) -> Vec<f32> {
    let a = (std * 3f64.sqrt()) as f32;
    (0..n).map(|_| rng.uniform_sym(a)).collect()
}

fn tensor(name: &str, shape: &[usize], dtype: DType, data: Vec<u8>) -> Result<Tensor, ModelError> {
    Tensor::new(shape.to_vec(), dtype, data).map_err(|source| ModelError::Tensor {
        name: name.to_string(),
        source,
    })
}

/// Name of the scale tensor that goes with weight `name` (`X.weight` → `X.scale`).
fn scale_name(name: &str) -> String {
    format!("{}.scale", name.strip_suffix(".weight").unwrap_or(name))
}

fn fp8_linear(
    name: &str,
    shape: &[usize],
    rng: &mut SplitMix64,
) -> Result<Vec<(String, Tensor)>, ModelError> {
    let (o, i) = (shape[0], shape[1]);
    let values = uniform(rng, o * i, 1.0 / (i as f64).sqrt());
    let (codes, scales) = quantize_fp8_blocks(&values, o, i)?;
    let scale_shape = [o.div_ceil(FP8_BLOCK), i.div_ceil(FP8_BLOCK)];
    Ok(vec![
        (name.to_string(), tensor(name, shape, DType::F8E4M3, codes)?),
        (
            scale_name(name),
            tensor(name, &scale_shape, DType::F8E8M0, scales)?,
        ),
    ])
}

fn mxfp4_linear(
    name: &str,
    shape: &[usize],
    rng: &mut SplitMix64,
) -> Result<Vec<(String, Tensor)>, ModelError> {
    let (o, i) = (shape[0], shape[1] * 2);
    let values = uniform(rng, o * i, 1.0 / (i as f64).sqrt());
    let (packed, scales) = quantize_mxfp4(&values, o, i)?;
    Ok(vec![
        (name.to_string(), tensor(name, shape, DType::I8, packed)?),
        (
            scale_name(name),
            tensor(name, &[o, i / MXFP4_BLOCK], DType::F8E8M0, scales)?,
        ),
    ])
}

/// `[V, top_k]` distinct expert ids per row (partial Fisher–Yates).
fn tid2eid(
    spec: &TensorSpec,
    experts: usize,
    rng: &mut SplitMix64,
) -> Result<(String, Tensor), ModelError> {
    let (rows, k) = (spec.shape[0], spec.shape[1]);
    let mut ids = Vec::with_capacity(rows * k);
    let mut perm: Vec<i64> = (0..experts as i64).collect();
    for _ in 0..rows {
        for j in 0..k {
            let pick = j + rng.below((experts - j) as u64) as usize;
            perm.swap(j, pick);
            ids.push(perm[j]);
        }
    }
    let t = Tensor::from_i64(spec.shape.clone(), &ids).map_err(|source| ModelError::Tensor {
        name: spec.name.clone(),
        source,
    })?;
    Ok((spec.name.clone(), t))
}

fn bf16_tensor(spec: &TensorSpec, rng: &mut SplitMix64) -> Result<(String, Tensor), ModelError> {
    let n = spec.numel();
    let values: Vec<f32> = if spec.name.ends_with("norm.weight") {
        uniform(rng, n, 0.02).into_iter().map(|v| 1.0 + v).collect()
    } else if spec.name == "embed.weight" {
        uniform(rng, n, 1.0)
    } else {
        // Linear [out, in] (head, router gate, compressor projections, weights_proj).
        let inp = spec.shape.last().copied().unwrap_or(1).max(1);
        uniform(rng, n, 1.0 / (inp as f64).sqrt())
    };
    let t = Tensor::from_f32_as_bf16(spec.shape.clone(), &values).map_err(|source| {
        ModelError::Tensor {
            name: spec.name.clone(),
            source,
        }
    })?;
    Ok((spec.name.clone(), t))
}

/// F32 tensors: mHC parameters, attention sinks, compressor position biases, router biases.
fn f32_tensor(
    spec: &TensorSpec,
    hc: usize,
    rng: &mut SplitMix64,
) -> Result<(String, Tensor), ModelError> {
    let n = spec.numel();
    let name = spec.name.as_str();
    let values: Vec<f32> = if name.ends_with("_fn") {
        // m = W·x̂/rms(x̂) then has entries of size ≈ 0.1.
        let cols = spec.shape.last().copied().unwrap_or(1).max(1);
        uniform(rng, n, 0.1 / (cols as f64).sqrt())
    } else if name.ends_with("_scale") {
        vec![1.0; n]
    } else if name.ends_with("_base") {
        hc_base(n, hc, rng)
    } else if name.ends_with("attn_sink") {
        uniform(rng, n, 0.5 / 3f64.sqrt())
    } else {
        // `ape` and `gate.bias`: small.
        uniform(rng, n, 0.05)
    };
    let t = Tensor::from_f32(spec.shape.clone(), &values).map_err(|source| ModelError::Tensor {
        name: spec.name.clone(),
        source,
    })?;
    Ok((spec.name.clone(), t))
}

/// mHC biases: pre ≈ σ(−1) ≈ 0.27 ≈ 1/M, post = 2σ(0) ≈ 1, C's logits favour the diagonal
/// (+2) so the mixing matrix starts near the identity; each with ±0.05 noise.
fn hc_base(n: usize, m: usize, rng: &mut SplitMix64) -> Vec<f32> {
    (0..n)
        .map(|j| {
            let centre = if j < m {
                -1.0
            } else if j < 2 * m {
                0.0
            } else {
                let c = j - 2 * m;
                if c / m == c % m { 2.0 } else { 0.0 }
            };
            centre + rng.uniform_sym(0.05)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_core::codec::{e2m1_to_f32, e4m3_to_f32, ue8m0_to_f32, unpack_e2m1};

    #[test]
    fn generation_size_matches_the_weights_and_refuses_what_cannot_fit() {
        let cfg = ModelConfig::tiny();
        let made: u64 = generate_weights(&cfg, 0)
            .unwrap()
            .iter()
            .map(|(_, t)| t.data().len() as u64)
            .sum();
        let (stored, peak) = generation_bytes(&cfg);
        assert_eq!(stored, made);
        assert!(peak > stored);
        check_generation_fits(&cfg, None).unwrap();
        check_generation_fits(&cfg, Some(peak)).unwrap();
        let e = check_generation_fits(&cfg, Some(peak - 1)).unwrap_err();
        assert!(e.to_string().contains("use a smaller config"), "{e}");
        // A config at the field limits: terabytes, refused without allocating them.
        let mut big = ModelConfig::tiny();
        big.hidden_size = 1 << 20;
        big.vocab_size = 1 << 20;
        big.validate().unwrap();
        assert!(generation_bytes(&big).0 > 1 << 42);
        // (Where the available memory cannot be told, init_random would try to allocate them.)
        if dsv4_core::sys::mem_available().is_some() {
            let dir = std::env::temp_dir().join("dsv4-tiny-too-big");
            let e = init_random(&dir, &big, 0).unwrap_err();
            assert!(e.to_string().contains("GiB of memory"), "{e}");
            assert!(!dir.join("model.safetensors").exists());
        }
    }

    #[test]
    fn fp8_blocks_dequantize_close_and_scale_is_pow2_ceil() {
        let (o, i) = (130, 200);
        let mut rng = SplitMix64::new(1);
        let v = uniform(&mut rng, o * i, 1.0);
        let (codes, scales) = quantize_fp8_blocks(&v, o, i).unwrap();
        assert_eq!(scales.len(), 2 * 2);
        for r in 0..o {
            for c in 0..i {
                let s = ue8m0_to_f32(scales[(r / 128) * 2 + c / 128]);
                let back = e4m3_to_f32(codes[r * i + c]) * s;
                let x = v[r * i + c];
                assert!((back - x).abs() <= x.abs() / 16.0 + s / 512.0, "{x} {back}");
            }
        }
        // Block (0,0): amax/scale lies in (224, 448].
        let amax = (0..128)
            .flat_map(|r| v[r * i..r * i + 128].iter())
            .fold(0f32, |m, x| m.max(x.abs()));
        let ratio = amax / ue8m0_to_f32(scales[0]);
        assert!(ratio > 224.0 && ratio <= 448.0, "{ratio}");
    }

    #[test]
    fn mxfp4_packs_low_nibble_first() {
        let mut v = vec![0f32; 32];
        v[0] = 6.0;
        v[1] = -1.0;
        v[2] = 0.5;
        let (packed, scales) = quantize_mxfp4(&v, 1, 32).unwrap();
        assert!(quantize_mxfp4(&v, 2, 16).is_err());
        assert!(quantize_mxfp4(&v, 2, 32).is_err());
        assert_eq!(scales, vec![127]); // amax 6 → scale 2^0
        assert_eq!(packed.len(), 16);
        let codes = unpack_e2m1(&packed);
        assert_eq!(e2m1_to_f32(codes[0]), 6.0);
        assert_eq!(e2m1_to_f32(codes[1]), -1.0);
        assert_eq!(e2m1_to_f32(codes[2]), 0.5);
        assert_eq!(packed[0], 0x7 | (0x8 | 0x2) << 4);
    }

    #[test]
    fn zero_block_gets_a_finite_scale() {
        let (codes, scales) = quantize_fp8_blocks(&[0.0; 4], 2, 2).unwrap();
        assert_eq!(codes, vec![0; 4]);
        assert!(ue8m0_to_f32(scales[0]).is_finite() && scales[0] > 0);
    }

    #[test]
    fn tid2eid_rows_are_distinct_and_in_range() {
        let spec = TensorSpec {
            name: "t".into(),
            dtype: DType::I64,
            shape: vec![50, 6],
        };
        let (_, t) = tid2eid(&spec, 8, &mut SplitMix64::new(3)).unwrap();
        for row in t.to_i64().unwrap().chunks(6) {
            let mut r = row.to_vec();
            r.sort_unstable();
            r.dedup();
            assert_eq!(r.len(), 6);
            assert!(r.iter().all(|&e| (0..8).contains(&e)));
        }
    }

    #[test]
    fn hc_base_is_near_identity_mixing() {
        let b = hc_base(24, 4, &mut SplitMix64::new(0));
        assert!(b[..4].iter().all(|x| (x + 1.0).abs() <= 0.05));
        assert!(b[4..8].iter().all(|x| x.abs() <= 0.05));
        assert!((b[8] - 2.0).abs() <= 0.05 && b[9].abs() <= 0.05 && (b[13] - 2.0).abs() <= 0.05);
    }
}

//! The tiny model's weights: deterministic to the bit (pinned hash), seed-dependent, complete,
//! and scaled as documented.

mod common;

use dsv4_core::DType;
use dsv4_model::checkpoint::SINGLE_FILE;
use dsv4_model::tiny::{generate_weights, init_tiny};
use dsv4_model::{Checkpoint, ModelConfig, checkpoint_manifest};

/// Hash of `generate_weights(tiny, 0)` (names, dtypes, shapes, bytes). A change here means the
/// tiny model changed, on purpose or because some arithmetic is not reproducible.
const GOLDEN_SEED0: u64 = 0x7be0_a31c_dbe6_fda7;

#[test]
fn weights_for_seed_0_match_the_pinned_hash() {
    let w = generate_weights(&ModelConfig::tiny(), 0).unwrap();
    assert_eq!(
        common::hash_tensors(&w),
        GOLDEN_SEED0,
        "{:#018x}",
        common::hash_tensors(&w)
    );
}

#[test]
fn same_seed_same_file_other_seed_other_weights() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    init_tiny(a.path(), 7).unwrap();
    init_tiny(b.path(), 7).unwrap();
    init_tiny(c.path(), 8).unwrap();
    let read = |d: &tempfile::TempDir| std::fs::read(d.path().join(SINGLE_FILE)).unwrap();
    let (fa, fb, fc) = (read(&a), read(&b), read(&c));
    assert_eq!(
        common::fnv1a(common::FNV_BASIS, &fa),
        common::fnv1a(common::FNV_BASIS, &fb)
    );
    assert!(fa == fb);
    assert_eq!(fa.len(), fc.len());
    assert!(fa != fc);
    // Every tensor depends on the seed, not just some.
    let (wa, wc) = (
        generate_weights(&ModelConfig::tiny(), 7).unwrap(),
        generate_weights(&ModelConfig::tiny(), 8).unwrap(),
    );
    for ((name, x), (_, y)) in wa.iter().zip(&wc) {
        // Scales are powers of two and may coincide; the mHC scales are constant 1.
        if !name.ends_with("scale") {
            assert_ne!(x.data(), y.data(), "{name} ignores the seed");
        }
    }
}

#[test]
fn init_tiny_writes_a_valid_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), 0).unwrap();
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.config(), &ModelConfig::tiny());
    ck.validate_manifest().unwrap();
    let w = generate_weights(&ModelConfig::tiny(), 0).unwrap();
    assert_eq!(w.len(), checkpoint_manifest(&ModelConfig::tiny()).len());
    for (name, t) in &w {
        assert!(ck.tensor(name).unwrap().data == t.data(), "{name}");
    }
}

fn std_of(v: &[f32]) -> f64 {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    (v.iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt()
}

/// Dequantize an fp8 or MXFP4 weight of the written checkpoint.
fn dequantized(ck: &Checkpoint, base: &str) -> Vec<f32> {
    let w = ck.tensor(&format!("{base}.weight")).unwrap();
    let s = ck
        .tensor(&format!("{base}.scale"))
        .unwrap()
        .to_f32()
        .unwrap();
    let (out, cols) = (w.shape[0], w.shape[1]);
    match w.dtype {
        DType::F8E4M3 => {
            let v = w.to_f32().unwrap();
            let sc = cols.div_ceil(128);
            (0..out * cols)
                .map(|k| v[k] * s[(k / cols / 128) * sc + (k % cols) / 128])
                .collect()
        }
        DType::I8 => {
            let codes = dsv4_core::codec::unpack_e2m1(w.data);
            codes
                .iter()
                .enumerate()
                .map(|(k, &c)| dsv4_core::codec::e2m1_to_f32(c) * s[k / 32])
                .collect()
        }
        other => panic!("{base} is {other}"),
    }
}

#[test]
fn weight_scales_keep_activations_order_one() {
    let dir = tempfile::tempdir().unwrap();
    init_tiny(dir.path(), 0).unwrap();
    let ck = Checkpoint::open(dir.path()).unwrap();
    // Linears: std ≈ 1/sqrt(in) after quantization.
    for (base, inp) in [
        ("layers.0.attn.wq_a", 256.0),
        ("layers.1.attn.wo_b", 256.0),
        ("layers.3.ffn.shared_experts.w2", 128.0),
        ("layers.2.ffn.experts.5.w1", 256.0),
        ("layers.2.ffn.experts.5.w2", 128.0),
    ] {
        let s = std_of(&dequantized(&ck, base)) * f64::sqrt(inp);
        assert!((0.85..1.15).contains(&s), "{base}: std·sqrt(in) = {s}");
    }
    let norm = ck
        .tensor("layers.1.attn.kv_norm.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    assert!(norm.iter().all(|&x| (0.9..1.1).contains(&x)));
    let embed = ck.tensor("embed.weight").unwrap().to_f32().unwrap();
    assert!((0.9..1.1).contains(&std_of(&embed)));
    let hc = ck.tensor("layers.0.hc_attn_fn").unwrap().to_f32().unwrap();
    let s = std_of(&hc) * f64::sqrt(1024.0);
    assert!((0.09..0.11).contains(&s), "hc fn std·sqrt(M·D) = {s}");
    let scale = ck
        .tensor("layers.0.hc_ffn_scale")
        .unwrap()
        .to_f32()
        .unwrap();
    assert_eq!(scale, vec![1.0; 3]);
    let sink = ck
        .tensor("layers.0.attn.attn_sink")
        .unwrap()
        .to_f32()
        .unwrap();
    assert!(sink.iter().all(|x| x.abs() <= 0.5));
}

//! `dsv4 model forward` on a checkpoint that dsv4's tiny generator did not make: tensors drawn
//! independently for every manifest entry, written sharded in the official layout.

use dsv4_core::codec::{f32_to_bf16, f32_to_e4m3};
use dsv4_core::{DType, SplitMix64, Tensor};
use dsv4_model::checkpoint::write_checkpoint;
use dsv4_model::{ModelConfig, checkpoint_manifest};
use std::path::Path;
use std::process::Command;

/// A tensor of this dtype and shape from an independent stream, sized so the forward stays finite.
fn independent(dtype: DType, shape: &[usize], experts: usize, g: &mut SplitMix64) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<u8> = match dtype {
        DType::F32 => (0..n)
            .flat_map(|_| g.uniform_sym(0.25).to_le_bytes())
            .collect(),
        DType::BF16 => (0..n)
            .flat_map(|_| f32_to_bf16(1.0 + g.uniform_sym(0.25)).to_le_bytes())
            .collect(),
        // e4m3 elements in [-1, 1], scales 2^-4 .. 2^-3.
        DType::F8E4M3 => (0..n).map(|_| f32_to_e4m3(g.uniform_sym(1.0))).collect(),
        DType::F8E8M0 => (0..n).map(|_| 123 + g.below(2) as u8).collect(),
        // Packed e2m1 pairs: any nibble is a valid value.
        DType::I8 => (0..n).map(|_| g.next_u64() as u8).collect(),
        DType::I64 => {
            let k = shape[1];
            (0..shape[0])
                .flat_map(|_| {
                    let mut row: Vec<i64> = Vec::new();
                    while row.len() < k {
                        let e = g.below(experts as u64) as i64;
                        if !row.contains(&e) {
                            row.push(e);
                        }
                    }
                    row
                })
                .flat_map(|v| v.to_le_bytes())
                .collect()
        }
        other => panic!("the manifest has no {other} tensors"),
    };
    Tensor::new(shape.to_vec(), dtype, data).unwrap()
}

fn write_independent_checkpoint(dir: &Path) -> ModelConfig {
    let cfg = ModelConfig::tiny();
    let mut g = SplitMix64::new(0x1d3f_5eed);
    let tensors: Vec<(String, Tensor)> = checkpoint_manifest(&cfg)
        .iter()
        .map(|s| {
            // Norm and mHC scale parameters near 1, biases and the rest small.
            (
                s.name.clone(),
                independent(s.dtype, &s.shape, cfg.n_routed_experts, &mut g),
            )
        })
        .collect();
    write_checkpoint(dir, &cfg, &tensors, Some(2 << 20)).unwrap();
    cfg
}

fn read_npy_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + hlen) % 64, 0, "header padded to 64 bytes");
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(
        header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"),
        "{header}"
    );
    let shape_txt = header
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape: Vec<usize> = shape_txt
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let values = bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (shape, values)
}

#[test]
fn forward_runs_on_an_independently_written_sharded_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let cfg = write_independent_checkpoint(&ckpt);
    assert!(ckpt.join("model.safetensors.index.json").exists());
    let tokens: Vec<String> = (0..40).map(|i| ((i * 37 + 5) % 384).to_string()).collect();
    let out = dir.path().join("logits.npy");
    let topk = dir.path().join("topk.json");
    let st = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .args(["--profile", "reference", "model", "forward", "--model"])
        .arg(&ckpt)
        .args(["--tokens", &tokens.join(","), "--out"])
        .arg(&out)
        .arg("--dump-topk")
        .arg(&topk)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let (shape, values) = read_npy_f32(&out);
    assert_eq!(shape, vec![40, cfg.vocab_size]);
    assert_eq!(values.len(), 40 * cfg.vocab_size);
    assert!(values.iter().all(|v| v.is_finite()));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&topk).unwrap()).unwrap();
    let layers = doc["layers"].as_object().unwrap();
    let c4: Vec<String> = (0..cfg.num_hidden_layers)
        .filter(|&l| cfg.compress_ratios[l] == 4)
        .map(|l| l.to_string())
        .collect();
    assert_eq!(layers.keys().cloned().collect::<Vec<_>>(), c4);
    for sel in layers.values() {
        let sel = sel.as_array().unwrap();
        assert_eq!(sel.len(), 40);
        for (p, s) in sel.iter().enumerate() {
            let n = (p + 1) / 4;
            assert_eq!(
                s.as_array().unwrap().len(),
                n.min(cfg.index_topk),
                "position {p}"
            );
        }
    }
}

#[test]
fn forward_rejects_a_token_outside_the_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .args([
            "--profile",
            "reference",
            "model",
            "forward",
            "--tokens",
            "1,2,999",
            "--out",
        ])
        .arg(dir.path().join("x.npy"))
        .output()
        .unwrap();
    assert!(!st.status.success());
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(err.contains("999") && err.contains("vocab"), "{err}");
    assert!(!dir.path().join("x.npy").exists());
    // A --dump-topk path that cannot be written is refused before the forward, so the logits
    // file is not written either.
    let st = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .args(["model", "forward", "--tokens", "1,2", "--out"])
        .arg(dir.path().join("y.npy"))
        .arg("--dump-topk")
        .arg(dir.path().join("gone/topk.json"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success() && err.contains("--dump-topk"), "{err}");
    assert!(!dir.path().join("y.npy").exists());
}

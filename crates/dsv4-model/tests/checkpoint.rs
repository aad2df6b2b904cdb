//! Checkpoint directories: bit-exact round trips (single file and sharded), interoperability
//! with the official safetensors crate, and every corruption reported with its name.

mod common;

use std::collections::HashMap;
use std::path::Path;

use dsv4_core::{DType, Tensor};
use dsv4_model::checkpoint::{
    INDEX_FILE, SINGLE_FILE, SafetensorsFile, write_checkpoint, write_safetensors,
};
use dsv4_model::{Checkpoint, ModelConfig, ModelError};

fn assert_same_tensors(ck: &Checkpoint, tensors: &[(String, Tensor)]) {
    assert_eq!(ck.names().len(), tensors.len());
    for (name, t) in tensors {
        let r = ck.tensor(name).unwrap();
        assert_eq!(
            (r.name, r.dtype, r.shape),
            (name.as_str(), t.dtype(), t.shape())
        );
        assert!(r.data == t.data(), "{name} differs");
        assert_eq!(&r.to_tensor().unwrap(), t);
    }
}

fn write_random(dir: &Path, shard: Option<u64>) -> (ModelConfig, Vec<(String, Tensor)>) {
    let cfg = ModelConfig::tiny();
    let tensors = common::random_checkpoint(&cfg, 11);
    write_checkpoint(dir, &cfg, &tensors, shard).unwrap();
    (cfg, tensors)
}

#[test]
fn single_file_round_trip_is_bit_exact_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, tensors) = write_random(dir.path(), None);
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.config(), &cfg);
    assert_eq!(
        ck.file_paths(),
        vec![dir.path().join(SINGLE_FILE).as_path()]
    );
    assert_same_tensors(&ck, &tensors);
    ck.validate_manifest().unwrap();
}

#[test]
fn sharded_round_trip_is_bit_exact_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let (_, tensors) = write_random(dir.path(), Some(1 << 20));
    assert!(dir.path().join(INDEX_FILE).is_file());
    assert!(!dir.path().join(SINGLE_FILE).exists());
    let ck = Checkpoint::open(dir.path()).unwrap();
    let files = ck.file_paths();
    assert!(files.len() > 2, "{} shards", files.len());
    let last = format!("model-{n:05}-of-{n:05}.safetensors", n = files.len());
    assert!(files.last().unwrap().ends_with(&last));
    assert_same_tensors(&ck, &tensors);
    ck.validate_manifest().unwrap();
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(INDEX_FILE)).unwrap())
            .unwrap();
    let total: u64 = tensors.iter().map(|(_, t)| t.data().len() as u64).sum();
    assert_eq!(index["metadata"]["total_size"], total);
}

#[test]
fn rewriting_in_the_other_layout_removes_stale_files() {
    let dir = tempfile::tempdir().unwrap();
    write_random(dir.path(), Some(1 << 20));
    let (_, tensors) = write_random(dir.path(), None);
    assert!(!dir.path().join(INDEX_FILE).exists());
    let leftover: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("model-"))
        .collect();
    assert!(leftover.is_empty(), "{leftover:?}");
    assert_same_tensors(&Checkpoint::open(dir.path()).unwrap(), &tensors);
}

#[test]
fn tensor_views_decode() {
    let dir = tempfile::tempdir().unwrap();
    write_random(dir.path(), None);
    let ck = Checkpoint::open(dir.path()).unwrap();
    let sink = ck.tensor("layers.0.attn.attn_sink").unwrap();
    assert_eq!(sink.to_f32().unwrap().len(), 4);
    assert!(sink.to_i64().is_err());
    let ids = ck
        .tensor("layers.0.ffn.gate.tid2eid")
        .unwrap()
        .to_i64()
        .unwrap();
    assert!(ids.iter().all(|&i| (0..8).contains(&i)));
    let err = ck.tensor("layers.9.nothing").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("layers.9.nothing") && msg.contains(&dir.path().display().to_string()));
}

#[test]
fn official_safetensors_crate_reads_our_files_and_writes_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = common::random_checkpoint(&ModelConfig::tiny(), 5);
    let path = dir.path().join("x.safetensors");
    write_safetensors(&path, &tensors).unwrap();
    let ours = std::fs::read(&path).unwrap();
    let parsed = safetensors::SafeTensors::deserialize(&ours).unwrap();
    assert_eq!(parsed.len(), tensors.len());
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, t)| {
            let v = parsed.tensor(name).unwrap();
            assert_eq!(v.dtype().to_string(), t.dtype().safetensors_name());
            assert_eq!((v.shape(), v.data()), (t.shape(), t.data()));
            let dtype = serde_json::from_value(t.dtype().safetensors_name().into()).unwrap();
            let view = safetensors::tensor::TensorView::new(dtype, t.shape().to_vec(), t.data());
            (name.clone(), view.unwrap())
        })
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let official = safetensors::serialize(views, Some(meta)).unwrap();
    assert!(
        official == ours,
        "byte layout differs from the official writer"
    );
}

/// Write the tiny random checkpoint with `edit` applied to its tensor list.
fn edited(edit: impl FnOnce(&mut Vec<(String, Tensor)>)) -> (tempfile::TempDir, ModelError) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::tiny();
    let mut tensors = common::random_checkpoint(&cfg, 3);
    edit(&mut tensors);
    write_checkpoint(dir.path(), &cfg, &tensors, None).unwrap();
    let err = Checkpoint::open(dir.path())
        .unwrap()
        .validate_manifest()
        .unwrap_err();
    (dir, err)
}

#[test]
fn missing_tensor_is_named() {
    let (_dir, err) = edited(|t| t.retain(|(n, _)| n != "layers.1.attn.indexer.wq_b.scale"));
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("`layers.1.attn.indexer.wq_b.scale`"),
        "{err}"
    );
}

#[test]
fn wrong_dtype_names_tensor_expected_and_found() {
    let (_dir, err) = edited(|t| {
        let slot = t
            .iter_mut()
            .find(|(n, _)| n == "layers.2.attn.attn_sink")
            .unwrap();
        slot.1 = Tensor::zeros(vec![4], DType::BF16);
    });
    let msg = err.to_string();
    assert!(matches!(err, ModelError::WrongDType { .. }), "{msg}");
    assert!(msg.contains("layers.2.attn.attn_sink") && msg.contains("F32") && msg.contains("BF16"));
}

#[test]
fn wrong_shape_names_tensor_expected_and_found() {
    let (_dir, err) = edited(|t| {
        let slot = t
            .iter_mut()
            .find(|(n, _)| n == "mtp.0.e_proj.weight")
            .unwrap();
        slot.1 = Tensor::zeros(vec![256, 128], DType::F8E4M3);
    });
    let msg = err.to_string();
    assert!(matches!(err, ModelError::WrongShape { .. }), "{msg}");
    assert!(
        msg.contains("mtp.0.e_proj.weight")
            && msg.contains("[256, 256]")
            && msg.contains("[256, 128]")
    );
}

fn open_err(dir: &Path) -> String {
    Checkpoint::open(dir).unwrap_err().to_string()
}

#[test]
fn truncated_file_is_reported_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    write_random(dir.path(), None);
    let path = dir.path().join(SINGLE_FILE);
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 10).unwrap();
    let msg = open_err(dir.path());
    assert!(
        msg.contains("model.safetensors") && msg.contains("past the"),
        "{msg}"
    );
    f.set_len(5).unwrap();
    let msg = open_err(dir.path());
    assert!(
        msg.contains("model.safetensors") && msg.contains("shorter than"),
        "{msg}"
    );
}

#[test]
fn bad_header_is_reported_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    write_random(dir.path(), None);
    let path = dir.path().join(SINGLE_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..16].copy_from_slice(b"garbage!");
    std::fs::write(&path, &bytes).unwrap();
    let msg = open_err(dir.path());
    assert!(
        msg.contains("model.safetensors") && msg.contains("not valid JSON"),
        "{msg}"
    );
    let too_long = (bytes.len() as u64).to_le_bytes();
    bytes[..8].copy_from_slice(&too_long);
    std::fs::write(&path, &bytes).unwrap();
    let msg = open_err(dir.path());
    assert!(msg.contains("runs past the end"), "{msg}");
}

#[test]
fn shard_index_problems_are_named() {
    let dir = tempfile::tempdir().unwrap();
    write_random(dir.path(), Some(1 << 20));
    let index_path = dir.path().join(INDEX_FILE);
    let text = std::fs::read_to_string(&index_path).unwrap();
    let mut index: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Point a tensor at a shard that does not hold it.
    let first = index["weight_map"]["embed.weight"]
        .as_str()
        .unwrap()
        .to_string();
    let other = index["weight_map"]["mtp.0.hc_head_fn"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(first, other);
    index["weight_map"]["embed.weight"] = other.clone().into();
    std::fs::write(&index_path, index.to_string()).unwrap();
    let msg = open_err(dir.path());
    assert!(
        msg.contains("`embed.weight`") && msg.contains(&other),
        "{msg}"
    );
    index["weight_map"]["embed.weight"] = "../escape.safetensors".into();
    std::fs::write(&index_path, index.to_string()).unwrap();
    assert!(open_err(dir.path()).contains("plain file names"));
    std::fs::write(&index_path, "{\"weight_map\": 3}").unwrap();
    let msg = open_err(dir.path());
    assert!(
        msg.contains(INDEX_FILE) && msg.contains("weight_map"),
        "{msg}"
    );
}

#[test]
fn missing_weights_and_bad_config_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let msg = open_err(dir.path());
    assert!(msg.contains("config.json"), "{msg}");
    std::fs::write(
        dir.path().join("config.json"),
        ModelConfig::tiny_json().replace("DeepseekV4ForCausalLM", "LlamaForCausalLM"),
    )
    .unwrap();
    assert!(open_err(dir.path()).contains("LlamaForCausalLM"));
    std::fs::write(dir.path().join("config.json"), ModelConfig::tiny_json()).unwrap();
    let msg = open_err(dir.path());
    assert!(msg.contains("model.safetensors"), "{msg}");
}

#[test]
fn writer_rejects_duplicate_names_and_zero_shards() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tensor::zeros(vec![2], DType::F32);
    let dup = vec![("a".to_string(), t.clone()), ("a".to_string(), t.clone())];
    let err = write_safetensors(&dir.path().join("d.safetensors"), &dup).unwrap_err();
    assert!(err.to_string().contains("`a`"), "{err}");
    let one = vec![("a".to_string(), t)];
    let err = write_checkpoint(dir.path(), &ModelConfig::tiny(), &one, Some(0)).unwrap_err();
    assert!(err.to_string().contains("max_shard_bytes"), "{err}");
}

#[test]
fn single_safetensors_file_api() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.safetensors");
    let t = Tensor::from_f32(vec![2], &[1.5, -2.0]).unwrap();
    write_safetensors(&path, &[("w".to_string(), t)]).unwrap();
    let f = SafetensorsFile::open(&path).unwrap();
    assert_eq!(f.metadata()["format"], "pt");
    assert_eq!(f.names().collect::<Vec<_>>(), vec!["w"]);
    assert_eq!(f.tensor("w").unwrap().to_f32().unwrap(), vec![1.5, -2.0]);
    let msg = f.tensor("v").unwrap_err().to_string();
    assert!(
        msg.contains("`v`") && msg.contains("one.safetensors"),
        "{msg}"
    );
}

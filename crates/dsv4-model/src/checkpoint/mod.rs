//! Hugging Face checkpoint directories: config.json plus `model.safetensors` or sharded
//! `model-0000i-of-0000N.safetensors` with `model.safetensors.index.json`; memory-mapped
//! reading, manifest validation and writing.

mod reader;
mod writer;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use dsv4_core::{DType, Tensor};
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::manifest::checkpoint_manifest;

pub use reader::SafetensorsFile;
pub use writer::{write_checkpoint, write_safetensors};

/// The config file of a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// The single-file weights name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The shard index name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// A borrowed view of one tensor in a mapped file.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: &'a [usize],
    /// Little-endian bytes (numel × dtype size).
    pub data: &'a [u8],
}

impl TensorRef<'_> {
    /// Decode a floating tensor (F32, F16, BF16, F8_E4M3, F8_E8M0) to f32 (exact).
    pub fn to_f32(&self) -> Result<Vec<f32>, ModelError> {
        dsv4_core::tensor::decode_f32(self.dtype, self.data).map_err(|source| self.err(source))
    }

    /// Decode an integer tensor (I8, U8, I32, I64) to i64.
    pub fn to_i64(&self) -> Result<Vec<i64>, ModelError> {
        dsv4_core::tensor::decode_i64(self.dtype, self.data).map_err(|source| self.err(source))
    }

    /// Copy into an owned [`Tensor`].
    pub fn to_tensor(&self) -> Result<Tensor, ModelError> {
        Tensor::new(self.shape.to_vec(), self.dtype, self.data.to_vec())
            .map_err(|source| self.err(source))
    }

    fn err(&self, source: dsv4_core::CoreError) -> ModelError {
        ModelError::Tensor {
            name: self.name.to_string(),
            source,
        }
    }
}

/// An opened checkpoint directory: validated config and memory-mapped weight files.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    config: ModelConfig,
    files: Vec<SafetensorsFile>,
    /// Tensor name → index into `files`.
    index: BTreeMap<String, usize>,
}

impl Checkpoint {
    /// Open `dir`: read and validate config.json, then map `model.safetensors` or every shard
    /// named by `model.safetensors.index.json` (the index wins when both exist).
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let config = ModelConfig::from_file(&dir.join(CONFIG_FILE))?;
        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        let (files, index) = if index_path.is_file() {
            open_sharded(dir, &index_path)?
        } else if single_path.is_file() {
            let file = SafetensorsFile::open(&single_path)?;
            let index = file.names().map(|n| (n.to_string(), 0)).collect();
            (vec![file], index)
        } else {
            return Err(ModelError::io(
                "find model.safetensors or model.safetensors.index.json in",
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no weights file"),
            ));
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            files,
            index,
        })
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The validated config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Paths of the mapped weight files, in shard order.
    pub fn file_paths(&self) -> Vec<&Path> {
        self.files.iter().map(SafetensorsFile::path).collect()
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.index.keys().map(String::as_str).collect()
    }

    /// A view of tensor `name`; missing → error naming the tensor and the directory.
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>, ModelError> {
        match self.index.get(name) {
            Some(&i) => self.files[i].tensor(name),
            None => Err(ModelError::MissingTensor {
                name: name.to_string(),
                location: self.dir.display().to_string(),
            }),
        }
    }

    /// Check that every manifest tensor (spec §2) is present with its dtype and shape; the
    /// first mismatch is returned. Extra tensors are allowed.
    pub fn validate_manifest(&self) -> Result<(), ModelError> {
        for spec in checkpoint_manifest(&self.config) {
            let t = self.tensor(&spec.name)?;
            if t.dtype != spec.dtype {
                return Err(ModelError::WrongDType {
                    name: spec.name,
                    expected: spec.dtype,
                    found: t.dtype,
                });
            }
            if t.shape != spec.shape.as_slice() {
                return Err(ModelError::WrongShape {
                    name: spec.name,
                    expected: spec.shape,
                    found: t.shape.to_vec(),
                });
            }
        }
        Ok(())
    }
}

type Files = (Vec<SafetensorsFile>, BTreeMap<String, usize>);

/// Read the shard index and map each shard it names.
fn open_sharded(dir: &Path, index_path: &Path) -> Result<Files, ModelError> {
    let text =
        std::fs::read_to_string(index_path).map_err(|e| ModelError::io("read", index_path, e))?;
    let bad = |reason: String| ModelError::corrupt(index_path, reason);
    let json: Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("index is not valid JSON ({e})")))?;
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("index has no `weight_map` object".into()))?;
    let mut wanted: BTreeMap<String, &str> = BTreeMap::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map entry `{name}` is not a file name")))?;
        if file.is_empty() || file.contains(['/', '\\']) || file == ".." || file == "." {
            return Err(bad(format!(
                "weight_map entry `{name}` names `{file}`; shards must be plain file names in the checkpoint directory"
            )));
        }
        wanted.insert(name.clone(), file);
    }
    let shard_names: BTreeSet<&str> = wanted.values().copied().collect();
    let mut files = Vec::new();
    let mut shard_index = BTreeMap::new();
    for shard in shard_names {
        shard_index.insert(shard, files.len());
        files.push(SafetensorsFile::open(&dir.join(shard))?);
    }
    let mut index = BTreeMap::new();
    for (name, shard) in wanted {
        let i = shard_index[shard];
        if !files[i].contains(&name) {
            return Err(ModelError::MissingTensor {
                location: files[i].path().display().to_string(),
                name,
            });
        }
        index.insert(name, i);
    }
    Ok((files, index))
}

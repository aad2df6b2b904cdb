//! Where a model's weights come from (the embedded tiny model or a checkpoint directory) and
//! loading them into a runnable [`Model`].

use crate::checkpoint::Checkpoint;
use crate::forward::Model;
use crate::weights::{RawTensor, TensorSource};
use crate::{ModelConfig, ModelError};
use dsv4_core::{Numerics, Tensor};
use dsv4_kernels::Backend;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The weights a run uses.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// The embedded tiny model, weights generated from `seed`.
    Tiny {
        /// Weight seed.
        seed: u64,
    },
    /// A checkpoint directory in the official layout.
    Dir(PathBuf),
}

impl ModelSource {
    /// From a profile's `[model] path`: "tiny" means the embedded model.
    pub fn from_path(path: &str, seed: u64) -> Self {
        if path == "tiny" {
            ModelSource::Tiny { seed }
        } else {
            ModelSource::Dir(PathBuf::from(path))
        }
    }
}

impl TensorSource for Checkpoint {
    fn fetch(&self, name: &str) -> Result<RawTensor<'_>, ModelError> {
        let t = self.tensor(name)?;
        Ok(RawTensor {
            dtype: t.dtype,
            shape: t.shape.to_vec(),
            data: Cow::Borrowed(t.data),
        })
    }
}

/// Load the model of `source` onto `backend` with `numerics`.
pub fn load_model(
    source: &ModelSource,
    backend: Arc<dyn Backend>,
    numerics: Numerics,
) -> Result<Model, ModelError> {
    match source {
        ModelSource::Tiny { seed } => {
            let cfg = ModelConfig::tiny();
            let tensors: HashMap<String, Tensor> = crate::tiny::generate_weights(&cfg, *seed)?
                .into_iter()
                .collect();
            Model::load(cfg, &tensors, backend, numerics)
        }
        ModelSource::Dir(dir) => {
            let ckpt = Checkpoint::open(dir)?;
            ckpt.validate_manifest()?;
            Model::load(ckpt.config().clone(), &ckpt, backend, numerics)
        }
    }
}

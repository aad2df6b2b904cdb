//! dsv4-model: `config.json`, checkpoint reading and writing (safetensors, official DSV4 names),
//! the embedded tiny model, and the forward pass (prefill and incremental decode).

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod manifest;
pub mod params;
pub mod tiny;

pub use checkpoint::{Checkpoint, TensorRef};
pub use config::ModelConfig;
pub use error::ModelError;
pub use manifest::{TensorSpec, checkpoint_manifest};

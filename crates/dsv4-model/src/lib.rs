//! dsv4-model: `config.json`, checkpoint reading and writing (safetensors, official DSV4 names),
//! the embedded tiny model, and the forward pass (prefill and incremental decode).

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod forward;
pub mod load;
pub mod manifest;
pub mod params;
pub mod tiny;
pub mod weights;

pub use checkpoint::{Checkpoint, TensorRef};
pub use config::ModelConfig;
pub use error::ModelError;
pub use forward::{ForwardError, ForwardOutput, LogitRows, Model, SequenceState, StepOutputs};
pub use load::{ModelSource, load_model};
pub use manifest::{TensorSpec, checkpoint_manifest};

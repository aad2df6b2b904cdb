//! dsv4-model: `config.json`, checkpoint reading and writing (safetensors, official DSV4 names),
//! the embedded tiny model, and the forward pass (prefill and incremental decode).

pub mod config;

pub use config::ModelConfig;

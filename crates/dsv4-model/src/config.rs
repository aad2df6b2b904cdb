//! `config.json` of a DeepseekV4ForCausalLM checkpoint (spec §1): the struct every size is read
//! from, parsing that names the offending field, validation (spec §6) and per-layer helpers.

mod parse;
mod validate;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// The architecture string a config must list.
pub const ARCHITECTURE: &str = "DeepseekV4ForCausalLM";

/// The embedded tiny model's config.json (spec §1, "tiny" column).
const TINY_CONFIG_JSON: &str = include_str!("../data/tiny-config.json");
const SMALL_CONFIG_JSON: &str = include_str!("../data/small-config.json");

/// YaRN rope scaling parameters (`rope_scaling` in config.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// Scaling kind; only "yarn" is supported.
    #[serde(rename = "type", alias = "rope_type")]
    pub kind: String,
    /// Context extension factor.
    pub factor: f64,
    /// Context length the base model was trained at.
    pub original_max_position_embeddings: usize,
    /// YaRN β_fast (high-frequency boundary, in rotations).
    pub beta_fast: f64,
    /// YaRN β_slow (low-frequency boundary, in rotations).
    pub beta_slow: f64,
}

/// `quantization_config` in config.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantizationConfig {
    /// "fp8".
    pub quant_method: String,
    /// Element format of fp8 weights ("e4m3").
    pub fmt: String,
    /// Scale format ("ue8m0").
    pub scale_fmt: String,
    /// Block of one weight scale, [rows, cols] ([128, 128]).
    pub weight_block_size: [usize; 2],
    /// Routed-expert weight format ("fp4" = MXFP4); may instead sit at the top level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_dtype: Option<String>,
}

/// The model's configuration as read from config.json (field names are the file's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Must contain "DeepseekV4ForCausalLM".
    pub architectures: Vec<String>,
    /// Vocabulary size V.
    pub vocab_size: usize,
    /// Hidden size D.
    pub hidden_size: usize,
    /// Number of main-model layers.
    pub num_hidden_layers: usize,
    /// Compress ratio of each layer (0, 4 or 128), then one per MTP layer.
    pub compress_ratios: Vec<usize>,
    /// Query heads H.
    pub num_attention_heads: usize,
    /// KV heads (always 1).
    pub num_key_value_heads: usize,
    /// Head size hd.
    pub head_dim: usize,
    /// Rotary part of a head, rd (the last rd dims).
    pub qk_rope_head_dim: usize,
    /// Query low-rank width.
    pub q_lora_rank: usize,
    /// Output projection groups.
    pub o_groups: usize,
    /// Output low-rank width per group.
    pub o_lora_rank: usize,
    /// Routed experts E.
    pub n_routed_experts: usize,
    /// Shared experts.
    pub n_shared_experts: usize,
    /// Routed experts per token.
    pub num_experts_per_tok: usize,
    /// Expert hidden width I.
    pub moe_intermediate_size: usize,
    /// Router scoring ("sqrtsoftplus").
    pub scoring_func: String,
    /// Top-k method ("noaux_tc").
    pub topk_method: String,
    /// Normalise the chosen experts' weights.
    pub norm_topk_prob: bool,
    /// Multiplier on routed weights.
    pub routed_scaling_factor: f64,
    /// The first this-many layers route by token id (tid2eid).
    pub num_hash_layers: usize,
    /// SwiGLU clamp L.
    pub swiglu_limit: f64,
    /// Sliding attention window (tokens, including the current one).
    pub sliding_window: usize,
    /// Indexer heads In.
    pub index_n_heads: usize,
    /// Indexer head size Id.
    pub index_head_dim: usize,
    /// Compressed entries the indexer selects.
    pub index_topk: usize,
    /// Residual streams M.
    pub hc_mult: usize,
    /// Sinkhorn rounds in mHC.
    pub hc_sinkhorn_iters: usize,
    /// mHC epsilon.
    pub hc_eps: f64,
    /// RoPE base of ratio-0 layers.
    pub rope_theta: f64,
    /// RoPE base of compressed (ratio 4/128) layers.
    pub compress_rope_theta: f64,
    /// YaRN scaling of compressed layers.
    pub rope_scaling: RopeScaling,
    /// Longest supported context.
    pub max_position_embeddings: usize,
    /// MTP layers.
    pub num_nextn_predict_layers: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Beginning-of-sequence token.
    pub bos_token_id: u32,
    /// End-of-sequence token.
    pub eos_token_id: u32,
    /// Weight quantization.
    pub quantization_config: QuantizationConfig,
    /// Routed-expert weight format at the top level (alternative to the quantization_config field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_dtype: Option<String>,
}

impl ModelConfig {
    /// Parse config.json text and validate it (unknown extra fields are ignored).
    pub fn from_json_str(text: &str) -> Result<Self, ModelError> {
        let cfg = parse::parse_config(text, "config JSON")?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Read, parse and validate a config.json file; errors name the file.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io("read", path, e))?;
        let cfg = parse::parse_config(&text, &path.display().to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Check that dsv4 can run this config: supported architecture and methods, consistent and
    /// block-aligned sizes (spec §1, §6). The error names the first offending field.
    pub fn validate(&self) -> Result<(), ModelError> {
        validate::validate(self)
    }

    /// The embedded tiny config (spec §1, "tiny" column).
    pub fn tiny() -> Self {
        // The embedded file is checked by a unit test; a failure here is a build defect.
        serde_json::from_str(TINY_CONFIG_JSON).expect("embedded data/tiny-config.json parses")
    }

    /// The embedded "small" config: hidden 1024, 8 layers with Flash-like compress ratios, 32
    /// experts — big enough for benchmarks and long-context diffs, small enough for a laptop.
    pub fn small() -> Self {
        // The embedded file is checked by a unit test; a failure here is a build defect.
        serde_json::from_str(SMALL_CONFIG_JSON).expect("embedded data/small-config.json parses")
    }

    /// An embedded config by name ("tiny" or "small").
    pub fn embedded(name: &str) -> Option<Self> {
        match name {
            "tiny" => Some(Self::tiny()),
            "small" => Some(Self::small()),
            _ => None,
        }
    }

    /// The embedded tiny config as the JSON text it was built from.
    pub fn tiny_json() -> &'static str {
        TINY_CONFIG_JSON
    }

    /// This config as pretty-printed JSON (what a written checkpoint's config.json holds).
    pub fn to_json_pretty(&self) -> String {
        // Serializing plain structs of numbers, strings and vectors cannot fail.
        serde_json::to_string_pretty(self).expect("ModelConfig serializes")
    }

    /// The routed experts' weight format ("fp4" = MXFP4), read from the top level or from
    /// `quantization_config` (spec §6); empty if neither has it (validation rejects that).
    pub fn expert_dtype(&self) -> &str {
        self.expert_dtype
            .as_deref()
            .or(self.quantization_config.expert_dtype.as_deref())
            .unwrap_or("")
    }

    /// Main layers plus MTP layers.
    pub fn num_layers_with_mtp(&self) -> usize {
        self.num_hidden_layers + self.num_nextn_predict_layers
    }

    /// Compress ratio of layer `layer`: main layers are 0..num_hidden_layers, MTP layer k is
    /// num_hidden_layers + k; an index past the list gives 0 (sliding window only).
    pub fn compress_ratio(&self, layer: usize) -> usize {
        self.compress_ratios.get(layer).copied().unwrap_or(0)
    }

    /// Width multiplier of a compressor's projections: 2 for ratio 4 (overlapping windows),
    /// else 1 (spec §2).
    pub fn compressor_coff(ratio: usize) -> usize {
        if ratio == 4 { 2 } else { 1 }
    }

    /// Whether layer `layer` routes by token id (`tid2eid`); MTP layers never do (spec §6).
    pub fn is_hash_layer(&self, layer: usize) -> bool {
        layer < self.num_hash_layers && layer < self.num_hidden_layers
    }

    /// The tensor-name prefix of layer `layer`: `layers.i.` or, for MTP layer k, `mtp.k.`.
    pub fn layer_prefix(&self, layer: usize) -> String {
        if layer < self.num_hidden_layers {
            format!("layers.{layer}.")
        } else {
            format!("mtp.{}.", layer - self.num_hidden_layers)
        }
    }

    /// The shared expert's hidden width: moe_intermediate_size × n_shared_experts (spec §6).
    pub fn shared_intermediate_size(&self) -> usize {
        self.moe_intermediate_size * self.n_shared_experts
    }

    /// The "nope" (non-rotary) part of a head, hd − rd.
    pub fn nope_head_dim(&self) -> usize {
        self.head_dim.saturating_sub(self.qk_rope_head_dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_matches_spec_table_and_validates() {
        let cfg = ModelConfig::tiny();
        cfg.validate().unwrap();
        assert_eq!(ModelConfig::from_json_str(TINY_CONFIG_JSON).unwrap(), cfg);
        assert_eq!(
            (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers),
            (384, 256, 4)
        );
        assert_eq!(cfg.compress_ratios, vec![0, 4, 128, 4, 0]);
        assert_eq!(
            (cfg.head_dim, cfg.qk_rope_head_dim, cfg.q_lora_rank),
            (128, 64, 128)
        );
        assert_eq!((cfg.o_groups, cfg.o_lora_rank), (2, 128));
        assert_eq!(
            (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk),
            (4, 128, 16)
        );
        assert_eq!(
            (cfg.sliding_window, cfg.max_position_embeddings),
            (16, 65536)
        );
        assert_eq!(cfg.expert_dtype(), "fp4");
    }

    #[test]
    fn small_validates_and_is_flash_like() {
        let cfg = ModelConfig::small();
        cfg.validate().unwrap();
        assert_eq!(ModelConfig::from_json_str(SMALL_CONFIG_JSON).unwrap(), cfg);
        assert_eq!(
            (cfg.hidden_size, cfg.num_hidden_layers, cfg.n_routed_experts),
            (1024, 8, 32)
        );
        assert_eq!(cfg.compress_ratios, vec![0, 0, 4, 128, 4, 128, 4, 0, 0]);
        assert_eq!(ModelConfig::embedded("small"), Some(cfg));
        assert_eq!(ModelConfig::embedded("huge"), None);
    }

    #[test]
    fn layer_helpers() {
        let cfg = ModelConfig::tiny();
        assert_eq!(cfg.compress_ratio(2), 128);
        assert_eq!(cfg.compress_ratio(4), 0, "MTP entry");
        assert_eq!(cfg.compress_ratio(99), 0);
        assert_eq!(ModelConfig::compressor_coff(4), 2);
        assert_eq!(ModelConfig::compressor_coff(128), 1);
        assert!(cfg.is_hash_layer(0) && !cfg.is_hash_layer(1));
        assert_eq!(cfg.layer_prefix(3), "layers.3.");
        assert_eq!(cfg.layer_prefix(4), "mtp.0.");
        assert_eq!(cfg.nope_head_dim(), 64);
    }

    #[test]
    fn expert_dtype_is_read_from_either_place() {
        let mut cfg = ModelConfig::tiny();
        cfg.expert_dtype = None;
        assert_eq!(cfg.expert_dtype(), "");
        cfg.quantization_config.expert_dtype = Some("fp4".into());
        assert_eq!(cfg.expert_dtype(), "fp4");
        cfg.validate().unwrap();
    }

    #[test]
    fn pretty_json_round_trips() {
        let cfg = ModelConfig::tiny();
        assert_eq!(
            ModelConfig::from_json_str(&cfg.to_json_pretty()).unwrap(),
            cfg
        );
    }
}

//! `config.json` of a DeepseekV4ForCausalLM checkpoint (spec §1): the struct every size is read from.

use serde::{Deserialize, Serialize};

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

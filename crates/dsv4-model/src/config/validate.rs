//! Validation of a parsed config (spec §1, §6): supported architecture and methods, consistent
//! counts, and sizes that are multiples of the quantization blocks. Each error names the field.

use super::{ARCHITECTURE, ModelConfig};
use crate::error::ModelError;
use crate::manifest::checkpoint_manifest;

/// fp8 weight/activation block (spec §6).
const FP8_BLOCK: usize = 128;
/// KV-cache nope scale block (spec §4).
const KV_NOPE_BLOCK: usize = 64;
/// Compress ratios a layer may have.
const RATIOS: [usize; 3] = [0, 4, 128];
/// Upper bound on any size field, so products of sizes cannot overflow.
const MAX_SIZE: usize = 1 << 20;
/// Upper bound on layer counts.
const MAX_LAYERS: usize = 4096;
/// Upper bound on routed experts summed over main and MTP layers: each is six tensors of the
/// checkpoint, so this bounds what listing a config's tensors costs (Flash has 44 × 256 =
/// 11 264; this is over ten times that).
const MAX_EXPERT_INSTANCES: usize = 1 << 17;
/// Upper bound on the elements a checkpoint stores, all tensors together (2^50, thousands of
/// times any published model), so every size and sum derived from a config fits in 64 bits.
const MAX_ELEMENTS: u64 = 1 << 50;

/// Run every check; the first failure is returned.
pub(super) fn validate(c: &ModelConfig) -> Result<(), ModelError> {
    if !c.architectures.iter().any(|a| a == ARCHITECTURE) {
        return Err(ModelError::UnknownArchitecture {
            found: c.architectures.clone(),
        });
    }
    nonzero(c)?;
    layers(c)?;
    attention(c)?;
    moe(c)?;
    indexer(c)?;
    scalars(c)?;
    quantization(c)?;
    elements(c)?;
    Ok(())
}

fn err(field: &str, message: String) -> Result<(), ModelError> {
    Err(ModelError::invalid(field, message))
}

fn nonzero(c: &ModelConfig) -> Result<(), ModelError> {
    let fields = [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("num_hidden_layers", c.num_hidden_layers),
        ("num_attention_heads", c.num_attention_heads),
        ("head_dim", c.head_dim),
        ("q_lora_rank", c.q_lora_rank),
        ("o_groups", c.o_groups),
        ("o_lora_rank", c.o_lora_rank),
        ("n_routed_experts", c.n_routed_experts),
        ("n_shared_experts", c.n_shared_experts),
        ("num_experts_per_tok", c.num_experts_per_tok),
        ("moe_intermediate_size", c.moe_intermediate_size),
        ("sliding_window", c.sliding_window),
        ("index_n_heads", c.index_n_heads),
        ("index_head_dim", c.index_head_dim),
        ("index_topk", c.index_topk),
        ("hc_mult", c.hc_mult),
        ("hc_sinkhorn_iters", c.hc_sinkhorn_iters),
    ];
    if let Some((field, _)) = fields.iter().find(|(_, v)| *v == 0) {
        return err(field, "must be at least 1".into());
    }
    at_most(&fields, MAX_SIZE, "")?;
    at_most(
        &[
            ("num_hash_layers", c.num_hash_layers),
            ("qk_rope_head_dim", c.qk_rope_head_dim),
        ],
        MAX_SIZE,
        "",
    )?;
    at_most(
        &[
            ("num_hidden_layers", c.num_hidden_layers),
            ("num_nextn_predict_layers", c.num_nextn_predict_layers),
        ],
        MAX_LAYERS,
        " layers",
    )?;
    if c.max_position_embeddings == 0 {
        return err("max_position_embeddings", "must be at least 1".into());
    }
    Ok(())
}

/// The first of `fields` above `max` is an error ("is N, above the supported maximum M{unit}").
fn at_most(fields: &[(&str, usize)], max: usize, unit: &str) -> Result<(), ModelError> {
    match fields.iter().find(|(_, v)| *v > max) {
        Some((field, v)) => err(
            field,
            format!("is {v}, above the supported maximum {max}{unit}"),
        ),
        None => Ok(()),
    }
}

fn layers(c: &ModelConfig) -> Result<(), ModelError> {
    let want = c.num_hidden_layers + c.num_nextn_predict_layers;
    if c.compress_ratios.len() != want {
        return err(
            "compress_ratios",
            format!(
                "has {} entries but num_hidden_layers ({}) + num_nextn_predict_layers ({}) = {want}; \
                 give one ratio per layer, then one per MTP layer",
                c.compress_ratios.len(),
                c.num_hidden_layers,
                c.num_nextn_predict_layers
            ),
        );
    }
    for (i, &r) in c.compress_ratios.iter().enumerate() {
        if !RATIOS.contains(&r) {
            return err(
                &format!("compress_ratios[{i}]"),
                format!("is {r}; each ratio must be 0, 4 or 128"),
            );
        }
        if i >= c.num_hidden_layers && r != 0 {
            return err(
                &format!("compress_ratios[{i}]"),
                format!("is {r} for an MTP layer; the MTP block is sliding-window only (ratio 0)"),
            );
        }
    }
    if c.num_hash_layers > c.num_hidden_layers {
        return err(
            "num_hash_layers",
            format!(
                "is {} but there are only {} layers",
                c.num_hash_layers, c.num_hidden_layers
            ),
        );
    }
    Ok(())
}

fn multiple(field: &str, what: &str, value: usize, block: usize) -> Result<(), ModelError> {
    if !value.is_multiple_of(block) {
        return err(
            field,
            format!("{what} = {value} must be a multiple of {block} (quantization block, spec §6)"),
        );
    }
    Ok(())
}

fn attention(c: &ModelConfig) -> Result<(), ModelError> {
    if c.num_key_value_heads != 1 {
        return err(
            "num_key_value_heads",
            format!(
                "is {}; DSV4 attention has exactly one KV head",
                c.num_key_value_heads
            ),
        );
    }
    let rd = c.qk_rope_head_dim;
    if rd > c.head_dim || !rd.is_multiple_of(2) {
        return err(
            "qk_rope_head_dim",
            format!(
                "is {rd}; it must be even and at most head_dim ({})",
                c.head_dim
            ),
        );
    }
    if !c.num_attention_heads.is_multiple_of(c.o_groups) {
        return err(
            "o_groups",
            format!(
                "is {} but num_attention_heads ({}) is not divisible by it",
                c.o_groups, c.num_attention_heads
            ),
        );
    }
    let q_width = c.num_attention_heads * c.head_dim;
    multiple("hidden_size", "hidden_size", c.hidden_size, FP8_BLOCK)?;
    multiple("q_lora_rank", "q_lora_rank", c.q_lora_rank, FP8_BLOCK)?;
    multiple(
        "head_dim",
        "num_attention_heads × head_dim",
        q_width,
        FP8_BLOCK,
    )?;
    multiple(
        "o_groups",
        "num_attention_heads × head_dim / o_groups (wo_a input)",
        q_width / c.o_groups,
        FP8_BLOCK,
    )?;
    multiple(
        "o_lora_rank",
        "o_groups × o_lora_rank",
        c.o_groups * c.o_lora_rank,
        FP8_BLOCK,
    )?;
    multiple(
        "head_dim",
        "head_dim − qk_rope_head_dim",
        c.head_dim - rd,
        KV_NOPE_BLOCK,
    )?;
    if c.sliding_window > c.max_position_embeddings {
        return err(
            "sliding_window",
            format!(
                "is {} but max_position_embeddings is {}",
                c.sliding_window, c.max_position_embeddings
            ),
        );
    }
    Ok(())
}

fn moe(c: &ModelConfig) -> Result<(), ModelError> {
    let layers = c.num_layers_with_mtp();
    let instances = layers * c.n_routed_experts;
    if instances > MAX_EXPERT_INSTANCES {
        return err(
            "n_routed_experts",
            format!(
                "{} routed experts in each of {layers} layers (main and MTP) make {instances} \
                 expert instances, above the supported maximum {MAX_EXPERT_INSTANCES}",
                c.n_routed_experts
            ),
        );
    }
    if c.num_experts_per_tok > c.n_routed_experts {
        return err(
            "num_experts_per_tok",
            format!(
                "is {} but there are only {} routed experts (n_routed_experts)",
                c.num_experts_per_tok, c.n_routed_experts
            ),
        );
    }
    // 128-multiples are also 32-multiples, so the MXFP4 input dims (hidden_size for w1/w3,
    // moe_intermediate_size for w2) need no separate check.
    multiple(
        "moe_intermediate_size",
        "moe_intermediate_size",
        c.moe_intermediate_size,
        FP8_BLOCK,
    )?;
    if c.scoring_func != "sqrtsoftplus" {
        return err(
            "scoring_func",
            format!(
                "is {:?}; only \"sqrtsoftplus\" is supported",
                c.scoring_func
            ),
        );
    }
    if c.topk_method != "noaux_tc" {
        return err(
            "topk_method",
            format!("is {:?}; only \"noaux_tc\" is supported", c.topk_method),
        );
    }
    Ok(())
}

fn indexer(c: &ModelConfig) -> Result<(), ModelError> {
    let id = c.index_head_dim;
    if !id.is_power_of_two() {
        return err(
            "index_head_dim",
            format!("is {id}; it must be a power of two (the indexer applies a Hadamard rotation)"),
        );
    }
    if c.qk_rope_head_dim > id {
        return err(
            "index_head_dim",
            format!(
                "is {id}, smaller than qk_rope_head_dim ({}) which the indexer rotates",
                c.qk_rope_head_dim
            ),
        );
    }
    multiple(
        "index_n_heads",
        "index_n_heads × index_head_dim",
        c.index_n_heads * id,
        FP8_BLOCK,
    )
}

fn positive(field: &str, v: f64) -> Result<(), ModelError> {
    if !(v.is_finite() && v > 0.0) {
        return err(field, format!("is {v}; it must be a finite number above 0"));
    }
    Ok(())
}

fn scalars(c: &ModelConfig) -> Result<(), ModelError> {
    positive("rms_norm_eps", c.rms_norm_eps)?;
    positive("rope_theta", c.rope_theta)?;
    positive("compress_rope_theta", c.compress_rope_theta)?;
    positive("routed_scaling_factor", c.routed_scaling_factor)?;
    positive("swiglu_limit", c.swiglu_limit)?;
    if !(c.hc_eps.is_finite() && c.hc_eps >= 0.0) {
        return err(
            "hc_eps",
            format!("is {}; it must be finite and ≥ 0", c.hc_eps),
        );
    }
    let rs = &c.rope_scaling;
    if rs.kind != "yarn" {
        return err(
            "rope_scaling.type",
            format!("is {:?}; only \"yarn\" is supported", rs.kind),
        );
    }
    if !(rs.factor.is_finite() && rs.factor >= 1.0) {
        return err(
            "rope_scaling.factor",
            format!("is {}; it must be at least 1", rs.factor),
        );
    }
    positive("rope_scaling.beta_fast", rs.beta_fast)?;
    positive("rope_scaling.beta_slow", rs.beta_slow)?;
    if rs.original_max_position_embeddings == 0 {
        return err(
            "rope_scaling.original_max_position_embeddings",
            "must be at least 1".into(),
        );
    }
    for (field, id) in [
        ("bos_token_id", c.bos_token_id),
        ("eos_token_id", c.eos_token_id),
    ] {
        if id as usize >= c.vocab_size {
            return err(field, format!("is {id} but vocab_size is {}", c.vocab_size));
        }
    }
    Ok(())
}

fn quantization(c: &ModelConfig) -> Result<(), ModelError> {
    let q = &c.quantization_config;
    let checks = [
        (
            "quantization_config.quant_method",
            q.quant_method.as_str(),
            "fp8",
        ),
        ("quantization_config.fmt", q.fmt.as_str(), "e4m3"),
        (
            "quantization_config.scale_fmt",
            q.scale_fmt.as_str(),
            "ue8m0",
        ),
    ];
    for (field, got, want) in checks {
        if got != want {
            return err(field, format!("is {got:?}; only {want:?} is supported"));
        }
    }
    if q.weight_block_size != [FP8_BLOCK, FP8_BLOCK] {
        return err(
            "quantization_config.weight_block_size",
            format!("is {:?}; only [128, 128] is supported", q.weight_block_size),
        );
    }
    match (c.expert_dtype.as_deref(), q.expert_dtype.as_deref()) {
        (Some(a), Some(b)) if a != b => err(
            "expert_dtype",
            format!("is {a:?} at the top level but {b:?} in quantization_config; make them agree"),
        ),
        (None, None) => err(
            "expert_dtype",
            "is missing; add \"expert_dtype\": \"fp4\" (routed experts in MXFP4)".into(),
        ),
        _ if c.expert_dtype() != "fp4" => err(
            "expert_dtype",
            format!(
                "is {:?}; only \"fp4\" (MXFP4 routed experts) is supported",
                c.expert_dtype()
            ),
        ),
        _ => Ok(()),
    }
}

/// The checkpoint's tensors, each and together, stay within [`MAX_ELEMENTS`] (run last: the
/// manifest is built from the checked fields, and the expert cap bounds its length).
fn elements(c: &ModelConfig) -> Result<(), ModelError> {
    let mut total = 0u64;
    for spec in checkpoint_manifest(c) {
        let sum = spec
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .and_then(|n| total.checked_add(n))
            .filter(|&t| t <= MAX_ELEMENTS);
        let Some(sum) = sum else {
            return Err(ModelError::ConfigTooLarge {
                tensor: spec.name,
                shape: spec.shape,
            });
        };
        total = sum;
    }
    Ok(())
}

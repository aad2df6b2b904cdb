//! Fuzz target for a checkpoint's config.json: parse and validate it, then everything dsv4
//! derives from a config that passed (parameter counts, cache sizes under every KV and
//! index-K format, the memory `model init-random` would need, and the decode and prefill step
//! plans with and without overlap, verified). A config that validates must never panic, and
//! nothing derived from it may need memory out of proportion to the config (libFuzzer's
//! `-rss_limit_mb` and `-malloc_limit_mb` turn that into a crash).
//!
//! Input: a byte string that edits the embedded tiny config (so most inputs are configs that
//! validate, or fail one check): byte 0 picks the compress-ratio pattern, then each pair of
//! bytes sets one integer field (first byte) to one of a list of edge values (second byte).
#![no_main]

use dsv4_core::{IndexKDtype, KvCacheDtype};
use dsv4_model::ModelConfig;
use dsv4_model::forward::build::{PlanSpec, StepKind, build_plan};
use dsv4_model::params::{cache_bytes, count_params};
use dsv4_model::tiny::generation_bytes;
use libfuzzer_sys::fuzz_target;

/// The integer fields an input may set.
const FIELDS: [&str; 25] = [
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "qk_rope_head_dim",
    "q_lora_rank",
    "o_groups",
    "o_lora_rank",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "num_hash_layers",
    "sliding_window",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "hc_mult",
    "hc_sinkhorn_iters",
    "max_position_embeddings",
    "num_nextn_predict_layers",
    "bos_token_id",
    "eos_token_id",
];

/// Edge values: zero, small, block sizes and their neighbours, the validation limits.
const VALUES: [u64; 16] = [
    0,
    1,
    2,
    3,
    4,
    16,
    64,
    127,
    128,
    256,
    512,
    4096,
    4097,
    65536,
    1 << 20,
    (1 << 20) + 1,
];

/// Configs with more main layers than this skip the plan checks.
const MAX_PLAN_LAYERS: usize = 64;

/// The tiny config edited by `data`.
fn edited(data: &[u8]) -> Option<String> {
    let (&pattern, edits) = data.split_first()?;
    let mut cfg: serde_json::Value = serde_json::from_str(ModelConfig::tiny_json()).ok()?;
    let obj = cfg.as_object_mut()?;
    for pair in edits.chunks_exact(2) {
        let field = FIELDS[pair[0] as usize % FIELDS.len()];
        let value = VALUES[pair[1] as usize % VALUES.len()] * (pair[1] as u64 / 16 % 3 + 1);
        obj.insert(field.into(), value.into());
    }
    let count = |k: &str| obj.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let layers = (count("num_hidden_layers") + count("num_nextn_predict_layers")).min(9000);
    let ratios: Vec<u64> = (0..layers)
        .map(|i| [0, 4, 128][(pattern as u64 + i * (pattern as u64 >> 2)) as usize % 3])
        .collect();
    obj.insert("compress_ratios".into(), ratios.into());
    Some(cfg.to_string())
}

fuzz_target!(|data: &[u8]| {
    let Some(text) = edited(data) else {
        return;
    };
    let Ok(cfg) = ModelConfig::from_json_str(&text) else {
        return;
    };
    let _ = count_params(&cfg);
    for kv in [KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
        for ik in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
            if let Ok(c) = cache_bytes(&cfg, kv, ik) {
                let _ = c.request_bytes(cfg.max_position_embeddings as u64);
            }
        }
    }
    let _ = generation_bytes(&cfg);
    // Plans grow with the layer count (a 4096-layer plan takes seconds under the sanitizer);
    // their size per layer does not depend on it, so fuzz them on configs of few layers.
    if cfg.num_hidden_layers > MAX_PLAN_LAYERS {
        return;
    }
    for (kind, rows) in [(StepKind::Decode, 3), (StepKind::Prefill, 17)] {
        for overlap in [false, true] {
            for mtp in [false, cfg.num_nextn_predict_layers > 0] {
                let plan = build_plan(
                    &cfg,
                    PlanSpec {
                        kind,
                        rows,
                        overlap,
                        mtp,
                    },
                );
                let _ = dsv4_plan::verify(&plan);
            }
        }
    }
});

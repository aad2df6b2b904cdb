//! config.json: the published Flash file parses; every kind of bad config is rejected with a
//! message naming the field (or the file).

mod common;

use dsv4_model::{ModelConfig, ModelError};

#[test]
fn flash_config_parses_with_extra_fields() {
    let cfg = common::flash();
    assert_eq!(cfg.num_hidden_layers, 43);
    assert_eq!(cfg.compress_ratios.len(), 44);
    assert_eq!(cfg.compress_ratio(0), 0);
    assert_eq!(cfg.compress_ratio(2), 4);
    assert_eq!(cfg.compress_ratio(41), 128);
    assert_eq!(cfg.compress_ratio(42), 4);
    assert_eq!(cfg.compress_ratio(43), 0, "MTP layer");
    assert_eq!(cfg.expert_dtype(), "fp4");
    assert_eq!(cfg.compress_rope_theta, 160_000.0);
    assert_eq!(cfg.rope_scaling.original_max_position_embeddings, 65_536);
    assert_eq!(cfg.shared_intermediate_size(), 2048);
    assert_eq!(
        ModelConfig::from_json_str(&cfg.to_json_pretty()).unwrap(),
        cfg
    );
}

fn tiny_with(from: &str, to: &str) -> String {
    let text = ModelConfig::tiny_json();
    assert!(text.contains(from), "tiny config has no `{from}`");
    text.replacen(from, to, 1)
}

fn error_of(json: &str) -> ModelError {
    ModelConfig::from_json_str(json).expect_err("config must be rejected")
}

#[test]
fn unknown_architecture_is_rejected() {
    let err = error_of(&tiny_with("DeepseekV4ForCausalLM", "DeepseekV3ForCausalLM"));
    assert!(
        matches!(err, ModelError::UnknownArchitecture { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("architectures") && msg.contains("DeepseekV3ForCausalLM"),
        "{msg}"
    );
}

#[test]
fn missing_field_is_named_with_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, tiny_with("\"index_topk\": 16,", "")).unwrap();
    let err = ModelConfig::from_file(&path).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, ModelError::ConfigMissingField { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("`index_topk`") && msg.contains("config.json"),
        "{msg}"
    );
}

#[test]
fn missing_file_names_the_path() {
    let err =
        ModelConfig::from_file(std::path::Path::new("/nonexistent/dsv4/config.json")).unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/dsv4/config.json"),
        "{err}"
    );
}

#[test]
fn wrong_json_type_names_the_field() {
    let err = error_of(&tiny_with(
        "\"sliding_window\": 16",
        "\"sliding_window\": -16",
    ));
    assert!(err.to_string().contains("sliding_window"), "{err}");
}

/// (edit of the tiny config, field the error must name, text the message must contain).
const INVALID: &[(&str, &str, &str, &str)] = &[
    (
        "[0, 4, 128, 4, 0]",
        "[0, 4, 128, 4]",
        "compress_ratios",
        "num_nextn_predict_layers",
    ),
    (
        "[0, 4, 128, 4, 0]",
        "[0, 4, 5, 4, 0]",
        "compress_ratios[2]",
        "0, 4 or 128",
    ),
    (
        "[0, 4, 128, 4, 0]",
        "[0, 4, 128, 4, 4]",
        "compress_ratios[4]",
        "MTP",
    ),
    (
        "\"num_key_value_heads\": 1",
        "\"num_key_value_heads\": 4",
        "num_key_value_heads",
        "one KV head",
    ),
    (
        "\"qk_rope_head_dim\": 64",
        "\"qk_rope_head_dim\": 63",
        "qk_rope_head_dim",
        "even",
    ),
    (
        "\"qk_rope_head_dim\": 64",
        "\"qk_rope_head_dim\": 256",
        "qk_rope_head_dim",
        "head_dim",
    ),
    (
        "\"num_experts_per_tok\": 2",
        "\"num_experts_per_tok\": 9",
        "num_experts_per_tok",
        "n_routed_experts",
    ),
    (
        "\"o_groups\": 2",
        "\"o_groups\": 3",
        "o_groups",
        "divisible",
    ),
    (
        "\"index_head_dim\": 128",
        "\"index_head_dim\": 96",
        "index_head_dim",
        "power of two",
    ),
    (
        "\"scoring_func\": \"sqrtsoftplus\"",
        "\"scoring_func\": \"softmax\"",
        "scoring_func",
        "sqrtsoftplus",
    ),
    (
        "\"topk_method\": \"noaux_tc\"",
        "\"topk_method\": \"greedy\"",
        "topk_method",
        "noaux_tc",
    ),
    ("\"hc_mult\": 4", "\"hc_mult\": 0", "hc_mult", "at least 1"),
    (
        "\"n_shared_experts\": 1",
        "\"n_shared_experts\": 0",
        "n_shared_experts",
        "at least 1",
    ),
    (
        "\"n_routed_experts\": 8",
        "\"n_routed_experts\": 32768",
        "n_routed_experts",
        "163840 expert instances",
    ),
    (
        "\"num_nextn_predict_layers\": 1",
        "\"num_nextn_predict_layers\": 4097",
        "num_nextn_predict_layers",
        "maximum 4096 layers",
    ),
    (
        "\"num_hash_layers\": 1",
        "\"num_hash_layers\": 5",
        "num_hash_layers",
        "only 4 layers",
    ),
    (
        "\"eos_token_id\": 1",
        "\"eos_token_id\": 384",
        "eos_token_id",
        "vocab_size",
    ),
    (
        "\"rms_norm_eps\": 1e-6",
        "\"rms_norm_eps\": 0",
        "rms_norm_eps",
        "above 0",
    ),
    (
        "\"type\": \"yarn\"",
        "\"type\": \"linear\"",
        "rope_scaling.type",
        "yarn",
    ),
    (
        "\"expert_dtype\": \"fp4\"",
        "\"expert_dtype\": \"fp8\"",
        "expert_dtype",
        "fp4",
    ),
    ("\"expert_dtype\": \"fp4\",", "", "expert_dtype", "missing"),
    (
        "\"fmt\": \"e4m3\"",
        "\"fmt\": \"e5m2\"",
        "quantization_config.fmt",
        "e4m3",
    ),
    (
        "[128, 128]",
        "[64, 64]",
        "quantization_config.weight_block_size",
        "[128, 128]",
    ),
    // Block multiples (spec §6).
    (
        "\"hidden_size\": 256",
        "\"hidden_size\": 200",
        "hidden_size",
        "multiple of 128",
    ),
    (
        "\"q_lora_rank\": 128",
        "\"q_lora_rank\": 96",
        "q_lora_rank",
        "multiple of 128",
    ),
    (
        "\"moe_intermediate_size\": 128",
        "\"moe_intermediate_size\": 100",
        "moe_intermediate_size",
        "multiple of 128",
    ),
    (
        "\"o_lora_rank\": 128",
        "\"o_lora_rank\": 96",
        "o_lora_rank",
        "multiple of 128",
    ),
    (
        "\"qk_rope_head_dim\": 64",
        "\"qk_rope_head_dim\": 32",
        "head_dim",
        "multiple of 64",
    ),
    (
        "\"index_n_heads\": 4,\n  \"index_head_dim\": 128",
        "\"index_n_heads\": 3,\n  \"index_head_dim\": 64",
        "index_n_heads",
        "multiple of 128",
    ),
    (
        "\"num_attention_heads\": 4,\n  \"num_key_value_heads\": 1,\n  \"head_dim\": 128",
        "\"num_attention_heads\": 2,\n  \"num_key_value_heads\": 1,\n  \"head_dim\": 192",
        "o_groups",
        "wo_a input",
    ),
];

#[test]
fn sizes_past_what_64_bits_count_safely_are_refused() {
    // hc_mult 2^20 alone: hc_attn_fn is [(2 + m)·m, m·d], about 2^68 elements.
    let err = error_of(&tiny_with("\"hc_mult\": 4", "\"hc_mult\": 1048576"));
    let msg = err.to_string();
    assert!(matches!(err, ModelError::ConfigTooLarge { .. }), "{msg}");
    assert!(
        msg.contains("`layers.0.hc_attn_fn`") && msg.contains("2^50") && msg.contains("hc_mult"),
        "{msg}"
    );
    // Each tensor fits, the sum does not: wq_a is [q_lora_rank, hidden_size] = 2^40 elements,
    // and 4096 layers of it make 2^52.
    let mut cfg: serde_json::Value = serde_json::from_str(ModelConfig::tiny_json()).unwrap();
    cfg["hidden_size"] = 1_048_576.into();
    cfg["q_lora_rank"] = 1_048_576.into();
    cfg["num_hidden_layers"] = 4096.into();
    cfg["compress_ratios"] = serde_json::json!(vec![0; 4097]);
    let err = error_of(&cfg.to_string());
    match &err {
        ModelError::ConfigTooLarge { tensor, .. } => {
            let layer: usize = tensor.split('.').nth(1).unwrap().parse().unwrap();
            assert!(
                layer > 1000,
                "the total, not one tensor, passes the limit: {err}"
            );
        }
        _ => panic!("expected ConfigTooLarge: {err}"),
    }
    // The Flash config is far inside the limit.
    common::flash().validate().unwrap();
}

#[test]
fn invalid_configs_name_the_field() {
    for &(from, to, field, needle) in INVALID {
        let err = error_of(&tiny_with(from, to));
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("`{field}`")) && msg.contains(needle),
            "{from} -> {to}: expected field `{field}` and `{needle}` in: {msg}"
        );
    }
}

#[test]
fn expert_dtype_may_sit_in_quantization_config() {
    let moved = tiny_with("\"expert_dtype\": \"fp4\",", "").replacen(
        "\"quant_method\": \"fp8\",",
        "\"quant_method\": \"fp8\", \"expert_dtype\": \"fp4\",",
        1,
    );
    let cfg = ModelConfig::from_json_str(&moved).unwrap();
    assert_eq!(cfg.expert_dtype(), "fp4");
    assert_eq!(cfg.expert_dtype, None);
    let both_differ = ModelConfig::tiny_json().replacen(
        "\"quant_method\": \"fp8\",",
        "\"quant_method\": \"fp8\", \"expert_dtype\": \"fp8\",",
        1,
    );
    let msg = error_of(&both_differ).to_string();
    assert!(
        msg.contains("`expert_dtype`") && msg.contains("agree"),
        "{msg}"
    );
}

#[test]
fn validate_catches_edits_made_in_code() {
    let mut cfg = ModelConfig::tiny();
    cfg.validate().unwrap();
    cfg.hidden_size = 320;
    let msg = cfg.validate().unwrap_err().to_string();
    assert!(
        msg.contains("`hidden_size`") && msg.contains("320"),
        "{msg}"
    );
}

//! Parameter and cache-size counts against the published DeepSeek-V4-Flash config.

mod common;

use dsv4_core::{IndexKDtype, KvCacheDtype};
use dsv4_model::params::{cache_bytes, count_params};
use dsv4_model::{ModelConfig, checkpoint_manifest};

fn within(value: u64, target: f64, rel: f64) -> bool {
    (value as f64 - target).abs() <= target * rel
}

#[test]
fn flash_total_is_284b_and_active_is_13b() {
    let p = count_params(&common::flash());
    assert!(within(p.total_main, 284e9, 0.01), "total {}", p.total_main);
    assert!(
        within(p.active_main, 13e9, 0.03),
        "active {}",
        p.active_main
    );
    assert_eq!(p.embedding, 129_280 * 4096);
    assert_eq!(p.head, 129_280 * 4096);
    // One routed expert is 3 · 2048 · 4096 values; 256 per layer, 43 layers; 6 active.
    assert_eq!(p.main.routed_experts, 43 * 256 * 3 * 2048 * 4096);
    assert_eq!(p.active.routed_experts, 43 * 6 * 3 * 2048 * 4096);
    assert_eq!(p.active.embedding, 0);
    assert_eq!(p.main.total(), p.total_main);
    assert!(
        p.mtp > 6_000_000_000 && p.mtp < 7_000_000_000,
        "mtp {}",
        p.mtp
    );
    // Pinned exact values (scales and tid2eid excluded, see dsv4_model::params).
    assert_eq!(p.total_main, 284_332_240_471);
    assert_eq!(p.active_main, 13_270_101_591);
    assert_eq!(p.mtp, 6_610_048_891);
    assert_eq!(p.scale_elements, 8_858_737_664);
}

#[test]
fn flash_manifest_matches_the_published_index() {
    // The published model.safetensors.index.json lists 69 187 tensors with total_size
    // 159 609 485 896 bytes.
    let m = checkpoint_manifest(&common::flash());
    assert_eq!(m.len(), 69_187);
    let bytes: u64 = m.iter().map(|s| s.byte_len() as u64).sum();
    assert_eq!(bytes, 159_609_485_896);
}

#[test]
fn flash_cache_bytes() {
    let cfg = common::flash();
    let c = cache_bytes(&cfg, KvCacheDtype::Fp8, IndexKDtype::Fp8).unwrap();
    assert_eq!((c.kv_entry_bytes, c.index_k_entry_bytes), (584, 132));
    assert_eq!((c.swa_layers, c.c4_layers, c.c128_layers), (43, 21, 20));
    assert_eq!(c.swa_cap_bytes, 128 * 584 * 43);
    let per_token = 21.0 * (584.0 + 132.0) / 4.0 + 20.0 * 584.0 / 128.0;
    assert_eq!(c.compressed_bytes_per_token, per_token);
    let bf16 = cache_bytes(&cfg, KvCacheDtype::Bf16, IndexKDtype::Bf16).unwrap();
    assert_eq!((bf16.kv_entry_bytes, bf16.index_k_entry_bytes), (1024, 256));
    let fp4 = cache_bytes(&cfg, KvCacheDtype::Fp8, IndexKDtype::Fp4).unwrap();
    assert_eq!(fp4.index_k_entry_bytes, 68);
    // A 1M-token request: SWA capped, compressed caches dominate.
    let big = c.request_bytes(1 << 20);
    assert!(big > c.swa_cap_bytes && big < 5_000_000_000, "{big}");
}

#[test]
fn tiny_counts_are_small_and_consistent() {
    let p = count_params(&ModelConfig::tiny());
    assert!(
        p.total_main > 1_000_000 && p.total_main < 20_000_000,
        "{}",
        p.total_main
    );
    assert!(p.active_main < p.total_main);
}

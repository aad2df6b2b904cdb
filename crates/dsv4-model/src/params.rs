//! Sizes from config.json alone: parameter counts (total and active per token, by component)
//! and the bytes each cache buffer needs per token under chosen numerics (spec §4).
//!
//! Parameters are counted from the checkpoint manifest, so they agree with the tensors a
//! checkpoint holds. Counted: logical weight values (a packed MXFP4 byte is two parameters),
//! norm weights, biases, sinks, position biases and mHC tensors. NOT counted: the ue8m0 scale
//! tensors (reported separately as `scale_elements`: one per 32 routed-expert values, so about
//! 3% as many elements as parameters, but only one byte each) and `tid2eid`, a routing table
//! rather than a parameter (reported as `tid2eid_entries`). With these definitions the
//! published DeepSeek-V4-Flash config gives 284.3B total and 13.27B active.

use dsv4_core::cache::{IndexKLayout, KvLayout};
use dsv4_core::{DType, IndexKDtype, KvCacheDtype};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::manifest::checkpoint_manifest;

/// Parameters by component.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakdown {
    /// `embed.weight`.
    pub embedding: u64,
    /// `head.weight`.
    pub head: u64,
    /// Attention projections `wq_a, wq_b, wkv, wo_a, wo_b` and `attn_sink`.
    pub attention: u64,
    /// The attention compressors (`attn.compressor.*`, ratio 4 and 128 layers).
    pub compressor: u64,
    /// The lightning indexers (`attn.indexer.*`, ratio 4 layers), their compressors included.
    pub indexer: u64,
    /// Router `ffn.gate.weight` and `ffn.gate.bias`.
    pub router: u64,
    /// Routed experts.
    pub routed_experts: u64,
    /// Shared experts.
    pub shared_experts: u64,
    /// mHC tensors (`hc_*`).
    pub hyper_connections: u64,
    /// RMSNorm weights outside compressors (layer, q/kv, final, MTP enorm/hnorm).
    pub norms: u64,
    /// MTP input projections `e_proj`, `h_proj`.
    pub mtp_projections: u64,
}

impl Breakdown {
    /// Sum of all components.
    pub fn total(&self) -> u64 {
        self.embedding
            + self.head
            + self.attention
            + self.compressor
            + self.indexer
            + self.router
            + self.routed_experts
            + self.shared_experts
            + self.hyper_connections
            + self.norms
            + self.mtp_projections
    }

    fn slot(&mut self, kind: Kind) -> &mut u64 {
        match kind {
            Kind::Embedding => &mut self.embedding,
            Kind::Head => &mut self.head,
            Kind::Attention => &mut self.attention,
            Kind::Compressor => &mut self.compressor,
            Kind::Indexer => &mut self.indexer,
            Kind::Router => &mut self.router,
            Kind::Routed => &mut self.routed_experts,
            Kind::Shared => &mut self.shared_experts,
            Kind::Hc => &mut self.hyper_connections,
            Kind::Norm => &mut self.norms,
            Kind::MtpProj => &mut self.mtp_projections,
        }
    }

    /// What one token touches: no embedding table, routed experts scaled by top_k / E.
    fn active(&self, top_k: u64, experts: u64) -> Self {
        Self {
            embedding: 0,
            routed_experts: self.routed_experts / experts.max(1) * top_k,
            ..*self
        }
    }
}

/// Parameter counts of a config. "Main" is every main layer plus embedding, head, final norm
/// and `hc_head_*`; the MTP layers are counted separately (they share embedding and head).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParamCounts {
    /// All main-model parameters (MTP excluded).
    pub total_main: u64,
    /// Parameters one token touches in the main model: everything except the embedding
    /// table, with only top_k routed experts per layer (the head included).
    pub active_main: u64,
    /// The embedding table.
    pub embedding: u64,
    /// The output head.
    pub head: u64,
    /// The MTP layers' own parameters.
    pub mtp: u64,
    /// Parameters one MTP draft step touches in the MTP layers (top_k routed experts).
    pub mtp_active: u64,
    /// Main model by component.
    pub main: Breakdown,
    /// Active per token by component.
    pub active: Breakdown,
    /// MTP layers by component.
    pub mtp_breakdown: Breakdown,
    /// Elements of all ue8m0 scale tensors (not counted above).
    pub scale_elements: u64,
    /// Entries of all `tid2eid` tables (not counted above).
    pub tid2eid_entries: u64,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Embedding,
    Head,
    Attention,
    Compressor,
    Indexer,
    Router,
    Routed,
    Shared,
    Hc,
    Norm,
    MtpProj,
}

/// Component of a tensor, from its name with the `layers.i.` / `mtp.k.` prefix removed.
fn kind(local: &str) -> Kind {
    if local == "embed.weight" {
        Kind::Embedding
    } else if local == "head.weight" {
        Kind::Head
    } else if local.starts_with("attn.compressor.") {
        Kind::Compressor
    } else if local.starts_with("attn.indexer.") {
        Kind::Indexer
    } else if local.starts_with("hc_") {
        Kind::Hc
    } else if local.ends_with("norm.weight") {
        Kind::Norm
    } else if local.starts_with("ffn.gate.") {
        Kind::Router
    } else if local.starts_with("ffn.shared_experts.") {
        Kind::Shared
    } else if local.starts_with("ffn.experts.") {
        Kind::Routed
    } else if local.starts_with("e_proj.") || local.starts_with("h_proj.") {
        Kind::MtpProj
    } else {
        Kind::Attention
    }
}

/// Strip `layers.i.` or `mtp.k.`; returns (is_mtp, local name).
fn split_prefix(name: &str) -> (bool, &str) {
    for (root, mtp) in [("layers.", false), ("mtp.", true)] {
        if let Some(rest) = name.strip_prefix(root)
            && let Some((_, local)) = rest.split_once('.')
        {
            return (mtp, local);
        }
    }
    (false, name)
}

/// Count parameters of `cfg` (see the module docs for what is counted).
pub fn count_params(cfg: &ModelConfig) -> ParamCounts {
    let mut main = Breakdown::default();
    let mut mtp = Breakdown::default();
    let (mut scale_elements, mut tid2eid_entries) = (0u64, 0u64);
    for spec in checkpoint_manifest(cfg) {
        let n = spec.numel() as u64;
        match spec.dtype {
            DType::F8E8M0 => scale_elements += n,
            DType::I64 => tid2eid_entries += n,
            dtype => {
                let params = if dtype == DType::I8 { 2 * n } else { n };
                let (is_mtp, local) = split_prefix(&spec.name);
                let target = if is_mtp { &mut mtp } else { &mut main };
                *target.slot(kind(local)) += params;
            }
        }
    }
    let (k, e) = (cfg.num_experts_per_tok as u64, cfg.n_routed_experts as u64);
    let active = main.active(k, e);
    ParamCounts {
        total_main: main.total(),
        active_main: active.total(),
        embedding: main.embedding,
        head: main.head,
        mtp: mtp.total(),
        mtp_active: mtp.active(k, e).total(),
        main,
        active,
        mtp_breakdown: mtp,
        scale_elements,
        tid2eid_entries,
    }
}

/// Cache sizes of a config under chosen numerics, for the main layers (MTP excluded).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheBytes {
    /// KV storage format.
    pub kv_dtype: KvCacheDtype,
    /// Index-K storage format.
    pub index_k_dtype: IndexKDtype,
    /// Bytes of one SWA / C4 / C128 entry (bf16: 2·hd; fp8: nd + 2·rd + nd/64 + 1).
    pub kv_entry_bytes: u64,
    /// Bytes of one index-K entry (fp8: Id + 4; bf16: 2·Id; fp4: Id/2 + Id/32).
    pub index_k_entry_bytes: u64,
    /// Layers with a sliding-window cache (every main layer).
    pub swa_layers: u64,
    /// Ratio-4 layers.
    pub c4_layers: u64,
    /// Ratio-128 layers.
    pub c128_layers: u64,
    /// Sliding window (tokens); a request's SWA cache stops growing at this many entries.
    pub swa_window: u64,
    /// SWA bytes per token per layer (one entry).
    pub swa_bytes_per_token: u64,
    /// C4 KV bytes per 4 tokens per C4 layer (one entry).
    pub c4_bytes_per_4_tokens: u64,
    /// Index-K bytes per 4 tokens per C4 layer (one entry).
    pub index_k_bytes_per_4_tokens: u64,
    /// C128 KV bytes per 128 tokens per C128 layer (one entry).
    pub c128_bytes_per_128_tokens: u64,
    /// Compressor state per request per C4 layer: the attention ring (8 rows of f32 [a|z],
    /// width 2·2·hd) plus the indexer ring (8 rows, width 2·2·Id).
    pub c4_state_bytes: u64,
    /// Compressor state per request per C128 layer (128 rows of f32 [a|z], width 2·hd).
    pub c128_state_bytes: u64,
    /// SWA bytes of one request across all layers once its window is full.
    pub swa_cap_bytes: u64,
    /// Long-context growth across all layers: compressed KV + index-K bytes per token.
    pub compressed_bytes_per_token: f64,
    /// `compressed_bytes_per_token` averaged over the main layers.
    pub avg_bytes_per_token_per_layer: f64,
}

impl CacheBytes {
    /// Entry bytes of one request of `tokens` tokens across all layers: SWA (capped at the
    /// window), finished compressed and index-K entries, and compressor state (page padding
    /// not included).
    pub fn request_bytes(&self, tokens: u64) -> u64 {
        let swa = tokens.min(self.swa_window) * self.swa_bytes_per_token * self.swa_layers;
        let c4 = (tokens / 4)
            * (self.c4_bytes_per_4_tokens + self.index_k_bytes_per_4_tokens)
            * self.c4_layers;
        let c128 = (tokens / 128) * self.c128_bytes_per_128_tokens * self.c128_layers;
        let state = self.c4_state_bytes * self.c4_layers + self.c128_state_bytes * self.c128_layers;
        swa + c4 + c128 + state
    }
}

/// Bytes of one SWA/C4/C128 KV entry (spec §4, §6), from dsv4-core's page layout.
pub fn kv_entry_bytes(cfg: &ModelConfig, kv: KvCacheDtype) -> Result<u64, ModelError> {
    let layout = KvLayout::from_head_dims(kv, cfg.head_dim, cfg.qk_rope_head_dim, 1)?;
    Ok(layout.entry_bytes() as u64)
}

/// Bytes of one index-K entry (spec §4), from dsv4-core's page layout.
pub fn index_k_entry_bytes(cfg: &ModelConfig, ik: IndexKDtype) -> Result<u64, ModelError> {
    Ok(IndexKLayout::new(ik, cfg.index_head_dim, 1)?.entry_bytes() as u64)
}

/// Per-token cache sizes of `cfg` with KV format `kv` and index-K format `ik`; fails when the
/// sizes do not fit the format (e.g. fp4 index keys with index_head_dim not a multiple of 32).
pub fn cache_bytes(
    cfg: &ModelConfig,
    kv: KvCacheDtype,
    ik: IndexKDtype,
) -> Result<CacheBytes, ModelError> {
    let layers = cfg.num_hidden_layers as u64;
    let ratios = &cfg.compress_ratios[..cfg.num_hidden_layers.min(cfg.compress_ratios.len())];
    let c4_layers = ratios.iter().filter(|&&r| r == 4).count() as u64;
    let c128_layers = ratios.iter().filter(|&&r| r == 128).count() as u64;
    let kv_entry = kv_entry_bytes(cfg, kv)?;
    let ik_entry = index_k_entry_bytes(cfg, ik)?;
    let (hd, id) = (cfg.head_dim as u64, cfg.index_head_dim as u64);
    const F32: u64 = 4;
    // Rings of [a | z] rows: 2·ratio rows of width 2·coff·d for ratio 4, ratio rows for 128.
    let c4_state = 8 * (2 * 2 * hd) * F32 + 8 * (2 * 2 * id) * F32;
    let c128_state = 128 * (2 * hd) * F32;
    let compressed = c4_layers as f64 * (kv_entry + ik_entry) as f64 / 4.0
        + c128_layers as f64 * kv_entry as f64 / 128.0;
    let window = cfg.sliding_window as u64;
    Ok(CacheBytes {
        kv_dtype: kv,
        index_k_dtype: ik,
        kv_entry_bytes: kv_entry,
        index_k_entry_bytes: ik_entry,
        swa_layers: layers,
        c4_layers,
        c128_layers,
        swa_window: window,
        swa_bytes_per_token: kv_entry,
        c4_bytes_per_4_tokens: kv_entry,
        index_k_bytes_per_4_tokens: ik_entry,
        c128_bytes_per_128_tokens: kv_entry,
        c4_state_bytes: c4_state,
        c128_state_bytes: c128_state,
        swa_cap_bytes: window * kv_entry * layers,
        compressed_bytes_per_token: compressed,
        avg_bytes_per_token_per_layer: compressed / layers.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_sizes_match_spec_examples() {
        let mut cfg = ModelConfig::tiny();
        let kv = |cfg: &ModelConfig, d| kv_entry_bytes(cfg, d).unwrap();
        let ik = |cfg: &ModelConfig, d| index_k_entry_bytes(cfg, d).unwrap();
        assert_eq!(kv(&cfg, KvCacheDtype::Fp8), 194);
        assert_eq!(kv(&cfg, KvCacheDtype::Bf16), 256);
        cfg.head_dim = 512;
        assert_eq!(kv(&cfg, KvCacheDtype::Fp8), 584);
        assert_eq!(kv(&cfg, KvCacheDtype::Bf16), 1024);
        assert_eq!(ik(&cfg, IndexKDtype::Fp8), 132);
        assert_eq!(ik(&cfg, IndexKDtype::Bf16), 256);
        assert_eq!(ik(&cfg, IndexKDtype::Fp4), 68);
    }

    #[test]
    fn formats_that_do_not_fit_are_errors() {
        let mut cfg = ModelConfig::tiny();
        cfg.index_head_dim = 16;
        let err = cache_bytes(&cfg, KvCacheDtype::Bf16, IndexKDtype::Fp4).unwrap_err();
        assert!(err.to_string().contains("index_head_dim"), "{err}");
        assert!(cache_bytes(&cfg, KvCacheDtype::Bf16, IndexKDtype::Bf16).is_ok());
    }

    #[test]
    fn tiny_cache_bytes_and_request_total() {
        let cfg = ModelConfig::tiny();
        let c = cache_bytes(&cfg, KvCacheDtype::Bf16, IndexKDtype::Fp8).unwrap();
        assert_eq!((c.swa_layers, c.c4_layers, c.c128_layers), (4, 2, 1));
        assert_eq!(c.swa_cap_bytes, 16 * 256 * 4);
        assert_eq!(
            c.compressed_bytes_per_token,
            2.0 * (256.0 + 132.0) / 4.0 + 256.0 / 128.0
        );
        // 300 tokens: 16 SWA entries × 4 layers, 75 C4 entries × 2 layers, 2 C128 entries.
        let want = 16 * 256 * 4
            + 75 * (256 + 132) * 2
            + 2 * 256
            + 2 * c.c4_state_bytes
            + c.c128_state_bytes;
        assert_eq!(c.request_bytes(300), want);
        assert_eq!(c.c4_state_bytes, 8 * 512 * 4 * 2);
    }

    #[test]
    fn tiny_param_breakdown_adds_up() {
        let cfg = ModelConfig::tiny();
        let p = count_params(&cfg);
        assert_eq!(p.embedding, 384 * 256);
        assert_eq!(p.main.total(), p.total_main);
        // One routed expert: 3 · 128 · 256 values; 8 per layer, 4 layers.
        assert_eq!(p.main.routed_experts, 4 * 8 * 3 * 128 * 256);
        assert_eq!(p.active.routed_experts, 4 * 2 * 3 * 128 * 256);
        assert_eq!(
            p.active_main,
            p.total_main - p.embedding - 4 * 6 * 3 * 128 * 256
        );
        assert_eq!(p.mtp_breakdown.mtp_projections, 2 * 256 * 256);
        assert_eq!(p.tid2eid_entries, 384 * 2);
        assert_eq!(p.mtp_breakdown.embedding + p.mtp_breakdown.head, 0);
    }
}

//! The checkpoint manifest: every tensor of spec §2 with its official name, dtype and shape,
//! derived from config.json alone, in a fixed order (globals, each layer, then MTP layers).

use dsv4_core::DType;

use crate::config::ModelConfig;

/// One tensor a checkpoint must contain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    /// Official tensor name, e.g. `layers.3.attn.wq_a.weight`.
    pub name: String,
    /// Element type in the checkpoint.
    pub dtype: DType,
    /// Shape in the checkpoint.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Number of stored elements (packed MXFP4 bytes count as one element each).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Stored size in bytes.
    pub fn byte_len(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

/// fp8 weight block edge (spec §2).
pub const FP8_BLOCK: usize = 128;
/// Values per MXFP4 scale (spec §2).
pub const MXFP4_BLOCK: usize = 32;

/// Every tensor of the checkpoint for `cfg` (spec §2), in manifest order.
pub fn checkpoint_manifest(cfg: &ModelConfig) -> Vec<TensorSpec> {
    let mut m = Manifest::default();
    let (v, d, mm) = (cfg.vocab_size, cfg.hidden_size, cfg.hc_mult);
    m.push("embed.weight", DType::BF16, &[v, d]);
    m.push("head.weight", DType::BF16, &[v, d]);
    m.push("norm.weight", DType::BF16, &[d]);
    m.hc_head("", mm, d);
    for layer in 0..cfg.num_layers_with_mtp() {
        let p = cfg.layer_prefix(layer);
        m.block(cfg, layer, &p);
        if layer >= cfg.num_hidden_layers {
            m.fp8(&format!("{p}e_proj"), d, d);
            m.fp8(&format!("{p}h_proj"), d, d);
            m.push(&format!("{p}enorm.weight"), DType::BF16, &[d]);
            m.push(&format!("{p}hnorm.weight"), DType::BF16, &[d]);
            m.push(&format!("{p}norm.weight"), DType::BF16, &[d]);
            m.hc_head(&p, mm, d);
        }
    }
    m.specs
}

/// Shape of the ue8m0 scale of an fp8 `[out, in]` weight: one per 128×128 block.
pub fn fp8_scale_shape(out: usize, inp: usize) -> [usize; 2] {
    [out.div_ceil(FP8_BLOCK), inp.div_ceil(FP8_BLOCK)]
}

#[derive(Default)]
struct Manifest {
    specs: Vec<TensorSpec>,
}

impl Manifest {
    fn push(&mut self, name: &str, dtype: DType, shape: &[usize]) {
        self.specs.push(TensorSpec {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
        });
    }

    /// An fp8 linear `base` computing [out] from [in]: `.weight` e4m3 and `.scale` ue8m0.
    fn fp8(&mut self, base: &str, out: usize, inp: usize) {
        self.push(&format!("{base}.weight"), DType::F8E4M3, &[out, inp]);
        self.push(
            &format!("{base}.scale"),
            DType::F8E8M0,
            &fp8_scale_shape(out, inp),
        );
    }

    /// An MXFP4 linear: `.weight` I8 [out, in/2] (packed e2m1), `.scale` ue8m0 [out, in/32].
    fn mxfp4(&mut self, base: &str, out: usize, inp: usize) {
        self.push(&format!("{base}.weight"), DType::I8, &[out, inp / 2]);
        self.push(
            &format!("{base}.scale"),
            DType::F8E8M0,
            &[out, inp / MXFP4_BLOCK],
        );
    }

    fn bf16(&mut self, name: &str, shape: &[usize]) {
        self.push(name, DType::BF16, shape);
    }

    fn f32(&mut self, name: &str, shape: &[usize]) {
        self.push(name, DType::F32, shape);
    }

    fn hc_head(&mut self, p: &str, mm: usize, d: usize) {
        self.f32(&format!("{p}hc_head_fn"), &[mm, mm * d]);
        self.f32(&format!("{p}hc_head_base"), &[mm]);
        self.f32(&format!("{p}hc_head_scale"), &[1]);
    }

    /// One transformer block (attention + MoE, both wrapped by mHC).
    fn block(&mut self, cfg: &ModelConfig, layer: usize, p: &str) {
        let (d, mm) = (cfg.hidden_size, cfg.hc_mult);
        self.bf16(&format!("{p}attn_norm.weight"), &[d]);
        self.bf16(&format!("{p}ffn_norm.weight"), &[d]);
        let mix = (2 + mm) * mm;
        for sub in ["attn", "ffn"] {
            self.f32(&format!("{p}hc_{sub}_fn"), &[mix, mm * d]);
            self.f32(&format!("{p}hc_{sub}_base"), &[mix]);
            self.f32(&format!("{p}hc_{sub}_scale"), &[3]);
        }
        self.attention(cfg, layer, &format!("{p}attn."));
        self.moe(cfg, layer, &format!("{p}ffn."));
    }

    fn attention(&mut self, cfg: &ModelConfig, layer: usize, a: &str) {
        let (d, h, hd, ql) = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.head_dim,
            cfg.q_lora_rank,
        );
        let o_width = cfg.o_groups * cfg.o_lora_rank;
        self.fp8(&format!("{a}wq_a"), ql, d);
        self.fp8(&format!("{a}wq_b"), h * hd, ql);
        self.fp8(&format!("{a}wkv"), hd, d);
        self.fp8(&format!("{a}wo_a"), o_width, h * hd / cfg.o_groups);
        self.fp8(&format!("{a}wo_b"), d, o_width);
        self.bf16(&format!("{a}q_norm.weight"), &[ql]);
        self.bf16(&format!("{a}kv_norm.weight"), &[hd]);
        self.f32(&format!("{a}attn_sink"), &[h]);
        let ratio = cfg.compress_ratio(layer);
        if ratio > 0 {
            self.compressor(&format!("{a}compressor."), ratio, hd, d);
        }
        if ratio == 4 {
            let (inh, id) = (cfg.index_n_heads, cfg.index_head_dim);
            self.fp8(&format!("{a}indexer.wq_b"), inh * id, ql);
            self.bf16(&format!("{a}indexer.weights_proj.weight"), &[inh, d]);
            self.compressor(&format!("{a}indexer.compressor."), 4, id, d);
        }
    }

    fn compressor(&mut self, c: &str, ratio: usize, width: usize, d: usize) {
        let w = ModelConfig::compressor_coff(ratio) * width;
        self.bf16(&format!("{c}wkv.weight"), &[w, d]);
        self.bf16(&format!("{c}wgate.weight"), &[w, d]);
        self.f32(&format!("{c}ape"), &[ratio, w]);
        self.bf16(&format!("{c}norm.weight"), &[width]);
    }

    fn moe(&mut self, cfg: &ModelConfig, layer: usize, f: &str) {
        let (d, e, i) = (
            cfg.hidden_size,
            cfg.n_routed_experts,
            cfg.moe_intermediate_size,
        );
        self.bf16(&format!("{f}gate.weight"), &[e, d]);
        if cfg.is_hash_layer(layer) {
            self.push(
                &format!("{f}gate.tid2eid"),
                DType::I64,
                &[cfg.vocab_size, cfg.num_experts_per_tok],
            );
        } else {
            self.f32(&format!("{f}gate.bias"), &[e]);
        }
        let si = cfg.shared_intermediate_size();
        self.fp8(&format!("{f}shared_experts.w1"), si, d);
        self.fp8(&format!("{f}shared_experts.w2"), d, si);
        self.fp8(&format!("{f}shared_experts.w3"), si, d);
        for x in 0..e {
            self.mxfp4(&format!("{f}experts.{x}.w1"), i, d);
            self.mxfp4(&format!("{f}experts.{x}.w2"), d, i);
            self.mxfp4(&format!("{f}experts.{x}.w3"), i, d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(m: &'a [TensorSpec], name: &str) -> &'a TensorSpec {
        m.iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} not in manifest"))
    }

    #[test]
    fn tiny_manifest_shapes_and_dtypes() {
        let cfg = ModelConfig::tiny();
        let m = checkpoint_manifest(&cfg);
        assert_eq!(m[0].name, "embed.weight");
        assert_eq!(find(&m, "layers.0.attn.wq_b.weight").shape, vec![512, 128]);
        assert_eq!(find(&m, "layers.0.attn.wq_b.scale").shape, vec![4, 1]);
        assert_eq!(find(&m, "layers.0.attn.wo_a.weight").shape, vec![256, 256]);
        assert_eq!(find(&m, "layers.0.hc_attn_fn").shape, vec![24, 1024]);
        assert_eq!(find(&m, "layers.0.ffn.gate.tid2eid").dtype, DType::I64);
        assert_eq!(find(&m, "layers.1.ffn.gate.bias").dtype, DType::F32);
        let c4 = find(&m, "layers.1.attn.compressor.wkv.weight");
        assert_eq!((c4.dtype, c4.shape.clone()), (DType::BF16, vec![256, 256]));
        assert_eq!(
            find(&m, "layers.2.attn.compressor.ape").shape,
            vec![128, 128]
        );
        assert_eq!(
            find(&m, "layers.1.attn.indexer.compressor.ape").shape,
            vec![4, 256]
        );
        let w1 = find(&m, "layers.3.ffn.experts.7.w2.weight");
        assert_eq!((w1.dtype, w1.shape.clone()), (DType::I8, vec![256, 64]));
        assert_eq!(
            find(&m, "layers.3.ffn.experts.7.w2.scale").shape,
            vec![256, 4]
        );
        assert_eq!(find(&m, "mtp.0.e_proj.scale").shape, vec![2, 2]);
        assert_eq!(find(&m, "mtp.0.ffn.gate.bias").shape, vec![8]);
        assert_eq!(m.last().unwrap().name, "mtp.0.hc_head_scale");
    }

    #[test]
    fn ratio_zero_layers_have_no_compressor_and_mtp_no_tid2eid() {
        let m = checkpoint_manifest(&ModelConfig::tiny());
        let names: Vec<&str> = m.iter().map(|s| s.name.as_str()).collect();
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("layers.0.attn.compressor"))
        );
        assert!(!names.iter().any(|n| n.starts_with("layers.2.attn.indexer")));
        assert!(!names.iter().any(|n| n.starts_with("mtp.0.attn.compressor")));
        assert!(!names.contains(&"mtp.0.ffn.gate.tid2eid"));
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "names are unique");
        for s in &m {
            if s.name.ends_with("norm.weight") {
                assert_eq!(s.dtype, DType::BF16, "{}", s.name);
            }
        }
    }
}

//! The model's weights in the form the forward pass uses: linears in their checkpoint format
//! (dequantized lazily and exactly by [`Linear`]), everything else as f32.

use crate::{ModelConfig, ModelError};
use dsv4_core::{DType, Tensor};
use dsv4_kernels::{Linear, WeightFormat};
use std::borrow::Cow;
use std::collections::HashMap;

/// One tensor as a [`TensorSource`] hands it out.
pub struct RawTensor<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub data: Cow<'a, [u8]>,
}

/// Raw access to named tensors: a checkpoint on disk, or tensors generated in memory.
pub trait TensorSource {
    /// The tensor's dtype, shape and bytes, or [`ModelError::MissingTensor`].
    fn fetch(&self, name: &str) -> Result<RawTensor<'_>, ModelError>;
}

impl TensorSource for HashMap<String, Tensor> {
    fn fetch(&self, name: &str) -> Result<RawTensor<'_>, ModelError> {
        let t = self.get(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.to_string(),
            location: "in-memory tensors".to_string(),
        })?;
        Ok(RawTensor {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            data: Cow::Borrowed(t.data()),
        })
    }
}

/// mHC parameters of one sublayer or of a head.
#[derive(Debug)]
pub struct HcWeights {
    /// `hc_*_fn` [n_out, M·D].
    pub fn_w: Vec<f32>,
    /// `hc_*_base` `[n_out]`.
    pub base: Vec<f32>,
    /// `hc_*_scale` `[3]` or `[1]`.
    pub scale: Vec<f32>,
}

/// A compressor (attention's or the indexer's): spec §3.4.
#[derive(Debug)]
pub struct CompressorWeights {
    /// `wkv` [coff·d, D].
    pub wkv: Linear,
    /// `wgate` [coff·d, D].
    pub wgate: Linear,
    /// `ape` [ratio, coff·d].
    pub ape: Vec<f32>,
    /// `norm.weight` `[d]`.
    pub norm: Vec<f32>,
    /// Compress ratio (4 or 128).
    pub ratio: usize,
    /// Entry width d.
    pub dim: usize,
    /// 2 for ratio 4 (overlapping windows), else 1.
    pub coff: usize,
}

/// The lightning indexer of a ratio-4 layer (spec §3.5).
#[derive(Debug)]
pub struct IndexerWeights {
    /// `wq_b` [In·Id, q_lora].
    pub wq_b: Linear,
    /// `weights_proj` [In, D].
    pub weights_proj: Linear,
    /// The indexer's own compressor (d = Id).
    pub compressor: CompressorWeights,
}

/// One attention layer (spec §3.3).
#[derive(Debug)]
pub struct AttentionWeights {
    /// `wq_a` [q_lora, D].
    pub wq_a: Linear,
    /// `q_norm.weight` `[q_lora]`.
    pub q_norm: Vec<f32>,
    /// `wq_b` [H·hd, q_lora].
    pub wq_b: Linear,
    /// `wkv` [hd, D].
    pub wkv: Linear,
    /// `kv_norm.weight` `[hd]`.
    pub kv_norm: Vec<f32>,
    /// `wo_a` split into its o_groups row groups, each [o_lora, H·hd/o_groups].
    pub wo_a: Vec<Linear>,
    /// `wo_b` [D, o_groups·o_lora].
    pub wo_b: Linear,
    /// `attn_sink` `[H]`.
    pub sink: Vec<f32>,
    /// Compressor of ratio-4/128 layers.
    pub compressor: Option<CompressorWeights>,
    /// Indexer of ratio-4 layers.
    pub indexer: Option<IndexerWeights>,
}

/// One SwiGLU expert (routed or shared).
#[derive(Debug)]
pub struct ExpertWeights {
    /// Gate projection [I, D].
    pub w1: Linear,
    /// Down projection [D, I].
    pub w2: Linear,
    /// Up projection [I, D].
    pub w3: Linear,
}

/// How a MoE layer picks experts.
#[derive(Debug)]
pub enum Routing {
    /// Hash layers: `tid2eid` [V, top_k].
    Hash(Vec<i64>),
    /// top-k of (score + bias).
    Bias(Vec<f32>),
}

/// One MoE layer (spec §3.6).
#[derive(Debug)]
pub struct MoeWeights {
    /// Router `gate.weight` [E, D].
    pub gate: Linear,
    /// Expert choice rule.
    pub routing: Routing,
    /// Routed experts.
    pub experts: Vec<ExpertWeights>,
    /// The shared expert.
    pub shared: ExpertWeights,
}

/// One transformer block: attention and MoE, each wrapped by mHC.
#[derive(Debug)]
pub struct BlockWeights {
    /// Compress ratio of this layer (0, 4 or 128).
    pub ratio: usize,
    /// `attn_norm.weight`.
    pub attn_norm: Vec<f32>,
    /// `ffn_norm.weight`.
    pub ffn_norm: Vec<f32>,
    /// mHC around attention.
    pub hc_attn: HcWeights,
    /// mHC around the MoE.
    pub hc_ffn: HcWeights,
    /// Attention.
    pub attn: AttentionWeights,
    /// MoE.
    pub moe: MoeWeights,
}

/// The MTP draft layer (spec §3.7).
#[derive(Debug)]
pub struct MtpWeights {
    /// `e_proj` [D, D].
    pub e_proj: Linear,
    /// `h_proj` [D, D].
    pub h_proj: Linear,
    /// `enorm.weight`.
    pub enorm: Vec<f32>,
    /// `hnorm.weight`.
    pub hnorm: Vec<f32>,
    /// Final `norm.weight` of the MTP head.
    pub norm: Vec<f32>,
    /// The MTP head's mHC merge.
    pub hc_head: HcWeights,
    /// Its ratio-0 block.
    pub block: BlockWeights,
}

/// All weights of a model.
#[derive(Debug)]
pub struct ModelWeights {
    /// `embed.weight` as f32, [V, D].
    pub embed: Vec<f32>,
    /// `head.weight` [V, D].
    pub head: Linear,
    /// Final `norm.weight`.
    pub norm: Vec<f32>,
    /// `hc_head_*`.
    pub hc_head: HcWeights,
    /// Main blocks.
    pub layers: Vec<BlockWeights>,
    /// MTP layers.
    pub mtp: Vec<MtpWeights>,
}

struct Loader<'a> {
    src: &'a dyn TensorSource,
}

impl Loader<'_> {
    fn raw(&self, name: &str, shape: &[usize]) -> Result<(DType, Cow<'_, [u8]>), ModelError> {
        let RawTensor {
            dtype,
            shape: found,
            data,
        } = self.src.fetch(name)?;
        if found != shape {
            return Err(ModelError::WrongShape {
                name: name.into(),
                expected: shape.to_vec(),
                found,
            });
        }
        Ok((dtype, data))
    }

    fn f32s(&self, name: &str, shape: &[usize], allowed: &[DType]) -> Result<Vec<f32>, ModelError> {
        let (dtype, data) = self.raw(name, shape)?;
        if !allowed.contains(&dtype) {
            return Err(ModelError::WrongDType {
                name: name.into(),
                expected: allowed[0],
                found: dtype,
            });
        }
        dsv4_core::tensor::decode_f32(dtype, &data).map_err(|e| ModelError::ConfigInvalid {
            field: name.into(),
            message: e.to_string(),
        })
    }

    fn norm(&self, name: &str, dim: usize) -> Result<Vec<f32>, ModelError> {
        self.f32s(name, &[dim], &[DType::BF16, DType::F32])
    }

    fn f32_param(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.f32s(name, shape, &[DType::F32])
    }

    /// A linear `prefix.weight` (+ `prefix.scale` for fp8/MXFP4) of logical shape [out, in].
    fn linear(
        &self,
        prefix: &str,
        out: usize,
        inp: usize,
        expect: WeightFormat,
    ) -> Result<Linear, ModelError> {
        let wname = format!("{prefix}.weight");
        let (wshape, wdtype, sshape) = match expect {
            WeightFormat::F32 => (vec![out, inp], DType::F32, None),
            WeightFormat::Bf16 => (vec![out, inp], DType::BF16, None),
            WeightFormat::Fp8Block => (
                vec![out, inp],
                DType::F8E4M3,
                Some(vec![out.div_ceil(128), inp.div_ceil(128)]),
            ),
            WeightFormat::Mxfp4 => (vec![out, inp / 2], DType::I8, Some(vec![out, inp / 32])),
        };
        let (dtype, data) = self.raw(&wname, &wshape)?;
        if dtype != wdtype {
            return Err(ModelError::WrongDType {
                name: wname,
                expected: wdtype,
                found: dtype,
            });
        }
        let scale = match sshape {
            Some(s) => {
                let sname = format!("{prefix}.scale");
                let (sd, sdata) = self.raw(&sname, &s)?;
                if sd != DType::F8E8M0 {
                    return Err(ModelError::WrongDType {
                        name: sname,
                        expected: DType::F8E8M0,
                        found: sd,
                    });
                }
                sdata.into_owned()
            }
            None => Vec::new(),
        };
        Ok(Linear::new(
            prefix,
            out,
            inp,
            expect,
            data.into_owned(),
            scale,
        )?)
    }

    fn hc(
        &self,
        prefix: &str,
        n_out: usize,
        md: usize,
        n_scale: usize,
    ) -> Result<HcWeights, ModelError> {
        Ok(HcWeights {
            fn_w: self.f32_param(&format!("{prefix}_fn"), &[n_out, md])?,
            base: self.f32_param(&format!("{prefix}_base"), &[n_out])?,
            scale: self.f32_param(&format!("{prefix}_scale"), &[n_scale])?,
        })
    }

    fn compressor(
        &self,
        prefix: &str,
        cfg: &ModelConfig,
        ratio: usize,
        dim: usize,
    ) -> Result<CompressorWeights, ModelError> {
        let coff = if ratio == 4 { 2 } else { 1 };
        let d = cfg.hidden_size;
        Ok(CompressorWeights {
            wkv: self.linear(&format!("{prefix}.wkv"), coff * dim, d, WeightFormat::Bf16)?,
            wgate: self.linear(
                &format!("{prefix}.wgate"),
                coff * dim,
                d,
                WeightFormat::Bf16,
            )?,
            ape: self.f32_param(&format!("{prefix}.ape"), &[ratio, coff * dim])?,
            norm: self.norm(&format!("{prefix}.norm.weight"), dim)?,
            ratio,
            dim,
            coff,
        })
    }

    fn expert(
        &self,
        prefix: &str,
        d: usize,
        i: usize,
        fmt: WeightFormat,
    ) -> Result<ExpertWeights, ModelError> {
        Ok(ExpertWeights {
            w1: self.linear(&format!("{prefix}.w1"), i, d, fmt)?,
            w2: self.linear(&format!("{prefix}.w2"), d, i, fmt)?,
            w3: self.linear(&format!("{prefix}.w3"), i, d, fmt)?,
        })
    }

    fn block(
        &self,
        p: &str,
        cfg: &ModelConfig,
        ratio: usize,
        hash: bool,
    ) -> Result<BlockWeights, ModelError> {
        let (d, m) = (cfg.hidden_size, cfg.hc_mult);
        let (h, hd) = (cfg.num_attention_heads, cfg.head_dim);
        let (ql, og, ol) = (cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank);
        let fp8 = WeightFormat::Fp8Block;
        let wo_a = self.linear(&format!("{p}attn.wo_a"), og * ol, h * hd / og, fp8)?;
        let wo_a = (0..og)
            .map(|g| wo_a.rows(g * ol, ol))
            .collect::<Result<Vec<_>, _>>()?;
        let compressor = (ratio > 0)
            .then(|| self.compressor(&format!("{p}attn.compressor"), cfg, ratio, hd))
            .transpose()?;
        let indexer = if ratio == 4 {
            let (inh, id) = (cfg.index_n_heads, cfg.index_head_dim);
            Some(IndexerWeights {
                wq_b: self.linear(&format!("{p}attn.indexer.wq_b"), inh * id, ql, fp8)?,
                weights_proj: self.linear(
                    &format!("{p}attn.indexer.weights_proj"),
                    inh,
                    d,
                    WeightFormat::Bf16,
                )?,
                compressor: self.compressor(&format!("{p}attn.indexer.compressor"), cfg, 4, id)?,
            })
        } else {
            None
        };
        let attn = AttentionWeights {
            wq_a: self.linear(&format!("{p}attn.wq_a"), ql, d, fp8)?,
            q_norm: self.norm(&format!("{p}attn.q_norm.weight"), ql)?,
            wq_b: self.linear(&format!("{p}attn.wq_b"), h * hd, ql, fp8)?,
            wkv: self.linear(&format!("{p}attn.wkv"), hd, d, fp8)?,
            kv_norm: self.norm(&format!("{p}attn.kv_norm.weight"), hd)?,
            wo_a,
            wo_b: self.linear(&format!("{p}attn.wo_b"), d, og * ol, fp8)?,
            sink: self.f32_param(&format!("{p}attn.attn_sink"), &[h])?,
            compressor,
            indexer,
        };
        let (e, k, i) = (
            cfg.n_routed_experts,
            cfg.num_experts_per_tok,
            cfg.moe_intermediate_size,
        );
        let routing = if hash {
            let name = format!("{p}ffn.gate.tid2eid");
            let (dtype, data) = self.raw(&name, &[cfg.vocab_size, k])?;
            let ids = dsv4_core::tensor::decode_i64(dtype, &data).map_err(|_| {
                ModelError::WrongDType {
                    name: name.clone(),
                    expected: DType::I64,
                    found: dtype,
                }
            })?;
            if let Some(bad) = ids.iter().find(|&&x| x < 0 || x as usize >= e) {
                return Err(ModelError::ConfigInvalid {
                    field: name,
                    message: format!("expert id {bad} is outside 0..{e}"),
                });
            }
            Routing::Hash(ids)
        } else {
            Routing::Bias(self.f32_param(&format!("{p}ffn.gate.bias"), &[e])?)
        };
        let expert_fmt = WeightFormat::Mxfp4;
        let moe = MoeWeights {
            gate: self.linear(&format!("{p}ffn.gate"), e, d, WeightFormat::Bf16)?,
            routing,
            experts: (0..e)
                .map(|x| self.expert(&format!("{p}ffn.experts.{x}"), d, i, expert_fmt))
                .collect::<Result<_, _>>()?,
            shared: self.expert(
                &format!("{p}ffn.shared_experts"),
                d,
                i * cfg.n_shared_experts,
                fp8,
            )?,
        };
        let n_hc = (2 + m) * m;
        Ok(BlockWeights {
            ratio,
            attn_norm: self.norm(&format!("{p}attn_norm.weight"), d)?,
            ffn_norm: self.norm(&format!("{p}ffn_norm.weight"), d)?,
            hc_attn: self.hc(&format!("{p}hc_attn"), n_hc, m * d, 3)?,
            hc_ffn: self.hc(&format!("{p}hc_ffn"), n_hc, m * d, 3)?,
            attn,
            moe,
        })
    }
}

impl ModelWeights {
    /// Load and check every tensor the forward pass needs (names, dtypes, shapes of spec §2).
    pub fn load(cfg: &ModelConfig, src: &dyn TensorSource) -> Result<Self, ModelError> {
        let l = Loader { src };
        let (v, d, m) = (cfg.vocab_size, cfg.hidden_size, cfg.hc_mult);
        let embed = l.f32s("embed.weight", &[v, d], &[DType::BF16, DType::F32])?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                l.block(
                    &format!("layers.{i}."),
                    cfg,
                    cfg.compress_ratios[i],
                    i < cfg.num_hash_layers,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mtp = (0..cfg.num_nextn_predict_layers)
            .map(|k| {
                let p = format!("mtp.{k}.");
                let fp8 = WeightFormat::Fp8Block;
                Ok(MtpWeights {
                    e_proj: l.linear(&format!("{p}e_proj"), d, d, fp8)?,
                    h_proj: l.linear(&format!("{p}h_proj"), d, d, fp8)?,
                    enorm: l.norm(&format!("{p}enorm.weight"), d)?,
                    hnorm: l.norm(&format!("{p}hnorm.weight"), d)?,
                    norm: l.norm(&format!("{p}norm.weight"), d)?,
                    hc_head: l.hc(&format!("{p}hc_head"), m, m * d, 1)?,
                    block: l.block(
                        &p,
                        cfg,
                        cfg.compress_ratios[cfg.num_hidden_layers + k],
                        false,
                    )?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            embed,
            head: l.linear("head", v, d, WeightFormat::Bf16)?,
            norm: l.norm("norm.weight", d)?,
            hc_head: l.hc("hc_head", m, m * d, 1)?,
            layers,
            mtp,
        })
    }
}

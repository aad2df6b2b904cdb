//! The ops of a DSV4 step plan: what each launch of a [`dsv4_plan::Plan`] computes. The
//! executor interprets them with the backend's op set; their operands are the launch's
//! transient slices, in order (see [`OpKind`] for each op's operands).

use serde::Serialize;
use std::fmt;

/// Which block's weights and caches an op uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockRef {
    /// Main layer `i`.
    Main(usize),
    /// The MTP draft layer.
    Mtp,
}

impl BlockRef {
    /// The tap and plan scope prefix: "layers.3" or "mtp.0".
    pub fn scope(self) -> String {
        match self {
            BlockRef::Main(i) => format!("layers.{i}"),
            BlockRef::Mtp => "mtp.0".into(),
        }
    }
}

/// Which residual sublayer an mHC or norm op belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sub {
    /// Attention.
    Attn,
    /// MoE.
    Ffn,
}

/// Which compressor a compressor op runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Chain {
    /// The attention's compressor (C4/C128 KV entries).
    Attn,
    /// The lightning indexer's compressor (index-K rows).
    Indexer,
}

/// What a launch computes. Operands are listed as `[transient reads] → [transient writes]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum OpKind {
    /// `[] → [tokens]`, plus `[residual]` for MTP plans: copy the step's host inputs in.
    Upload,
    /// `[tokens] → [x]`: embedding rows repeated into hc_mult streams.
    Embed,
    /// `[tokens, residual] → [x]`: the MTP layer's input from the next tokens and the main
    /// model's final residual.
    MtpInput,
    /// `[] → [loc]`: this block's cache write locations (host-prepared) into the step.
    Locate,
    /// `[x] → [u, post, comb]`: mHC pre of a sublayer.
    HcPre(Sub),
    /// `[u] → [xn]`: the sublayer's RMSNorm.
    Norm(Sub),
    /// `[xn] → [cq]`: wq_a and q_norm.
    QA,
    /// `[cq] → [q]`: wq_b, per-head RMS, RoPE.
    QB,
    /// `[xn] → [kv]`: wkv, kv_norm, RoPE.
    Kv,
    /// `[kv, loc] → []`: SWA rows into the SWA pool (decode plans).
    SwaStore,
    /// `[xn] → [a, z]`: a compressor's projections plus ape.
    CompressorIn(Chain),
    /// `[a, z, loc] → []`: ring rows and finished entries into their pools.
    Compress(Chain),
    /// `[cq] → [qi]`: indexer queries (wq_b, RoPE, Hadamard, rounding).
    IndexerQ,
    /// `[xn] → [hw]`: indexer head weights.
    IndexerWeights,
    /// `[qi, hw] → [topk]`: indexer scores over index-K rows, top-k entry ids.
    IndexerTopk,
    /// `[q, (kv, loc when it stores), (topk)] → [o]`: sparse attention over the SWA window and
    /// compressed entries, inverse RoPE; stores each row's SWA entry first in prefill plans.
    Attention {
        /// Whether it writes the SWA rows itself (prefill plans).
        stores: bool,
    },
    /// `[o] → [ou]`: grouped wo_a.
    OutA,
    /// `[ou] → [y]`: wo_b.
    OutB,
    /// `[x, y, post, comb] → [x']`: mHC post of a sublayer.
    HcPost(Sub),
    /// `[xn, tokens] → [routes]`: router scores and expert choice (ids then weights).
    Router,
    /// `[xn] → [ys]`: the shared expert.
    SharedExpert,
    /// `[xn, routes] → [yr]`: the routed experts, summed in ascending expert order.
    RoutedExperts,
    /// `[yr, ys] → [y]`: routed plus shared.
    MoeSum,
    /// `[x] → [xs]`: the rows that need logits, gathered (prefill steps that need fewer rows'
    /// logits than they compute; the step names the rows).
    HeadRows,
    /// `[x] → [h]`: the head's stream merge.
    HcHead,
    /// `[h] → [hn]`: the final norm.
    FinalNorm,
    /// `[hn] → [logits]`: the head projection.
    Logits,
}

/// One launch's op: its kind and, for block ops, the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Op {
    /// What it computes.
    pub kind: OpKind,
    /// The block it belongs to (None for embedding, upload; the head of MTP plans uses Mtp).
    pub block: Option<BlockRef>,
}

impl OpKind {
    /// The op's short name in plans and hazard reports.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Upload => "upload",
            OpKind::Embed => "embed",
            OpKind::MtpInput => "mtp.input",
            OpKind::Locate => "locate",
            OpKind::HcPre(Sub::Attn) => "hc_attn_pre",
            OpKind::HcPre(Sub::Ffn) => "hc_ffn_pre",
            OpKind::Norm(Sub::Attn) => "attn_norm",
            OpKind::Norm(Sub::Ffn) => "ffn_norm",
            OpKind::QA => "attn.q_a",
            OpKind::QB => "attn.q",
            OpKind::Kv => "attn.kv",
            OpKind::SwaStore => "attn.swa_store",
            OpKind::CompressorIn(Chain::Attn) => "compressor.in",
            OpKind::CompressorIn(Chain::Indexer) => "indexer.compressor.in",
            OpKind::Compress(Chain::Attn) => "compressor.pool",
            OpKind::Compress(Chain::Indexer) => "indexer.compressor.pool",
            OpKind::IndexerQ => "indexer.q",
            OpKind::IndexerWeights => "indexer.weights",
            OpKind::IndexerTopk => "indexer.topk",
            OpKind::Attention { .. } => "attn.o",
            OpKind::OutA => "attn.wo_a",
            OpKind::OutB => "attn.out",
            OpKind::HcPost(Sub::Attn) => "hc_attn_post",
            OpKind::HcPost(Sub::Ffn) => "hc_ffn_post",
            OpKind::Router => "moe.router",
            OpKind::SharedExpert => "moe.shared",
            OpKind::RoutedExperts => "moe.experts",
            OpKind::MoeSum => "moe.out",
            OpKind::HeadRows => "head_rows",
            OpKind::HcHead => "hc_head",
            OpKind::FinalNorm => "norm",
            OpKind::Logits => "logits",
        }
    }

    /// The tap name observers see after this op (`dsv4 diff --model`), if it has one.
    pub fn tap(self) -> Option<&'static str> {
        match self {
            OpKind::Embed
            | OpKind::Norm(_)
            | OpKind::QB
            | OpKind::Kv
            | OpKind::IndexerQ
            | OpKind::IndexerWeights
            | OpKind::Attention { .. }
            | OpKind::OutB
            | OpKind::HcPost(_)
            | OpKind::MoeSum
            | OpKind::Logits => Some(self.name()),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.block {
            Some(b) => write!(f, "{} {}", b.scope(), self.kind.name()),
            None => f.write_str(self.kind.name()),
        }
    }
}

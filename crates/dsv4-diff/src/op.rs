//! The ops of the [`dsv4_kernels::Backend`] trait as the diff names them (one name per trait
//! method).

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// One op of the backend trait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `Backend::linear`.
    Linear,
    /// `Backend::act_quant_fp8`.
    ActQuantFp8,
    /// `Backend::rms_norm`.
    RmsNorm,
    /// `Backend::rope`.
    Rope,
    /// `Backend::mhc_pre`.
    MhcPre,
    /// `Backend::mhc_post`.
    MhcPost,
    /// `Backend::hc_head`.
    HcHead,
    /// `Backend::softmax_pool`.
    SoftmaxPool,
    /// `Backend::softmax_pool_rows`.
    SoftmaxPoolRows,
    /// `Backend::hadamard`.
    Hadamard,
    /// `Backend::indexer_scores`.
    IndexerScores,
    /// `Backend::indexer_scores_rows`.
    IndexerScoresRows,
    /// `Backend::topk`.
    Topk,
    /// `Backend::topk_rows`.
    TopkRows,
    /// `Backend::indexer_topk_rows`.
    IndexerTopkRows,
    /// `Backend::indexer_topk_ranges`.
    IndexerTopkRanges,
    /// `Backend::paged_indexer_topk_rows`.
    PagedIndexerTopkRows,
    /// `Backend::paged_indexer_topk_ranges`.
    PagedIndexerTopkRanges,
    /// `Backend::sparse_attention`.
    SparseAttention,
    /// `Backend::sparse_attention_rows`.
    SparseAttentionRows,
    /// `Backend::sparse_attention_indexed`.
    SparseAttentionIndexed,
    /// `Backend::paged_attention_rows`.
    PagedAttentionRows,
    /// `Backend::paged_attention_indexed`.
    PagedAttentionIndexed,
    /// `Backend::router_scores`.
    RouterScores,
    /// `Backend::swiglu`.
    Swiglu,
    /// `Backend::cache_store`.
    CacheStore,
    /// `Backend::cache_load`.
    CacheLoad,
    /// `Backend::cache_load_rows`.
    CacheLoadRows,
    /// `Backend::cache_encode_rows`.
    CacheEncodeRows,
    /// `Backend::round_index_rows`.
    RoundIndexRows,
}

impl Op {
    /// Every op, in trait order.
    pub const ALL: [Op; 30] = [
        Op::Linear,
        Op::ActQuantFp8,
        Op::RmsNorm,
        Op::Rope,
        Op::MhcPre,
        Op::MhcPost,
        Op::HcHead,
        Op::SoftmaxPool,
        Op::SoftmaxPoolRows,
        Op::Hadamard,
        Op::IndexerScores,
        Op::IndexerScoresRows,
        Op::Topk,
        Op::TopkRows,
        Op::IndexerTopkRows,
        Op::IndexerTopkRanges,
        Op::PagedIndexerTopkRows,
        Op::PagedIndexerTopkRanges,
        Op::SparseAttention,
        Op::SparseAttentionRows,
        Op::SparseAttentionIndexed,
        Op::PagedAttentionRows,
        Op::PagedAttentionIndexed,
        Op::RouterScores,
        Op::Swiglu,
        Op::CacheStore,
        Op::CacheLoad,
        Op::CacheLoadRows,
        Op::CacheEncodeRows,
        Op::RoundIndexRows,
    ];

    /// The trait method's name, as used by `-o`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Linear => "linear",
            Op::ActQuantFp8 => "act_quant_fp8",
            Op::RmsNorm => "rms_norm",
            Op::Rope => "rope",
            Op::MhcPre => "mhc_pre",
            Op::MhcPost => "mhc_post",
            Op::HcHead => "hc_head",
            Op::SoftmaxPool => "softmax_pool",
            Op::SoftmaxPoolRows => "softmax_pool_rows",
            Op::Hadamard => "hadamard",
            Op::IndexerScores => "indexer_scores",
            Op::IndexerScoresRows => "indexer_scores_rows",
            Op::Topk => "topk",
            Op::TopkRows => "topk_rows",
            Op::IndexerTopkRows => "indexer_topk_rows",
            Op::IndexerTopkRanges => "indexer_topk_ranges",
            Op::PagedIndexerTopkRows => "paged_indexer_topk_rows",
            Op::PagedIndexerTopkRanges => "paged_indexer_topk_ranges",
            Op::SparseAttention => "sparse_attention",
            Op::SparseAttentionRows => "sparse_attention_rows",
            Op::SparseAttentionIndexed => "sparse_attention_indexed",
            Op::PagedAttentionRows => "paged_attention_rows",
            Op::PagedAttentionIndexed => "paged_attention_indexed",
            Op::RouterScores => "router_scores",
            Op::Swiglu => "swiglu",
            Op::CacheStore => "cache_store",
            Op::CacheLoad => "cache_load",
            Op::CacheLoadRows => "cache_load_rows",
            Op::CacheEncodeRows => "cache_encode_rows",
            Op::RoundIndexRows => "round_index_rows",
        }
    }

    /// Every op name, comma-separated (for error messages).
    pub fn known() -> String {
        Op::ALL.map(Op::name).join(", ")
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Op::ALL
            .into_iter()
            .find(|op| op.name() == s)
            .ok_or_else(|| format!("unknown op `{s}` (ops: {})", Op::known()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_ops() {
        for op in Op::ALL {
            assert_eq!(op.name().parse::<Op>(), Ok(op));
            assert_eq!(serde_json::to_value(op).unwrap(), op.name());
        }
        let e = "rmsnorm".parse::<Op>().unwrap_err();
        assert!(
            e.contains("rms_norm") && e.contains("round_index_rows"),
            "{e}"
        );
    }
}

//! The forward pass (spec §3): a [`Model`] (config, weights, backend, numerics) runs tokens of a
//! [`SequenceState`] through embedding, mHC-wrapped attention and MoE blocks, and the head.
//! Prefill of T tokens and T single-token decode steps compute the same function.
//!
//! Every step runs through its plan: [`build`] makes the plan of the step (launches on streams
//! over buffers, `dsv4-plan`), `prepare` reserves the pages the step writes, and the executor
//! (`run`) interprets the launches with the backend's ops — eagerly with fresh buffers, or by
//! replaying a [`captured`] plan whose buffers sit in one verified arena.

mod attention;
pub mod build;
mod cached;
pub mod captured;
pub mod compressor;
mod dense;
pub mod exec;
mod gather;
mod moe;
mod moe_dev;
mod mtp;
pub mod op;
pub mod pages;
mod prepare;
pub mod resident;
mod resident_ops;
pub mod ring;
mod run;
pub mod state;
mod step;
mod taps;
mod threaded;
pub mod transfer;

use crate::weights::{BlockWeights, HcWeights, ModelWeights, TensorSource};
use crate::{ModelConfig, ModelError};
use captured::CaptureCache;
use dsv4_core::cache::{CacheLayoutError, INDEX_K_PAGE_ENTRIES, IndexKLayout, KvLayout};
use dsv4_core::{ActQuant, Numerics};
use dsv4_kernels::rope::Yarn;
use dsv4_kernels::{Backend, HcParams, Linear, RopeTable};
pub use exec::{ExecOptions, Executor, Fault, PageWrite, StepReport};
pub use mtp::MtpState;
use op::BlockRef;
use pages::CacheStores;
pub use resident_ops::host_last_order;
use ring::CompressorRing;
use state::{LayerState, ring_coff, ring_rows};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
pub use taps::{ChoiceControl, TapFn, Taps};

/// Why a forward call was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// A token id outside the vocabulary.
    #[error("token id {id} at index {index} is outside the vocabulary (vocab_size {vocab})")]
    InvalidToken {
        /// The id.
        id: u32,
        /// Its index in the input.
        index: usize,
        /// vocab_size.
        vocab: usize,
    },
    /// The sequence would pass max_position_embeddings.
    #[error("sequence would reach position {wanted}, beyond max_position_embeddings {max}")]
    ContextFull {
        /// Last position asked for (exclusive).
        wanted: usize,
        /// The model's limit.
        max: usize,
    },
    /// No tokens were given.
    #[error("forward needs at least one token")]
    Empty,
    /// A cache row could not be encoded or decoded.
    #[error("cache layout: {0}")]
    Cache(#[from] CacheLayoutError),
    /// A pooled cache store had no free page for a row.
    #[error(
        "cache pool `{pool}` has no free page; free requests or size the pools larger \
         (cache.max_total_tokens)"
    )]
    PoolExhausted {
        /// The pool's name.
        pool: String,
    },
    /// A plan could not be built, verified or executed.
    #[error("plan: {message}")]
    Plan {
        /// What went wrong and what to do.
        message: String,
    },
    /// A device-resident op failed (device memory, a binding limit, inconsistent buffers).
    #[error("device: {message}")]
    Device {
        /// What went wrong.
        message: String,
    },
    /// A pooled store was asked for a page it never took (a bug in the page bookkeeping).
    #[error("cache pool `{pool}`: page {index} was asked for but the store holds only {held}")]
    MissingPage {
        /// The pool's name.
        pool: String,
        /// The logical page asked for.
        index: usize,
        /// Pages held.
        held: usize,
    },
}

/// The indexer's selected compressed entries of each token of a call.
pub type Selections = Vec<Vec<u32>>;

/// The per-request state of one sequence: its position and every layer's caches.
#[derive(Debug, Clone)]
pub struct SequenceState {
    /// Tokens processed so far (the next token's position).
    pub pos: usize,
    /// Caches of the main layers.
    pub layers: Vec<LayerState>,
}

/// Which rows of a step the head computes logits for. The logits of a row do not depend on
/// which other rows the head computes (each is its own row of every head op).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogitRows<'a> {
    /// Every row of every sequence.
    #[default]
    All,
    /// The last `n[s]` rows of sequence `s` (0 ..= its tokens): a step that only samples
    /// needs each sequence's last row, one that scores a prompt the rows it scores. At
    /// DSV4's vocabulary a row's logits take 517 KB, so a prompt chunk of 8,192 tokens would
    /// otherwise compute and read back 4.2 GB.
    Last(&'a [usize]),
}

/// What a step reads back: the logits of some rows, and (for the MTP layer) every row's final
/// residual streams. A [`LogitRows`] alone reads the residual too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepOutputs<'a> {
    /// The rows whose logits the head computes.
    pub logits: LogitRows<'a>,
    /// Read back every row's final residual streams ([`ForwardOutput::residual`]; else it is
    /// empty). At DSV4-Flash's 4 × 4,096 streams a row's take 64 KB.
    pub residual: bool,
}

impl<'a> From<LogitRows<'a>> for StepOutputs<'a> {
    fn from(logits: LogitRows<'a>) -> Self {
        StepOutputs {
            logits,
            residual: true,
        }
    }
}

/// What a forward call returns.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// f32 logits, [rows, vocab]: of every token of the call, or of the sequence's last rows
    /// when the step asked for fewer ([`LogitRows::Last`]).
    pub logits: Vec<f32>,
    /// Vocabulary size (row width of `logits`).
    pub vocab: usize,
    /// For each ratio-4 layer: the indexer's selected compressed entries per token (ascending).
    pub topk: BTreeMap<usize, Vec<Vec<u32>>>,
    /// For each ratio-4 layer: each token's indexer scores over its entries `0..⌊(p+1)/4⌋`,
    /// when the call's [`ChoiceControl::record_scores`] asked for them (else empty).
    pub indexer_scores: BTreeMap<usize, Vec<Vec<f32>>>,
    /// For each main layer with biased routing: the router's own choice of experts per token
    /// (ascending ids), when the call's [`ChoiceControl::record_experts`] asked for it (else
    /// empty).
    pub experts: BTreeMap<usize, Vec<Vec<u32>>>,
    /// For each main layer with biased routing: each token's biased router scores (what the
    /// top-k ranks), when the call's [`ChoiceControl::record_scores`] asked for them (else empty).
    pub router_scores: BTreeMap<usize, Vec<Vec<f32>>>,
    /// The final residual streams, [T, M, D] (input of the MTP layer), when the step asked for
    /// them ([`StepOutputs::residual`]; else empty).
    pub residual: Vec<f32>,
}

/// A loaded model ready to run on one backend with fixed numerics.
pub struct Model {
    /// config.json.
    pub cfg: ModelConfig,
    /// Weights.
    pub weights: ModelWeights,
    /// Numerics knobs (spec §5).
    pub numerics: Numerics,
    backend: Arc<dyn Backend>,
    rope_plain: RopeTable,
    rope_compress: RopeTable,
    kv_layout: KvLayout,
    ik_layout: IndexKLayout,
    heap: CacheStores,
    exec: ExecOptions,
    captured: CaptureCache,
    steps: AtomicU64,
}

impl Model {
    /// Build a model from validated config and a tensor source.
    pub fn load(
        cfg: ModelConfig,
        src: &dyn TensorSource,
        backend: Arc<dyn Backend>,
        numerics: Numerics,
    ) -> Result<Self, ModelError> {
        let weights = ModelWeights::load(&cfg, src)?;
        Self::from_weights(cfg, weights, backend, numerics)
    }

    /// Assemble a model from already-loaded weights.
    pub fn from_weights(
        cfg: ModelConfig,
        weights: ModelWeights,
        backend: Arc<dyn Backend>,
        numerics: Numerics,
    ) -> Result<Self, ModelError> {
        let rd = cfg.qk_rope_head_dim;
        let rs = &cfg.rope_scaling;
        let yarn = Yarn {
            factor: rs.factor,
            original_max_position: rs.original_max_position_embeddings as f64,
            beta_fast: rs.beta_fast,
            beta_slow: rs.beta_slow,
        };
        let kv_layout = KvLayout::from_head_dims(
            numerics.kv_cache_dtype,
            cfg.head_dim,
            rd,
            state::KV_PAGE_ENTRIES,
        )?;
        let ik_layout = IndexKLayout::new(
            numerics.index_k_dtype,
            cfg.index_head_dim,
            INDEX_K_PAGE_ENTRIES,
        )?;
        let ring = |r: usize, d: usize| CompressorRing::page_bytes(ring_rows(r), ring_coff(r) * d);
        let heap = CacheStores::heap(
            kv_layout.page_bytes(),
            ik_layout.page_bytes(),
            [
                ring(4, cfg.head_dim),
                ring(128, cfg.head_dim),
                ring(4, cfg.index_head_dim),
            ],
        );
        Ok(Self {
            heap,
            exec: ExecOptions::default(),
            captured: Default::default(),
            steps: AtomicU64::new(0),
            kv_layout,
            ik_layout,
            rope_plain: RopeTable::plain(rd, cfg.rope_theta),
            rope_compress: RopeTable::yarn(rd, cfg.compress_rope_theta, yarn),
            cfg,
            weights,
            numerics,
            backend,
        })
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    fn eps(&self) -> f32 {
        self.cfg.rms_norm_eps as f32
    }

    /// Empty caches of a block of `ratio` in the model's own page stores.
    fn layer_state(&self, ratio: usize) -> LayerState {
        let c = &self.cfg;
        LayerState::new_in(
            ratio,
            c.head_dim,
            c.sliding_window,
            &self.kv_layout,
            &self.ik_layout,
            &self.heap,
        )
        .expect("heap page stores always have a free page")
    }

    /// A fresh sequence at position 0, its caches in the model's own growable page stores.
    pub fn new_sequence(&self) -> SequenceState {
        let layers = self
            .weights
            .layers
            .iter()
            .map(|b| self.layer_state(b.ratio))
            .collect();
        SequenceState { pos: 0, layers }
    }

    /// The model's own page stores (where [`Model::new_sequence`] keeps caches).
    pub fn heap_stores(&self) -> &CacheStores {
        &self.heap
    }

    /// The execution options `forward`, `forward_batch` and `mtp_forward` use.
    pub fn exec(&self) -> &ExecOptions {
        &self.exec
    }

    /// Set the execution options (captured plans already built for other options are kept).
    pub fn set_exec(&mut self, exec: ExecOptions) {
        self.exec = exec;
    }

    /// The weights of a block (a main layer, the MTP layer; None: the first layer).
    pub(crate) fn block_weights(&self, b: Option<BlockRef>) -> Result<&BlockWeights, ForwardError> {
        let w = match b {
            Some(BlockRef::Mtp) => self.weights.mtp.first().map(|m| &m.block),
            Some(BlockRef::Main(i)) => self.weights.layers.get(i),
            None => self.weights.layers.first(),
        };
        w.ok_or_else(|| ForwardError::Plan {
            message: format!(
                "{} has no weights; the plan was built for another config",
                b.map_or("the model".into(), BlockRef::scope)
            ),
        })
    }

    /// A fresh sequence at position 0 whose caches live in `stores` (an engine's pools); its
    /// compressor rings take their pages now, so this fails when a ring pool is full.
    pub fn new_sequence_in(&self, stores: &CacheStores) -> Result<SequenceState, ForwardError> {
        let c = &self.cfg;
        let layers = self
            .weights
            .layers
            .iter()
            .map(|b| {
                LayerState::new_in(
                    b.ratio,
                    c.head_dim,
                    c.sliding_window,
                    &self.kv_layout,
                    &self.ik_layout,
                    stores,
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(SequenceState { pos: 0, layers })
    }

    /// The byte layout of SWA/C4/C128 KV entries (pages of [`state::KV_PAGE_ENTRIES`]).
    pub fn kv_layout(&self) -> &KvLayout {
        &self.kv_layout
    }

    /// The byte layout of index-K rows.
    pub fn index_k_layout(&self) -> &IndexKLayout {
        &self.ik_layout
    }

    /// Compress ratio of each main layer (0, 4 or 128).
    pub fn layer_ratios(&self) -> Vec<usize> {
        self.weights.layers.iter().map(|b| b.ratio).collect()
    }

    /// `W·x` for `rows` rows, quantizing the input per 1×128 block first when `act_quant = fp8`
    /// and the weight is fp8/fp4 (spec §5).
    fn project(&self, w: &Linear, x: &[f32], rows: usize) -> Vec<f32> {
        let mut out = vec![0f32; rows * w.out_dim];
        if self.numerics.act_quant == ActQuant::Fp8 && w.format.is_low_precision() {
            let mut xq = x.to_vec();
            self.backend.act_quant_fp8(&mut xq, w.in_dim);
            self.backend.linear(w, &xq, rows, &mut out);
        } else {
            self.backend.linear(w, x, rows, &mut out);
        }
        out
    }

    fn hc_params<'w>(&self, hc: &'w HcWeights) -> HcParams<'w> {
        HcParams {
            fn_w: &hc.fn_w,
            base: &hc.base,
            scale: &hc.scale,
            m: self.cfg.hc_mult,
            d: self.cfg.hidden_size,
            norm_eps: self.eps(),
            hc_eps: self.cfg.hc_eps as f32,
            sinkhorn_iters: self.cfg.hc_sinkhorn_iters,
        }
    }

    fn check_tokens(&self, st_pos: usize, tokens: &[u32]) -> Result<Vec<usize>, ForwardError> {
        if tokens.is_empty() {
            return Err(ForwardError::Empty);
        }
        let vocab = self.cfg.vocab_size;
        if let Some((index, &id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= vocab)
        {
            return Err(ForwardError::InvalidToken { id, index, vocab });
        }
        let end = st_pos + tokens.len();
        if end > self.cfg.max_position_embeddings {
            return Err(ForwardError::ContextFull {
                wanted: end,
                max: self.cfg.max_position_embeddings,
            });
        }
        Ok((st_pos..end).collect())
    }

    /// Run `tokens` (a prefill chunk, or one decode token) through the model, advancing `st`.
    pub fn forward(
        &self,
        st: &mut SequenceState,
        tokens: &[u32],
    ) -> Result<ForwardOutput, ForwardError> {
        self.forward_with_taps(st, tokens, &mut Taps::none())
    }

    /// [`Model::forward`] with an observer of every intermediate activation.
    pub fn forward_with_taps(
        &self,
        st: &mut SequenceState,
        tokens: &[u32],
        taps: &mut Taps<'_>,
    ) -> Result<ForwardOutput, ForwardError> {
        let mut out = self.forward_batch_with_taps(&mut [st], &[tokens], taps)?;
        Ok(out.pop().expect("one output per sequence"))
    }

    /// Run several sequences in one step: `tokens[s]` continues `seqs[s]`. The rows of all
    /// sequences share every projection; each row only ever reads its own sequence's caches, so
    /// each output equals what the sequence would get alone. Nothing is changed when the input
    /// is refused; a pooled store running out of pages mid-step leaves the sequences partly
    /// advanced (drop them).
    pub fn forward_batch(
        &self,
        seqs: &mut [&mut SequenceState],
        tokens: &[&[u32]],
    ) -> Result<Vec<ForwardOutput>, ForwardError> {
        self.forward_batch_with_taps(seqs, tokens, &mut Taps::none())
    }

    /// [`Model::forward_batch`] with an observer of every intermediate activation.
    pub fn forward_batch_with_taps(
        &self,
        seqs: &mut [&mut SequenceState],
        tokens: &[&[u32]],
        taps: &mut Taps<'_>,
    ) -> Result<Vec<ForwardOutput>, ForwardError> {
        let exec = self.exec.clone();
        self.forward_step(seqs, tokens, LogitRows::All, &exec, taps)
            .map(|(o, _)| o)
    }
}

#[cfg(test)]
mod tests;

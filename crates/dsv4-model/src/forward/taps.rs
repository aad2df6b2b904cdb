//! What `dsv4 diff --model` asks of a forward call besides its result: an observer of the
//! intermediate activations ([`Taps`]) and control over the indexer's discrete choice
//! ([`IndexerControl`]): its scores reported, and its selections pinned to another run's.

use super::Selections;
use std::collections::BTreeMap;

/// Where a tap sits: layer prefix (e.g. "layers.2." or "mtp.0.", "" for globals) and op name.
pub type TapFn<'a> = dyn FnMut(&str, &str, &[f32]) + 'a;

/// Control over the indexer of the ratio-4 main layers, for comparing two runs.
///
/// A top-k over near-tied scores may legitimately choose differently on two backends (their
/// sums round differently), and one different entry changes the attention of that token and,
/// through the caches, of every later one. Pinning the candidate's attention to the oracle's
/// selections keeps the two runs comparable tap by tap after such a flip; the candidate's own
/// choice is still what [`super::ForwardOutput::topk`] reports, so the flip itself is judged
/// (against the oracle's scores) rather than hidden.
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexerControl<'a> {
    /// Report each token's scores over its entries in [`super::ForwardOutput::indexer_scores`]
    /// (the selection is then the backend's `topk_rows` of exactly those scores).
    pub record_scores: bool,
    /// Attend over these selections instead of the indexer's own: per ratio-4 main layer, one
    /// set of entry ids per token of the step (all sequences' tokens in order). A layer not in
    /// the map attends over its own selection.
    pub pinned: Option<&'a BTreeMap<usize, Selections>>,
}

/// An optional observer of intermediate activations, and the indexer's control (for `dsv4
/// diff --model`).
#[derive(Default)]
pub struct Taps<'a> {
    observer: Option<&'a mut TapFn<'a>>,
    /// The indexer's control during the call.
    pub indexer: IndexerControl<'a>,
}

impl<'a> Taps<'a> {
    /// No observer, no control.
    pub fn none() -> Self {
        Taps::default()
    }

    /// Call `f(layer, op, values)` after every op.
    pub fn new(f: &'a mut TapFn<'a>) -> Self {
        Taps {
            observer: Some(f),
            indexer: IndexerControl::default(),
        }
    }

    /// The same observer with the indexer under `control`.
    pub fn with_indexer(self, control: IndexerControl<'a>) -> Self {
        Taps {
            indexer: control,
            ..self
        }
    }

    pub(super) fn record(&mut self, layer: &str, op: &str, values: &[f32]) {
        if let Some(f) = self.observer.as_mut() {
            f(layer, op, values);
        }
    }

    pub(super) fn active(&self) -> bool {
        self.observer.is_some()
    }
}

//! What `dsv4 diff --model` asks of a forward call besides its result: an observer of the
//! intermediate activations ([`Taps`]) and control over the discrete choices ([`ChoiceControl`]:
//! the indexer's and the router's top-k): their scores reported, their choices pinned to another
//! run's.

use super::Selections;
use std::collections::BTreeMap;

/// Where a tap sits: layer prefix (e.g. "layers.2." or "mtp.0.", "" for globals) and op name.
pub type TapFn<'a> = dyn FnMut(&str, &str, &[f32]) + 'a;

/// Control over the model's discrete choices — the indexer's top-k of the ratio-4 main layers
/// and the router's biased top-k of the main layers that do not hash-route — for comparing two
/// runs.
///
/// A top-k over near-tied scores may legitimately choose differently on two backends (their
/// sums round differently), and one different entry or expert changes that token's output and,
/// through the caches, every later token's. Pinning the candidate to the oracle's choices keeps
/// the two runs comparable tap by tap after such a flip; the candidate's own choices are still
/// what [`super::ForwardOutput::topk`] and [`super::ForwardOutput::experts`] report, so each
/// flip itself is judged (against the oracle's scores) rather than hidden.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChoiceControl<'a> {
    /// Report the scores each choice ranked: [`super::ForwardOutput::indexer_scores`] and
    /// [`super::ForwardOutput::router_scores`] (the indexer's selection is then the backend's
    /// `topk_rows` of exactly those scores, as the router's always is).
    pub record_scores: bool,
    /// Report the router's own choice of experts per biased-routing main layer
    /// ([`super::ForwardOutput::experts`]); a device that routes on the device then reads each
    /// such layer's routes back.
    pub record_experts: bool,
    /// Attend over these selections instead of the indexer's own: per ratio-4 main layer, one
    /// set of entry ids per token of the step (all sequences' tokens in order). A layer not in
    /// the map attends over its own selection.
    pub pinned: Option<&'a BTreeMap<usize, Selections>>,
    /// Route to these experts instead of the router's own top-k: per biased-routing main layer,
    /// k distinct expert ids per token of the step; their weights come from this run's own
    /// scores of those experts. A layer not in the map routes by its own choice.
    pub pinned_experts: Option<&'a BTreeMap<usize, Selections>>,
}

/// An optional observer of intermediate activations, and the control of the discrete choices
/// (for `dsv4 diff --model`).
#[derive(Default)]
pub struct Taps<'a> {
    observer: Option<&'a mut TapFn<'a>>,
    /// The control of the discrete choices during the call.
    pub choices: ChoiceControl<'a>,
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
            choices: ChoiceControl::default(),
        }
    }

    /// The same observer with the discrete choices under `control`.
    pub fn with_choices(self, control: ChoiceControl<'a>) -> Self {
        Taps {
            choices: control,
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

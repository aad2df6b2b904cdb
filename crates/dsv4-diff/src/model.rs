//! `--model` mode: both sides load their model, run the same prefill and decode steps with a tap
//! after every op of every layer, and the taps are compared in execution order. The report names
//! the first tap above its tolerance and summarizes the final logits and the indexer selections.
//! The candidate's discrete choices (indexer selections, router experts) are judged against the
//! oracle's scores ([`crate::selection`]) and, by default, the candidate follows the oracle's
//! choices, so a near-tie broken the other way does not make the rest of the run incomparable.
//! Two sides with the same backend and numerics (only the execution mode differs) must agree
//! bitwise: every tap's tolerance is then 0.

use crate::DiffError;
use crate::metrics::{self, LogitsStats};
use crate::progress::Progress;
use crate::report::{ChoiceAgreement, ModelReport, TapDiff};
use crate::selection::{INDEXER_INPUT, LayerTally, ROUTER_INPUT, Verdict, judge, score_slack};
use crate::side::Side;
use crate::tolerance::{MIN_CHOICE_AGREEMENT, Metric, coarse_rounding, tap_tolerance};
use dsv4_core::Numerics;
use dsv4_core::SplitMix64;
use dsv4_kernels::DeviceStats;
use dsv4_model::forward::{ChoiceControl, Taps};
use dsv4_model::{ForwardOutput, Model, SequenceState, load_model};
use std::collections::BTreeMap;

/// What `--model` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelOptions {
    /// Tokens of the prefill call (at least 1).
    pub prefill: usize,
    /// Single-token decode calls after it.
    pub decode: usize,
    /// Seed of the token ids.
    pub seed: u64,
    /// The candidate follows the oracle's discrete choices — attends over its indexer
    /// selections, routes to its experts — while its own are judged against the oracle's
    /// scores, so a near-tie broken the other way does not make every later tap incomparable.
    pub pin_selections: bool,
    /// A progress bar on stderr (when it is a terminal).
    pub progress: bool,
    /// Other sequences sharing each of the candidate's steps (its rows are compared with the
    /// oracle's run of the sequence alone): batch invariance through the model. Choices are not
    /// pinned then.
    pub neighbours: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            prefill: 64,
            decode: 4,
            seed: 0,
            pin_selections: true,
            progress: false,
            neighbours: 0,
        }
    }
}

/// One recorded tap of the oracle.
struct Tap {
    layer: String,
    op: String,
    values: Vec<f32>,
}

/// Running comparison state of the candidate's taps of one call against the oracle's.
struct TapCompare<'r> {
    call: String,
    exact: bool,
    tokens: usize,
    numerics: (Numerics, Numerics),
    oracle: &'r [Tap],
    next: usize,
    diffs: Vec<TapDiff>,
    structure_error: Option<String>,
}

impl TapCompare<'_> {
    fn observe(&mut self, layer: &str, op: &str, values: &[f32]) {
        if self.structure_error.is_some() {
            return;
        }
        let index = self.next;
        self.next += 1;
        let Some(o) = self.oracle.get(index) else {
            self.structure_error = Some(format!(
                "{}: the candidate has tap #{index} ({layer}{op}) beyond the oracle's {}",
                self.call,
                self.oracle.len()
            ));
            return;
        };
        if o.layer != layer || o.op != op || o.values.len() != values.len() {
            self.structure_error = Some(format!(
                "{}: tap #{index} is {}{} [{}] on the oracle but {layer}{op} [{}] on the candidate",
                self.call,
                o.layer,
                o.op,
                o.values.len(),
                values.len()
            ));
            return;
        }
        let nmse = metrics::nmse(&o.values, values);
        let (a, b) = &self.numerics;
        let tolerance = if self.exact {
            0.0
        } else {
            tap_tolerance(op, coarse_rounding(op, a, b))
        };
        // Per-token rows: a flip touches a few rows, a systematic error all of them.
        let rows = if self.tokens > 0 && values.len().is_multiple_of(self.tokens) {
            self.tokens
        } else {
            1
        };
        let width = values.len() / rows.max(1);
        let rows_over = if width == 0 {
            0
        } else {
            o.values
                .chunks(width)
                .zip(values.chunks(width))
                .filter(|(x, y)| !Metric::Nmse.passes(metrics::nmse(x, y), tolerance))
                .count()
        };
        self.diffs.push(TapDiff {
            call: self.call.clone(),
            index,
            layer: layer.to_string(),
            op: op.to_string(),
            len: values.len(),
            nmse,
            max_abs: metrics::max_abs_diff(&o.values, values),
            tolerance,
            rows,
            rows_over,
            passed: Metric::Nmse.passes(nmse, tolerance),
        });
    }
}

fn load(side: &Side, role: &'static str) -> Result<Model, DiffError> {
    let mut m = load_model(
        &side.config.model,
        side.backend.clone(),
        side.config.numerics,
    )
    .map_err(|source| DiffError::Model { side: role, source })?;
    m.set_exec(side.config.exec.clone());
    Ok(m)
}

/// Whether the two sides must agree bitwise: the same backend with the same numerics (only
/// the execution differs — captured or eager plans, streams — which must never change a bit).
pub fn exact(oracle: &Side, candidate: &Side) -> bool {
    oracle.config.backend == candidate.config.backend
        && oracle.config.numerics == candidate.config.numerics
}

/// One step of `seqs` (`tokens[s]` continuing `seqs[s]`) with taps; the first sequence's
/// output.
fn forward(
    model: &Model,
    seqs: &mut [&mut SequenceState],
    tokens: &[&[u32]],
    role: &'static str,
    choices: ChoiceControl<'_>,
    tap: &mut dyn FnMut(&str, &str, &[f32]),
) -> Result<ForwardOutput, DiffError> {
    let mut f = |l: &str, o: &str, v: &[f32]| tap(l, o, v);
    let mut taps = Taps::new(&mut f).with_choices(choices);
    let outs = model
        .forward_batch_with_taps(seqs, tokens, &mut taps)
        .map_err(|source| DiffError::Forward { side: role, source })?;
    outs.into_iter().next().ok_or(DiffError::Forward {
        side: role,
        source: dsv4_model::ForwardError::Empty,
    })
}

/// The first `rows` of a tap over a step of `total` rows (a tap holds one row per token of the
/// step, sequences in order); the whole tap when its length does not divide into rows, so the
/// comparison reports the sizes.
fn first_rows(v: &[f32], rows: usize, total: usize) -> &[f32] {
    if total == 0 || !v.len().is_multiple_of(total) {
        return v;
    }
    &v[..v.len() / total * rows]
}

/// The token ids of the candidate's other sequences ([`ModelOptions::neighbours`]): neighbour
/// j prefills `max(1, prefill·(2 + j)/3)` tokens (shorter and longer prompts than the probe's),
/// then decodes one token per decode call.
fn neighbour_tokens(opts: &ModelOptions, vocab: u64) -> Vec<(usize, Vec<u32>)> {
    let mut rng = SplitMix64::for_name(opts.seed, "dsv4-diff/model/neighbours");
    (0..opts.neighbours)
        .map(|j| {
            let prefill = (opts.prefill * (2 + j) / 3).max(1);
            let ids = (0..prefill + opts.decode)
                .map(|_| rng.below(vocab) as u32)
                .collect();
            (prefill, ids)
        })
        .collect()
}

/// Per layer, per token: a choice (entry or expert ids).
type Choices = BTreeMap<usize, Vec<Vec<u32>>>;

/// Judge the candidate's choices of one kind in a call (its tokens from `first`) against the
/// oracle's, over the oracle's `scores`, into the per-layer tallies.
fn agree(
    acc: &mut BTreeMap<usize, LayerTally>,
    (oracle, scores, cand): (&Choices, &BTreeMap<usize, Vec<Vec<f32>>>, &Choices),
    first: usize,
    slack: f64,
) {
    for (layer, sel) in oracle {
        let tally = acc.entry(*layer).or_default();
        let scores = scores.get(layer);
        for (t, s) in sel.iter().enumerate() {
            let verdict = match (cand.get(layer).and_then(|c| c.get(t)), scores) {
                (None, _) => Verdict::Differs("the candidate reports no choice".into()),
                (Some(cs), Some(sc)) => judge(s, cs, &sc[t], slack),
                (Some(cs), None) if metrics::same_set(s, cs) => Verdict::Same,
                (Some(_), None) => Verdict::Differs("the oracle reported no scores".into()),
            };
            tally.add(first + t, verdict);
        }
    }
}

/// How far past its tolerance a tap is (value / tolerance; ∞ for any error at tolerance 0).
fn severity(t: &TapDiff) -> f64 {
    if t.nmse.is_nan() {
        f64::INFINITY
    } else if t.tolerance > 0.0 {
        t.nmse / t.tolerance
    } else if t.nmse > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// Run the prefill and decode calls on both sides and compare them tap by tap.
pub fn run_model(
    oracle: &Side,
    candidate: &Side,
    opts: &ModelOptions,
) -> Result<ModelReport, DiffError> {
    if opts.prefill == 0 {
        return Err(DiffError::InvalidOption {
            what: "prefill",
            message: "the prefill needs at least one token".into(),
        });
    }
    let (mo, mc) = (load(oracle, "oracle")?, load(candidate, "candidate")?);
    let vocab = mo.cfg.vocab_size.min(mc.cfg.vocab_size) as u64;
    if vocab == 0 {
        return Err(DiffError::InvalidOption {
            what: "model",
            message: "a side's model has an empty vocabulary; check its config.json".into(),
        });
    }
    let positions = mo
        .cfg
        .max_position_embeddings
        .min(mc.cfg.max_position_embeddings);
    if opts.prefill.saturating_add(opts.decode) > positions {
        return Err(DiffError::InvalidOption {
            what: "decode",
            message: format!(
                "{} prefill tokens and {} decode steps reach position {}, beyond the model's \
                 max_position_embeddings {positions}; lower --tokens or --decode",
                opts.prefill,
                opts.decode,
                opts.prefill.saturating_add(opts.decode)
            ),
        });
    }
    let mut rng = SplitMix64::for_name(opts.seed, "dsv4-diff/model/tokens");
    let tokens: Vec<u32> = (0..opts.prefill + opts.decode)
        .map(|_| rng.below(vocab) as u32)
        .collect();
    let mut calls: Vec<&[u32]> = vec![&tokens[..opts.prefill]];
    calls.extend(tokens[opts.prefill..].chunks(1));

    let (mut so, mut sc) = (mo.new_sequence(), mc.new_sequence());
    let neighbours = neighbour_tokens(opts, vocab);
    let mut others: Vec<SequenceState> = neighbours.iter().map(|_| mc.new_sequence()).collect();
    // Pins name every row of the step; with neighbours the oracle has only the probe's.
    let pin_choices = opts.pin_selections && opts.neighbours == 0;
    let (mut taps, mut structure_error) = (Vec::new(), None);
    let (mut lo, mut lc) = (Vec::new(), Vec::new());
    let (mut indexer, mut router) = (BTreeMap::new(), BTreeMap::new());
    let slack = |input| {
        score_slack(
            exact(oracle, candidate),
            input,
            &oracle.config.numerics,
            &candidate.config.numerics,
        )
    };
    let (indexer_slack, router_slack) = (slack(INDEXER_INPUT), slack(ROUTER_INPUT));
    let mut first_token = 0;
    let mut candidate_device: Option<DeviceStats> = None;
    let progress = Progress::new(opts.progress, 2 * calls.len(), "forward calls");
    for (ci, chunk) in calls.iter().enumerate() {
        let call = if ci == 0 {
            "prefill".to_string()
        } else {
            format!("decode {ci}")
        };
        let mut recorded = Vec::new();
        let record = ChoiceControl {
            record_scores: true,
            record_experts: true,
            ..ChoiceControl::default()
        };
        let tokens = match chunk.len() {
            1 => String::new(),
            n => format!(" ({n} tokens)"),
        };
        progress.start(format!("oracle {call}{tokens}"));
        let out_o = forward(
            &mo,
            &mut [&mut so],
            &[chunk],
            "oracle",
            record,
            &mut |l, o, v| {
                recorded.push(Tap {
                    layer: l.to_string(),
                    op: o.to_string(),
                    values: v.to_vec(),
                })
            },
        )?;
        progress.done();
        let mut cmp = TapCompare {
            call: call.clone(),
            exact: exact(oracle, candidate),
            tokens: chunk.len(),
            numerics: (oracle.config.numerics, candidate.config.numerics),
            oracle: &recorded,
            next: 0,
            diffs: Vec::new(),
            structure_error: None,
        };
        let dev = candidate.backend.device();
        let before = dev.map(|d| d.stats());
        let pin = ChoiceControl {
            record_scores: false,
            record_experts: true,
            pinned: pin_choices.then_some(&out_o.topk),
            pinned_experts: pin_choices.then_some(&out_o.experts),
        };
        // The probe first, then the neighbours' rows of this call.
        let mut step_tokens: Vec<&[u32]> = vec![chunk];
        step_tokens.extend(neighbours.iter().map(|(prefill, ids)| match ci {
            0 => &ids[..*prefill],
            _ => &ids[prefill + ci - 1..prefill + ci],
        }));
        let total: usize = step_tokens.iter().map(|t| t.len()).sum();
        let mut seqs: Vec<&mut SequenceState> = vec![&mut sc];
        seqs.extend(others.iter_mut());
        let with = match opts.neighbours {
            0 => String::new(),
            n => format!(", with {}", crate::modes::others(n)),
        };
        progress.start(format!("candidate {call}{tokens}{with}"));
        let out_c = forward(
            &mc,
            &mut seqs,
            &step_tokens,
            "candidate",
            pin,
            &mut |l, o, v| cmp.observe(l, o, first_rows(v, chunk.len(), total)),
        )?;
        progress.done();
        if let (Some(d), Some(b)) = (dev, before) {
            let spent = d.stats().since(&b);
            let total = candidate_device.get_or_insert_with(DeviceStats::default);
            *total = total.zip(&spent, |x, y| x + y);
        }
        if cmp.structure_error.is_none() && cmp.next != recorded.len() {
            cmp.structure_error = Some(format!(
                "{call}: the candidate made {} taps, the oracle {}",
                cmp.next,
                recorded.len()
            ));
        }
        if out_o.vocab != out_c.vocab && cmp.structure_error.is_none() {
            cmp.structure_error = Some(format!(
                "vocabularies differ: {} vs {}",
                out_o.vocab, out_c.vocab
            ));
        }
        taps.extend(cmp.diffs);
        if structure_error.is_none() {
            structure_error = cmp.structure_error;
        }
        lo.extend_from_slice(&out_o.logits);
        lc.extend_from_slice(&out_c.logits);
        let indexer_choices = (&out_o.topk, &out_o.indexer_scores, &out_c.topk);
        agree(&mut indexer, indexer_choices, first_token, indexer_slack);
        let router_choices = (&out_o.experts, &out_o.router_scores, &out_c.experts);
        agree(&mut router, router_choices, first_token, router_slack);
        first_token += chunk.len();
    }
    let logits: LogitsStats = metrics::logits_stats(&lo, &lc, mo.cfg.vocab_size);
    let finish = |tallies: BTreeMap<usize, LayerTally>| -> Vec<ChoiceAgreement> {
        tallies
            .into_iter()
            .map(|(layer, tally)| tally.finish(layer))
            .collect()
    };
    let (indexer, router) = (finish(indexer), finish(router));
    let first_divergence = taps.iter().find(|t| !t.passed).cloned();
    let mut worst = taps.clone();
    worst.sort_by(|a, b| severity(b).total_cmp(&severity(a)));
    worst.truncate(10);
    let passed = first_divergence.is_none()
        && structure_error.is_none()
        && indexer
            .iter()
            .chain(&router)
            .all(|a| a.rate >= MIN_CHOICE_AGREEMENT);
    Ok(ModelReport {
        prefill_tokens: opts.prefill,
        decode_steps: opts.decode,
        seed: opts.seed,
        first_divergence,
        structure_error,
        logits,
        indexer,
        router,
        pinned: pin_choices,
        neighbours: opts.neighbours,
        worst_taps: worst,
        taps,
        candidate_device,
        passed,
    })
}

//! One step through its plan: validate the inputs, pick the plan (a captured decode plan for
//! the batch's bucket, or an eager plan of the step's rows), reserve the pages the step
//! writes, bind the inputs, run the launches with the chosen executor, read the results.

use super::build::{PlanSpec, StepKind, build_plan_under};
use super::exec::{ExecOptions, Executor, Fault, StepReport};
use super::op::{BlockRef, Op};
use super::prepare::{SeqRows, prepare};
use super::resident::{DeviceMemory, GraphSpan};
use super::resident_ops::host_last_order;
use super::run::{Bound, BoundBlock, Gathered, Memory, Run, plan_rows};
use super::threaded::run_threaded;
use super::{
    ChoiceControl, ForwardError, ForwardOutput, LogitRows, Model, SequenceState, StepOutputs, Taps,
};
use dsv4_plan::Plan;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

/// Run `run`'s launches with `executor`; `device_order` is the plan's host-last order when
/// it was computed ahead (a captured plan's).
fn execute(
    model: &Model,
    run: &Run<'_>,
    executor: Executor,
    device_order: Option<&[usize]>,
) -> Result<(), ForwardError> {
    let plan_err = |e: dsv4_plan::PlanError| ForwardError::Plan {
        message: e.to_string(),
    };
    let result = match executor {
        // On a device, the host launches run as late as their readers allow, so a run of them
        // reads its operands back in one wait (the plan and its taps keep their order).
        Executor::Serial if matches!(run.mem, Memory::Device(_)) => match device_order {
            Some(order) => run.run_in(order),
            None => host_last_order(run.plan)
                .map_err(plan_err)
                .and_then(|order| run.run_in(&order)),
        },
        Executor::Serial => run.run_in(&dsv4_plan::serial(run.plan)),
        Executor::Interleaved { seed } => {
            let step = model.steps.fetch_add(1, Ordering::Relaxed);
            let seed = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            dsv4_plan::interleaved(run.plan, seed)
                .map_err(plan_err)
                .and_then(|order| run.run_in(&order))
        }
        Executor::Threaded => run_threaded(run),
    };
    run.finish_streams(result)
}

/// What a mutex holds, leaving the default there.
fn take<T: Default>(m: &Mutex<T>) -> T {
    std::mem::take(&mut *m.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Rows `start .. start + n` of each layer's per-row records.
fn rows_of<T: Clone>(
    m: &BTreeMap<usize, Vec<T>>,
    start: usize,
    n: usize,
) -> BTreeMap<usize, Vec<T>> {
    m.iter()
        .map(|(l, rows)| (*l, rows[start..start + n].to_vec()))
        .collect()
}

/// Emit the recorded taps in issue order.
fn emit_taps(plan: &Plan<Op>, out: &Gathered, taps: &mut Taps<'_>) {
    let Some(rec) = &out.taps else {
        return;
    };
    let rec = rec.lock().unwrap_or_else(|e| e.into_inner());
    for (l, v) in plan.launches.iter().zip(rec.iter()) {
        if let (Some(v), Some(name)) = (v, l.op.kind.tap()) {
            let layer =
                l.op.block
                    .map_or(String::new(), |b| format!("{}.", b.scope()));
            taps.record(&layer, name, v);
        }
    }
}

/// The buffer the host reads the final residual streams from (the one host-read buffer of a
/// main-model plan besides its logits).
fn final_residual(plan: &Plan<Op>) -> Option<(String, String)> {
    let b = plan
        .buffers
        .iter()
        .find(|b| b.host_read && !(b.name == "logits" && b.scope.is_empty()))?;
    Some((b.name.clone(), b.scope.clone()))
}

/// Which rows of a step's logits each sequence gets: `(first row in the logits buffer,
/// rows)` per sequence, and the runs of step rows the head gathers (None: every row).
struct HeadRows {
    per_seq: Vec<(usize, usize)>,
    gather: Option<Vec<(usize, usize)>>,
}

impl HeadRows {
    /// The head's rows for `want` over sequences of `lens` tokens each; without `may_gather`
    /// (a captured plan) it computes every row and each sequence takes its own.
    fn plan(want: LogitRows<'_>, lens: &[usize], may_gather: bool) -> Result<Self, ForwardError> {
        let want: &[usize] = match want {
            LogitRows::All => lens,
            LogitRows::Last(want) => want,
        };
        if want.len() != lens.len() {
            return Err(ForwardError::Plan {
                message: format!(
                    "a step of {} sequences was asked for the logits of {} sequences; give one \
                     count per sequence",
                    lens.len(),
                    want.len()
                ),
            });
        }
        if let Some(s) = (0..lens.len()).find(|&s| want[s] > lens[s]) {
            return Err(ForwardError::Plan {
                message: format!(
                    "sequence {s} runs {} tokens but was asked for the logits of its last {}",
                    lens[s], want[s]
                ),
            });
        }
        let t: usize = lens.iter().sum();
        let total: usize = want.iter().sum();
        let (mut runs, mut per_seq) = (Vec::<(usize, usize)>::new(), Vec::new());
        let (mut start, mut at) = (0, 0);
        for (&n, &k) in lens.iter().zip(want) {
            let first = start + n - k;
            start += n;
            if !may_gather || total == t {
                per_seq.push((first, k));
                continue;
            }
            per_seq.push((at, k));
            at += k;
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == first => r.1 += k,
                _ if k > 0 => runs.push((first, k)),
                _ => {}
            }
        }
        let gather = (may_gather && total < t).then_some(runs);
        Ok(HeadRows { per_seq, gather })
    }

    /// Rows the head computes.
    fn rows(&self, t: usize) -> usize {
        self.gather
            .as_ref()
            .map_or(t, |runs| runs.iter().map(|r| r.1).sum())
    }
}

impl Model {
    /// The device op set a step under `exec` keeps its activations in, if any.
    fn device_for(&self, exec: &ExecOptions) -> Option<&dyn dsv4_kernels::DeviceOps> {
        if exec.host_activations {
            None
        } else {
            self.backend.device()
        }
    }

    /// Run one step of several sequences under `exec`: `tokens[s]` continues `seqs[s]`; the
    /// step reads back what `outputs` names (a [`LogitRows`]: those rows' logits and the
    /// residual). Also returns what the step reports (plan kind, rows, captured or not,
    /// declared page writes).
    pub fn forward_step<'w>(
        &self,
        seqs: &mut [&mut SequenceState],
        tokens: &[&[u32]],
        outputs: impl Into<StepOutputs<'w>>,
        exec: &ExecOptions,
        taps: &mut Taps<'_>,
    ) -> Result<(Vec<ForwardOutput>, StepReport), ForwardError> {
        if seqs.len() != tokens.len() {
            return Err(ForwardError::Plan {
                message: format!(
                    "a step of {} sequences was given {} token slices; give one per sequence",
                    seqs.len(),
                    tokens.len()
                ),
            });
        }
        if seqs.is_empty() {
            return Err(ForwardError::Empty);
        }
        let lens: Vec<usize> = tokens.iter().map(|t| t.len()).collect();
        let (mut positions, mut row_seq) = (Vec::new(), Vec::new());
        for (s, (st, toks)) in seqs.iter().zip(tokens).enumerate() {
            positions.extend(self.check_tokens(st.pos, toks)?);
            row_seq.extend(std::iter::repeat_n(s, toks.len()));
        }
        let all: Vec<u32> = tokens.concat();
        let t = all.len();
        let kind = if tokens.iter().all(|t| t.len() == 1) {
            StepKind::Decode
        } else {
            StepKind::Prefill
        };
        let bucket = match kind {
            StepKind::Decode => exec.bucket_for(seqs.len()),
            StepKind::Prefill => None,
        };
        // A captured plan computes every row's logits; each sequence takes its own.
        let outputs = outputs.into();
        let head = HeadRows::plan(outputs.logits, &lens, bucket.is_none())?;
        let ratios = self.layer_ratios();
        let prepared = {
            let mut rows: Vec<SeqRows<'_>> = seqs
                .iter_mut()
                .zip(tokens)
                .map(|(s, toks)| SeqRows {
                    pos: s.pos,
                    rows: toks.len(),
                    layers: s.layers.iter_mut().collect(),
                })
                .collect();
            prepare(&mut rows, &ratios, Some)?
        };
        let blocks = prepared
            .locs
            .into_iter()
            .enumerate()
            .map(|(l, loc)| BoundBlock {
                states: seqs.iter().map(|s| &s.layers[l]).collect(),
                loc,
            })
            .collect();
        let bound = Bound {
            rows: t,
            tokens: &all,
            positions: &positions,
            row_seq: &row_seq,
            blocks,
            residual_in: None,
            head: head.gather.clone(),
        };
        let captured = bucket.map(|b| self.captured_plan(b, exec)).transpose()?;
        let dev = self.device_for(exec);
        let eager;
        let (plan, mem, _replay) = match &captured {
            Some(c) => {
                let replay = c.replay.lock().unwrap_or_else(|e| e.into_inner());
                let mem = match dev {
                    Some(dev) => Memory::Device(DeviceMemory::arena(
                        dev,
                        &c.plan,
                        c.device_arena(&self.backend)?,
                    )?),
                    None => Memory::Arena(&c.arena),
                };
                (&c.plan, mem, Some(replay))
            }
            None => {
                let spec = PlanSpec {
                    kind,
                    rows: t,
                    head_rows: head.rows(t),
                    overlap: exec.overlap,
                    mtp: false,
                };
                eager = build_plan_under(&self.cfg, spec, exec);
                (&eager, Memory::fresh_on(dev, &eager)?, None)
            }
        };
        let run = Run {
            model: self,
            plan,
            plan_rows: plan_rows(plan),
            bound: &bound,
            mem,
            out: Gathered {
                taps: taps
                    .active()
                    .then(|| Mutex::new(vec![None; plan.launches.len()])),
                ..Gathered::default()
            },
            skip_index_k_wait: exec.has(Fault::SkipIndexKTransferWait),
            choices: taps.choices,
            one_issuer: exec.executor != Executor::Threaded,
        };
        let traffic_start = self.backend.device().map(|d| d.stats());
        // A captured plan on a device replays its repeated runs of launches as graphs.
        let span = match (&captured, &run.mem) {
            (Some(_), Memory::Device(dm)) => Some(GraphSpan::open(dm.dev)?),
            _ => None,
        };
        let executed = execute(
            self,
            &run,
            exec.executor,
            captured.as_ref().map(|c| &c.device_order[..]),
        );
        let closed = span.map_or(Ok(()), GraphSpan::close);
        executed?;
        closed?;
        emit_taps(plan, &run.out, taps);
        let (rname, rscope) = final_residual(plan).unwrap_or_default();
        let mut wanted = Vec::new();
        if head.rows(t) > 0 {
            wanted.push(("logits", ""));
        }
        if outputs.residual {
            wanted.push((rname.as_str(), rscope.as_str()));
        }
        let mut results = run.results(&wanted)?.into_iter();
        let logits = if head.rows(t) > 0 {
            results.next()
        } else {
            Some(Vec::new())
        };
        let residual = if outputs.residual {
            results.next()
        } else {
            Some(Vec::new())
        };
        let (Some(logits), Some(residual)) = (logits, residual) else {
            return Err(ForwardError::Plan {
                message: "a device read returned fewer than the step's results".into(),
            });
        };
        let (selected, experts) = (take(&run.out.selected), take(&run.out.experts));
        let (scores, router_scores) = (take(&run.out.scores), take(&run.out.router_scores));
        // A backend with device memory counts the step's traffic in either mode (host ops
        // submit and read back too).
        let device = self
            .backend
            .device()
            .zip(traffic_start)
            .map(|(d, start)| d.stats().since(&start));
        // Frees the step's device buffers and ends its borrows of the sequences.
        drop(run);
        let (v, m, d) = (self.cfg.vocab_size, self.cfg.hc_mult, self.cfg.hidden_size);
        let mut outs = Vec::with_capacity(seqs.len());
        let mut start = 0;
        for ((st, toks), &(first, k)) in seqs.iter_mut().zip(tokens).zip(&head.per_seq) {
            let n = toks.len();
            st.pos += n;
            outs.push(ForwardOutput {
                logits: logits[first * v..(first + k) * v].to_vec(),
                vocab: v,
                topk: rows_of(&selected, start, n),
                indexer_scores: rows_of(&scores, start, n),
                experts: rows_of(&experts, start, n),
                router_scores: rows_of(&router_scores, start, n),
                residual: residual
                    .get(start * m * d..(start + n) * m * d)
                    .map_or_else(Vec::new, <[f32]>::to_vec),
            });
            start += n;
        }
        let report = StepReport {
            kind,
            rows: t,
            plan_rows: bucket.unwrap_or(t),
            logit_rows: bucket.unwrap_or(head.rows(t)),
            captured: captured.is_some(),
            launches: plan.launches.len(),
            writes: prepared.writes,
            device,
        };
        Ok((outs, report))
    }

    /// Run the MTP layer's plan for `next_tokens` over `residual`, advancing `layer`'s caches.
    pub(crate) fn mtp_step(
        &self,
        layer: &mut super::state::LayerState,
        pos: usize,
        residual: &[f32],
        next_tokens: &[u32],
    ) -> Result<Vec<f32>, ForwardError> {
        let positions = self.check_tokens(pos, next_tokens)?;
        let t = next_tokens.len();
        let ratio = self.block_weights(Some(BlockRef::Mtp))?.ratio;
        let prepared = {
            let mut rows = [SeqRows {
                layers: vec![&mut *layer],
                pos,
                rows: t,
            }];
            prepare(&mut rows, &[ratio], |_| None)?
        };
        let row_seq = vec![0; t];
        let bound = Bound {
            rows: t,
            tokens: next_tokens,
            positions: &positions,
            row_seq: &row_seq,
            blocks: prepared
                .locs
                .into_iter()
                .map(|loc| BoundBlock {
                    states: vec![&*layer],
                    loc,
                })
                .collect(),
            residual_in: Some(residual),
            head: None,
        };
        let spec = PlanSpec {
            kind: StepKind::Prefill,
            rows: t,
            head_rows: t,
            overlap: self.exec.overlap,
            mtp: true,
        };
        let plan = build_plan_under(&self.cfg, spec, &self.exec);
        let run = Run {
            model: self,
            plan: &plan,
            plan_rows: plan_rows(&plan),
            bound: &bound,
            mem: Memory::fresh_on(self.device_for(&self.exec), &plan)?,
            out: Gathered::default(),
            skip_index_k_wait: self.exec.has(Fault::SkipIndexKTransferWait),
            choices: ChoiceControl::default(),
            // The MTP step never runs threaded (below).
            one_issuer: true,
        };
        let executor = match self.exec.executor {
            Executor::Threaded => Executor::Serial,
            e => e,
        };
        execute(self, &run, executor, None)?;
        let mut logits = run.results(&[("logits", &BlockRef::Mtp.scope())])?;
        logits.pop().ok_or_else(|| ForwardError::Plan {
            message: "the MTP step's logits were not read back".into(),
        })
    }
}

//! The plan executor: runs a [`Plan`]'s launches with the backend's op set, reading each
//! launch's transient operands from, and writing its results to, the plan's memory — fresh
//! buffers (eager: each allocated at its first write, dropped after its last use) or one
//! arena at the plan's fixed offsets (captured). Launches run one at a time in an order
//! ([`dsv4_plan::serial`] or a seeded [`dsv4_plan::interleaved`] order), or on one thread per
//! stream ([`super::threaded`]).

use super::op::{BlockRef, Op, OpKind};
use super::resident::{DeviceMemory, Reads};
use super::state::LayerState;
use super::{ChoiceControl, ForwardError, Model};
use crate::weights::BlockWeights;
use dsv4_kernels::DevSlice;
use dsv4_plan::{BufferClass, BufferId, Plan, Slice};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// One block's binding: its layer state per sequence and its write locations.
pub(crate) struct BoundBlock<'a> {
    /// Layer state of each sequence of the step (read-only while launches run).
    pub states: Vec<&'a LayerState>,
    /// `[rows × loc_width]` write locations.
    pub loc: Vec<u32>,
}

/// A step's inputs bound to a plan: what changes between replays of the same plan.
pub(crate) struct Bound<'a> {
    /// Rows computed (≤ the plan's rows).
    pub rows: usize,
    /// Token of each row.
    pub tokens: &'a [u32],
    /// Position of each row.
    pub positions: &'a [usize],
    /// Sequence (index into each block's `states`) of each row.
    pub row_seq: &'a [usize],
    /// Per block of the plan (main layers in order, or the MTP block).
    pub blocks: Vec<BoundBlock<'a>>,
    /// The main model's final residual (MTP plans).
    pub residual_in: Option<&'a [f32]>,
    /// The rows the head computes logits for, as ascending runs `(first row, rows)`, when
    /// the plan gathers them (its `head_rows` launch); None: every row.
    pub head: Option<Vec<(usize, usize)>>,
}

impl Bound<'_> {
    /// Rows the head computes logits for.
    pub fn head_rows(&self) -> usize {
        self.head
            .as_ref()
            .map_or(self.rows, |runs| runs.iter().map(|r| r.1).sum())
    }
}

/// Where a plan's transient buffers live during one execution.
pub(crate) enum Memory<'m> {
    /// One allocation per buffer; `left` counts the launches still to touch each.
    Fresh {
        bufs: Vec<Mutex<Option<Vec<f32>>>>,
        left: Vec<Mutex<usize>>,
    },
    /// A captured plan's arena (word offsets from the plan's byte offsets).
    Arena(&'m Mutex<Vec<f32>>),
    /// Buffers in the backend's device memory ([`DeviceMemory`]).
    Device(DeviceMemory<'m>),
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Launches complete their own writes before releasing; a panic elsewhere leaves data that
    // is no less consistent than the step, which is abandoned anyway.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The buffers launch `l` touches, each once.
pub(crate) fn touched(l: &dsv4_plan::Launch<Op>) -> Vec<u32> {
    let mut seen: Vec<u32> = l
        .reads
        .iter()
        .chain(&l.writes)
        .map(|s| s.buffer.0)
        .collect();
    seen.sort_unstable();
    seen.dedup();
    seen
}

/// How many launches touch each buffer of `plan`.
pub(crate) fn uses(plan: &Plan<Op>) -> Vec<Mutex<usize>> {
    let mut left = vec![0usize; plan.buffers.len()];
    for l in &plan.launches {
        touched(l).into_iter().for_each(|b| left[b as usize] += 1);
    }
    left.into_iter().map(Mutex::new).collect()
}

impl<'m> Memory<'m> {
    /// Fresh buffers for `plan`.
    pub fn fresh(plan: &Plan<Op>) -> Self {
        Memory::Fresh {
            bufs: plan.buffers.iter().map(|_| Mutex::new(None)).collect(),
            left: uses(plan),
        }
    }

    /// Fresh buffers for `plan`, in `dev`'s memory when there is one.
    pub fn fresh_on(
        dev: Option<&'m dyn dsv4_kernels::DeviceOps>,
        plan: &Plan<Op>,
    ) -> Result<Self, ForwardError> {
        Ok(match dev {
            Some(dev) => Memory::Device(DeviceMemory::fresh(dev, plan)?),
            None => Memory::fresh(plan),
        })
    }
}

/// Per-step results gathered while launches run.
#[derive(Default)]
pub(crate) struct Gathered {
    /// Selected compressed entries per ratio-4 main layer, per row.
    pub selected: Mutex<BTreeMap<usize, Vec<Vec<u32>>>>,
    /// The indexer's scores per ratio-4 main layer, per row (when asked for).
    pub scores: Mutex<BTreeMap<usize, Vec<Vec<f32>>>>,
    /// The router's own expert choice per biased-routing main layer, per row.
    pub experts: Mutex<BTreeMap<usize, Vec<Vec<u32>>>>,
    /// The router's biased scores per biased-routing main layer, per row (when asked for).
    pub router_scores: Mutex<BTreeMap<usize, Vec<Vec<f32>>>>,
    /// Tap values per launch (when taps are on).
    pub taps: Option<Mutex<Vec<Option<Vec<f32>>>>>,
}

/// One execution of a plan.
pub(crate) struct Run<'a> {
    pub model: &'a Model,
    pub plan: &'a Plan<Op>,
    /// Rows of the plan's buffers (see [`plan_rows`]).
    pub plan_rows: usize,
    pub bound: &'a Bound<'a>,
    pub mem: Memory<'a>,
    pub out: Gathered,
    /// The index-K read skips its load-back wait (`Fault::SkipIndexKTransferWait`).
    pub skip_index_k_wait: bool,
    /// What the caller asks of the discrete choices (scores reported, choices pinned).
    pub choices: ChoiceControl<'a>,
    /// One thread issues every launch, in one order (the serial and interleaved executors;
    /// not the threaded one): a run of host launches may then read its operands across
    /// streams in one wait for every stream ([`Run::host_run_reads`]).
    pub one_issuer: bool,
}

/// Rows of a plan's buffers: the length of its step-wide `tokens` buffer.
pub(crate) fn plan_rows(plan: &Plan<Op>) -> usize {
    plan.buffers
        .iter()
        .find(|b| b.name == "tokens" && b.scope.is_empty())
        .map_or(1, |b| b.bytes as usize / 4)
}

impl Run<'_> {
    /// Words of transient buffer `b` the step's rows fill: all of it in an eager plan (whose
    /// buffers hold the step's rows, or the head's gathered rows), the first `rows` of the
    /// bucket's rows in a captured plan.
    pub(crate) fn live_words(&self, b: BufferId) -> usize {
        let words = self.plan.buffer(b).bytes as usize / 4;
        if self.bound.rows >= self.plan_rows {
            words
        } else {
            words / self.plan_rows.max(1) * self.bound.rows
        }
    }

    fn read(&self, s: &Slice) -> Result<Vec<f32>, ForwardError> {
        self.read_or_take(s, false)
    }

    /// Read transient slice `s` for the launch running now. With `last` (only this launch
    /// touches the buffer from here on, and it reads it once: [`Run::last_read`]) a fresh
    /// buffer is moved out rather than copied.
    fn read_or_take(&self, s: &Slice, last: bool) -> Result<Vec<f32>, ForwardError> {
        let n = self.live_words(s.buffer);
        match &self.mem {
            Memory::Fresh { bufs, .. } => {
                let mut slot = lock(&bufs[s.buffer.0 as usize]);
                let unwritten = || ForwardError::Plan {
                    message: format!(
                        "buffer `{}` was read before any launch wrote it",
                        self.plan.buffer(s.buffer).label()
                    ),
                };
                if last {
                    let mut v = slot.take().ok_or_else(unwritten)?;
                    v.truncate(n);
                    Ok(v)
                } else {
                    slot.as_ref().map(|v| v[..n].to_vec()).ok_or_else(unwritten)
                }
            }
            Memory::Arena(arena) => {
                let off = self.plan.offset(s.buffer).unwrap_or(0) as usize / 4;
                Ok(lock(arena)[off..off + n].to_vec())
            }
            Memory::Device(dm) => dm.read(self.plan, s.buffer, n),
        }
    }

    /// Whether launch `i`'s read of transient buffer `b` is the buffer's last use in fresh
    /// memory: no launch after `i` touches it (its use count is down to this one), the
    /// launch reads it once and does not write it, and the host does not read it afterwards.
    fn last_read(&self, i: usize, b: BufferId) -> bool {
        let Memory::Fresh { left, .. } = &self.mem else {
            return false;
        };
        let l = &self.plan.launches[i];
        !self.plan.buffer(b).host_read
            && l.reads.iter().filter(|s| s.buffer == b).count() == 1
            && l.writes.iter().all(|s| s.buffer != b)
            && *lock(&left[b.0 as usize]) == 1
    }

    /// Write launch output `values` to transient slice `s`. In fresh memory the first write
    /// to a buffer moves `values` in (no zero-filled allocation, no copy).
    fn write(&self, s: &Slice, values: Vec<f32>) -> Result<(), ForwardError> {
        match &self.mem {
            Memory::Fresh { bufs, .. } => {
                let len = self.plan.buffer(s.buffer).bytes as usize / 4;
                let mut b = lock(&bufs[s.buffer.0 as usize]);
                match b.as_mut() {
                    Some(buf) => buf[..values.len()].copy_from_slice(&values),
                    None => {
                        let mut v = values;
                        if v.len() < len {
                            v.resize(len, 0.0);
                        }
                        *b = Some(v);
                    }
                }
            }
            Memory::Arena(arena) => {
                let off = self.plan.offset(s.buffer).unwrap_or(0) as usize / 4;
                lock(arena)[off..off + values.len()].copy_from_slice(&values);
            }
            Memory::Device(dm) => return dm.write(self.plan, s.buffer, &values),
        }
        Ok(())
    }

    /// Drop fresh buffers no later launch touches (host-read buffers stay).
    fn release(&self, i: usize) {
        if let Memory::Device(dm) = &self.mem {
            return dm.release(self.plan, i);
        }
        let Memory::Fresh { bufs, left } = &self.mem else {
            return;
        };
        for b in touched(&self.plan.launches[i]) {
            let mut n = lock(&left[b as usize]);
            *n = n.saturating_sub(1);
            if *n == 0 && !self.plan.buffers[b as usize].host_read {
                *lock(&bufs[b as usize]) = None;
            }
        }
    }

    /// The host-read buffers `(name, scope)` after the run, in order: on a device in one read
    /// (one wait for the step's results).
    pub fn results(&self, wanted: &[(&str, &str)]) -> Result<Reads, ForwardError> {
        let ids = wanted
            .iter()
            .map(|&(name, scope)| {
                let id = self
                    .plan
                    .buffers
                    .iter()
                    .position(|b| b.name == name && b.scope == scope)
                    .ok_or_else(|| ForwardError::Plan {
                        message: format!("the plan has no buffer `{scope}.{name}`"),
                    })?;
                Ok(BufferId(id as u32))
            })
            .collect::<Result<Vec<_>, ForwardError>>()?;
        let n = |b: BufferId| self.live_words(b);
        match &self.mem {
            Memory::Device(dm) => {
                let sized: Vec<_> = ids.iter().map(|&b| (b, n(b))).collect();
                dm.read_many(self.plan, &sized)
            }
            _ => ids
                .iter()
                .map(|&b| {
                    self.read(&Slice {
                        buffer: b,
                        start: 0,
                        len: self.plan.buffer(b).bytes,
                    })
                })
                .collect(),
        }
    }

    /// The device streams the plan's streams map to, if the run has any.
    pub fn device_streams(&self) -> Option<&dyn dsv4_kernels::DeviceStreams> {
        match &self.mem {
            Memory::Device(dm) => dm.streams.as_deref(),
            _ => None,
        }
    }

    /// Run launch `i`: on device streams, on its stream after its waits, recording its events.
    /// `next` is what the calling executor runs after it, in order (on this thread).
    pub fn launch(&self, i: usize, next: &[usize]) -> Result<(), ForwardError> {
        let Some(st) = self.device_streams() else {
            return self.launch_here(i, next);
        };
        let l = &self.plan.launches[i];
        st.enter(l.stream.0 as usize)?;
        l.waits.iter().try_for_each(|e| st.wait(e.0 as usize))?;
        self.launch_here(i, next)?;
        l.records.iter().try_for_each(|e| st.record(e.0 as usize))?;
        Ok(())
    }

    /// Finish the run's device streams (when it has any): the calling thread issues to the
    /// default queue again, and every stream's work has finished. `result` is the run's.
    pub fn finish_streams(&self, result: Result<(), ForwardError>) -> Result<(), ForwardError> {
        let Some(st) = self.device_streams() else {
            return result;
        };
        st.leave();
        let joined = st.join();
        result?;
        Ok(joined?)
    }

    fn launch_here(&self, i: usize, next: &[usize]) -> Result<(), ForwardError> {
        if self.launch_resident(i)? {
            self.release(i);
            return Ok(());
        }
        let l = &self.plan.launches[i];
        if let Memory::Device(dm) = &self.mem
            && self.attention_side(l.op.kind).is_some()
        {
            self.attention_side_resident(dm, i, next)?;
            self.release(i);
            return Ok(());
        }
        let transient = |s: &&Slice| self.plan.buffer(s.buffer).class == BufferClass::Transient;
        let reads: Vec<&Slice> = l.reads.iter().filter(transient).collect();
        let ins = match &self.mem {
            // The launch's operands without a host copy come back in one device read, with
            // those of the host launches right after it (kept as host copies for them). A
            // launch that reads nothing (a location table, the upload) leaves that read to the
            // next one, which may have more to bring back with it (encoded cache entries).
            Memory::Device(_) if reads.is_empty() => Vec::new(),
            Memory::Device(dm) => {
                let n = |b: BufferId| self.live_words(b);
                let mut wanted: Vec<_> = reads.iter().map(|s| (s.buffer, n(s.buffer))).collect();
                let (run, across) = self.host_run_reads(i, next);
                wanted.extend(run.into_iter().map(|b| (b, n(b))));
                let (mut ins, _) = self.read_for_run(dm, (&wanted, &[]), across)?;
                ins.truncate(reads.len());
                ins
            }
            _ => reads
                .iter()
                .map(|s| self.read_or_take(s, self.last_read(i, s.buffer)))
                .collect::<Result<_, _>>()?,
        };
        let outs = self.dispatch(l.op, &ins)?;
        if let (Some(taps), Some(_)) = (&self.out.taps, l.op.kind.tap()) {
            lock(taps)[i] = outs.first().cloned();
        }
        for (s, v) in l.writes.iter().filter(transient).zip(outs) {
            self.write(s, v)?;
        }
        self.release(i);
        Ok(())
    }

    /// The transient buffers read by the run of host launches that follows launch `i` in
    /// `next` (what this thread runs after it; the serial executor's deferred order puts a
    /// decode layer's stores, pooling, top-k and attention back to back) up to the first
    /// launch with a device form, less what the run writes itself; and whether the run goes
    /// past a launch on another stream or one that waits for an event (`across`).
    ///
    /// Without [`Run::one_issuer`] the run stops there instead: on its own stream, with no
    /// event wait, anything another stream writes that the run reads is ordered before it by
    /// an event the run would wait for, so the operands are final when launch `i` reads its
    /// own on its stream. With one issuer, every launch before the run in `next` has been
    /// issued, and a later launch of the run reads only what those wrote (what the run writes
    /// stays out), so reading after every stream's work ([`Run::read_for_run`]) gives final
    /// operands across streams too: with side streams a layer's SWA store, compressors,
    /// indexer and attention, each on its own stream, wait once together instead of once each.
    /// Attention's and the indexer's queries stay out where the device attends (they stay on
    /// the device: [`Run::attention_side`]).
    pub(super) fn host_run_reads(&self, i: usize, next: &[usize]) -> (Vec<BufferId>, bool) {
        let launches = &self.plan.launches;
        let stream = launches[i].stream;
        let transient = |b: BufferId| self.plan.buffer(b).class == BufferClass::Transient;
        let mut written: Vec<BufferId> = launches[i].writes.iter().map(|s| s.buffer).collect();
        let (mut wanted, mut across): (Vec<BufferId>, bool) = (Vec::new(), false);
        for l in next.iter().map(|&k| &launches[k]) {
            if super::resident_ops::has_device_form(l.op.kind) {
                break;
            }
            if l.stream != stream || !l.waits.is_empty() {
                if !self.one_issuer {
                    break;
                }
                across = true;
            }
            let on_device = self.attention_side(l.op.kind).unwrap_or(0);
            let host_reads = l
                .reads
                .iter()
                .filter(|s| transient(s.buffer))
                .skip(on_device);
            for s in host_reads {
                let b = s.buffer;
                if !written.contains(&b) && !wanted.contains(&b) {
                    wanted.push(b);
                }
            }
            written.extend(l.writes.iter().map(|s| s.buffer));
        }
        (wanted, across)
    }

    /// Read `wanted` (and the device slices `extra`) back for launch `i` in one wait on its
    /// stream; for a run `across` streams ([`Run::host_run_reads`]) that stream first waits
    /// for the work issued so far on every stream.
    pub(super) fn read_for_run(
        &self,
        dm: &DeviceMemory<'_>,
        (wanted, extra): (&[(BufferId, usize)], &[DevSlice]),
        across: bool,
    ) -> Result<(Reads, Reads), ForwardError> {
        if let Some(st) = self.device_streams().filter(|_| across) {
            st.wait_for_all()?;
        }
        dm.read_many_and(self.plan, wanted, extra)
    }

    /// Run the launches in `order`.
    pub fn run_in(&self, order: &[usize]) -> Result<(), ForwardError> {
        (0..order.len()).try_for_each(|k| self.launch(order[k], &order[k + 1..]))
    }

    /// Block `b`'s weights.
    pub fn weights(&self, b: Option<BlockRef>) -> Result<&BlockWeights, ForwardError> {
        self.model.block_weights(b)
    }

    /// Block `b`'s binding.
    pub fn bound_block(&self, b: Option<BlockRef>) -> Result<&BoundBlock<'_>, ForwardError> {
        let i = match b {
            Some(BlockRef::Main(i)) => i,
            _ => 0,
        };
        self.bound.blocks.get(i).ok_or_else(|| ForwardError::Plan {
            message: format!("the step binds no state for block {i}"),
        })
    }

    fn dispatch(&self, op: Op, ins: &[Vec<f32>]) -> Result<Vec<Vec<f32>>, ForwardError> {
        let b = op.block;
        match op.kind {
            OpKind::Upload => Ok(self.upload()),
            OpKind::Embed => self.embed(&ins[0]).map(|x| vec![x]),
            OpKind::MtpInput => self.mtp_input(&ins[0], &ins[1]).map(|x| vec![x]),
            OpKind::Locate => Ok(vec![
                self.bound_block(b)?
                    .loc
                    .iter()
                    .map(|&w| f32::from_bits(w))
                    .collect(),
            ]),
            OpKind::HcPre(sub) => self.hc_pre(b, sub, &ins[0]),
            OpKind::Norm(sub) => self.norm(b, sub, &ins[0]).map(|x| vec![x]),
            OpKind::QA => self.q_a(b, &ins[0]).map(|x| vec![x]),
            OpKind::QB => self.q_b(b, &ins[0]).map(|x| vec![x]),
            OpKind::Kv => self.kv(b, &ins[0]).map(|x| vec![x]),
            OpKind::SwaStore => self.swa_store(b, &ins[0], &ins[1]).map(|()| vec![]),
            OpKind::CompressorIn(chain) => self.compressor_in(b, chain, &ins[0]),
            OpKind::Compress(chain) => self
                .compress(b, chain, &ins[0], &ins[1], &ins[2])
                .map(|()| vec![]),
            OpKind::IndexerQ => self.indexer_q(b, &ins[0]).map(|x| vec![x]),
            OpKind::IndexerWeights => self.indexer_weights(b, &ins[0]).map(|x| vec![x]),
            OpKind::IndexerTopk => self.indexer_topk(b, &ins[0], &ins[1]).map(|x| vec![x]),
            OpKind::Attention { stores } => self.attention(b, stores, ins).map(|x| vec![x]),
            OpKind::OutA => self.out_a(b, &ins[0]).map(|x| vec![x]),
            OpKind::OutB => self.out_b(b, &ins[0]).map(|x| vec![x]),
            OpKind::HcPost(_) => self
                .hc_post(&ins[0], &ins[1], &ins[2], &ins[3])
                .map(|x| vec![x]),
            OpKind::Router => self
                .router(b, &ins[0], ins.get(1).map(Vec::as_slice))
                .map(|x| vec![x]),
            OpKind::SharedExpert => self.shared_expert(b, &ins[0]).map(|x| vec![x]),
            OpKind::RoutedExperts => self.routed_experts(b, &ins[0], &ins[1]).map(|x| vec![x]),
            OpKind::MoeSum => Ok(vec![
                ins[0].iter().zip(&ins[1]).map(|(a, b)| a + b).collect(),
            ]),
            OpKind::HeadRows => Ok(vec![self.head_rows_of(&ins[0])]),
            OpKind::HcHead => self.hc_head(b, &ins[0]).map(|x| vec![x]),
            OpKind::FinalNorm => self.final_norm(b, &ins[0]).map(|x| vec![x]),
            OpKind::Logits => Ok(vec![self.logits(&ins[0])]),
        }
    }

    fn upload(&self) -> Vec<Vec<f32>> {
        let mut out = vec![
            self.bound
                .tokens
                .iter()
                .map(|&t| f32::from_bits(t))
                .collect(),
        ];
        if let Some(r) = self.bound.residual_in {
            out.push(r.to_vec());
        }
        out
    }
}

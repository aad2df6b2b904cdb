//! Device-resident execution: when the backend has a device op set
//! ([`dsv4_kernels::Backend::device`]) and `exec.device_resident` is on, a plan's transient
//! buffers live in device memory — one buffer per plan buffer for eager plans (freed after
//! its last use), or one arena allocation at the plan's verified offsets for captured plans
//! (kept across replays, as a CUDA graph's pool is). Row-wise launches run as device ops
//! (`super::resident_ops`); the launches that touch host state (cache pages, routing,
//! top-k, attention) read their operands back and write their results in.

use super::ForwardError;
use super::op::Op;
use super::run::{Memory, Run, lock, touched, uses};
use dsv4_kernels::{Backend, DevBufId, DevSlice, DeviceOps, DeviceStreams, KernelError};
use dsv4_plan::{BufferClass, BufferId, Plan};
use std::sync::{Arc, Mutex};

impl From<KernelError> for ForwardError {
    fn from(e: KernelError) -> Self {
        ForwardError::Device {
            message: e.to_string(),
        }
    }
}

/// Temporary device buffers of one execution's launches, reused launch after launch (so a
/// captured plan's replays bind the same buffers every time). A buffer is reused only by a
/// launch on the stream it was last used on: work on one device stream runs in order, work on
/// two may overlap, so handing a buffer to another stream could let its new user overwrite it
/// before its old user has read it.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Buffers not in use: (stream of the last use, buffer, words).
    free: Mutex<Vec<(usize, DevBufId, usize)>>,
    /// Every buffer allocated.
    all: Mutex<Vec<DevBufId>>,
}

/// A scratch buffer lent to one launch; returned when dropped.
pub(crate) struct Tmp<'a> {
    /// The words asked for.
    pub s: DevSlice,
    words: usize,
    stream: usize,
    pool: &'a Scratch,
}

impl Drop for Tmp<'_> {
    fn drop(&mut self) {
        lock(&self.pool.free).push((self.stream, self.s.buf, self.words));
    }
}

impl Scratch {
    /// A buffer of at least `words` words for a launch on plan stream `stream` (the smallest
    /// free one last used on that stream that fits, the oldest of equals, else a new one).
    pub fn take(
        &self,
        dev: &dyn DeviceOps,
        stream: usize,
        words: usize,
    ) -> Result<Tmp<'_>, ForwardError> {
        let words = words.max(1);
        let mut free = lock(&self.free);
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, (s, _, w))| *s == stream && *w >= words)
            // Ties go to the oldest buffer, so a replay takes the buffers the last one took
            // whatever order they were returned in (a device graph replays fixed addresses).
            .min_by_key(|(_, (_, b, w))| (*w, *b))
            .map(|(i, _)| i);
        let (buf, cap) = match best {
            Some(i) => {
                let (_, buf, cap) = free.swap_remove(i);
                (buf, cap)
            }
            None => {
                // Round up so later, slightly larger asks reuse the buffer.
                let cap = words.next_multiple_of(256);
                let buf = dev.alloc(cap)?;
                lock(&self.all).push(buf);
                (buf, cap)
            }
        };
        Ok(Tmp {
            s: DevSlice::whole(buf, words),
            words: cap,
            stream,
            pool: self,
        })
    }

    fn free_all(&self, dev: &dyn DeviceOps) {
        lock(&self.free).clear();
        lock(&self.all).drain(..).for_each(|b| dev.free(b));
    }
}

/// A captured plan's device memory: the arena allocation and the replays' scratch buffers.
pub struct DeviceArena {
    backend: Arc<dyn Backend>,
    /// The arena (the plan's placement bytes / 4 words).
    pub(crate) buf: DevBufId,
    pub(crate) scratch: Scratch,
    /// The device streams the plan's streams map to, kept across replays (made at the first).
    streams: Mutex<Option<Arc<dyn DeviceStreams>>>,
}

impl DeviceArena {
    /// Allocate `words` on `backend`'s device.
    pub(crate) fn new(backend: Arc<dyn Backend>, words: usize) -> Result<Self, ForwardError> {
        let dev = backend.device().ok_or_else(no_device)?;
        let buf = dev.alloc(words)?;
        Ok(Self {
            backend,
            buf,
            scratch: Scratch::default(),
            streams: Mutex::new(None),
        })
    }
}

/// A graph span of a device ([`DeviceOps::graphs`]) around a captured plan's execution: its
/// repeated runs of launches replay as device graphs. Closed by [`GraphSpan::close`], or
/// when dropped on an error path.
pub(crate) struct GraphSpan<'d>(Option<&'d dyn DeviceOps>);

impl<'d> GraphSpan<'d> {
    /// Open a span on `dev`.
    pub fn open(dev: &'d dyn DeviceOps) -> Result<Self, ForwardError> {
        dev.graphs(true)?;
        Ok(Self(Some(dev)))
    }

    /// Close the span: whatever the device still holds is issued.
    pub fn close(mut self) -> Result<(), ForwardError> {
        match self.0.take() {
            Some(dev) => Ok(dev.graphs(false)?),
            None => Ok(()),
        }
    }
}

impl Drop for GraphSpan<'_> {
    fn drop(&mut self) {
        if let Some(dev) = self.0.take()
            && let Err(e) = dev.graphs(false)
        {
            tracing::warn!(error = %e, "closing a graph span after a failed step");
        }
    }
}

/// The device streams for an execution of `plan`: `None` for a one-stream plan, or when the
/// device runs everything in one queue.
fn plan_streams(
    dev: &dyn DeviceOps,
    plan: &Plan<Op>,
) -> Result<Option<Arc<dyn DeviceStreams>>, ForwardError> {
    if plan.streams.len() <= 1 {
        return Ok(None);
    }
    Ok(dev.streams(plan.streams.len(), plan.events.len())?)
}

impl Drop for DeviceArena {
    fn drop(&mut self) {
        // The streams go back to the backend's pool while the backend is surely alive.
        lock(&self.streams).take();
        if let Some(dev) = self.backend.device() {
            self.scratch.free_all(dev);
            dev.free(self.buf);
        }
    }
}

/// Whether two slices share a word.
fn overlap(a: DevSlice, b: DevSlice) -> bool {
    a.buf == b.buf && a.off < b.off + b.len && b.off < a.off + a.len
}

fn no_device() -> ForwardError {
    ForwardError::Device {
        message: "the backend has no device op set".into(),
    }
}

/// Values read back from the device, one vector per slice asked for.
pub(crate) type Reads = Vec<Vec<f32>>;

/// Where one execution's buffers live on the device.
pub(crate) struct DeviceMemory<'m> {
    pub dev: &'m dyn DeviceOps,
    /// Each plan buffer's slice (its whole size), once it has one.
    slots: Vec<Mutex<Option<DevSlice>>>,
    /// Eager plans: launches still to touch each buffer.
    left: Option<Vec<Mutex<usize>>>,
    /// Captured plans: the arena (which also holds the scratch buffers).
    arena: Option<Arc<DeviceArena>>,
    /// Eager plans' scratch buffers.
    own_scratch: Scratch,
    /// Host copies of buffers the host wrote or read back, by buffer, valid until a launch
    /// writes anything overlapping them on the device (so host launches reading what host
    /// launches wrote — write locations, token ids, routes, top-k — read nothing back).
    shadows: Mutex<Vec<(BufferId, DevSlice, Vec<f32>)>>,
    /// The device streams the plan's streams map to, when the device has several queues.
    pub streams: Option<Arc<dyn DeviceStreams>>,
}

impl<'m> DeviceMemory<'m> {
    /// Fresh device buffers for an eager plan.
    pub fn fresh(dev: &'m dyn DeviceOps, plan: &Plan<Op>) -> Result<Self, ForwardError> {
        Ok(Self {
            dev,
            slots: plan.buffers.iter().map(|_| Mutex::new(None)).collect(),
            left: Some(uses(plan)),
            arena: None,
            own_scratch: Scratch::default(),
            shadows: Mutex::new(Vec::new()),
            streams: plan_streams(dev, plan)?,
        })
    }

    /// A captured plan's buffers at their offsets in `arena`.
    pub fn arena(
        dev: &'m dyn DeviceOps,
        plan: &Plan<Op>,
        arena: Arc<DeviceArena>,
    ) -> Result<Self, ForwardError> {
        let align = dev.offset_alignment().max(1) as u64;
        let slots = plan
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let off = match plan.offset(BufferId(i as u32)) {
                    Some(off) if b.class == BufferClass::Transient => off,
                    _ => return Ok(Mutex::new(None)),
                };
                if !off.is_multiple_of(align) {
                    return Err(ForwardError::Device {
                        message: format!(
                            "arena offset {off} of `{}` is not a multiple of the device's \
                             {align}-byte binding alignment",
                            b.label()
                        ),
                    });
                }
                Ok(Mutex::new(Some(DevSlice {
                    buf: arena.buf,
                    off: off as usize / 4,
                    len: b.bytes as usize / 4,
                })))
            })
            .collect::<Result<_, _>>()?;
        let streams = {
            let mut kept = lock(&arena.streams);
            if kept.is_none() {
                *kept = plan_streams(dev, plan)?;
            }
            kept.clone()
        };
        Ok(Self {
            dev,
            slots,
            left: None,
            arena: Some(arena),
            own_scratch: Scratch::default(),
            shadows: Mutex::new(Vec::new()),
            streams,
        })
    }

    /// The scratch pool of this execution.
    pub fn scratch(&self) -> &Scratch {
        self.arena
            .as_ref()
            .map_or(&self.own_scratch, |a| &a.scratch)
    }

    /// The slice of buffer `b`, allocating it (eager plans) on first use.
    fn slot(&self, plan: &Plan<Op>, b: BufferId) -> Result<DevSlice, ForwardError> {
        let mut s = lock(&self.slots[b.0 as usize]);
        if let Some(s) = *s {
            return Ok(s);
        }
        if self.arena.is_some() {
            return Err(ForwardError::Plan {
                message: format!(
                    "buffer `{}` has no place in the captured arena",
                    plan.buffer(b).label()
                ),
            });
        }
        let words = (plan.buffer(b).bytes as usize / 4).max(1);
        let slice = DevSlice::whole(self.dev.alloc(words)?, words);
        *s = Some(slice);
        Ok(slice)
    }

    /// The first `n` words of buffer `b`, which a launch reads (it must have been written).
    pub fn input(&self, plan: &Plan<Op>, b: BufferId, n: usize) -> Result<DevSlice, ForwardError> {
        let s = *lock(&self.slots[b.0 as usize]);
        match s {
            Some(s) => Ok(s.prefix(n.min(s.len))),
            None => Err(ForwardError::Plan {
                message: format!(
                    "buffer `{}` was read before any launch wrote it",
                    plan.buffer(b).label()
                ),
            }),
        }
    }

    /// The first `n` words of buffer `b`, which a launch writes.
    pub fn output(&self, plan: &Plan<Op>, b: BufferId, n: usize) -> Result<DevSlice, ForwardError> {
        let s = self.slot(plan, b)?;
        Ok(s.prefix(n.min(s.len)))
    }

    /// Read the first `n` words of buffer `b` back to the host (from its host copy when it
    /// has a valid one).
    pub fn read(&self, plan: &Plan<Op>, b: BufferId, n: usize) -> Result<Vec<f32>, ForwardError> {
        let mut v = self.read_many(plan, &[(b, n)])?;
        Ok(v.remove(0))
    }

    /// [`DeviceMemory::read`] of several (buffer, words) at once: the ones without a valid
    /// host copy come back in one device read.
    pub fn read_many(
        &self,
        plan: &Plan<Op>,
        wanted: &[(BufferId, usize)],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        Ok(self.read_many_and(plan, wanted, &[])?.0)
    }

    /// [`DeviceMemory::read_many`], and in the same device read the slices `extra` (device
    /// memory outside the plan's buffers, such as encoded cache entries): both results.
    pub fn read_many_and(
        &self,
        plan: &Plan<Op>,
        wanted: &[(BufferId, usize)],
        extra: &[DevSlice],
    ) -> Result<(Reads, Reads), ForwardError> {
        let slices = wanted
            .iter()
            .map(|&(b, n)| self.input(plan, b, n))
            .collect::<Result<Vec<_>, _>>()?;
        let mut shadows = lock(&self.shadows);
        let mut out: Vec<Option<Vec<f32>>> = wanted
            .iter()
            .map(|&(b, n)| {
                let copy = shadows.iter().find(|(id, _, v)| *id == b && v.len() >= n);
                copy.map(|(_, _, v)| v[..n].to_vec())
            })
            .collect();
        let missing: Vec<usize> = (0..wanted.len()).filter(|&i| out[i].is_none()).collect();
        let mut extra_out = Vec::new();
        if !missing.is_empty() || !extra.is_empty() {
            let mut read: Vec<DevSlice> = missing.iter().map(|&i| slices[i]).collect();
            read.extend_from_slice(extra);
            let mut got = self.dev.read_many(&read)?;
            if got.len() != read.len() {
                return Err(ForwardError::Plan {
                    message: "a device read returned fewer slices than it was given".into(),
                });
            }
            extra_out = got.split_off(missing.len());
            for (&i, v) in missing.iter().zip(got) {
                let b = wanted[i].0;
                shadows.retain(|(id, _, _)| *id != b);
                shadows.push((b, slices[i], v.clone()));
                out[i] = Some(v);
            }
        }
        let out = out
            .into_iter()
            .map(|v| {
                v.ok_or_else(|| ForwardError::Plan {
                    message: "a device read returned fewer slices than it was given".into(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok((out, extra_out))
    }

    /// Write host values into the start of buffer `b`.
    pub fn write(&self, plan: &Plan<Op>, b: BufferId, values: &[f32]) -> Result<(), ForwardError> {
        let s = self.output(plan, b, values.len())?;
        self.dev.write(s, values)?;
        let mut shadows = lock(&self.shadows);
        shadows.retain(|(id, other, _)| *id != b && !overlap(s, *other));
        shadows.push((b, s, values.to_vec()));
        Ok(())
    }

    /// Write `values` into `s` (a slice of a plan buffer a device launch writes) and keep them
    /// as that buffer's host copy, as [`DeviceMemory::write`] does.
    pub fn write_slice(&self, s: DevSlice, values: &[f32]) -> Result<(), ForwardError> {
        self.dev.write(s, values)?;
        let owner = self.slots.iter().position(|slot| {
            lock(slot).is_some_and(|whole| whole.buf == s.buf && whole.off == s.off)
        });
        let mut shadows = lock(&self.shadows);
        shadows.retain(|(_, other, _)| !overlap(s, *other));
        if let Some(b) = owner {
            shadows.push((BufferId(b as u32), s, values.to_vec()));
        }
        Ok(())
    }

    /// The host copy of slice `s` (a prefix of a buffer the host wrote or read back), if it
    /// has a valid one.
    pub fn host_copy(&self, s: DevSlice) -> Option<Vec<f32>> {
        lock(&self.shadows)
            .iter()
            .find(|(_, other, v)| other.buf == s.buf && other.off == s.off && v.len() >= s.len)
            .map(|(_, _, v)| v[..s.len].to_vec())
    }

    /// Forget host copies overlapping `s`, which a device launch is about to write.
    pub fn written_on_device(&self, s: DevSlice) {
        lock(&self.shadows).retain(|(_, other, _)| !overlap(s, *other));
    }

    /// After launch `i`: free eager buffers no later launch touches (host-read ones stay).
    pub fn release(&self, plan: &Plan<Op>, i: usize) {
        let Some(left) = &self.left else {
            return;
        };
        for b in touched(&plan.launches[i]) {
            let mut n = lock(&left[b as usize]);
            *n = n.saturating_sub(1);
            if *n == 0
                && !plan.buffers[b as usize].host_read
                && let Some(s) = lock(&self.slots[b as usize]).take()
            {
                lock(&self.shadows).retain(|(id, _, _)| id.0 != b);
                self.dev.free(s.buf);
            }
        }
    }
}

impl Drop for DeviceMemory<'_> {
    fn drop(&mut self) {
        if self.arena.is_none() {
            for s in &self.slots {
                if let Some(s) = lock(s).take() {
                    self.dev.free(s.buf);
                }
            }
        }
        self.own_scratch.free_all(self.dev);
    }
}

impl Run<'_> {
    /// Run launch `i` as device ops when the memory is on the device and the op has a device
    /// form; false when it must run through host slices instead.
    pub(crate) fn launch_resident(&self, i: usize) -> Result<bool, ForwardError> {
        let Memory::Device(dm) = &self.mem else {
            return Ok(false);
        };
        let l = &self.plan.launches[i];
        if !super::resident_ops::has_device_form(l.op.kind) {
            return Ok(false);
        }
        let transient =
            |s: &&dsv4_plan::Slice| self.plan.buffer(s.buffer).class == BufferClass::Transient;
        let n = |s: &dsv4_plan::Slice| self.live_words(s.buffer);
        let ins = l
            .reads
            .iter()
            .filter(transient)
            .map(|s| dm.input(self.plan, s.buffer, n(s)))
            .collect::<Result<Vec<_>, _>>()?;
        let outs = l
            .writes
            .iter()
            .filter(transient)
            .map(|s| dm.output(self.plan, s.buffer, n(s)))
            .collect::<Result<Vec<_>, _>>()?;
        outs.iter().for_each(|&s| dm.written_on_device(s));
        self.dispatch_resident(dm, l.op, l.stream.0 as usize, &ins, &outs)?;
        if let (Some(taps), Some(_), Some(first)) = (&self.out.taps, l.op.kind.tap(), outs.first())
        {
            lock(taps)[i] = Some(dm.dev.read(*first)?);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelConfig;
    use crate::forward::build::{PlanSpec, StepKind, build_plan};
    use dsv4_backend_reference::ReferenceBackend;
    use dsv4_kernels::{Backend, HostResident};

    #[test]
    fn a_host_written_slice_is_read_from_its_copy_until_the_device_writes_over_it() {
        let spec = PlanSpec {
            kind: StepKind::Decode,
            rows: 2,
            head_rows: 2,
            overlap: false,
            mtp: false,
        };
        let plan = build_plan(&ModelConfig::tiny(), spec);
        let be = HostResident::new(Arc::new(ReferenceBackend));
        let dev = be.device().unwrap();
        let dm = DeviceMemory::fresh(dev, &plan).unwrap();
        let routes = plan
            .buffers
            .iter()
            .position(|b| b.name == "routes")
            .unwrap();
        let s = dm.output(&plan, BufferId(routes as u32), 8).unwrap();
        dm.write_slice(s, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
            .unwrap();
        let reads = dev.stats().reads;
        // Its prefix and the buffer read through the plan come from the copy, not the device.
        assert_eq!(dm.host_copy(s.prefix(3)), Some(vec![1.0, 2.0, 3.0]));
        let back = dm.read(&plan, BufferId(routes as u32), 8).unwrap();
        assert_eq!(back, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        assert_eq!(dev.stats().reads, reads);
        // A device launch writing over part of it drops the copy: the next read goes to the
        // device (which holds what was written).
        dm.written_on_device(s.sub(4, 1));
        assert_eq!(dm.host_copy(s), None);
        assert_eq!(dm.read(&plan, BufferId(routes as u32), 8).unwrap(), back);
        assert_eq!(dev.stats().reads, reads + 1);
    }
}

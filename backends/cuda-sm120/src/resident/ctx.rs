//! What the resident ops share behind one lock ([`State`]: the buffer slab, the parameter
//! arena and its page-locked mirror, the parameter cache, buffers waiting for a
//! synchronisation, the counters), and what one op works with while it holds it ([`Ctx`]:
//! slices resolved and checked, scratch and parameters in the arena, read-backs).

use crate::device::HostBuf;
use crate::{Core, CudaError, DevBuf, DevPtr};
use dsv4_kernels::{DevSlice, DeviceStats, KernelError};
use std::collections::HashMap;
use std::sync::MutexGuard;

/// Byte alignment of slice offsets: linear's kernels load inputs as 16-byte vectors.
pub(crate) const ALIGN: usize = 16;
/// Alignment of arena chunks (what cudaMalloc gives).
const CHUNK_ALIGN: usize = 256;
/// Smallest parameter arena.
const ARENA_MIN: usize = 1 << 20;
/// Pending (freed, maybe still in use) bytes past which the next op synchronises and drops them.
pub(super) const PENDING_MAX: usize = 256 << 20;
/// Cached parameter bytes past which the parameter cache starts over.
const CACHE_MAX: usize = 1 << 30;

/// A live buffer of the slab.
pub(super) struct Slot {
    pub(super) buf: DevBuf,
    pub(super) words: usize,
}

/// The key of a cached parameter: host address, length and a hash of the contents (all of
/// them up to 64 KiB, 4096 evenly spaced 8-byte words beyond).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(super) struct ParamKey {
    pub(super) ptr: usize,
    pub(super) bytes: usize,
    pub(super) hash: u64,
}

impl ParamKey {
    pub(super) fn of(v: &[u8]) -> Self {
        let words = v.len() / 8;
        let step = if v.len() <= 64 << 10 { 1 } else { words / 4096 };
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |x: u64| h = (h ^ x).wrapping_mul(0x0100_0000_01b3);
        for c in v.chunks_exact(8).step_by(step) {
            mix(u64::from_le_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        for &b in v.chunks_exact(8).remainder() {
            mix(u64::from(b));
        }
        Self {
            ptr: v.as_ptr() as usize,
            bytes: v.len(),
            hash: h,
        }
    }
}

/// Everything the resident ops (and the executions' stream sets) share, behind one lock (an op holds it while it queues its
/// launches, so a synchronisation never rewinds the arena under an op).
#[derive(Default)]
pub(super) struct State {
    pub(super) next_id: u64,
    pub(super) bufs: HashMap<u64, Slot>,
    /// Freed buffers and retired arenas, dropped after the next synchronisation.
    pub(super) pending: Vec<DevBuf>,
    pub(super) pending_bytes: usize,
    pub(super) arena: Option<DevBuf>,
    /// The arena's page-locked host mirror: a parameter is written at its chunk's offset here
    /// and copied from here, asynchronously (same capacity as the arena).
    pub(super) mirror: Option<HostBuf>,
    /// Retired mirrors, dropped after the next synchronisation (copies may still read them).
    pub(super) pending_host: Vec<HostBuf>,
    pub(super) arena_used: usize,
    pub(super) cache: HashMap<[ParamKey; 2], DevBuf>,
    pub(super) cache_bytes: usize,
    pub(super) stats: DeviceStats,
}

/// The sum of two sets of counters.
pub(super) fn sum(a: DeviceStats, b: DeviceStats) -> DeviceStats {
    a.zip(&b, |x, y| x + y)
}

/// A `KernelError::Device` for a device failure of `op`.
pub(super) fn dev_err(op: &str, e: CudaError) -> KernelError {
    KernelError::Device {
        message: format!("{op}: {e}"),
    }
}

/// A `KernelError::Device` with `message`.
pub(crate) fn op_err(message: String) -> KernelError {
    KernelError::Device { message }
}

/// What an op works with: the device, the locked state, the op's name.
pub(crate) struct Ctx<'a> {
    pub(super) core: &'a Core,
    pub(super) st: MutexGuard<'a, State>,
    pub(super) op: &'static str,
}

impl Ctx<'_> {
    /// The device address range of `s` (`what` names it in errors).
    pub(super) fn slice(&self, what: &str, s: DevSlice) -> Result<DevPtr, KernelError> {
        let op = self.op;
        let slot = self.st.bufs.get(&s.buf.0).ok_or_else(|| {
            op_err(format!(
                "{op}: {what} is in buffer {}, which is not allocated",
                s.buf.0
            ))
        })?;
        if s.off.checked_add(s.len).is_none_or(|end| end > slot.words) {
            return Err(op_err(format!(
                "{op}: {what} [{}, +{}) is outside its buffer of {} words",
                s.off, s.len, slot.words
            )));
        }
        if !(s.off * 4).is_multiple_of(ALIGN) {
            return Err(op_err(format!(
                "{op}: {what} starts at word {}, not a multiple of {ALIGN} bytes",
                s.off
            )));
        }
        Ok(DevPtr {
            ptr: slot.buf.ptr() + (s.off * 4) as u64,
            bytes: s.len * 4,
        })
    }

    /// Wait for what a read depends on, then copy `out.len()` words at `p` to the host: on the
    /// default stream after every stream's work (rewinding the arena), on a plan stream after
    /// that stream's only (the plan's events order whatever the value depends on before it, so
    /// the other streams keep running; the arena is rewound when the execution joins them).
    pub(super) fn download(&mut self, p: DevPtr, out: &mut [f32]) -> Result<(), KernelError> {
        if self.core.dev.stream() == crate::device::DEFAULT_STREAM {
            sync_and_drain(&self.core.dev, &mut self.st).map_err(|e| dev_err(self.op, e))?;
        } else {
            self.st.stats.submissions += 1;
        }
        let r = self.core.dev.download_f32_from(p, out);
        self.run(r)?;
        self.st.stats.reads += 1;
        self.st.stats.read_bytes += out.len() as u64 * 4;
        Ok(())
    }

    /// `bytes` bytes of the arena (256-byte aligned), valid until the next wait for every
    /// stream.
    pub(super) fn scratch(&mut self, bytes: usize) -> Result<DevPtr, KernelError> {
        let need = bytes.max(1).next_multiple_of(CHUNK_ALIGN);
        let st = &mut *self.st;
        let cap = st.arena.as_ref().map_or(0, DevBuf::bytes);
        if cap - st.arena_used < need {
            // Queued launches may still read the old arena, queued copies the old mirror:
            // retire both until the next sync.
            if let Some(old) = st.arena.take() {
                st.pending_bytes += old.bytes();
                st.pending.push(old);
            }
            st.pending_host.extend(st.mirror.take());
            let cap = need.max(2 * cap).max(ARENA_MIN);
            let dev = &self.core.dev;
            st.arena = Some(dev.alloc(cap).map_err(|e| dev_err(self.op, e))?);
            st.mirror = Some(dev.host_alloc(cap).map_err(|e| dev_err(self.op, e))?);
            st.stats.allocs += 1;
            st.arena_used = 0;
        }
        let base = st.arena.as_ref().map_or(0, DevBuf::ptr);
        let p = DevPtr {
            ptr: base + st.arena_used as u64,
            bytes,
        };
        st.arena_used += need;
        Ok(p)
    }

    /// `data` copied into the arena (a per-call parameter): written into the host mirror at
    /// the chunk's offset and copied from there asynchronously, ordered on the calling thread's
    /// stream before the launches that read it. The arena and its mirror are rewound only
    /// after a wait for every stream, so no queued launch can still read a chunk, nor a queued
    /// copy its mirror range, when it is handed out again.
    pub(super) fn param(&mut self, data: &[u8]) -> Result<DevPtr, KernelError> {
        let p = self.scratch(data.len())?;
        let st = &mut *self.st;
        let off = st.arena.as_ref().map_or(0, |a| (p.ptr - a.ptr()) as usize);
        let mirror = st
            .mirror
            .as_mut()
            .ok_or_else(|| op_err(format!("{}: the parameter arena has no mirror", self.op)))?;
        let r = mirror
            .write(off, data)
            .and_then(|()| self.core.dev.stage(p, mirror, off, data.len()));
        r.map_err(|e| dev_err(self.op, e))?;
        self.st.stats.writes += 1;
        self.st.stats.write_bytes += data.len() as u64;
        Ok(p)
    }

    /// `v` on the device, uploaded once per distinct host array (see [`ParamKey`]).
    pub(super) fn cached(&mut self, v: &[u8]) -> Result<DevPtr, KernelError> {
        self.cached_as([ParamKey::of(v), ParamKey::default()], || v.to_vec())
    }

    /// The concatenation of `a` and `b` on the device, uploaded once per distinct pair.
    pub(super) fn cached_pair(&mut self, a: &[u8], b: &[u8]) -> Result<DevPtr, KernelError> {
        self.cached_as([ParamKey::of(a), ParamKey::of(b)], || [a, b].concat())
    }

    /// `data()` on the device under `key`, uploaded on the first call with that key.
    pub(super) fn cached_as(
        &mut self,
        key: [ParamKey; 2],
        data: impl FnOnce() -> Vec<u8>,
    ) -> Result<DevPtr, KernelError> {
        if let Some(b) = self.st.cache.get(&key) {
            return Ok(b.at());
        }
        let v = data();
        let st = &mut *self.st;
        if st.cache_bytes + v.len() > CACHE_MAX {
            for (_, b) in st.cache.drain() {
                st.pending_bytes += b.bytes();
                st.pending.push(b);
            }
            st.cache_bytes = 0;
        }
        let b = self.core.dev.upload(&v).map_err(|e| dev_err(self.op, e))?;
        st.stats.allocs += 1;
        st.stats.writes += 1;
        st.stats.write_bytes += v.len() as u64;
        st.cache_bytes += v.len();
        let p = b.at();
        st.cache.insert(key, b);
        Ok(p)
    }

    /// Count `n` queued kernel launches.
    pub(super) fn dispatched(&mut self, n: u64) {
        self.st.stats.dispatches += n;
    }

    /// A device result of this op as the trait's error.
    pub(super) fn run(&self, r: Result<(), CudaError>) -> Result<(), KernelError> {
        r.map_err(|e| dev_err(self.op, e))
    }
}

/// Whether two device ranges overlap.
pub(super) fn overlap(a: DevPtr, b: DevPtr) -> bool {
    a.bytes > 0 && b.bytes > 0 && a.ptr < b.ptr + b.bytes as u64 && b.ptr < a.ptr + a.bytes as u64
}

/// Wait for every stream of the device (one submission), then drop what waited for it and
/// rewind the arena.
pub(super) fn sync_and_drain(dev: &crate::Device, st: &mut State) -> Result<(), CudaError> {
    st.stats.submissions += 1;
    dev.synchronize()?;
    st.pending.clear();
    st.pending_host.clear();
    st.pending_bytes = 0;
    st.arena_used = 0;
    Ok(())
}

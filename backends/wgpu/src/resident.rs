//! Device-resident buffers of the wgpu backend ([`DeviceOps`]'s storage side): a slab of
//! buffers by id, the pending command encoder every resident op records into, per-op
//! persistent scratch buffers, and host constants (norm weights, mHC tables) kept on the
//! device by content.
//!
//! Ordering: every op, and every `write`, is recorded into the one pending encoder in call
//! order. A write goes through a fresh staging buffer and a `copy_buffer_to_buffer` in that
//! encoder (not `queue.write_buffer`, which lands before every command of the next
//! submission and so would overwrite data a pending dispatch has yet to read). `read` submits
//! the pending encoder with the read-back copy and waits; `flush` submits without waiting.

use crate::gpu::{Gpu, Step};
use crate::setup::Bind;
use dsv4_kernels::{DevBufId, DevSlice, KernelError};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Persistent scratch buffers kept; past this they are dropped (with the bind groups naming
/// them) and made again on demand.
const MAX_SCRATCH: usize = 256;
/// Host constants kept on the device; past this they are dropped and uploaded again on demand.
const MAX_CONSTS: usize = 4096;

/// A buffer range an op binds: the buffer (a cheap handle), its id and the byte range.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    buf: wgpu::Buffer,
    id: u64,
    off: u64,
    size: u64,
}

impl Held {
    /// The range as a binding.
    pub fn bind(&self) -> Bind<'_> {
        Bind {
            buf: &self.buf,
            id: self.id,
            off: self.off,
            size: self.size,
        }
    }
}

/// The resident state of one [`crate::WgpuBackend`].
#[derive(Default)]
pub(crate) struct Resident {
    pending: Mutex<Option<wgpu::CommandEncoder>>,
    bufs: Mutex<HashMap<u64, wgpu::Buffer>>,
    scratch: Mutex<HashMap<(&'static str, u64), Held>>,
    consts: Mutex<HashMap<(u64, usize), Held>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The error of a device op.
pub(crate) fn dev_err(message: impl Into<String>) -> KernelError {
    KernelError::Device {
        message: message.into(),
    }
}

/// FNV-style hash of all of `v`'s bits in four independent lanes (fast on long weights).
fn content_hash(v: &[f32]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let words: &[u32] = bytemuck::cast_slice(v);
    let mut lanes = [K, K ^ 1, K ^ 2, K ^ 3];
    let mut chunks = words.chunks_exact(4);
    for c in &mut chunks {
        for (l, w) in lanes.iter_mut().zip(c) {
            *l = (l.rotate_left(23) ^ u64::from(*w)).wrapping_mul(K);
        }
    }
    for (l, w) in lanes.iter_mut().zip(chunks.remainder()) {
        *l = (l.rotate_left(23) ^ u64::from(*w)).wrapping_mul(K);
    }
    lanes.iter().fold(v.len() as u64, |h, l| {
        (h.rotate_left(17) ^ l).wrapping_mul(K)
    })
}

/// Err unless `bytes` fit one binding.
fn fits(gpu: &Gpu, what: &str, bytes: u64) -> Result<(), KernelError> {
    let max = gpu.max_binding_bytes();
    if bytes > max {
        return Err(dev_err(format!(
            "{what} needs {bytes} bytes in one binding, more than this device's {max}; the batch or context does not fit this device"
        )));
    }
    Ok(())
}

impl Resident {
    /// A zeroed buffer of `words` words.
    pub fn alloc(&self, gpu: &Gpu, words: usize) -> Result<DevBufId, KernelError> {
        if words == 0 {
            return Err(dev_err("alloc: a buffer needs at least one word"));
        }
        let bytes = (words as u64).saturating_mul(4);
        let max = gpu.limits().max_buffer_size;
        if bytes > max {
            return Err(dev_err(format!(
                "alloc: {bytes} bytes exceed the device's largest buffer ({max} bytes)"
            )));
        }
        let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("resident"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let id = gpu.fresh_id();
        lock(&self.bufs).insert(id, buf);
        gpu.count(|s| s.allocs += 1);
        Ok(DevBufId(id))
    }

    /// Forget `buf` and the bind groups naming it (queued work keeps the buffer alive).
    pub fn free(&self, gpu: &Gpu, buf: DevBufId) {
        if lock(&self.bufs).remove(&buf.0).is_some() {
            gpu.setups().forget(buf.0);
        }
    }

    /// The range of `s` after checking that the buffer exists, holds it, the offset has the
    /// binding alignment and (when `bound`) one binding can cover it.
    pub fn slice(
        &self,
        gpu: &Gpu,
        op: &str,
        what: &str,
        s: DevSlice,
        bound: bool,
    ) -> Result<Held, KernelError> {
        let buf = lock(&self.bufs).get(&s.buf.0).cloned().ok_or_else(|| {
            dev_err(format!(
                "{op}: {what} names buffer {} which does not exist (freed, or never allocated)",
                s.buf.0
            ))
        })?;
        let (off, size) = (s.off as u64 * 4, s.len as u64 * 4);
        let align = gpu.limits().min_storage_buffer_offset_alignment as u64;
        if !off.is_multiple_of(align) {
            return Err(dev_err(format!(
                "{op}: {what} starts at byte {off}, not a multiple of the device's {align}-byte offset alignment"
            )));
        }
        if off + size > buf.size() {
            return Err(dev_err(format!(
                "{op}: {what} [{}, {}) words lies outside its buffer of {} words",
                s.off,
                s.off + s.len,
                buf.size() / 4
            )));
        }
        let max = gpu.max_binding_bytes();
        if bound && size > max {
            return Err(dev_err(format!(
                "{op}: {what} is {size} bytes, more than one binding of this device holds ({max}); the batch or context does not fit this device"
            )));
        }
        Ok(Held {
            buf,
            id: s.buf.0,
            off,
            size,
        })
    }

    /// A persistent zeroed scratch buffer of `bytes` for `tag` (the same one on every call with
    /// the same tag and size, so the bind groups naming it are reused).
    pub fn scratch(&self, gpu: &Gpu, tag: &'static str, bytes: usize) -> Result<Held, KernelError> {
        let size = (bytes.div_ceil(4).max(1) * 4) as u64;
        fits(gpu, tag, size)?;
        let mut pool = lock(&self.scratch);
        if let Some(h) = pool.get(&(tag, size)) {
            return Ok(h.clone());
        }
        if pool.len() >= MAX_SCRATCH {
            pool.clear();
            gpu.setups().clear_groups();
        }
        let h = Held {
            buf: gpu.scratch(tag, size as usize),
            id: gpu.fresh_id(),
            off: 0,
            size,
        };
        gpu.count(|s| s.allocs += 1);
        pool.insert((tag, size), h.clone());
        Ok(h)
    }

    /// `v` on the device, uploaded once per distinct content (norm weights, mHC tables).
    pub fn constant(&self, gpu: &Gpu, v: &[f32]) -> Result<Held, KernelError> {
        fits(gpu, "a host constant", v.len() as u64 * 4)?;
        let key = (content_hash(v), v.len());
        let mut pool = lock(&self.consts);
        if let Some(h) = pool.get(&key) {
            return Ok(h.clone());
        }
        if pool.len() >= MAX_CONSTS {
            pool.clear();
            gpu.setups().clear_groups();
        }
        let bytes: &[u8] = if v.is_empty() {
            &[0; 4]
        } else {
            bytemuck::cast_slice(v)
        };
        let buf = gpu.upload("constant", bytes);
        gpu.count(|s| {
            s.allocs += 1;
            s.writes += 1;
            s.write_bytes += bytes.len() as u64;
        });
        let h = Held {
            size: buf.size(),
            buf,
            id: gpu.fresh_id(),
            off: 0,
        };
        pool.insert(key, h.clone());
        Ok(h)
    }

    /// Record into the pending encoder (in call order with every other resident op).
    pub fn encode<R>(&self, gpu: &Gpu, f: impl FnOnce(&mut Step<'_>) -> R) -> R {
        let mut pending = lock(&self.pending);
        let encoder = pending.take().unwrap_or_else(|| gpu.encoder());
        let mut step = gpu.resume(encoder);
        let r = f(&mut step);
        *pending = Some(step.into_encoder());
        r
    }

    /// Submit the pending work, then read each range back (one submission for all).
    pub fn read(&self, gpu: &Gpu, hs: &[&Held]) -> Result<Vec<Vec<u8>>, KernelError> {
        let mut pending = lock(&self.pending);
        let encoder = pending.take().unwrap_or_else(|| gpu.encoder());
        let ranges: Vec<_> = hs
            .iter()
            .map(|h| (&h.buf, h.off, h.size as usize))
            .collect();
        gpu.submit_and_read(encoder, &ranges).map_err(dev_err)
    }

    /// Submit the pending work without waiting.
    pub fn flush(&self, gpu: &Gpu) -> Result<(), KernelError> {
        let mut pending = lock(&self.pending);
        if let Some(e) = pending.take() {
            gpu.submit(e);
            gpu.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| dev_err(format!("wgpu device lost: {e}")))?;
        }
        Ok(())
    }
}

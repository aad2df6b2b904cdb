//! The device a kernel runs on, behind one small trait: the CUDA driver (`cuda.rs`, cudarc) or the
//! CPU emulator (`emu.rs`) that runs the same `.cu` sources. The op wrappers in `ops/` only see
//! [`Device`]: allocate, copy, launch by kernel name with arguments in the kernel's order.

mod memory;
mod raw;

pub use memory::{DevBuf, DevPtr, HostBuf};
pub use raw::{DEFAULT_STREAM, DeviceInfo, Dim3, RawDevice, StreamHandle};

use crate::CudaError;
use crate::graphs::{GraphLaunch, Recorder};
use crate::temp::{self, TempPool};
use dsv4_kernels::DeviceStats;
use std::sync::{Arc, Mutex};

thread_local! {
    /// The stream the calling thread issues to: (device identity, stream). Work for any other
    /// device goes to that device's default stream.
    static CURRENT: std::cell::Cell<(usize, StreamHandle)> =
        const { std::cell::Cell::new((0, DEFAULT_STREAM)) };
}

/// One kernel argument, given in the order of the kernel's parameters.
#[derive(Debug, Clone, Copy)]
pub enum KArg<'a> {
    /// A pointer parameter (`const float*`, `uint8_t*`, …).
    Buf(&'a DevBuf),
    /// A pointer parameter into memory the caller keeps alive for the launch.
    Ptr(DevPtr),
    /// `unsigned int` / `uint32_t`.
    U32(u32),
    /// `int`.
    I32(i32),
    /// `unsigned long long` / `uint64_t`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
}

/// A device the ops run on: the raw device plus typed helpers.
#[derive(Clone)]
pub struct Device {
    /// The raw device with its graph recorder (shared by every handle of the device).
    rec: Arc<Recorder>,
    /// The host ops' temporaries (shared by every handle of the device).
    temps: Arc<TempPool>,
    /// Where this handle counts its traffic, if it does (see [`Device::counted`]).
    traffic: Option<Arc<Mutex<DeviceStats>>>,
}

impl Device {
    /// Wrap a raw device.
    pub fn new(raw: Arc<dyn RawDevice>) -> Self {
        Self {
            rec: Arc::new(Recorder::new(raw.clone())),
            temps: Arc::new(TempPool::new(raw)),
            traffic: None,
        }
    }

    fn raw(&self) -> &dyn RawDevice {
        self.rec.raw()
    }

    /// Open (`true`) or close (`false`) a graph span (see `graphs.rs`): while one is open,
    /// launches and staged copies are held per stream and issued as segments, repeated
    /// segments as graphs. Closing the last span issues everything held.
    pub fn graphs(&self, on: bool) -> Result<(), CudaError> {
        self.rec.span(on)
    }

    /// The graph counters (graph launches, kernels run by them, graphs built).
    pub fn graph_stats(&self) -> DeviceStats {
        self.rec.stats()
    }

    /// Issue what the calling thread's stream holds (before anything that is not a launch).
    fn flush(&self) -> Result<(), CudaError> {
        self.rec.flush(self.stream())
    }

    /// The same device, through a handle that counts its traffic into `stats`: an allocation,
    /// a host-to-device copy, a launch, and a read-back or synchronisation (one submission:
    /// a device-to-host copy waits for everything before it).
    pub(crate) fn counted(&self, stats: Arc<Mutex<DeviceStats>>) -> Self {
        Self {
            rec: self.rec.clone(),
            temps: self.temps.clone(),
            traffic: Some(stats),
        }
    }

    /// The identity of the raw device (what [`CURRENT`] is keyed by).
    fn identity(&self) -> usize {
        Arc::as_ptr(&self.rec) as usize
    }

    /// The stream the calling thread issues this device's work to.
    pub fn stream(&self) -> StreamHandle {
        let (dev, s) = CURRENT.with(std::cell::Cell::get);
        if dev == self.identity() {
            s
        } else {
            DEFAULT_STREAM
        }
    }

    /// Issue the calling thread's later work on this device to `stream` (one this device
    /// created, or [`DEFAULT_STREAM`]).
    pub fn set_stream(&self, stream: StreamHandle) {
        CURRENT.with(|c| c.set((self.identity(), stream)));
    }

    /// A new stream of this device.
    pub fn stream_create(&self) -> Result<StreamHandle, CudaError> {
        self.raw().stream_create()
    }

    /// Destroy a stream of this device after its work has finished.
    ///
    /// # Safety
    /// `stream` came from [`Device::stream_create`] and is not used afterwards.
    pub unsafe fn stream_destroy(&self, stream: StreamHandle) {
        self.rec.flush_all_deferred();
        // SAFETY: as the caller guarantees.
        unsafe { self.raw().stream_destroy(stream) }
    }

    /// A new event of this device.
    pub fn event_create(&self) -> Result<u64, CudaError> {
        self.raw().event_create()
    }

    /// Destroy an event of this device.
    ///
    /// # Safety
    /// `event` came from [`Device::event_create`] and is not used afterwards.
    pub unsafe fn event_destroy(&self, event: u64) {
        // SAFETY: as the caller guarantees.
        unsafe { self.raw().event_destroy(event) }
    }

    /// Record `event` on the calling thread's stream.
    pub fn event_record(&self, event: u64) -> Result<(), CudaError> {
        self.flush()?;
        self.raw().event_record(event, self.stream())
    }

    /// Make the calling thread's stream wait for the last record of `event`.
    pub fn wait_event(&self, event: u64) -> Result<(), CudaError> {
        self.flush()?;
        self.raw().stream_wait_event(self.stream(), event)
    }

    /// Wait until the work issued on `stream` so far has finished.
    pub fn stream_synchronize(&self, stream: StreamHandle) -> Result<(), CudaError> {
        self.count(|s| s.submissions += 1);
        self.rec.flush(stream)?;
        self.raw().stream_synchronize(stream)
    }

    fn count(&self, f: impl FnOnce(&mut DeviceStats)) {
        if let Some(t) = &self.traffic {
            f(&mut t.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    fn raw_upload(&self, ptr: u64, data: &[u8]) -> Result<(), CudaError> {
        self.count(|s| {
            s.writes += 1;
            s.write_bytes += data.len() as u64;
        });
        self.flush()?;
        self.raw().upload(self.stream(), ptr, data)
    }

    fn raw_download(&self, ptr: u64, out: &mut [u8]) -> Result<(), CudaError> {
        self.count(|s| {
            s.submissions += 1;
            s.reads += 1;
            s.read_bytes += out.len() as u64;
        });
        self.flush()?;
        self.raw().download(self.stream(), ptr, out)
    }

    /// What the device is.
    pub fn info(&self) -> DeviceInfo {
        self.raw().info()
    }

    /// Device memory free now, in bytes (None where the device has no limit of its own).
    pub fn free_memory(&self) -> Option<u64> {
        self.raw().free_memory()
    }

    /// A zero-filled buffer of `bytes` bytes (at least 16 are allocated, so empty tensors
    /// still have an address); zero before any later work on the calling thread's stream.
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, CudaError> {
        let ptr = self.raw().alloc(self.stream(), bytes.max(16))?;
        self.count(|s| s.allocs += 1);
        Ok(DevBuf {
            ptr,
            bytes,
            owner: self.rec.clone(),
            home: None,
        })
    }

    /// A zero-filled temporary of `bytes` bytes for work on the calling thread's stream only,
    /// given back to that stream's pool when dropped (see `temp.rs`): no allocation once the
    /// pool is warm, and no synchronisation when it goes.
    pub fn temp(&self, bytes: usize) -> Result<DevBuf, CudaError> {
        self.take_temp(bytes, true)
    }

    /// A temporary (see [`Device::temp`]) holding `data`, ordered on the calling thread's
    /// stream before later work there.
    pub fn temp_upload(&self, data: &[u8]) -> Result<DevBuf, CudaError> {
        let b = self.take_temp(data.len(), false)?;
        if !data.is_empty() {
            self.raw_upload(b.ptr, data)?;
        }
        Ok(b)
    }

    /// A temporary holding `data` as f32.
    pub fn temp_f32(&self, data: &[f32]) -> Result<DevBuf, CudaError> {
        self.temp_upload(f32_bytes(data))
    }

    /// Bytes of temporaries waiting in the pools for reuse.
    pub fn pooled_temp_bytes(&self) -> usize {
        self.temps.pooled_bytes()
    }

    fn take_temp(&self, bytes: usize, zero: bool) -> Result<DevBuf, CudaError> {
        let stream = self.stream();
        let class = temp::class_of(bytes);
        let (ptr, reused) = match self.temps.take(stream, class) {
            Some(p) => (p, true),
            None => {
                let p = self.raw().alloc(stream, class)?;
                self.count(|s| s.allocs += 1);
                (p, false)
            }
        };
        let b = DevBuf {
            ptr,
            bytes,
            owner: self.rec.clone(),
            home: Some((self.temps.clone(), stream, class)),
        };
        if reused && zero && bytes > 0 {
            // After the held work of its last user, which may still read it.
            self.flush()?;
            self.raw().zero(stream, ptr, bytes)?;
        }
        Ok(b)
    }

    /// A new buffer holding `data`, complete when this returns (so work on any stream may
    /// read it: weights and cached parameters are uploaded this way).
    pub fn upload(&self, data: &[u8]) -> Result<DevBuf, CudaError> {
        let b = self.alloc(data.len())?;
        if !data.is_empty() {
            self.raw_upload(b.ptr, data)?;
        }
        self.raw().stream_synchronize(self.stream())?;
        Ok(b)
    }

    /// A new buffer holding `data` as f32.
    pub fn upload_f32(&self, data: &[f32]) -> Result<DevBuf, CudaError> {
        self.upload(f32_bytes(data))
    }

    /// Overwrite the start of `buf` with `data`, after the calling thread's stream's earlier work.
    pub fn write(&self, buf: &DevBuf, data: &[u8]) -> Result<(), CudaError> {
        check_len("write", buf, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.raw_upload(buf.ptr, data)
    }

    /// Copy the first `out.len()` bytes of `buf` into `out` (after the calling thread's
    /// stream's earlier work).
    pub fn download(&self, buf: &DevBuf, out: &mut [u8]) -> Result<(), CudaError> {
        check_len("download", buf, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.raw_download(buf.ptr, out)
    }

    /// Copy the first `out.len()` f32 of `buf` into `out`.
    pub fn download_f32(&self, buf: &DevBuf, out: &mut [f32]) -> Result<(), CudaError> {
        let mut bytes = vec![0u8; out.len() * 4];
        self.download(buf, &mut bytes)?;
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }

    /// Launch `kernel` on `grid` × `block` with `args` (in the kernel's parameter order) on the
    /// calling thread's stream; it finishes before any later launch or copy on that stream
    /// starts. A grid with a zero dimension launches nothing.
    ///
    /// # Safety
    /// The argument list matches the kernel's parameters and every buffer is as large as the
    /// launch reads or writes; the op wrappers check sizes before they launch.
    pub unsafe fn launch(
        &self,
        kernel: &str,
        grid: Dim3,
        block: Dim3,
        args: &[KArg<'_>],
    ) -> Result<(), CudaError> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        // Each value lives in its own 8-byte, 8-aligned slot; smaller values sit in the low
        // bytes (little endian), which is where the driver reads a 4-byte parameter.
        let mut store: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                KArg::Buf(b) => b.ptr,
                KArg::Ptr(p) => p.ptr,
                KArg::U32(v) => u64::from(v),
                KArg::I32(v) => u64::from(v as u32),
                KArg::U64(v) => v,
                KArg::F32(v) => u64::from(v.to_bits()),
                KArg::F64(v) => v.to_bits(),
            })
            .collect();
        self.count(|s| s.dispatches += 1);
        if self.rec.holding() {
            let launch = GraphLaunch {
                name: kernel.to_string(),
                grid,
                block,
                params: store,
            };
            return self.rec.launch(self.stream(), launch);
        }
        let mut params = crate::graphs::param_ptrs(&mut store);
        // SAFETY: the caller guarantees the parameter list; `store` outlives the call.
        unsafe {
            self.raw()
                .launch_raw(self.stream(), kernel, grid, block, &mut params)
        }
    }
}

impl Device {
    /// Wait for everything issued so far on every stream (see [`RawDevice::synchronize`]).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.count(|s| s.submissions += 1);
        self.rec.flush_all()?;
        self.raw().synchronize()
    }

    /// Copy `data` into the start of `dst` (which the caller keeps alive), after the calling
    /// thread's stream's earlier work.
    pub fn upload_to(&self, dst: DevPtr, data: &[u8]) -> Result<(), CudaError> {
        if data.len() > dst.bytes {
            return Err(CudaError::OutOfBounds {
                what: "upload",
                len: data.len(),
                bytes: dst.bytes,
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        self.raw_upload(dst.ptr, data)
    }

    /// `bytes` bytes of page-locked host memory (see [`HostBuf`]).
    pub fn host_alloc(&self, bytes: usize) -> Result<HostBuf, CudaError> {
        let ptr = self.raw().host_alloc(bytes.max(16))?;
        Ok(HostBuf {
            ptr,
            bytes,
            owner: self.rec.clone(),
        })
    }

    /// Copy bytes `off..off + len` of `src` into `dst` asynchronously: `dst` is a parameter
    /// chunk no launch issued or held on the calling thread's stream since the device's last
    /// synchronisation reads, and the caller leaves the source range unchanged until the
    /// device's next device-wide synchronisation (the resident ops' per-call parameter arena
    /// and its host mirror). Ordered before later launches on that stream; inside a graph span
    /// it may be issued ahead of the held launches before it (see `graphs.rs`).
    pub fn stage(
        &self,
        dst: DevPtr,
        src: &HostBuf,
        off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        if len > dst.bytes || off.checked_add(len).is_none_or(|end| end > src.bytes) {
            return Err(CudaError::OutOfBounds {
                what: "stage",
                len,
                bytes: dst.bytes.min(src.bytes.saturating_sub(off)),
            });
        }
        if len == 0 {
            return Ok(());
        }
        self.count(|s| {
            s.writes += 1;
            s.write_bytes += len as u64;
        });
        let from = src.ptr + off as u64;
        if self.rec.holding() {
            return self.rec.stage(self.stream(), dst.ptr, from, len);
        }
        self.flush()?;
        // SAFETY: both ranges were checked above; the caller keeps the source unchanged.
        unsafe {
            self.raw()
                .upload_from_host(self.stream(), dst.ptr, from, len)
        }
    }

    /// Copy the first `out.len()` f32 of `src` (which the caller keeps alive) into `out`.
    pub fn download_f32_from(&self, src: DevPtr, out: &mut [f32]) -> Result<(), CudaError> {
        if out.len() * 4 > src.bytes {
            return Err(CudaError::OutOfBounds {
                what: "download",
                len: out.len() * 4,
                bytes: src.bytes,
            });
        }
        if out.is_empty() {
            return Ok(());
        }
        let mut bytes = vec![0u8; out.len() * 4];
        self.raw_download(src.ptr, &mut bytes)?;
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.info())
    }
}

fn check_len(what: &'static str, buf: &DevBuf, len: usize) -> Result<(), CudaError> {
    if len > buf.bytes {
        return Err(CudaError::OutOfBounds {
            what,
            len,
            bytes: buf.bytes,
        });
    }
    Ok(())
}

/// The bytes of an f32 slice (little endian, as the device reads them).
pub fn f32_bytes(data: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8; the targets are little endian.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

/// The bytes of an f64 slice (little endian, as the device reads them).
pub fn f64_bytes(data: &[f64]) -> &[u8] {
    // SAFETY: f64 has no padding and any byte pattern is a valid u8; the targets are little endian.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

/// Grid size for `n` items at `per_block` items per block (at least one block when n > 0).
pub fn blocks_for(n: usize, per_block: usize) -> u32 {
    u32::try_from(n.div_ceil(per_block.max(1))).expect("grid dimension exceeds u32")
}

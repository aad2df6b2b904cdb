//! What a device implementation provides ([`RawDevice`]), and the types it speaks in.

use crate::CudaError;
use crate::graphs::GraphLaunch;
use std::ffi::c_void;

/// A grid or block shape (x, y, z).
pub type Dim3 = (u32, u32, u32);

/// What a device is, as reported to the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name ("NVIDIA H200", or "cuda-emu (CPU emulator)").
    pub name: String,
    /// Compute capability (major, minor) the kernels were compiled for.
    pub capability: (u32, u32),
    /// Device memory in bytes (0 when unknown).
    pub memory_bytes: u64,
    /// Whether sums accumulate in f64 (`DSV4_ACC_F64`) or f32.
    pub f64_accumulation: bool,
    /// True for the CPU emulator.
    pub emulated: bool,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (sm_{}{}, {} MiB, {} accumulation)",
            self.name,
            self.capability.0,
            self.capability.1,
            self.memory_bytes >> 20,
            if self.f64_accumulation { "f64" } else { "f32" }
        )
    }
}

/// A stream of a [`RawDevice`] by handle; [`DEFAULT_STREAM`] is the device's default stream.
pub type StreamHandle = u64;
/// The default (legacy) stream: work issued on it runs in issue order.
pub const DEFAULT_STREAM: StreamHandle = 0;

/// The raw operations a device implementation provides. Addresses are device addresses (for
/// the emulator: host addresses); `params` is what `cuLaunchKernel` takes: one pointer per
/// kernel parameter, each pointing at an 8-byte slot holding that parameter's value in its low
/// bytes ([`Device::launch`](crate::Device::launch) lays them out so).
///
/// Work is issued on a stream: work on one stream runs in issue order; work on different
/// streams runs in any order unless an event orders it (the streams a device creates do not
/// synchronise with the default stream either).
pub trait RawDevice: Send + Sync {
    /// What the device is.
    fn info(&self) -> DeviceInfo;
    /// Allocate `bytes` (> 0) bytes, zero-filled before any later work on `stream` runs.
    fn alloc(&self, stream: StreamHandle, bytes: usize) -> Result<u64, CudaError>;
    /// Device memory free now, in bytes, where the device says (CUDA: `cuMemGetInfo`); None
    /// where it has no limit of its own (the CPU emulator).
    fn free_memory(&self) -> Option<u64> {
        None
    }
    /// Free an address `alloc` returned, after all work on every stream has finished.
    ///
    /// # Safety
    /// `ptr` came from this device's `alloc` and is not used afterwards.
    unsafe fn free(&self, ptr: u64);
    /// `bytes` (> 0) bytes of page-locked host memory, which the device copies from
    /// asynchronously (CUDA: `cuMemHostAlloc`), zero-filled.
    fn host_alloc(&self, bytes: usize) -> Result<u64, CudaError>;
    /// Free host memory `host_alloc` returned, after every copy from it has run.
    ///
    /// # Safety
    /// `ptr` came from this device's `host_alloc` and is not used afterwards.
    unsafe fn host_free(&self, ptr: u64);
    /// Copy `len` bytes of page-locked host memory at `src` to `dst` after the work issued on
    /// `stream` so far. The copy reads `src` when it runs, not when it is issued.
    ///
    /// # Safety
    /// `src..src + len` lies in memory `host_alloc` returned and stays unchanged until the copy
    /// has run; `dst` holds `len` bytes.
    unsafe fn upload_from_host(
        &self,
        stream: StreamHandle,
        dst: u64,
        src: u64,
        len: usize,
    ) -> Result<(), CudaError>;
    /// Zero `bytes` bytes at `ptr` after the work issued on `stream` so far.
    fn zero(&self, stream: StreamHandle, ptr: u64, bytes: usize) -> Result<(), CudaError>;
    /// Copy `data` to `ptr` (which holds at least `data.len()` bytes) after the work issued on
    /// `stream` so far; `data` is not used after the call returns.
    fn upload(&self, stream: StreamHandle, ptr: u64, data: &[u8]) -> Result<(), CudaError>;
    /// Wait for the work issued on `stream`, then copy `out.len()` bytes from `ptr` into `out`.
    fn download(&self, stream: StreamHandle, ptr: u64, out: &mut [u8]) -> Result<(), CudaError>;
    /// Launch kernel `name` on `stream`, after the work issued there so far (it may still be
    /// running when this returns).
    ///
    /// # Safety
    /// `params` matches the kernel's parameter list in number and types (8-byte slots, see
    /// above), and every buffer the kernel touches through them is large enough for the launch.
    unsafe fn launch_raw(
        &self,
        stream: StreamHandle,
        name: &str,
        grid: Dim3,
        block: Dim3,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError>;
    /// Wait until the work issued so far on every stream has finished.
    fn synchronize(&self) -> Result<(), CudaError>;
    /// Wait until the work issued so far on `stream` has finished.
    fn stream_synchronize(&self, stream: StreamHandle) -> Result<(), CudaError>;
    /// A new stream (not [`DEFAULT_STREAM`]), independent of every other.
    fn stream_create(&self) -> Result<StreamHandle, CudaError>;
    /// Destroy a stream `stream_create` returned, after its work has finished.
    ///
    /// # Safety
    /// `stream` came from this device's `stream_create` and is not used afterwards.
    unsafe fn stream_destroy(&self, stream: StreamHandle);
    /// A new event (never recorded).
    fn event_create(&self) -> Result<u64, CudaError>;
    /// Destroy an event `event_create` returned.
    ///
    /// # Safety
    /// `event` came from this device's `event_create` and is not used afterwards.
    unsafe fn event_destroy(&self, event: u64);
    /// Record `event` on `stream`, after the work issued there so far.
    fn event_record(&self, event: u64, stream: StreamHandle) -> Result<(), CudaError>;
    /// Make `stream`'s later work wait until the last record of `event` issued so far has
    /// been reached (nothing to wait for when it was never recorded).
    fn stream_wait_event(&self, stream: StreamHandle, event: u64) -> Result<(), CudaError>;
    /// An executable graph that runs `launches` in order, each after the previous (CUDA: a
    /// graph of kernel nodes, instantiated).
    ///
    /// # Safety
    /// Each launch's parameters match its kernel (as for [`RawDevice::launch_raw`]), and the
    /// graph is launched only while every buffer they address is alive and large enough.
    unsafe fn graph_create(&self, launches: &[GraphLaunch]) -> Result<u64, CudaError>;
    /// Launch `graph` on `stream`, after the work issued there so far.
    fn graph_launch(&self, stream: StreamHandle, graph: u64) -> Result<(), CudaError>;
    /// Destroy a graph `graph_create` returned, after its launches have finished.
    ///
    /// # Safety
    /// `graph` came from this device's `graph_create` and is not used afterwards.
    unsafe fn graph_destroy(&self, graph: u64);
}

//! The CUDA driver device (registry name `cuda-sm120`): a context on one GPU, the kernels compiled
//! by NVRTC for its compute capability and loaded as one module, and [`RawDevice`] over the
//! driver API (cudarc's `result` level: raw device pointers, stream-ordered copies and launches on
//! the legacy default stream or on non-blocking streams a plan's streams map to, events). libcuda is loaded
//! dynamically; [`probe`] checks for it before any cudarc driver call (cudarc panics when the
//! library is missing). `DSV4_CUDA_DRIVER=emu` loads the emulated driver instead
//! (`emu/driver*.cpp`), so this file's calls run and are checked without a GPU.

use crate::device::{DEFAULT_STREAM, Dim3, RawDevice, StreamHandle};
use crate::driver_lib::find_libcuda;
pub use crate::driver_lib::{
    DRIVER_ENV, DriverLib, EMU_CC_ENV, EMU_SCHEDULE_ENV, driver_lib, emulated_capability,
    emulated_driver_failures, emulated_schedule_deferred, select_driver,
};
use crate::graphs::GraphLaunch;
use crate::kernel_cache::{self, KernelSource};
use crate::{CudaError, Device, DeviceInfo, kernels, nvrtc, registry};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, OnceLock};

/// Ok when the NVIDIA driver (or the emulated one) is loadable, initializes, has at least one
/// device, and NVRTC is loadable; else why not. Checked once.
pub fn probe() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(probe_once).clone()
}

fn probe_once() -> Result<(), String> {
    match driver_lib()? {
        DriverLib::System => find_libcuda()?,
        DriverLib::Emulated => crate::driver_lib::load_emulated()?,
    }
    result::init().map_err(|e| format!("cuInit failed: {}", err_name(e)))?;
    let count = result::device::get_count()
        .map_err(|e| format!("cuDeviceGetCount failed: {}", err_name(e)))?;
    if count <= 0 {
        return Err("no CUDA device (the driver loads but reports no GPU)".to_string());
    }
    match kernel_cache::source()? {
        // open() says which cached CUBIN is missing, if one is.
        KernelSource::CachedOnly => Ok(()),
        KernelSource::Auto => nvrtc::nvrtc_probe().map_err(|e| {
            format!(
                "{e}; or set {}=cached to run CUBINs compiled before",
                kernel_cache::KERNELS_ENV
            )
        }),
    }
}

fn err_name(e: DriverError) -> String {
    match e.error_name() {
        Ok(n) => n.to_string_lossy().into_owned(),
        Err(_) => format!("CUresult {}", e.0 as i32),
    }
}

fn drv(what: &str) -> impl Fn(DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver(format!("{what}: {}", err_name(e)))
}

/// Whether a device of this compute capability accumulates in f64 by default: the ones with
/// full-rate FP64 (A100 sm_80, H100/H200 sm_90, B200 sm_100).
pub fn default_acc_f64(capability: (u32, u32)) -> bool {
    matches!(capability, (8, 0) | (9, 0) | (10, 0))
}

/// The GPU `device_index` with the backend's kernels compiled for it and loaded. Accumulation
/// is f64 when `f64_sums` is Some(true), f32 when Some(false), else [`default_acc_f64`] unless
/// `DSV4_CUDA_ACC=f32|f64` says otherwise.
pub fn open(device_index: usize, f64_sums: Option<bool>) -> Result<Device, CudaError> {
    probe().map_err(CudaError::Unavailable)?;
    let count = result::device::get_count().map_err(drv("cuDeviceGetCount"))?;
    let ordinal = i32::try_from(device_index)
        .ok()
        .filter(|&i| i < count)
        .ok_or_else(|| {
            CudaError::Unavailable(format!(
                "CUDA device {device_index} does not exist ({count} device(s))"
            ))
        })?;
    let dev = result::device::get(ordinal).map_err(drv("cuDeviceGet"))?;
    // SAFETY: dev is a valid device handle from cuDeviceGet.
    let ctx =
        unsafe { result::primary_ctx::retain(dev) }.map_err(drv("cuDevicePrimaryCtxRetain"))?;
    // From here on the device (and its Drop) owns the context reference.
    let mut d = CudaDevice {
        dev,
        ctx,
        module: std::ptr::null_mut(),
        funcs: HashMap::new(),
        info: DeviceInfo {
            name: String::new(),
            capability: (0, 0),
            memory_bytes: 0,
            f64_accumulation: false,
            emulated: false,
        },
    };
    d.current()?;
    let attr = |a| {
        // SAFETY: dev is valid; the attribute enum value is a valid CUdevice_attribute.
        unsafe { result::device::get_attribute(dev, a) }.map_err(drv("cuDeviceGetAttribute"))
    };
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let capability = (major as u32, minor as u32);
    d.info = DeviceInfo {
        name: result::device::get_name(dev).map_err(drv("cuDeviceGetName"))?,
        capability,
        // SAFETY: dev is valid.
        memory_bytes: unsafe { result::device::total_mem(dev) }.map_err(drv("cuDeviceTotalMem"))?
            as u64,
        f64_accumulation: match f64_sums {
            Some(f) => f,
            None => registry::acc_override()?.unwrap_or(default_acc_f64(capability)),
        },
        emulated: driver_lib() == Ok(DriverLib::Emulated),
    };
    if capability < (8, 0) {
        return Err(CudaError::Unavailable(format!(
            "CUDA device {device_index} ({}) is sm_{}{}; the kernels need sm_80 or newer \
             (bf16 mma.sync, 16-byte loads of packed weights)",
            d.info.name, capability.0, capability.1
        )));
    }
    if d.info.emulated {
        crate::driver_lib::check_emulated_acc(d.info.f64_accumulation)?;
    }
    d.module = load_module(capability, d.info.f64_accumulation)?;
    for name in kernels::kernel_names() {
        let cname =
            CString::new(name.clone()).map_err(|_| CudaError::NoSuchKernel(name.clone()))?;
        // SAFETY: the module is loaded and stays loaded while `d` lives.
        let f = unsafe { result::module::get_function(d.module, cname) }.map_err(|e| {
            CudaError::Driver(format!("cuModuleGetFunction({name}): {}", err_name(e)))
        })?;
        d.funcs.insert(name, f);
    }
    Ok(Device::new(Arc::new(d)))
}

/// Load the cached CUBIN for `sm_XY` (see `kernel_cache.rs`), else compile one, load it and
/// cache it; if the driver refuses a fresh CUBIN, load PTX for `compute_XY` instead
/// (JIT-compiled by the driver). The context must be current.
fn load_module(capability: (u32, u32), acc_f64: bool) -> Result<sys::CUmodule, CudaError> {
    let source = kernel_cache::source().map_err(CudaError::Unavailable)?;
    let cached = kernel_cache::path(capability, acc_f64);
    if let Some(cubin) = kernel_cache::load(capability, acc_f64) {
        // SAFETY: an ELF image (checked by load); the driver validates and copies it.
        match unsafe { result::module::load_data(cubin.as_ptr().cast()) } {
            Ok(m) => return Ok(m),
            Err(e) if source == KernelSource::CachedOnly => {
                return Err(CudaError::Driver(format!(
                    "cuModuleLoadData refused the cached CUBIN {}: {}",
                    cached.display(),
                    err_name(e)
                )));
            }
            Err(e) => tracing::warn!(
                "the cached CUBIN {} does not load ({}); compiling",
                cached.display(),
                err_name(e)
            ),
        }
    } else if source == KernelSource::CachedOnly {
        let acc = if acc_f64 { "f64" } else { "f32" };
        return Err(CudaError::Unavailable(format!(
            "{}=cached and no cached CUBIN for sm_{}{} ({} accumulation) at {}: run once where \
             NVRTC is, with the same DSV4_CACHE_DIR, or `dsv4 kernels compile --arch {}.{} \
             --sums {acc}` there (no GPU needed)",
            kernel_cache::KERNELS_ENV,
            capability.0,
            capability.1,
            acc,
            cached.display(),
            capability.0,
            capability.1
        )));
    }
    let cubin = nvrtc::compile_cubin(capability, acc_f64)?;
    // SAFETY: cubin is a complete ELF image produced by NVRTC; the driver copies it.
    let cubin_err = match unsafe { result::module::load_data(cubin.as_ptr().cast()) } {
        Ok(m) => {
            kernel_cache::store(capability, acc_f64, &cubin);
            return Ok(m);
        }
        Err(e) => err_name(e),
    };
    let ptx = nvrtc::compile_ptx(capability, acc_f64)?;
    let ptx = CString::new(ptx).map_err(|_| CudaError::Driver("PTX with a NUL byte".into()))?;
    // SAFETY: a NUL-terminated PTX string; the driver copies it.
    unsafe { result::module::load_data(ptx.as_ptr().cast()) }.map_err(|e| {
        CudaError::Driver(format!(
            "cuModuleLoadData: the CUBIN failed ({cubin_err}) and the PTX failed ({}); \
             is the driver older than NVRTC {:?}?",
            err_name(e),
            nvrtc::version().ok()
        ))
    })
}

/// One GPU: its primary context, the kernel module and its functions by name.
struct CudaDevice {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    funcs: HashMap<String, sys::CUfunction>,
    info: DeviceInfo,
}

// SAFETY: CUDA driver handles may be used from any host thread once the context is current
// there; every method makes it current first, and the driver API is thread safe.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; the handles are never mutated after `open`.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Make this device's context current on the calling thread.
    fn current(&self) -> Result<(), CudaError> {
        // SAFETY: ctx is the retained primary context of `dev`.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(drv("cuCtxSetCurrent"))
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.current().is_ok() && !self.module.is_null() {
            // SAFETY: the module was loaded by `open` and no function of it is used after this.
            let _ = unsafe { result::module::unload(self.module) };
        }
        // SAFETY: releases the reference `open` retained.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

impl CudaDevice {
    /// Add `launches` to `graph` as a chain of kernel nodes and instantiate it.
    ///
    /// # Safety
    /// As [`RawDevice::graph_create`]; `graph` is a valid, empty graph.
    unsafe fn instantiate(
        &self,
        graph: sys::CUgraph,
        launches: &[GraphLaunch],
    ) -> Result<sys::CUgraphExec, CudaError> {
        let mut prev: Option<sys::CUgraphNode> = None;
        for l in launches {
            let func = *self
                .funcs
                .get(&l.name)
                .ok_or_else(|| CudaError::NoSuchKernel(l.name.clone()))?;
            let mut slots = l.params.clone();
            let mut ptrs = crate::graphs::param_ptrs(&mut slots);
            let params = sys::CUDA_KERNEL_NODE_PARAMS {
                func,
                gridDimX: l.grid.0,
                gridDimY: l.grid.1,
                gridDimZ: l.grid.2,
                blockDimX: l.block.0,
                blockDimY: l.block.1,
                blockDimZ: l.block.2,
                sharedMemBytes: 0,
                kernelParams: ptrs.as_mut_ptr(),
                extra: std::ptr::null_mut(),
                kern: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            };
            let mut node: sys::CUgraphNode = std::ptr::null_mut();
            let (deps, n) = match &prev {
                Some(p) => (p as *const sys::CUgraphNode, 1),
                None => (std::ptr::null(), 0),
            };
            // SAFETY: graph is valid, deps points at `n` nodes of it, params and the slots it
            // points at live across the call (the driver copies the values).
            unsafe { sys::cuGraphAddKernelNode_v2(&mut node, graph, deps, n, &params) }
                .result()
                .map_err(|e| {
                    CudaError::Driver(format!("cuGraphAddKernelNode({}): {}", l.name, err_name(e)))
                })?;
            prev = Some(node);
        }
        // SAFETY: graph is valid and complete.
        unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
            .map_err(drv("cuGraphInstantiate"))
    }
}

/// A stream handle as the driver's `CUstream` ([`DEFAULT_STREAM`] is the legacy stream, null).
fn cu_stream(s: StreamHandle) -> sys::CUstream {
    s as usize as sys::CUstream
}

impl RawDevice for CudaDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn free_memory(&self) -> Option<u64> {
        self.current().ok()?;
        result::mem_get_info().ok().map(|(free, _)| free as u64)
    }

    fn alloc(&self, stream: StreamHandle, bytes: usize) -> Result<u64, CudaError> {
        self.current()?;
        // SAFETY: a plain allocation; it is zero-filled below before anyone reads it.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                CudaError::TooLarge {
                    what: format!(
                        "allocating {bytes} bytes on {}: out of device memory",
                        self.info.name
                    ),
                }
            } else {
                CudaError::Driver(format!("cuMemAlloc({bytes}): {}", err_name(e)))
            }
        })?;
        // SAFETY: ptr holds `bytes` bytes; the memset is ordered before later work on `stream`.
        if let Err(e) = unsafe { result::memset_d8_async(ptr, 0, bytes, cu_stream(stream)) } {
            // SAFETY: ptr was just allocated and is not used elsewhere.
            let _ = unsafe { result::free_sync(ptr) };
            return Err(drv("cuMemsetD8Async")(e));
        }
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: u64) {
        // Launches are asynchronous: wait for any still reading or writing this buffer, on
        // any stream.
        if self.current().is_ok() && result::ctx::synchronize().is_ok() {
            // SAFETY: the caller guarantees ptr came from alloc and is not used again.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    fn host_alloc(&self, bytes: usize) -> Result<u64, CudaError> {
        self.current()?;
        // SAFETY: a plain page-locked allocation (flags 0), zeroed below before any use.
        let p = unsafe { result::malloc_host(bytes, 0) }.map_err(drv("cuMemHostAlloc"))?;
        // SAFETY: p holds `bytes` bytes of host memory.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
        Ok(p as usize as u64)
    }

    unsafe fn host_free(&self, ptr: u64) {
        // Copies from it may still be queued on any stream.
        if self.current().is_ok() && result::ctx::synchronize().is_ok() {
            // SAFETY: the caller guarantees ptr came from host_alloc and is not used again.
            let _ = unsafe { result::free_host(ptr as usize as *mut c_void) };
        }
    }

    unsafe fn upload_from_host(
        &self,
        stream: StreamHandle,
        dst: u64,
        src: u64,
        len: usize,
    ) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: the caller guarantees src..src+len is page-locked memory that stays unchanged
        // until the copy runs, and that dst holds len bytes. From page-locked memory the copy is
        // truly asynchronous: no staging, no stall.
        unsafe {
            let data = std::slice::from_raw_parts(src as usize as *const u8, len);
            result::memcpy_htod_async(dst, data, cu_stream(stream))
        }
        .map_err(drv("cuMemcpyHtoDAsync"))
    }

    fn zero(&self, stream: StreamHandle, ptr: u64, bytes: usize) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: Device only zeroes inside its own temporaries; ordered on `stream`.
        unsafe { result::memset_d8_async(ptr, 0, bytes, cu_stream(stream)) }
            .map_err(drv("cuMemsetD8Async"))
    }

    fn upload(&self, stream: StreamHandle, ptr: u64, data: &[u8]) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: Device only uploads into buffers at least data.len() bytes long. `data` is
        // pageable memory, which the driver stages before cuMemcpyHtoDAsync returns, so it is
        // not used after the call.
        unsafe { result::memcpy_htod_async(ptr, data, cu_stream(stream)) }
            .map_err(drv("cuMemcpyHtoDAsync"))
    }

    fn download(&self, stream: StreamHandle, ptr: u64, out: &mut [u8]) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: Device only downloads from buffers at least out.len() bytes long; the
        // stream is synchronised before `out` is used.
        unsafe { result::memcpy_dtoh_async(out, ptr, cu_stream(stream)) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.stream_synchronize(stream)
    }

    unsafe fn launch_raw(
        &self,
        stream: StreamHandle,
        name: &str,
        grid: Dim3,
        block: Dim3,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let f = *self
            .funcs
            .get(name)
            .ok_or_else(|| CudaError::NoSuchKernel(name.to_string()))?;
        self.current()?;
        // SAFETY: the caller guarantees params match the kernel; cuLaunchKernel copies the
        // parameter values before it returns. The launch runs after the work issued on
        // `stream` before it; CUDA_LAUNCH_BLOCKING=1 makes each launch wait, for debugging.
        unsafe { result::launch_kernel(f, grid, block, 0, cu_stream(stream), params) }
            .map_err(|e| CudaError::Driver(format!("launching {name}: {}", err_name(e))))
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.current()?;
        result::ctx::synchronize()
            .map_err(|e| CudaError::Driver(format!("running kernels: {}", err_name(e))))
    }

    fn stream_synchronize(&self, stream: StreamHandle) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: the stream is the legacy stream or one stream_create made and not destroyed.
        unsafe { result::stream::synchronize(cu_stream(stream)) }
            .map_err(|e| CudaError::Driver(format!("running kernels: {}", err_name(e))))
    }

    fn stream_create(&self) -> Result<StreamHandle, CudaError> {
        self.current()?;
        // Non-blocking: no implicit synchronisation with the legacy stream, so only a plan's
        // events order its streams.
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(drv("cuStreamCreate"))?;
        Ok(s as usize as StreamHandle)
    }

    unsafe fn stream_destroy(&self, stream: StreamHandle) {
        if stream != DEFAULT_STREAM && self.current().is_ok() {
            // SAFETY: the caller guarantees the stream came from stream_create. The driver
            // finishes the stream's work before releasing it.
            let _ = unsafe { result::stream::destroy(cu_stream(stream)) };
        }
    }

    fn event_create(&self) -> Result<u64, CudaError> {
        self.current()?;
        let e = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(drv("cuEventCreate"))?;
        Ok(e as usize as u64)
    }

    unsafe fn event_destroy(&self, event: u64) {
        if self.current().is_ok() {
            // SAFETY: the caller guarantees the event came from event_create.
            let _ = unsafe { result::event::destroy(event as usize as sys::CUevent) };
        }
    }

    fn event_record(&self, event: u64, stream: StreamHandle) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: the event came from event_create; the stream is valid (see above).
        unsafe { result::event::record(event as usize as sys::CUevent, cu_stream(stream)) }
            .map_err(drv("cuEventRecord"))
    }

    unsafe fn graph_create(&self, launches: &[GraphLaunch]) -> Result<u64, CudaError> {
        self.current()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: graph is a valid out-pointer; flags must be 0.
        unsafe { sys::cuGraphCreate(&mut graph, 0) }
            .result()
            .map_err(drv("cuGraphCreate"))?;
        // SAFETY: each node's parameters match its kernel (the caller's guarantee); the driver
        // copies the parameter values when the node is added. The graph is destroyed on every
        // path, the executable graph keeps what it needs.
        let exec = unsafe { self.instantiate(graph, launches) };
        // SAFETY: graph came from cuGraphCreate above and is not used again.
        let _ = unsafe { result::graph::destroy(graph) };
        Ok(exec? as usize as u64)
    }

    fn graph_launch(&self, stream: StreamHandle, graph: u64) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: graph came from graph_create and was not destroyed; the stream is valid.
        unsafe { result::graph::launch(graph as usize as sys::CUgraphExec, cu_stream(stream)) }
            .map_err(drv("cuGraphLaunch"))
    }

    unsafe fn graph_destroy(&self, graph: u64) {
        if self.current().is_ok() {
            // SAFETY: the caller guarantees graph came from graph_create; the driver waits for
            // its launches before releasing it.
            let _ = unsafe { result::graph::exec_destroy(graph as usize as sys::CUgraphExec) };
        }
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: u64) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: as for event_record.
        unsafe {
            result::stream::wait_event(
                cu_stream(stream),
                event as usize as sys::CUevent,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(drv("cuStreamWaitEvent"))
    }
}

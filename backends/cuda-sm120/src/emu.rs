//! The CPU emulator (registry name `cuda-emu`): builds the kernel translation unit with the host
//! C++ compiler under `emu/shim.h` into a shared library (cached on disk, keyed by a hash of every
//! input), loads it, and runs launches on cooperative fibers (`emu/runtime.cpp`: blocks one after
//! another, one fiber per thread, `__syncthreads`/shuffles emulated). Device memory is host memory.
//! Work on every stream, the default one too, is queued and run in an adversarial order
//! (`emu/streams.rs`), and allocations are zeroed on their stream, so a plan's missing event or a
//! plan stream not ordered after the default stream shows up here as it might on a GPU.
//! This is how the kernels are diffed against the reference backend on machines without a GPU.

mod build;
mod streams;

pub use build::EXTRA_FLAGS_ENV;

use crate::device::{Dim3, RawDevice, StreamHandle};
use crate::graphs::GraphLaunch;
use crate::{CudaError, Device, DeviceInfo, kernels};
use build::{Library, build, find_compiler};
use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CString, c_char, c_void};
use std::sync::{Arc, Mutex};
use streams::{Item, Streams};

/// The device name the emulator reports.
pub const DEVICE_NAME: &str = "cuda-emu (CPU emulator)";

/// Allocation alignment (cudaMalloc guarantees 256).
const ALIGN: usize = 256;
/// Guard bytes before and after every allocation, checked after each launch: a kernel that
/// writes outside its buffers fails the launch instead of silently corrupting host memory.
const GUARD: usize = 256;
const GUARD_BYTE: u8 = 0xA5;

fn alloc_layout(bytes: usize) -> Option<Layout> {
    Layout::from_size_align(bytes.checked_add(2 * GUARD)?, ALIGN).ok()
}

type LaunchFn = unsafe extern "C" fn(
    *const c_char,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut *mut c_void,
    *mut c_char,
    usize,
) -> i32;

/// The runtime's launch state is global (one launch at a time per library), and tests run
/// launches from many threads: every launch of every emulated device takes this lock.
static LAUNCH: Mutex<()> = Mutex::new(());

/// Ok when a C++ compiler is available to build the emulator, else why not.
pub fn probe() -> Result<(), String> {
    find_compiler().map(|_| ())
}

/// The emulator running the backend's kernels (`kernels::translation_unit()`), with f64
/// accumulation (`DSV4_ACC_F64`) when `acc_f64`.
pub fn open(acc_f64: bool) -> Result<Device, CudaError> {
    open_tu(
        &kernels::translation_unit(),
        &kernels::kernel_names(),
        acc_f64,
    )
}

/// Build (or find cached) the emulated CUDA driver (`emu/driver*.cpp`): a `libcuda.so` whose
/// device has compute capability `capability` and runs the backend's kernels on the CPU with
/// f64 accumulation when `acc_f64`. The `cuda-sm120` device loads it for `DSV4_CUDA_DRIVER=emu`.
pub fn build_driver(
    capability: (u32, u32),
    acc_f64: bool,
) -> Result<std::path::PathBuf, CudaError> {
    build(
        &kernels::translation_unit(),
        &kernels::kernel_names(),
        acc_f64,
        Library::Driver(capability),
    )
}

/// The emulator running the kernels of `tu` instead (tests of the emulator itself); the kernels
/// are the `__global__` functions found in `tu`.
pub fn open_with_source(tu: &str, acc_f64: bool) -> Result<Device, CudaError> {
    open_tu(tu, &scan_kernel_names(tu), acc_f64)
}

/// Names of the `__global__` functions in `text` (the word before the first `(` after each).
fn scan_kernel_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("__global__") {
        rest = &rest[i + "__global__".len()..];
        let decl = rest.split('(').next().unwrap_or("");
        if let Some(name) = decl.split_whitespace().last() {
            names.push(name.to_string());
        }
    }
    names
}

fn open_tu(tu: &str, names: &[String], acc_f64: bool) -> Result<Device, CudaError> {
    let path = build(tu, names, acc_f64, Library::Emulator)?;
    // SAFETY: the library is ours (built above); its initializers only set up plain globals.
    let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
        CudaError::Unavailable(format!("cannot load the emulator {}: {e}", path.display()))
    })?;
    // SAFETY: dsv4_emu_launch is defined by registry_source with exactly this signature.
    let launch: LaunchFn = unsafe { lib.get::<LaunchFn>(b"dsv4_emu_launch\0") }
        .map(|s| *s)
        .map_err(|e| CudaError::Unavailable(format!("{}: {e}", path.display())))?;
    Ok(Device::new(Arc::new(EmuDevice {
        _lib: lib,
        launch,
        acc_f64,
        allocs: Mutex::new(BTreeMap::new()),
        streams: Mutex::new(Streams::default()),
        host_allocs: Mutex::new(BTreeMap::new()),
        kernels: names.iter().cloned().collect(),
        graphs: Mutex::default(),
        next_graph: Default::default(),
    })))
}

/// The emulated device: the loaded library and the host allocations standing in for device memory.
struct EmuDevice {
    _lib: libloading::Library,
    launch: LaunchFn,
    acc_f64: bool,
    /// Live allocations: address -> size in bytes (each between two guards of GUARD bytes).
    allocs: Mutex<BTreeMap<u64, usize>>,
    /// Created streams' queued work and the events (see `streams.rs`). Held while queued work
    /// runs, so one stream's items never run concurrently or out of order.
    streams: Mutex<Streams>,
    /// Live page-locked host allocations: address -> size in bytes.
    host_allocs: Mutex<BTreeMap<u64, usize>>,
    /// The kernels the library has.
    kernels: HashSet<String>,
    /// Graphs by handle: the launches each runs (copied when it was built).
    graphs: Mutex<HashMap<u64, Arc<Vec<GraphLaunch>>>>,
    next_graph: std::sync::atomic::AtomicU64,
}

impl EmuDevice {
    /// Check that `ptr..ptr+len` lies inside one live allocation.
    fn check(&self, what: &'static str, ptr: u64, len: usize) -> Result<(), CudaError> {
        let allocs = self.allocs.lock().unwrap_or_else(|e| e.into_inner());
        match allocs.range(..=ptr).next_back() {
            Some((&base, &bytes)) if ptr + len as u64 <= base + bytes as u64 => Ok(()),
            Some((&base, &bytes)) if ptr < base + bytes as u64 => Err(CudaError::OutOfBounds {
                what,
                len,
                bytes: (base + bytes as u64 - ptr) as usize,
            }),
            _ => Err(CudaError::BadOperands(format!(
                "cuda-emu: {what} at {ptr:#x}, which is not device memory"
            ))),
        }
    }

    /// After a launch of `kernel`: every guard intact, else an error saying where the kernel
    /// wrote (the guards are restored).
    fn check_guards(&self, kernel: &str) -> Result<(), CudaError> {
        let allocs = self.allocs.lock().unwrap_or_else(|e| e.into_inner());
        let mut bad = None;
        for (&ptr, &bytes) in allocs.iter() {
            for (start, before) in [(ptr - GUARD as u64, true), (ptr + bytes as u64, false)] {
                // SAFETY: both guards belong to this live allocation.
                let g = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, GUARD) };
                if let Some(i) = g.iter().position(|&b| b != GUARD_BYTE) {
                    let j = g.iter().rposition(|&b| b != GUARD_BYTE).unwrap_or(i);
                    bad.get_or_insert(
                        if before {
                            format!("{} to {} bytes before", GUARD - i, GUARD - j)
                        } else {
                            format!("{} to {} bytes after the end of", i + 1, j + 1)
                        } + &format!(" a {bytes}-byte buffer at {ptr:#x}"),
                    );
                    g.fill(GUARD_BYTE);
                }
            }
        }
        match bad {
            None => Ok(()),
            Some(where_) => Err(CudaError::Driver(format!(
                "cuda-emu: kernel {kernel} wrote outside its buffers: {where_}"
            ))),
        }
    }
}

impl EmuDevice {
    /// `bytes` (at least one) zeroed bytes between two guards, registered in `map`.
    fn allocate(&self, map: &Mutex<BTreeMap<u64, usize>>, bytes: usize) -> Result<u64, CudaError> {
        let bytes = bytes.max(1);
        let too_large = || CudaError::TooLarge {
            what: format!("cuda-emu: out of host memory allocating {bytes} bytes"),
        };
        let layout = alloc_layout(bytes).ok_or_else(too_large)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(too_large());
        }
        // SAFETY: p holds GUARD + bytes + GUARD bytes.
        unsafe {
            std::ptr::write_bytes(p, GUARD_BYTE, GUARD);
            std::ptr::write_bytes(p.add(GUARD), 0, bytes);
            std::ptr::write_bytes(p.add(GUARD + bytes), GUARD_BYTE, GUARD);
        }
        let ptr = p as u64 + GUARD as u64;
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ptr, bytes);
        Ok(ptr)
    }

    /// Release `ptr` of `map` after every queued item has run (queued work may still use it,
    /// as a CUDA free waits for the device). A free cannot fail: an error of that work goes to
    /// the next wait.
    ///
    /// # Safety
    /// `ptr` came from `allocate` with this `map` and is not used afterwards.
    unsafe fn release(&self, map: &Mutex<BTreeMap<u64, usize>>, ptr: u64) {
        if let Err(e) = self.run_all() {
            self.streams().fail(e);
        }
        let size = map.lock().unwrap_or_else(|e| e.into_inner()).remove(&ptr);
        if let Some(bytes) = size {
            let layout = alloc_layout(bytes).expect("layout was valid at alloc");
            // SAFETY: ptr - GUARD was allocated by `allocate` with this layout and is removed
            // from the map.
            unsafe { std::alloc::dealloc((ptr - GUARD as u64) as *mut u8, layout) }
        }
    }
}

impl EmuDevice {
    fn streams(&self) -> std::sync::MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run every stream's queued work (see `streams.rs`).
    fn run_all(&self) -> Result<(), CudaError> {
        self.streams().run_all(&mut |item| self.execute(item))
    }

    /// Run stream `s`'s queued work and what it waits for (see `streams.rs`).
    fn run_stream(&self, s: StreamHandle) -> Result<(), CudaError> {
        self.streams().run_stream(&mut |item| self.execute(item), s)
    }

    /// Run one queued launch or copy.
    fn execute(&self, item: &Item) -> Result<(), CudaError> {
        match item {
            Item::Launch {
                name,
                grid,
                block,
                params,
            } => {
                let mut slots = params.clone();
                let mut ptrs: Vec<*mut c_void> = slots
                    .iter_mut()
                    .map(|s| s as *mut u64 as *mut c_void)
                    .collect();
                // SAFETY: the values were copied from a parameter list the issuer guaranteed;
                // the buffers are alive (frees run the queues first).
                unsafe { self.launch_now(name, *grid, *block, &mut ptrs) }
            }
            Item::Upload { ptr, data } => self.copy_in(*ptr, data),
            Item::Zero { ptr, len } => {
                self.check("zero", *ptr, *len)?;
                // SAFETY: the range lies inside a live allocation (checked above).
                unsafe { std::ptr::write_bytes(*ptr as usize as *mut u8, 0, *len) };
                Ok(())
            }
            Item::CopyHost { dst, src, len } => self.copy_from_host(*dst, *src, *len),
            Item::Graph(launches) => launches.iter().try_for_each(|l| {
                let mut slots = l.params.clone();
                let mut ptrs = crate::graphs::param_ptrs(&mut slots);
                // SAFETY: as for a queued launch; graph_create's caller guaranteed the lists.
                unsafe { self.launch_now(&l.name, l.grid, l.block, &mut ptrs) }
            }),
            Item::Record { .. } | Item::Wait { .. } => Ok(()),
        }
    }

    /// Copy `len` bytes of host memory `host_alloc` returned, read now, to device memory.
    fn copy_from_host(&self, dst: u64, src: u64, len: usize) -> Result<(), CudaError> {
        let hosts = self.host_allocs.lock().unwrap_or_else(|e| e.into_inner());
        let inside = hosts
            .range(..=src)
            .next_back()
            .is_some_and(|(&base, &bytes)| src + len as u64 <= base + bytes as u64);
        if !inside {
            return Err(CudaError::BadOperands(format!(
                "cuda-emu: a copy of {len} bytes from {src:#x}, which is not page-locked host memory"
            )));
        }
        // SAFETY: the source range lies in a live host allocation (checked above, which stays
        // alive while the map is locked); copy_in checks the destination.
        let data = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
        self.copy_in(dst, data)
    }

    fn copy_in(&self, ptr: u64, data: &[u8]) -> Result<(), CudaError> {
        self.check("upload", ptr, data.len())?;
        // SAFETY: the range lies inside a live allocation (checked above).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, data.len()) };
        Ok(())
    }

    /// Run a launch at once.
    ///
    /// # Safety
    /// As [`RawDevice::launch_raw`].
    unsafe fn launch_now(
        &self,
        name: &str,
        grid: Dim3,
        block: Dim3,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let cname = CString::new(name).map_err(|_| CudaError::NoSuchKernel(name.to_string()))?;
        let mut err = vec![0u8; 2048];
        let _guard = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller guarantees params matches the kernel; err is writable for its length.
        let rc = unsafe {
            (self.launch)(
                cname.as_ptr(),
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                params.as_mut_ptr(),
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        let msg = || {
            let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
            String::from_utf8_lossy(&err[..end]).into_owned()
        };
        match rc {
            0 => self.check_guards(name),
            2 => Err(CudaError::NoSuchKernel(name.to_string())),
            _ => Err(CudaError::Driver(format!("cuda-emu: {}", msg()))),
        }
    }
}

/// CUDA's launch shape limits (those `emu/runtime.cpp` enforces too), checked when a launch is
/// issued.
fn check_shape(grid: Dim3, block: Dim3) -> Result<(), CudaError> {
    let threads = u64::from(block.0) * u64::from(block.1) * u64::from(block.2);
    if threads == 0 || threads > 1024 || block.2 > 64 {
        return Err(CudaError::Driver(format!(
            "cuda-emu: invalid block {block:?}: CUDA allows 1..1024 threads per block, z <= 64"
        )));
    }
    if grid.0 > 0x7fff_ffff || grid.1 > 65535 || grid.2 > 65535 {
        return Err(CudaError::Driver(format!(
            "cuda-emu: invalid grid {grid:?}: CUDA allows x < 2^31, y and z <= 65535"
        )));
    }
    Ok(())
}

impl RawDevice for EmuDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: DEVICE_NAME.to_string(),
            capability: (12, 0),
            memory_bytes: 0,
            f64_accumulation: self.acc_f64,
            emulated: true,
        }
    }

    fn alloc(&self, stream: StreamHandle, bytes: usize) -> Result<u64, CudaError> {
        self.streams().knows(stream)?;
        let ptr = self.allocate(&self.allocs, bytes)?;
        // Garbage until the zeroing queued on `stream` runs, as on a GPU (cuMemAlloc, then
        // cuMemsetD8Async there): work on another stream that nothing orders after the zeroing
        // may see the garbage, or have its writes wiped by it.
        // SAFETY: ptr holds `bytes` bytes, allocated above and not yet handed out.
        unsafe { std::ptr::write_bytes(ptr as usize as *mut u8, 0xCD, bytes) };
        self.zero(stream, ptr, bytes)?;
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: u64) {
        // SAFETY: as the caller guarantees.
        unsafe { self.release(&self.allocs, ptr) }
    }

    fn host_alloc(&self, bytes: usize) -> Result<u64, CudaError> {
        self.allocate(&self.host_allocs, bytes)
    }

    unsafe fn host_free(&self, ptr: u64) {
        // SAFETY: as the caller guarantees.
        unsafe { self.release(&self.host_allocs, ptr) }
    }

    unsafe fn upload_from_host(
        &self,
        stream: StreamHandle,
        dst: u64,
        src: u64,
        len: usize,
    ) -> Result<(), CudaError> {
        self.check("upload", dst, len)?;
        // Read when it runs, as a GPU's asynchronous copy does: a source overwritten before
        // then shows up as a wrong value.
        self.streams()
            .push(stream, Item::CopyHost { dst, src, len })
    }

    fn zero(&self, stream: StreamHandle, ptr: u64, bytes: usize) -> Result<(), CudaError> {
        self.check("zero", ptr, bytes)?;
        self.streams().push(stream, Item::Zero { ptr, len: bytes })
    }

    fn upload(&self, stream: StreamHandle, ptr: u64, data: &[u8]) -> Result<(), CudaError> {
        self.check("upload", ptr, data.len())?;
        let item = Item::Upload {
            ptr,
            data: data.to_vec(),
        };
        self.streams().push(stream, item)
    }

    fn download(&self, stream: StreamHandle, ptr: u64, out: &mut [u8]) -> Result<(), CudaError> {
        self.check("download", ptr, out.len())?;
        self.stream_synchronize(stream)?;
        // SAFETY: the range lies inside a live allocation (checked above).
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    unsafe fn launch_raw(
        &self,
        stream: StreamHandle,
        name: &str,
        grid: Dim3,
        block: Dim3,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        // What a driver refuses at the call; faults while the kernel runs are reported by the
        // stream's next synchronisation, as on a GPU.
        if !self.kernels.contains(name) {
            return Err(CudaError::NoSuchKernel(name.to_string()));
        }
        check_shape(grid, block)?;
        // SAFETY: each parameter points at an 8-byte slot (the trait's contract).
        let values = params
            .iter()
            .map(|&p| unsafe { *p.cast::<u64>() })
            .collect();
        let item = Item::Launch {
            name: name.to_string(),
            grid,
            block,
            params: values,
        };
        self.streams().push(stream, item)
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.run_all()
    }

    fn stream_synchronize(&self, stream: StreamHandle) -> Result<(), CudaError> {
        self.streams().knows(stream)?;
        self.run_stream(stream)
    }

    fn stream_create(&self) -> Result<StreamHandle, CudaError> {
        Ok(self.streams().create_stream())
    }

    unsafe fn stream_destroy(&self, stream: StreamHandle) {
        if let Err(e) = self.run_stream(stream) {
            self.streams().fail(e);
        }
        self.streams().destroy_stream(stream);
    }

    fn event_create(&self) -> Result<u64, CudaError> {
        Ok(self.streams().create_event())
    }

    unsafe fn event_destroy(&self, event: u64) {
        self.streams().destroy_event(event);
    }

    fn event_record(&self, event: u64, stream: StreamHandle) -> Result<(), CudaError> {
        self.streams().record(event, stream)
    }

    unsafe fn graph_create(&self, launches: &[GraphLaunch]) -> Result<u64, CudaError> {
        if let Some(l) = launches.iter().find(|l| !self.kernels.contains(&l.name)) {
            return Err(CudaError::NoSuchKernel(l.name.clone()));
        }
        let g = 1 + self
            .next_graph
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(g, Arc::new(launches.to_vec()));
        Ok(g)
    }

    fn graph_launch(&self, stream: StreamHandle, graph: u64) -> Result<(), CudaError> {
        let launches = self
            .graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&graph)
            .cloned()
            .ok_or_else(|| CudaError::BadOperands(format!("cuda-emu: no graph {graph}")))?;
        self.streams().push(stream, Item::Graph(launches))
    }

    unsafe fn graph_destroy(&self, graph: u64) {
        self.graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&graph);
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: u64) -> Result<(), CudaError> {
        self.streams().wait(stream, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_scanned_from_the_source() {
        let src = "extern \"C\" __global__ void a(float* x) {}\n\
                   extern \"C\" __global__ void\nbee (u32 n) {}";
        assert_eq!(scan_kernel_names(src), ["a", "bee"]);
    }
}

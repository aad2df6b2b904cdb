//! The CPU emulator (registry name `cuda-emu`): builds the kernel translation unit with the host
//! C++ compiler under `emu/shim.h` into a shared library (cached on disk, keyed by a hash of every
//! input), loads it, and runs launches on cooperative fibers (`emu/runtime.cpp`: blocks one after
//! another, one fiber per thread, `__syncthreads`/shuffles emulated). Device memory is host memory.
//! Work on created streams is queued and run in an adversarial order (`emu/streams.rs`), so a
//! plan's missing event shows up here as it might on a GPU.
//! This is how the kernels are diffed against the reference backend on machines without a GPU.

mod streams;

use crate::device::{DEFAULT_STREAM, Dim3, RawDevice, StreamHandle};
use crate::graphs::GraphLaunch;
use crate::{CudaError, Device, DeviceInfo, kernels};
use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CString, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use streams::{Item, Streams};

/// The device name the emulator reports.
pub const DEVICE_NAME: &str = "cuda-emu (CPU emulator)";

const SHIM: &str = include_str!("../emu/shim.h");
const RUNTIME: &str = include_str!("../emu/runtime.cpp");
/// Bump when the build recipe changes (it is part of the cache key).
const RECIPE: &str =
    "cuda-emu build v2: -O2 -std=c++17 -ffp-contract=off -fPIC -shared -fvisibility=hidden";
/// Extra C++ compiler flags for the emulator build, part of the cache key: `-g` to debug,
/// `-DDSV4_EMU_REVERSE` to run each block's threads in reverse order (a kernel that reads other
/// threads' writes without a barrier then gives different results: a race), `-DDSV4_EMU_UCONTEXT`
/// for the portable (slower) fiber switch.
pub const EXTRA_FLAGS_ENV: &str = "DSV4_EMU_CXXFLAGS";
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

fn find_compiler() -> Result<PathBuf, String> {
    find_compiler_from(std::env::var("CXX").ok())
}

/// The compiler `$CXX` names (when set), else the first of c++, g++, clang++ on PATH.
fn find_compiler_from(cxx: Option<String>) -> Result<PathBuf, String> {
    let from_env = cxx.filter(|s| !s.trim().is_empty());
    let candidates: Vec<String> = match &from_env {
        Some(cxx) => vec![cxx.trim().to_string()],
        None => ["c++", "g++", "clang++"].map(String::from).to_vec(),
    };
    for c in &candidates {
        if let Some(p) = which(c) {
            return Ok(p);
        }
    }
    Err(match from_env {
        Some(cxx) => format!(
            "the C++ compiler CXX={cxx} is not found; the cuda-emu emulator needs one (unset CXX, or `apt-get install g++`)"
        ),
        None => "no C++ compiler (c++, g++ or clang++) on PATH; the cuda-emu emulator needs one: `apt-get install g++`".to_string(),
    })
}

fn which(name: &str) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|c| c.is_file())
}

/// FNV-1a, 64 bit: a stable cache key (std's hasher may change between Rust releases).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(&(part.len() as u64).to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn cache_base() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("DSV4_CACHE_DIR") {
        return d;
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return d.join("dsv4");
    }
    if let Some(d) = env("HOME") {
        return d.join(".cache").join("dsv4");
    }
    std::env::temp_dir().join("dsv4")
}

/// The C++ that maps kernel names to launchers (appended to the kernel translation unit, where
/// each kernel's parameter types are known).
fn registry_source(names: &[String]) -> String {
    let mut s = String::from(
        "\n#line 1 \"dsv4_emu_registry.cpp\"\n\
         #include <stdio.h>\n\
         typedef int (*dsv4_emu_launcher)(dsv4_emu_dim3, dsv4_emu_dim3, void**, char*, size_t);\n\
         struct dsv4_emu_entry { const char* name; dsv4_emu_launcher launch; };\n\
         static const dsv4_emu_entry dsv4_emu_registry[] = {\n",
    );
    let mut seen = std::collections::HashSet::new();
    for n in names.iter().filter(|n| seen.insert(n.as_str())) {
        s.push_str(&format!(
            "    {{\"{n}\", [](dsv4_emu_dim3 g, dsv4_emu_dim3 b, void** p, char* e, size_t el) {{ \
             return dsv4_emu_launch_kernel(\"{n}\", &{n}, g, b, p, e, el); }}}},\n"
        ));
    }
    s.push_str(
        "    {nullptr, nullptr},\n};\n\
         extern \"C\" __attribute__((visibility(\"default\"))) int dsv4_emu_launch(\
         const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
         unsigned bz, void** params, char* err, size_t errlen) {\n\
         \x20   for (const dsv4_emu_entry* k = dsv4_emu_registry; k->name; k++)\n\
         \x20       if (strcmp(k->name, name) == 0)\n\
         \x20           return k->launch(dsv4_emu_dim3{gx, gy, gz}, dsv4_emu_dim3{bx, by, bz}, params, err, errlen);\n\
         \x20   snprintf(err, errlen, \"no kernel named %s\", name);\n\
         \x20   return 2;\n\
         }\n",
    );
    s
}

/// Write `text` to `path` atomically (racing writers write identical text).
fn write_atomic(path: &Path, text: &str, tag: &str) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{tag}"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Build (or find cached) the emulator library for `tu` and return its path.
fn build(tu: &str, names: &[String], acc_f64: bool) -> Result<PathBuf, CudaError> {
    let cxx = find_compiler().map_err(CudaError::Unavailable)?;
    let unit = format!("{tu}\n{}", registry_source(names));
    let extra = std::env::var(EXTRA_FLAGS_ENV).unwrap_or_default();
    let meta = std::fs::metadata(&cxx).ok();
    let cxx_id = format!(
        "{} {:?} {:?}",
        cxx.display(),
        meta.as_ref().map(|m| m.len()),
        meta.and_then(|m| m.modified().ok())
    );
    let key = fnv1a(&[
        RECIPE.as_bytes(),
        SHIM.as_bytes(),
        RUNTIME.as_bytes(),
        unit.as_bytes(),
        &[u8::from(acc_f64)],
        cxx_id.as_bytes(),
        extra.as_bytes(),
        std::env::consts::ARCH.as_bytes(),
    ]);
    let mut dir = cache_base().join("cuda-emu").join(format!("{key:016x}"));
    if dir.join("libdsv4emu.so").is_file() {
        return Ok(dir.join("libdsv4emu.so"));
    }
    if std::fs::create_dir_all(&dir).is_err() {
        // An unwritable cache (read-only home): build under the temp dir instead.
        dir = std::env::temp_dir()
            .join("dsv4")
            .join("cuda-emu")
            .join(format!("{key:016x}"));
    }
    let lib = dir.join("libdsv4emu.so");
    if lib.is_file() {
        return Ok(lib);
    }
    let io = |e: std::io::Error| CudaError::Compile {
        target: "cuda-emu (c++)".into(),
        log: format!("cannot write the emulator build to {}: {e}", dir.display()),
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    let tag = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    write_atomic(&dir.join("shim.h"), SHIM, &tag).map_err(io)?;
    write_atomic(&dir.join("runtime.cpp"), RUNTIME, &tag).map_err(io)?;
    write_atomic(&dir.join("kernels.cpp"), &unit, &tag).map_err(io)?;
    let out = dir.join(format!("libdsv4emu.so.tmp-{tag}"));
    let mut cmd = std::process::Command::new(&cxx);
    // Hidden symbols: the kernels' names (rope, swiglu, …) never interpose on anything in the
    // process; only dsv4_emu_launch is exported.
    cmd.args([
        "-O2",
        "-std=c++17",
        "-ffp-contract=off",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
    ]);
    if acc_f64 {
        cmd.arg("-DDSV4_ACC_F64");
    }
    cmd.args(extra.split_whitespace());
    cmd.arg("-include")
        .arg(dir.join("shim.h"))
        .arg(dir.join("kernels.cpp"))
        .arg(dir.join("runtime.cpp"))
        .arg("-o")
        .arg(&out)
        .current_dir(&dir);
    let res = cmd.output().map_err(|e| CudaError::Compile {
        target: "cuda-emu (c++)".into(),
        log: format!("cannot run {}: {e}", cxx.display()),
    })?;
    if !res.status.success() {
        let _ = std::fs::remove_file(&out);
        return Err(CudaError::Compile {
            target: "cuda-emu (c++)".into(),
            log: format!(
                "{}{}",
                String::from_utf8_lossy(&res.stderr),
                String::from_utf8_lossy(&res.stdout)
            ),
        });
    }
    std::fs::rename(&out, &lib).map_err(io)?;
    if let Some(parent) = dir.parent() {
        prune(parent, &dir);
    }
    Ok(lib)
}

/// Remove emulator builds (cache dirs named by a 16-hex-digit key) not modified for 14 days:
/// every kernel edit makes a new one. Best effort; a process still using one keeps its mapping.
fn prune(cache: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    let max_age = std::time::Duration::from_secs(14 * 24 * 3600);
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        let is_key = name.len() == 16
            && name
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_hexdigit());
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > max_age);
        if is_key && old && path != keep {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn open_tu(tu: &str, names: &[String], acc_f64: bool) -> Result<Device, CudaError> {
    let path = build(tu, names, acc_f64)?;
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
            Item::Graph(launches) => launches.iter().try_for_each(|l| {
                let mut slots = l.params.clone();
                let mut ptrs = crate::graphs::param_ptrs(&mut slots);
                // SAFETY: as for a queued launch; graph_create's caller guaranteed the lists.
                unsafe { self.launch_now(&l.name, l.grid, l.block, &mut ptrs) }
            }),
            Item::Record { .. } | Item::Wait { .. } => Ok(()),
        }
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
        // Zero-filled at once, which is before any later work on any stream.
        self.streams().knows(stream)?;
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
        self.allocs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ptr, bytes);
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: u64) {
        // Queued work may still use the buffer: run it all first (a CUDA free waits for the
        // device too). A free cannot fail: an error of that work goes to the next wait.
        if let Err(e) = self.run_all() {
            self.streams().fail(e);
        }
        let size = self
            .allocs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ptr);
        if let Some(bytes) = size {
            let layout = alloc_layout(bytes).expect("layout was valid at alloc");
            // SAFETY: ptr - GUARD was allocated by `alloc` with this layout and is removed
            // from the map.
            unsafe { std::alloc::dealloc((ptr - GUARD as u64) as *mut u8, layout) }
        }
    }

    fn zero(&self, stream: StreamHandle, ptr: u64, bytes: usize) -> Result<(), CudaError> {
        self.upload(stream, ptr, &vec![0; bytes])
    }

    fn upload(&self, stream: StreamHandle, ptr: u64, data: &[u8]) -> Result<(), CudaError> {
        self.check("upload", ptr, data.len())?;
        if stream == DEFAULT_STREAM {
            return self.copy_in(ptr, data);
        }
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
        if stream == DEFAULT_STREAM {
            // SAFETY: as the caller guarantees.
            return unsafe { self.launch_now(name, grid, block, params) };
        }
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
        let item = Item::Graph(launches);
        if stream == DEFAULT_STREAM {
            return self.execute(&item);
        }
        self.streams().push(stream, item)
    }

    unsafe fn graph_destroy(&self, graph: u64) {
        self.graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&graph);
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: u64) -> Result<(), CudaError> {
        let wait = self.streams().wait(stream, event)?;
        match wait {
            // The default stream runs at once, so it waits here.
            Some((e, n)) => self
                .streams()
                .run_to_record(&mut |item| self.execute(item), e, n),
            None => Ok(()),
        }
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

    #[test]
    fn a_missing_compiler_is_named_with_how_to_install_one() {
        let e = find_compiler_from(Some("/nonexistent/dsv4-c++".into())).unwrap_err();
        assert!(
            e.contains("CXX=/nonexistent/dsv4-c++") && e.contains("apt-get install g++"),
            "{e}"
        );
        assert!(find_compiler_from(Some("no-such-dsv4-compiler".into())).is_err());
    }

    #[test]
    fn the_cache_key_depends_on_every_part() {
        let a = fnv1a(&[b"ab", b"c"]);
        assert_ne!(a, fnv1a(&[b"a", b"bc"]));
        assert_ne!(a, fnv1a(&[b"ab", b"d"]));
        assert_eq!(a, fnv1a(&[b"ab", b"c"]));
    }
}

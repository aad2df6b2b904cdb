//! Which CUDA driver library the `cuda-sm120` device loads: NVIDIA's `libcuda`, found by the
//! loader, or the emulated driver (`emu/driver*.cpp`, `DSV4_CUDA_DRIVER=emu`), built from the
//! kernels with the host C++ compiler and reporting the compute capability `DSV4_CUDA_EMU_CC`
//! names, so `cuda.rs` runs and is checked without a GPU.

use crate::CudaError;
use crate::cuda::{default_acc_f64, probe};
use crate::registry;
use std::sync::OnceLock;

/// Environment variable choosing the driver library: unset for NVIDIA's `libcuda`, `emu` for the
/// emulated driver (`emu/driver*.cpp`: the same calls, checked, with the kernels run on the CPU),
/// which lets this device's code run without a GPU.
pub const DRIVER_ENV: &str = "DSV4_CUDA_DRIVER";

/// Environment variable setting the compute capability the emulated driver reports and NVRTC
/// compiles for, `MAJOR.MINOR`: 9.0 (the lent test machine's, an H200) unless set, e.g. 12.0
/// for the Blackwell target (f32 accumulation by default there).
pub const EMU_CC_ENV: &str = "DSV4_CUDA_EMU_CC";

/// Environment variable choosing when the emulated driver runs queued work: `deferred` (the
/// default: as late and in as adversarial an order as CUDA's stream and event rules allow, so
/// a missing synchronisation changes results) or `issue` (each piece of work as it is issued,
/// one valid schedule: a difference between the two is a synchronisation bug, not a kernel's).
pub const EMU_SCHEDULE_ENV: &str = "DSV4_CUDA_EMU_SCHEDULE";

/// Whether the emulated driver defers queued work ([`EMU_SCHEDULE_ENV`]), or why the
/// variable's value is not one it knows.
pub fn emulated_schedule_deferred() -> Result<bool, String> {
    match std::env::var(EMU_SCHEDULE_ENV).as_deref().map(str::trim) {
        Err(_) | Ok("") | Ok("deferred") => Ok(true),
        Ok("issue") => Ok(false),
        Ok(other) => Err(format!(
            "{EMU_SCHEDULE_ENV}={other}: expected `deferred` (the default: work waits in its \
             stream's queue as on a GPU) or `issue` (work runs as it is issued)"
        )),
    }
}

/// The compute capability the emulated driver reports: [`EMU_CC_ENV`]'s, else 9.0.
pub fn emulated_capability() -> Result<(u32, u32), String> {
    let Ok(v) = std::env::var(EMU_CC_ENV) else {
        return Ok((9, 0));
    };
    crate::kernel_cache::parse_capability(&v).map_err(|e| format!("{EMU_CC_ENV}={v}: {e}"))
}

/// The driver library this process loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverLib {
    /// NVIDIA's `libcuda`, found by the loader.
    System,
    /// The emulated driver, built from the kernels with the host C++ compiler.
    Emulated,
}

static DRIVER: OnceLock<Result<DriverLib, String>> = OnceLock::new();

/// Choose the driver library for this process (tests without a GPU choose
/// [`DriverLib::Emulated`]). Must come before the first probe; afterwards it is an error to ask
/// for a different one.
pub fn select_driver(lib: DriverLib) -> Result<(), String> {
    match DRIVER.get_or_init(|| Ok(lib)) {
        Ok(chosen) if *chosen == lib => Ok(()),
        Ok(chosen) => Err(format!("the CUDA driver library is already {chosen:?}")),
        Err(e) => Err(e.clone()),
    }
}

/// The driver library this process loads: the one [`select_driver`] chose, else [`DRIVER_ENV`]'s.
pub fn driver_lib() -> Result<DriverLib, String> {
    DRIVER
        .get_or_init(|| match std::env::var(DRIVER_ENV).as_deref().map(str::trim) {
            Err(_) | Ok("") => Ok(DriverLib::System),
            Ok("emu") => Ok(DriverLib::Emulated),
            Ok(other) => Err(format!(
                "{DRIVER_ENV}={other}: expected `emu` (the emulated driver) or unset (NVIDIA's libcuda)"
            )),
        })
        .clone()
}

/// Ok when a library by one of the names cudarc tries loads, else which names were tried.
pub(crate) fn find_libcuda() -> Result<(), String> {
    let mut names = cudarc::get_lib_name_candidates("cuda");
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    // SAFETY: loading libcuda runs only the driver's own initializers.
    let found = names
        .iter()
        .any(|n| unsafe { libloading::Library::new(n) }.is_ok());
    if found {
        Ok(())
    } else {
        Err(format!(
            "libcuda not found (no NVIDIA driver): tried {}",
            names.join(", ")
        ))
    }
}

/// The accumulation the emulated driver's kernels use: what `open` picks for its device.
fn emulated_acc_f64() -> Result<bool, String> {
    Ok(registry::acc_override()
        .map_err(|e| e.to_string())?
        .unwrap_or(default_acc_f64(emulated_capability()?)))
}

/// The emulated driver runs kernels it built once, at load, with [`emulated_acc_f64`]'s sums; a
/// backend asking for other sums (`backend.cuda_sums` against `DSV4_CUDA_ACC`) is an error.
pub(crate) fn check_emulated_acc(f64_sums: bool) -> Result<(), CudaError> {
    let built = emulated_acc_f64().map_err(CudaError::Unavailable)?;
    if built == f64_sums {
        return Ok(());
    }
    let name = |f: bool| if f { "f64" } else { "f32" };
    Err(CudaError::Unavailable(format!(
        "{DRIVER_ENV}=emu built its kernels with {} sums (DSV4_CUDA_ACC, else the emulated \
         capability's default) and cannot switch to {} in this process; set DSV4_CUDA_ACC={}",
        name(built),
        name(f64_sums),
        name(f64_sums)
    )))
}

/// Build the emulated driver and load it by path, for good: its soname is `libcuda.so`, the
/// first name cudarc asks the loader for, which then finds it loaded instead of searching.
pub(crate) fn load_emulated() -> Result<(), String> {
    // The driver reads the variable itself at cuInit; a value it does not know is said here.
    emulated_schedule_deferred()?;
    let path = crate::emu::build_driver(emulated_capability()?, emulated_acc_f64()?)
        .map_err(|e| format!("{DRIVER_ENV}=emu: cannot build the emulated driver: {e}"))?;
    // SAFETY: the library is ours (built above); its initializers only set up plain globals.
    let lib = unsafe { libloading::Library::new(&path) }
        .map_err(|e| format!("{DRIVER_ENV}=emu: cannot load {}: {e}", path.display()))?;
    std::mem::forget(lib);
    Ok(())
}

/// The emulated driver's failed calls so far, one message each (none until the emulated driver
/// is loaded): a run that should be clean asserts there are none.
pub fn emulated_driver_failures() -> Vec<String> {
    type Failures = unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> std::ffi::c_ulong;
    if driver_lib() != Ok(DriverLib::Emulated) || probe().is_err() {
        return Vec::new();
    }
    // SAFETY: the emulated driver is loaded (probed) under this soname; dlopen by it returns
    // that library without loading anything.
    let Ok(lib) = (unsafe { libloading::Library::new("libcuda.so") }) else {
        return Vec::new();
    };
    // SAFETY: emu/driver.cpp defines the function with this signature.
    let Ok(f) = (unsafe { lib.get::<Failures>(b"dsv4_emu_driver_failures\0") }) else {
        return Vec::new();
    };
    let mut buf = vec![0u8; 1 << 17];
    // SAFETY: buf is writable for its length; the function NUL-terminates within it.
    let n = unsafe { f(buf.as_mut_ptr().cast(), buf.len()) } as usize;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let mut v: Vec<String> = String::from_utf8_lossy(&buf[..end])
        .lines()
        .map(str::to_string)
        .collect();
    // Past the driver's 64 KiB of messages, the rest are only counted.
    v.extend((v.len()..n).map(|_| "(message not kept)".to_string()));
    v
}

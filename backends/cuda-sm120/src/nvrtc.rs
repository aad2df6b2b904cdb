//! NVRTC: compiles the kernel translation unit to PTX for one compute capability, through
//! cudarc's dynamically loaded bindings. Any compiler output, a warning included, is an error,
//! so CI (tests/nvrtc_compile.rs) fails on warnings as well as errors.
//!
//! cudarc panics when it cannot load libnvrtc, so [`nvrtc_probe`] looks for it first: by the
//! names cudarc tries (the loader's search path: `LD_LIBRARY_PATH`, ldconfig), then in
//! `$DSV4_NVRTC_LIB`, `$CUDA_HOME`/`$CUDA_PATH`, `/usr/local/cuda`, and NVIDIA's PyPI wheel
//! (`pip install nvidia-cuda-nvrtc-cu12`). A library found by path stays loaded, so cudarc's
//! later load by name (`libnvrtc.so.12`, its soname) finds the same one.

use crate::{CudaError, kernels};
use cudarc::nvrtc::{result, sys};
use std::ffi::{CString, c_char};
use std::path::PathBuf;
use std::sync::OnceLock;

/// An explicit path to libnvrtc (tried after the loader's search path).
pub const NVRTC_LIB_ENV: &str = "DSV4_NVRTC_LIB";

/// Ok when libnvrtc can be loaded, else why not (and how to get it). Checked once.
pub fn nvrtc_probe() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(find_nvrtc).clone()
}

fn find_nvrtc() -> Result<(), String> {
    for name in cudarc::get_lib_name_candidates("nvrtc") {
        // SAFETY: loading libnvrtc runs only its own initializers.
        if unsafe { libloading::Library::new(&name) }.is_ok() {
            return Ok(());
        }
    }
    let mut tried = Vec::new();
    for path in candidate_paths() {
        // SAFETY: as above.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => {
                // Keep it loaded for cudarc, which loads `libnvrtc.so.12` by name (its soname).
                std::mem::forget(lib);
                return Ok(());
            }
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(format!(
        "libnvrtc not found (not on the loader's path{}); install the CUDA toolkit or \
         `python3 -m pip install nvidia-cuda-nvrtc-cu12`, or set {NVRTC_LIB_ENV}",
        if tried.is_empty() {
            String::new()
        } else {
            format!("; tried {}", tried.join(", "))
        }
    ))
}

/// Files that may be libnvrtc, most explicit first; only existing files.
fn candidate_paths() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(p) = std::env::var_os(NVRTC_LIB_ENV).filter(|p| !p.is_empty()) {
        v.push(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|k| std::env::var_os(k).filter(|p| !p.is_empty()))
        .flat_map(|root| {
            let root = PathBuf::from(root);
            [root.join("lib64"), root.join("lib")]
        })
        .collect();
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.extend(wheel_lib_dir());
    for d in dirs {
        for name in ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"] {
            v.push(d.join(name));
        }
    }
    v.retain(|p| p.is_file());
    v
}

/// The lib directory of the `nvidia-cuda-nvrtc-cu12` wheel, asked of `python3` (the package
/// is a namespace package: no `__file__`, one `__path__` entry).
fn wheel_lib_dir() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvrtc as m; print(list(m.__path__)[0])",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8(out.stdout).ok()?;
    Some(PathBuf::from(dir.trim()).join("lib"))
}

/// The NVRTC version (major, minor).
pub fn version() -> Result<(i32, i32), CudaError> {
    nvrtc_probe().map_err(CudaError::Unavailable)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc is loadable (probed); both pointers are valid.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Unavailable(format!("nvrtcVersion: {e}")))?;
    Ok((major, minor))
}

/// PTX of the backend's kernels (`kernels::translation_unit()`) for compute capability `arch`
/// (`(12, 0)` -> `compute_120`), with f64 accumulation when `acc_f64`.
pub fn compile_ptx(arch: (u32, u32), acc_f64: bool) -> Result<String, CudaError> {
    compile_source(
        &kernels::translation_unit(),
        "dsv4_kernels.cu",
        arch,
        acc_f64,
    )
}

/// PTX of the CUDA C++ source `src` (named `name` in messages), compiled as [`compile_ptx`]
/// compiles the backend's kernels: `--fmad=false -std=c++17 --gpu-architecture=compute_XY`,
/// `-DDSV4_ACC_F64` when `acc_f64`. Errors and warnings both fail with the compiler's log.
pub fn compile_source(
    src: &str,
    name: &str,
    arch: (u32, u32),
    acc_f64: bool,
) -> Result<String, CudaError> {
    let ptx = compile(src, name, arch, acc_f64, false)?;
    Ok(String::from_utf8_lossy(&ptx).into_owned())
}

/// The backend's kernels as a CUBIN for `sm_XY` (same options as [`compile_ptx`], but NVRTC
/// assembles the machine code itself, so loading it needs no driver PTX JIT of NVRTC's PTX
/// version: an older driver of the same CUDA major version can load it).
pub fn compile_cubin(arch: (u32, u32), acc_f64: bool) -> Result<Vec<u8>, CudaError> {
    compile(
        &kernels::translation_unit(),
        "dsv4_kernels.cu",
        arch,
        acc_f64,
        true,
    )
}

/// What ptxas allocated for one kernel of a CUBIN.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelResources {
    /// The kernel's name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores and loads per thread (0 and 0 unless registers ran out).
    pub spill_stores: u32,
    /// See `spill_stores`.
    pub spill_loads: u32,
    /// Bytes of stack frame per thread.
    pub stack_bytes: u32,
    /// Bytes of static shared memory per block.
    pub shared_bytes: u32,
}

/// [`compile_cubin`] with ptxas reporting what each kernel uses (`--ptxas-options=-v`; the
/// machine code is the same). Any output besides those reports still fails the compile.
pub fn compile_cubin_with_resources(
    arch: (u32, u32),
    acc_f64: bool,
) -> Result<(Vec<u8>, Vec<KernelResources>), CudaError> {
    let (cubin, log) = compile_logged(
        &kernels::translation_unit(),
        "dsv4_kernels.cu",
        arch,
        acc_f64,
        true,
        true,
    )?;
    Ok((cubin, parse_resources(&log)))
}

/// The per-kernel reports of a `ptxas -v` log:
/// `Compiling entry function 'k' for 'sm_90'`, then `N bytes stack frame, N bytes spill stores,
/// N bytes spill loads` and `Used N registers, … N bytes smem, …`.
fn parse_resources(log: &str) -> Vec<KernelResources> {
    let number_before = |line: &str, unit: &str| -> Option<u32> {
        let at = line.find(unit)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    let mut out: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default();
            out.push(KernelResources {
                name: name.to_string(),
                ..KernelResources::default()
            });
            continue;
        }
        let Some(k) = out.last_mut() else { continue };
        if line.contains("bytes stack frame") {
            k.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("Used ") && line.contains(" registers") {
            k.registers = number_before(line, " registers").unwrap_or(0);
            k.shared_bytes = number_before(line, " bytes smem").unwrap_or(0);
        }
    }
    out
}

/// Whether a log line is one of ptxas's `-v` reports (not a warning).
fn is_report(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty()
        || t.starts_with("ptxas info")
        || (t.contains("bytes stack frame") && t.contains("spill"))
}

/// NVRTC's options for `arch`: `--fmad=false -std=c++17`, the architecture (`sm_XY` for a
/// CUBIN, `compute_XY` for PTX), `-DDSV4_ACC_F64` when `acc_f64` (part of the kernel cache's key).
pub fn options(arch: (u32, u32), acc_f64: bool, cubin: bool) -> Vec<String> {
    let mut opts = vec![
        "--fmad=false".to_string(),
        "-std=c++17".to_string(),
        format!(
            "--gpu-architecture={}_{}{}",
            if cubin { "sm" } else { "compute" },
            arch.0,
            arch.1
        ),
    ];
    if acc_f64 {
        opts.push("-DDSV4_ACC_F64".to_string());
    }
    opts
}

fn compile(
    src: &str,
    name: &str,
    arch: (u32, u32),
    acc_f64: bool,
    cubin: bool,
) -> Result<Vec<u8>, CudaError> {
    compile_logged(src, name, arch, acc_f64, cubin, false).map(|(out, _)| out)
}

/// Compile, with ptxas's resource reports in the returned log when `report`.
fn compile_logged(
    src: &str,
    name: &str,
    arch: (u32, u32),
    acc_f64: bool,
    cubin: bool,
    report: bool,
) -> Result<(Vec<u8>, String), CudaError> {
    nvrtc_probe().map_err(CudaError::Unavailable)?;
    let target = format!("sm_{}{}", arch.0, arch.1);
    let fail = |log: String| CudaError::Compile {
        target: target.clone(),
        log,
    };
    let csrc = CString::new(src).map_err(|_| fail("the source contains a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| fail("the name contains a NUL byte".into()))?;
    let mut opts = options(arch, acc_f64, cubin);
    if report {
        opts.push("--ptxas-options=-v".to_string());
    }
    let prog = result::create_program(&csrc, Some(&cname))
        .map_err(|e| fail(format!("nvrtcCreateProgram: {e}")))?;
    // SAFETY: prog was created above and is destroyed once, below; csrc/cname outlive it.
    unsafe {
        let compiled = result::compile_program(prog, &opts);
        let log = result::get_program_log(prog)
            .map(|l| c_chars_to_string(&l))
            .unwrap_or_default();
        // With `report`, ptxas's resource lines are expected; anything else is a warning.
        let clean = log.lines().all(|l| report && is_report(l)) || log.trim().is_empty();
        let out = match (&compiled, clean) {
            (Ok(()), true) if cubin => {
                get_cubin(prog).map_err(|e| fail(format!("nvrtcGetCUBIN: {e}")))
            }
            (Ok(()), true) => result::get_ptx(prog)
                .map(|p| c_chars_to_string(&p).into_bytes())
                .map_err(|e| fail(format!("nvrtcGetPTX: {e}"))),
            (Ok(()), false) => Err(fail(format!("warnings (treated as errors):\n{log}"))),
            (Err(e), _) => Err(fail(format!("{e} (options {})\n{log}", opts.join(" ")))),
        };
        let _ = result::destroy_program(prog);
        out.map(|o| (o, log))
    }
}

/// The CUBIN of a program compiled for a real architecture (`sm_XY`).
///
/// # Safety
/// `prog` is a live program that compiled successfully.
unsafe fn get_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: per the contract; size and the buffer are valid for the writes.
    unsafe {
        sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
        let mut buf = vec![0u8; size];
        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()).result()?;
        Ok(buf)
    }
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_reports_parse_per_kernel() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'linear_fp8_r8' for 'sm_90'\n\
ptxas info    : Function properties for linear_fp8_r8\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 96 registers, used 1 barriers, 384 bytes smem, 400 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'copy2d' for 'sm_90'\n\
ptxas info    : Function properties for copy2d\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 16 registers, 400 bytes cmem[0]\n";
        let r = parse_resources(log);
        assert_eq!(
            r,
            vec![
                KernelResources {
                    name: "linear_fp8_r8".into(),
                    registers: 96,
                    spill_stores: 4,
                    spill_loads: 12,
                    stack_bytes: 8,
                    shared_bytes: 384,
                },
                KernelResources {
                    name: "copy2d".into(),
                    registers: 16,
                    ..KernelResources::default()
                },
            ]
        );
        assert!(log.lines().all(is_report));
        assert!(!is_report(
            "dsv4_kernels.cu(12): warning #177-D: variable \"x\" was declared"
        ));
    }
}

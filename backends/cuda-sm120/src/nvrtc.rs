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
    nvrtc_probe().map_err(CudaError::Unavailable)?;
    let target = format!("sm_{}{}", arch.0, arch.1);
    let fail = |log: String| CudaError::Compile {
        target: target.clone(),
        log,
    };
    let csrc = CString::new(src).map_err(|_| fail("the source contains a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| fail("the name contains a NUL byte".into()))?;
    let opts = options(arch, acc_f64, cubin);
    let prog = result::create_program(&csrc, Some(&cname))
        .map_err(|e| fail(format!("nvrtcCreateProgram: {e}")))?;
    // SAFETY: prog was created above and is destroyed once, below; csrc/cname outlive it.
    unsafe {
        let compiled = result::compile_program(prog, &opts);
        let log = result::get_program_log(prog)
            .map(|l| c_chars_to_string(&l))
            .unwrap_or_default();
        let out = match (&compiled, log.trim().is_empty()) {
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
        out
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

//! Building the emulator: the host C++ compiler, the on-disk cache keyed by every input, and the
//! generated kernel table.

use crate::CudaError;
use crate::disk_cache::{cache_base, fnv1a};
use std::path::{Path, PathBuf};

const SHIM: &str = include_str!("../../emu/shim.h");
const RUNTIME: &str = include_str!("../../emu/runtime.cpp");
/// The emulated driver's sources (`Library::Driver`): the header, then the files compiled.
const DRIVER: &[(&str, &str)] = &[
    ("driver.h", include_str!("../../emu/driver.h")),
    ("driver.cpp", include_str!("../../emu/driver.cpp")),
    (
        "driver_modules.cpp",
        include_str!("../../emu/driver_modules.cpp"),
    ),
    (
        "driver_streams.cpp",
        include_str!("../../emu/driver_streams.cpp"),
    ),
    (
        "driver_graphs.cpp",
        include_str!("../../emu/driver_graphs.cpp"),
    ),
];
/// Bump when the build recipe changes (it is part of the cache key).
const RECIPE: &str = "cuda-emu build v3: -O2 -std=c++17 -ffp-contract=off -fPIC -fvisibility=hidden; \
     kernels.o with -fsanitize=alignment -fsanitize-recover=alignment, then -shared";
/// The flags every compile of the emulator gets.
const CXXFLAGS: &[&str] = &[
    "-O2",
    "-std=c++17",
    "-ffp-contract=off",
    "-fPIC",
    "-fvisibility=hidden",
];
/// The kernels' own flags: every typed load and store checks its address against the type's
/// alignment, as a GPU requires, and reports to the handler in `emu/runtime.cpp` (recoverable
/// calls, so no sanitizer runtime is linked). `DSV4_EMU_CXXFLAGS=-fno-sanitize=alignment` turns
/// the check off.
const KERNEL_CXXFLAGS: &[&str] = &["-fsanitize=alignment", "-fsanitize-recover=alignment"];
/// Extra C++ compiler flags for the emulator build (both steps), part of the cache key: `-g` to debug,
/// `-DDSV4_EMU_REVERSE` to run each block's threads and the grid's blocks in reverse order (a
/// kernel that reads other threads' writes without a barrier, or other blocks' writes of the same
/// launch, then gives different results: a race), `-DDSV4_EMU_UCONTEXT`
/// for the portable (slower) fiber switch.
pub const EXTRA_FLAGS_ENV: &str = "DSV4_EMU_CXXFLAGS";

pub(super) fn find_compiler() -> Result<PathBuf, String> {
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

/// The C++ that maps kernel names to launchers and to their parameters' sizes (appended to the
/// kernel translation unit, where each kernel's parameter types are known).
fn registry_source(names: &[String]) -> String {
    let mut s = String::from(
        "\n#line 1 \"dsv4_emu_registry.cpp\"\n\
         #include <stdio.h>\n\
         typedef int (*dsv4_emu_launcher)(dsv4_emu_dim3, dsv4_emu_dim3, void**, char*, size_t);\n\
         typedef int (*dsv4_emu_sizer)(size_t*, int);\n\
         struct dsv4_emu_entry { const char* name; dsv4_emu_launcher launch; dsv4_emu_sizer sizes; };\n\
         static const dsv4_emu_entry dsv4_emu_registry[] = {\n",
    );
    let mut seen = std::collections::HashSet::new();
    for n in names.iter().filter(|n| seen.insert(n.as_str())) {
        s.push_str(&format!(
            "    {{\"{n}\", [](dsv4_emu_dim3 g, dsv4_emu_dim3 b, void** p, char* e, size_t el) {{ \
             return dsv4_emu_launch_kernel(\"{n}\", &{n}, g, b, p, e, el); }}, \
             [](size_t* o, int c) {{ return dsv4_emu_param_sizes(&{n}, o, c); }}}},\n"
        ));
    }
    s.push_str(
        "    {nullptr, nullptr, nullptr},\n};\n\
         static const dsv4_emu_entry* dsv4_emu_find(const char* name) {\n\
         \x20   for (const dsv4_emu_entry* k = dsv4_emu_registry; k->name; k++)\n\
         \x20       if (strcmp(k->name, name) == 0) return k;\n\
         \x20   return nullptr;\n\
         }\n\
         extern \"C\" __attribute__((visibility(\"default\"))) int dsv4_emu_launch(\
         const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
         unsigned bz, void** params, char* err, size_t errlen) {\n\
         \x20   if (const dsv4_emu_entry* k = dsv4_emu_find(name))\n\
         \x20       return k->launch(dsv4_emu_dim3{gx, gy, gz}, dsv4_emu_dim3{bx, by, bz}, params, err, errlen);\n\
         \x20   snprintf(err, errlen, \"no kernel named %s\", name);\n\
         \x20   return 2;\n\
         }\n\
         extern \"C\" __attribute__((visibility(\"default\"))) int dsv4_emu_params(\
         const char* name, size_t* sizes, int cap) {\n\
         \x20   const dsv4_emu_entry* k = dsv4_emu_find(name);\n\
         \x20   return k ? k->sizes(sizes, cap) : -1;\n\
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

/// Which library to build from the kernels and the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Library {
    /// `libdsv4emu.so`, loaded by the `cuda-emu` device: exports `dsv4_emu_launch`.
    Emulator,
    /// `libcuda.so`: the emulated CUDA driver (`emu/driver*.cpp`) reporting a device of this
    /// compute capability, which the `cuda-sm120` device loads in place of NVIDIA's.
    Driver((u32, u32)),
}

impl Library {
    fn file_name(self) -> &'static str {
        match self {
            Library::Emulator => "libdsv4emu.so",
            Library::Driver(_) => "libcuda.so",
        }
    }

    /// The library's own compile arguments (both steps; part of the cache key).
    fn compile_args(self) -> Vec<String> {
        match self {
            Library::Emulator => Vec::new(),
            Library::Driver((major, minor)) => vec![
                format!("-DDSV4_DRIVER_CC_MAJOR={major}"),
                format!("-DDSV4_DRIVER_CC_MINOR={minor}"),
            ],
        }
    }

    /// The library's own link arguments (part of the cache key).
    fn link_args(self) -> Vec<String> {
        match self {
            Library::Emulator => Vec::new(),
            // cudarc opens "libcuda.so" by name: once this file is loaded by path, the loader
            // finds it under that soname instead of searching.
            Library::Driver(_) => vec!["-Wl,-soname,libcuda.so".to_string()],
        }
    }
}

/// Build (or find cached) `library` for the translation unit `tu` and return its path.
pub(super) fn build(
    tu: &str,
    names: &[String],
    acc_f64: bool,
    library: Library,
) -> Result<PathBuf, CudaError> {
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
    let lib_args = [library.compile_args(), library.link_args()]
        .concat()
        .join(" ");
    let driver: &[(&str, &str)] = match library {
        Library::Emulator => &[],
        Library::Driver(_) => DRIVER,
    };
    let driver_text: String = driver.iter().map(|(n, t)| format!("{n}\n{t}")).collect();
    let key = fnv1a(&[
        RECIPE.as_bytes(),
        SHIM.as_bytes(),
        RUNTIME.as_bytes(),
        unit.as_bytes(),
        &[u8::from(acc_f64)],
        cxx_id.as_bytes(),
        extra.as_bytes(),
        std::env::consts::ARCH.as_bytes(),
        lib_args.as_bytes(),
        driver_text.as_bytes(),
    ]);
    let file = library.file_name();
    let mut dir = cache_base().join("cuda-emu").join(format!("{key:016x}"));
    if dir.join(file).is_file() {
        return Ok(dir.join(file));
    }
    if std::fs::create_dir_all(&dir).is_err() {
        // An unwritable cache (read-only home): build under the temp dir instead.
        dir = std::env::temp_dir()
            .join("dsv4")
            .join("cuda-emu")
            .join(format!("{key:016x}"));
    }
    let lib = dir.join(file);
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
    for (name, text) in driver {
        write_atomic(&dir.join(name), text, &tag).map_err(io)?;
    }
    let out = dir.join(format!("{file}.tmp-{tag}"));
    let object = dir.join(format!("kernels.o.tmp-{tag}"));
    // Two steps, so that only the kernels carry the alignment checks, and the link step (which
    // would add a sanitizer runtime for -fsanitize) has none.
    let compiler = || {
        let mut cmd = std::process::Command::new(&cxx);
        cmd.args(CXXFLAGS).current_dir(&dir);
        if acc_f64 {
            cmd.arg("-DDSV4_ACC_F64");
        }
        cmd
    };
    let mut kernels = compiler();
    kernels
        .args(KERNEL_CXXFLAGS)
        .args(extra.split_whitespace())
        .args(library.compile_args())
        .arg("-include")
        .arg(dir.join("shim.h"))
        .arg("-c")
        .arg(dir.join("kernels.cpp"))
        .arg("-o")
        .arg(&object);
    let mut link = compiler();
    // Hidden symbols: the kernels' names (rope, swiglu, …) never interpose on anything in the
    // process; only dsv4_emu_launch, dsv4_emu_params and the driver's entry points are exported.
    link.arg("-shared")
        .args(extra.split_whitespace())
        .args(library.compile_args())
        .arg("-include")
        .arg(dir.join("shim.h"))
        .arg(&object)
        .arg(dir.join("runtime.cpp"));
    for (name, _) in driver.iter().filter(|(n, _)| n.ends_with(".cpp")) {
        link.arg(dir.join(name));
    }
    link.args(library.link_args()).arg("-o").arg(&out);
    let result = run_compiler(&cxx, kernels).and_then(|()| run_compiler(&cxx, link));
    let _ = std::fs::remove_file(&object);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&out);
        return Err(e);
    }
    std::fs::rename(&out, &lib).map_err(io)?;
    if let Some(parent) = dir.parent() {
        prune(parent, &dir);
    }
    Ok(lib)
}

/// Run one compiler command; its output is the error when it fails.
fn run_compiler(cxx: &Path, mut cmd: std::process::Command) -> Result<(), CudaError> {
    let res = cmd.output().map_err(|e| CudaError::Compile {
        target: "cuda-emu (c++)".into(),
        log: format!("cannot run {}: {e}", cxx.display()),
    })?;
    if res.status.success() {
        return Ok(());
    }
    Err(CudaError::Compile {
        target: "cuda-emu (c++)".into(),
        log: format!(
            "{}{}",
            String::from_utf8_lossy(&res.stderr),
            String::from_utf8_lossy(&res.stdout)
        ),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_compiler_is_named_with_how_to_install_one() {
        let e = find_compiler_from(Some("/nonexistent/dsv4-c++".into())).unwrap_err();
        assert!(
            e.contains("CXX=/nonexistent/dsv4-c++") && e.contains("apt-get install g++"),
            "{e}"
        );
        assert!(find_compiler_from(Some("no-such-dsv4-compiler".into())).is_err());
    }
}

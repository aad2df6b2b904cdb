//! NVRTC's CUBINs cached on disk: `<cache>/cuda-kernels/sm_XY-<acc>-<key>.cubin`, the key a hash
//! of the kernel translation unit and NVRTC's options, so an edit to any kernel or option names a
//! new file. `open` loads the cached CUBIN for its device when there is one (no compile at start)
//! and stores what it compiled. With `DSV4_CUDA_KERNELS=cached` it never compiles: a machine
//! without NVRTC (a GPU box that cannot reach PyPI) runs the CUBINs compiled elsewhere, e.g. on
//! the emulated driver (`DSV4_CUDA_DRIVER=emu DSV4_CUDA_EMU_CC=9.0`), and a deployment is sure
//! to run exactly the kernels it was validated with. [`precompile`] (`dsv4 kernels compile`)
//! fills a cache for any GPU without one.

use crate::disk_cache::{cache_base, fnv1a};
use crate::{CudaError, kernels, nvrtc};
use std::path::{Path, PathBuf};

/// Environment variable choosing where kernels come from: unset or `auto` (the cache, else
/// NVRTC, storing what it compiles) or `cached` (the cache only; a missing CUBIN is an error).
pub const KERNELS_ENV: &str = "DSV4_CUDA_KERNELS";

/// Where [`crate::cuda`] gets its kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSource {
    /// The cached CUBIN if there is one, else NVRTC (and the result is cached).
    Auto,
    /// Only the cache; NVRTC is never needed.
    CachedOnly,
}

/// The source [`KERNELS_ENV`] asks for.
pub fn source() -> Result<KernelSource, String> {
    match std::env::var(KERNELS_ENV).as_deref().map(str::trim) {
        Err(_) | Ok("") | Ok("auto") => Ok(KernelSource::Auto),
        Ok("cached") => Ok(KernelSource::CachedOnly),
        Ok(other) => Err(format!(
            "{KERNELS_ENV}={other}: expected `auto` (cache, else NVRTC) or `cached` (cache only)"
        )),
    }
}

/// The cached CUBIN's path for compute capability `arch` and accumulation `acc_f64`.
pub fn path(arch: (u32, u32), acc_f64: bool) -> PathBuf {
    path_in(&cache_base(), arch, acc_f64)
}

/// The CUBIN's path for `arch` and `acc_f64` in the kernel cache at `base`, for this build's
/// kernel sources and NVRTC options.
pub fn path_in(base: &Path, arch: (u32, u32), acc_f64: bool) -> PathBuf {
    let opts = nvrtc::options(arch, acc_f64, true).join(" ");
    let key = fnv1a(&[
        b"dsv4 cubin v1",
        kernels::translation_unit().as_bytes(),
        opts.as_bytes(),
    ]);
    let acc = if acc_f64 { "f64" } else { "f32" };
    base.join("cuda-kernels")
        .join(format!("sm_{}{}-{acc}-{key:016x}.cubin", arch.0, arch.1))
}

/// The cached CUBIN for `arch` and `acc_f64`, if there is one that looks like an ELF image (a
/// truncated or foreign file is ignored; the driver checks the rest when it loads it).
pub fn load(arch: (u32, u32), acc_f64: bool) -> Option<Vec<u8>> {
    load_from(&path(arch, acc_f64))
}

fn load_from(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    (bytes.len() > 64 && bytes.starts_with(b"\x7fELF")).then_some(bytes)
}

/// Keep `cubin` as the cached CUBIN for `arch` and `acc_f64` (written whole, then renamed, so a
/// concurrent reader sees the old file or the new one). Best effort: an unwritable cache only
/// means the next start compiles again.
pub fn store(arch: (u32, u32), acc_f64: bool, cubin: &[u8]) {
    store_at(&path(arch, acc_f64), cubin);
}

fn store_at(path: &Path, cubin: &[u8]) {
    let _ = write_at(path, cubin);
}

/// Write `cubin` to `path` whole, then rename it into place.
fn write_at(path: &Path, cubin: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, cubin)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// A CUBIN found in a kernel cache ([`list`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedCubin {
    /// The file.
    pub path: PathBuf,
    /// The compute capability it is for.
    pub arch: (u32, u32),
    /// f64 sums (else f32).
    pub acc_f64: bool,
    /// Its size in bytes.
    pub bytes: u64,
    /// Compiled from this build's kernel sources and options, so the backend loads it; a stale
    /// one (another build's) is never loaded again.
    pub current: bool,
}

/// The CUBINs in the kernel cache at `base` (None: the backend's), by architecture and sums,
/// current ones first. A cache that does not exist is empty; files not named like CUBINs are
/// left out.
pub fn list(base: Option<&Path>) -> std::io::Result<Vec<CachedCubin>> {
    let base = base.map_or_else(cache_base, Path::to_path_buf);
    let dir = base.join("cuda-kernels");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((arch, acc_f64)) = parse_name(&name) else {
            continue;
        };
        let path = entry.path();
        out.push(CachedCubin {
            current: path == path_in(&base, arch, acc_f64),
            bytes: entry.metadata()?.len(),
            path,
            arch,
            acc_f64,
        });
    }
    out.sort_by(|a, b| {
        (b.current, a.arch, !a.acc_f64, &a.path).cmp(&(a.current, b.arch, !b.acc_f64, &b.path))
    });
    Ok(out)
}

/// The architecture and sums of a cached CUBIN's file name, `sm_XY-<f64|f32>-<key>.cubin`.
fn parse_name(name: &str) -> Option<((u32, u32), bool)> {
    let stem = name.strip_suffix(".cubin")?;
    let mut parts = stem.splitn(3, '-');
    let arch = parse_capability(parts.next()?).ok()?;
    let acc_f64 = match parts.next()? {
        "f64" => true,
        "f32" => false,
        _ => return None,
    };
    let key = parts.next()?;
    (key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit())).then_some((arch, acc_f64))
}

/// A compute capability from `9.0`, `12.0`, `sm_90` or `sm_120` (the last digit of the `sm_`
/// form is the minor version); sm_80 and newer, the oldest the kernels target (bf16
/// `mma.sync`).
pub fn parse_capability(text: &str) -> Result<(u32, u32), String> {
    let t = text.trim();
    let bad = || {
        format!(
            "`{t}` is not a compute capability the kernels target: give MAJOR.MINOR or sm_XY \
             of sm_80 or newer, e.g. 9.0 (H100/H200) or 12.0 (RTX PRO 6000)"
        )
    };
    let cc = match t.split_once('.') {
        Some((major, minor)) => (major.parse::<u32>(), minor.parse::<u32>()),
        None => {
            let digits = t.strip_prefix("sm_").ok_or_else(bad)?;
            if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let (major, minor) = digits.split_at(digits.len() - 1);
            (major.parse::<u32>(), minor.parse::<u32>())
        }
    };
    let (Ok(major), Ok(minor)) = cc else {
        return Err(bad());
    };
    if (major, minor) < (8, 0) || major > 12 || minor > 9 {
        return Err(bad());
    }
    Ok((major, minor))
}

/// A CUBIN compiled ahead of time into a kernel cache ([`precompile`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Precompiled {
    /// The compute capability it is for.
    pub arch: (u32, u32),
    /// f64 sums (else f32).
    pub acc_f64: bool,
    /// Where it was written: the file the backend loads on such a device with such sums.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: usize,
    /// What ptxas allocated for each kernel (registers, spills, shared memory).
    pub resources: Vec<nvrtc::KernelResources>,
}

/// Compile the kernels for `arch` with `acc_f64` sums and write the CUBIN where the backend
/// looks for it in the kernel cache at `base` (None: the cache the backend reads, `$DSV4_CACHE_DIR`
/// …). Needs NVRTC, not a GPU: a deployment compiles its kernels once, ships the cache and runs
/// them with `DSV4_CUDA_KERNELS=cached`.
pub fn precompile(
    base: Option<&Path>,
    arch: (u32, u32),
    acc_f64: bool,
) -> Result<Precompiled, CudaError> {
    let name = format!("sm_{}{}", arch.0, arch.1);
    parse_capability(&name).map_err(CudaError::BadOperands)?;
    let base = base.map_or_else(cache_base, Path::to_path_buf);
    let path = path_in(&base, arch, acc_f64);
    let unwritable =
        |e: std::io::Error| CudaError::BadOperands(format!("cannot write {}: {e}", path.display()));
    // The directory first: an unwritable cache fails before the compile, not after it.
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(unwritable)?;
    }
    let (cubin, resources) = nvrtc::compile_cubin_with_resources(arch, acc_f64)?;
    write_at(&path, &cubin).map_err(unwritable)?;
    Ok(Precompiled {
        arch,
        acc_f64,
        path,
        bytes: cubin.len(),
        resources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_names_the_architecture_accumulation_and_sources() {
        let base = Path::new("/cache");
        let a = path_in(base, (9, 0), true);
        assert!(a.starts_with("/cache/cuda-kernels"), "{a:?}");
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("sm_90-f64-") && name.ends_with(".cubin"),
            "{name}"
        );
        assert_ne!(a, path_in(base, (9, 0), false));
        assert_ne!(a, path_in(base, (12, 0), true));
        assert_eq!(a, path_in(base, (9, 0), true));
    }

    #[test]
    fn capabilities_parse_in_both_spellings_from_sm_80_up() {
        for (text, cc) in [
            ("9.0", (9, 0)),
            ("12.0", (12, 0)),
            ("sm_90", (9, 0)),
            ("sm_120", (12, 0)),
            (" sm_86 ", (8, 6)),
            ("10.0", (10, 0)),
        ] {
            assert_eq!(parse_capability(text), Ok(cc), "{text}");
        }
        for text in [
            "7.5", "sm_75", "90", "sm_9", "sm_", "9.x", "13.0", "", "sm_9a",
        ] {
            let e = parse_capability(text).unwrap_err();
            assert!(e.contains("sm_80 or newer, e.g. 9.0"), "{text}: {e}");
        }
    }

    #[test]
    fn a_listing_tells_current_cubins_from_stale_ones() {
        let dir = std::env::temp_dir().join(format!("dsv4-klist-{}", std::process::id()));
        assert_eq!(
            list(Some(&dir)).unwrap(),
            vec![],
            "no cache: nothing listed"
        );
        let current = path_in(&dir, (12, 0), false);
        let stale = current.with_file_name("sm_90-f64-0123456789abcdef.cubin");
        store_at(&current, b"\x7fELF current");
        store_at(&stale, b"\x7fELF old");
        for junk in [
            "notes.txt",
            "sm_90-f16-0123456789abcdef.cubin",
            "sm_90-f64-xyz.cubin",
        ] {
            std::fs::write(current.with_file_name(junk), b"x").unwrap();
        }
        let l = list(Some(&dir)).unwrap();
        let seen: Vec<_> = l
            .iter()
            .map(|c| (c.arch, c.acc_f64, c.current, c.bytes))
            .collect();
        assert_eq!(
            seen,
            vec![((12, 0), false, true, 12), ((9, 0), true, false, 8)]
        );
        assert_eq!((&l[0].path, &l[1].path), (&current, &stale));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stored_cubin_loads_back_and_a_damaged_one_is_ignored() {
        let dir = std::env::temp_dir().join(format!("dsv4-kcache-{}", std::process::id()));
        let p = path_in(&dir, (8, 0), false);
        assert_eq!(load_from(&p), None, "nothing cached yet");
        let mut cubin = b"\x7fELF".to_vec();
        cubin.resize(200, 7);
        store_at(&p, &cubin);
        assert_eq!(load_from(&p).as_deref(), Some(&cubin[..]));
        std::fs::write(&p, b"\x7fELF truncated").unwrap();
        assert_eq!(load_from(&p), None, "too short to be a CUBIN");
        std::fs::write(&p, vec![0u8; 200]).unwrap();
        assert_eq!(load_from(&p), None, "not an ELF image");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

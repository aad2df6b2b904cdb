//! NVRTC's CUBINs cached on disk: `<cache>/cuda-kernels/sm_XY-<acc>-<key>.cubin`, the key a hash
//! of the kernel translation unit and NVRTC's options, so an edit to any kernel or option names a
//! new file. `open` loads the cached CUBIN for its device when there is one (no compile at start)
//! and stores what it compiled. With `DSV4_CUDA_KERNELS=cached` it never compiles: a machine
//! without NVRTC (a GPU box that cannot reach PyPI) runs the CUBINs compiled elsewhere, e.g. on
//! the emulated driver (`DSV4_CUDA_DRIVER=emu DSV4_CUDA_EMU_CC=9.0`), and a deployment is sure
//! to run exactly the kernels it was validated with.

use crate::disk_cache::{cache_base, fnv1a};
use crate::{kernels, nvrtc};
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

fn path_in(base: &Path, arch: (u32, u32), acc_f64: bool) -> PathBuf {
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
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    if std::fs::write(&tmp, cubin).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
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

//! Where the backend keeps what it builds on disk (the emulator's libraries, NVRTC's CUBINs), and
//! the stable hash that names each build after everything that went into it.

use std::path::PathBuf;

/// FNV-1a, 64 bit: a stable cache key (std's hasher may change between Rust releases).
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(&(part.len() as u64).to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The cache directory: `$DSV4_CACHE_DIR` (a relative one taken from the current directory), else `$XDG_CACHE_HOME/dsv4`, `~/.cache/dsv4`, the
/// temp dir's `dsv4`.
pub(crate) fn cache_base() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("DSV4_CACHE_DIR") {
        // Absolute: builds run compilers in their own directories.
        return std::env::current_dir().map_or(d.clone(), |cwd| cwd.join(&d));
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return d.join("dsv4");
    }
    if let Some(d) = env("HOME") {
        return d.join(".cache").join("dsv4");
    }
    std::env::temp_dir().join("dsv4")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_depends_on_every_part() {
        let a = fnv1a(&[b"ab", b"c"]);
        assert_ne!(a, fnv1a(&[b"a", b"bc"]));
        assert_ne!(a, fnv1a(&[b"ab", b"d"]));
        assert_eq!(a, fnv1a(&[b"ab", b"c"]));
    }
}

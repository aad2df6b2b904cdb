//! One module per command group; each exposes clap argument structs and a `run`-style function.

pub mod ab;
pub mod bench;
pub mod chat;
pub mod diff;
pub mod engine_config;
pub mod forward;
pub mod generate;
pub mod kernels;
pub mod ledger;
pub mod model;
pub mod plan;
pub mod profile;
pub mod run_batch;
pub mod serve;
pub mod stress;

use std::path::Path;

/// Refuse an output path that cannot be created (its directory is missing, or it is a
/// directory) before a long run whose report would otherwise be lost when written at the end.
pub fn check_output_path(flag: &str, path: &Path) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        anyhow::bail!(
            "{flag} {}: directory {} does not exist; create it first (nothing has run)",
            path.display(),
            dir.display()
        );
    }
    if path.is_dir() {
        anyhow::bail!(
            "{flag} {}: is a directory; name a file (nothing has run)",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_output_path;
    use std::path::Path;

    #[test]
    fn output_paths_are_checked_before_a_run() {
        let dir = tempfile::tempdir().unwrap();
        check_output_path("--json", &dir.path().join("r.json")).unwrap();
        check_output_path("--json", Path::new("r.json")).unwrap();
        let e = check_output_path("--json", &dir.path().join("no/r.json")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = check_output_path("--out", dir.path()).unwrap_err();
        assert!(e.to_string().starts_with("--out") && e.to_string().contains("is a directory"));
    }
}

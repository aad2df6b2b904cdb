//! Where an A/B run ran: the dsv4 version (`dsv4 --version`), the git revision of the working
//! directory when there is one, and the machine (CPU model, cores, memory, OS).

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;

/// Versions of what ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Versions {
    /// `dsv4 --version` of the binary that booted the servers.
    pub dsv4: Option<String>,
    /// `git rev-parse HEAD` of the current directory, when it is a git checkout.
    pub git_rev: Option<String>,
    /// Whether that checkout had uncommitted changes to tracked files.
    pub git_dirty: Option<bool>,
}

/// The machine the run ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model (`model name` in /proc/cpuinfo), when known.
    pub cpu: Option<String>,
    /// Logical cores available to this process.
    pub cores: usize,
    /// Total memory in bytes (`MemTotal` in /proc/meminfo), when known.
    pub memory_bytes: Option<u64>,
    /// Operating system and architecture.
    pub os: String,
}

/// Run a command and return its trimmed stdout when it succeeds.
fn output(program: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The versions of `binary` and of the git checkout in the current directory.
pub fn versions(binary: &Path) -> Versions {
    let git = Path::new("git");
    let git_rev = output(git, &["rev-parse", "HEAD"]);
    let git_dirty = git_rev.as_ref().and_then(|_| {
        output(git, &["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty())
    });
    Versions {
        dsv4: output(binary, &["--version"]),
        git_rev,
        git_dirty,
    }
}

/// The machine, from /proc where available.
pub fn machine() -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    });
    let memory_bytes = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_bytes,
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
    }
}

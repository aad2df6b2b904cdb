//! Where an A/B run ran: the dsv4 version (`dsv4 --version`), the git revision of the working
//! directory when there is one, and the machine (CPU model, cores, memory, OS).

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

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

/// How long a version probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Run a command and return its trimmed stdout when it succeeds within [`PROBE_TIMEOUT`].
async fn output(program: &Path, args: &[&str]) -> Option<String> {
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PROBE_TIMEOUT, child)
        .await
        .ok()?
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The versions of `binary` and of the git checkout in the current directory (each probe is
/// given up after 10 s).
pub async fn versions(binary: &Path) -> Versions {
    let git = Path::new("git");
    let git_rev = output(git, &["rev-parse", "HEAD"]).await;
    let git_dirty = match git_rev {
        Some(_) => output(git, &["status", "--porcelain", "--untracked-files=no"])
            .await
            .map(|s| !s.is_empty()),
        None => None,
    };
    Versions {
        dsv4: output(binary, &["--version"]).await,
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

//! One cold-booted `dsv4 serve --port 0` process for one arm of one repeat: spawn it, read the
//! bound URL from its first stdout line, wait for `GET /health` to answer 200, and stop it with
//! SIGTERM (then SIGKILL if it does not exit). Its stderr is kept as a tail for error messages.

use super::AbError;
use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Lines of the server's stderr kept for error messages.
const STDERR_TAIL_LINES: usize = 30;

/// How long a server may take to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// errno of "text file busy": exec of a file some process still has open for writing (Linux).
const ETXTBSY: i32 = 26;

/// A running `dsv4 serve` child.
pub struct ServerProcess {
    child: Child,
    /// The base URL it listens on (`http://127.0.0.1:PORT`).
    pub url: String,
    /// The command line it was started with (for the bundle).
    pub command: Vec<String>,
    /// Seconds from spawn to the first 200 from `/health`.
    pub boot_s: f64,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

/// The arguments of `dsv4 serve` for a profile and its `--set` overrides, listening on a free
/// loopback port.
pub fn serve_args(profile: &str, sets: &[String], extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = ["serve", "--port", "0", "--host", "127.0.0.1", "--profile"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(profile.to_owned());
    for s in sets {
        args.push("--set".into());
        args.push(s.clone());
    }
    args.extend(extra.iter().cloned());
    args
}

impl ServerProcess {
    /// Start `binary` with `args` and wait until it is healthy (at most `timeout` in all).
    /// `what` names the arm and repeat in errors.
    pub async fn start(
        binary: &Path,
        args: Vec<String>,
        timeout: Duration,
        what: &str,
    ) -> Result<Self, AbError> {
        let started = Instant::now();
        let mut command = vec![binary.display().to_string()];
        command.extend(args.iter().cloned());
        let spawn = || {
            Command::new(binary)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
        };
        // A binary written a moment ago can be briefly "busy" (ETXTBSY) while another thread's
        // fork still holds its write descriptor; retry a few times before giving up.
        let mut attempt = 0;
        let mut child = loop {
            match spawn() {
                Err(e) if e.raw_os_error() == Some(ETXTBSY) && attempt < 20 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                other => {
                    break other.map_err(|e| AbError::Boot {
                        what: what.into(),
                        message: format!("cannot start {}: {e}", binary.display()),
                        stderr_tail: String::new(),
                    })?;
                }
            }
        };
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            let tail = Arc::clone(&stderr);
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                    if t.len() == STDERR_TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            });
        }
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(timeout, lines.next_line()).await;
        let mut server = ServerProcess {
            child,
            url: String::new(),
            command,
            boot_s: 0.0,
            stderr,
        };
        let first = match first {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) | Ok(Err(_)) => {
                return Err(server
                    .fail(what, "exited before printing its URL on stdout")
                    .await);
            }
            Err(_) => {
                let msg = format!("printed no URL within {} s", timeout.as_secs());
                return Err(server.fail(what, &msg).await);
            }
        };
        let Some(url) = first.split_whitespace().find(|w| w.starts_with("http://")) else {
            let msg = format!("first stdout line has no http:// URL: {first:?}");
            return Err(server.fail(what, &msg).await);
        };
        server.url = url.trim_end_matches('/').to_owned();
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        server.wait_healthy(started, timeout, what).await?;
        server.boot_s = started.elapsed().as_secs_f64();
        Ok(server)
    }

    /// Poll `/health` until 200, the process exits, or the deadline passes.
    async fn wait_healthy(
        &mut self,
        started: Instant,
        timeout: Duration,
        what: &str,
    ) -> Result<(), AbError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| AbError::Boot {
                what: what.into(),
                message: format!("cannot build an HTTP client: {e}"),
                stderr_tail: String::new(),
            })?;
        let health = crate::ready::health_url(&self.url);
        let mut last;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let msg = format!("exited with {status} before {health} answered 200");
                return Err(self.fail(what, &msg).await);
            }
            last = match crate::ready::probe(&client, &health).await {
                crate::ready::Probe::Ready => return Ok(()),
                crate::ready::Probe::Unknown(status) => format!("HTTP {status}"),
                crate::ready::Probe::Waiting(why) => why,
            };
            if started.elapsed() >= timeout {
                let msg = format!(
                    "{health} did not answer 200 within {} s (last: {last}); raise --boot-timeout \
                     for a large model",
                    timeout.as_secs()
                );
                return Err(self.fail(what, &msg).await);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last lines the server wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        t.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Stop the process and build the boot error (with the stderr tail).
    async fn fail(&mut self, what: &str, message: &str) -> AbError {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        // Give the stderr reader a moment to collect the last lines.
        tokio::time::sleep(Duration::from_millis(50)).await;
        AbError::Boot {
            what: what.into(),
            message: message.into(),
            stderr_tail: self.stderr_tail(),
        }
    }

    /// SIGTERM, wait up to 30 s, then SIGKILL; the exit status as text.
    pub async fn stop(mut self) -> String {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
        }
        match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => format!("wait failed: {e}"),
            Err(_) => {
                let _ = self.child.kill().await;
                format!(
                    "killed: no exit within {} s of SIGTERM",
                    STOP_GRACE.as_secs()
                )
            }
        }
    }
}

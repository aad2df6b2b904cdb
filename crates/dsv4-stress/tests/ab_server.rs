//! Booting a server for an A/B arm fails clearly: a binary that exits early, one that prints no
//! URL, and one whose `/health` never answers each give an error naming the arm and showing the
//! server's stderr; a stopped run kills the server it booted. Stand-in "servers" are small shell scripts (skipped where there is no sh).

use dsv4_stress::StressOptions;
use dsv4_stress::ab::{
    AbError, AbOptions, ArmSpec, ServerProcess, Target, run_ab_until, serve_args,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Write an executable shell script; None (with the reason printed) when /bin/sh is missing and
/// CI is not set.
fn script(dir: &Path, name: &str, body: &str) -> Option<PathBuf> {
    if !Path::new("/bin/sh").exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "/bin/sh is missing"
        );
        eprintln!("skipped: /bin/sh is missing");
        return None;
    }
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    Some(path)
}

async fn boot_error(binary: &Path, timeout: Duration) -> AbError {
    let args = serve_args("dev-cpu", &["exec.cuda_graph=true".into()], &[]);
    match ServerProcess::start(binary, args, timeout, "arm A (test), repeat 1").await {
        Ok(_) => panic!("the stand-in server should not boot"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn a_server_that_exits_shows_its_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = script(
        dir.path(),
        "dies",
        "echo \"error: bad value for debug.inject ($*)\" >&2; exit 1",
    ) else {
        return;
    };
    let e = boot_error(&bin, Duration::from_secs(20)).await.to_string();
    assert!(e.contains("arm A (test), repeat 1"), "{e}");
    assert!(e.contains("exited before printing its URL"), "{e}");
    assert!(e.contains("bad value for debug.inject"), "{e}");
    // The arguments reached the server as `dsv4 serve` takes them.
    assert!(
        e.contains("serve --port 0 --host 127.0.0.1 --profile dev-cpu --set exec.cuda_graph=true"),
        "{e}"
    );
}

#[tokio::test]
async fn a_first_line_without_url_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = script(dir.path(), "nourl", "echo 'hello'; sleep 30") else {
        return;
    };
    let e = boot_error(&bin, Duration::from_secs(20)).await.to_string();
    assert!(e.contains("no http:// URL"), "{e}");
    assert!(e.contains("hello"), "{e}");
}

#[tokio::test]
async fn health_that_never_answers_times_out_with_the_stderr_tail() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard) on loopback: nothing listens there in a test environment.
    let Some(bin) = script(
        dir.path(),
        "silent",
        "echo 'dsv4 serve: listening on http://127.0.0.1:9'; echo 'loading the model' >&2; sleep 30",
    ) else {
        return;
    };
    let e = boot_error(&bin, Duration::from_secs(1)).await.to_string();
    assert!(
        e.contains("http://127.0.0.1:9/health did not answer 200 within 1 s"),
        "{e}"
    );
    assert!(e.contains("loading the model"), "{e}");
}

/// Whether process `pid` is gone (or only a zombie waiting to be reaped).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn stopping_a_run_kills_the_server_it_booted() {
    if !Path::new("/proc/self/stat").exists() {
        eprintln!("skipped: no /proc to check processes with");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let body = format!(
        "[ \"$1\" = serve ] || exit 0; echo $$ > {}; echo 'listening on http://127.0.0.1:9'; \
         exec sleep 60",
        pidfile.display()
    );
    let Some(bin) = script(dir.path(), "hangs", &body) else {
        return;
    };
    let arm = |label: &str| ArmSpec {
        label: label.into(),
        target: Target::Boot {
            profile: "dev-cpu".into(),
            sets: vec![],
        },
        config: serde_json::Value::Null,
    };
    let opts = AbOptions {
        a: arm("a"),
        b: arm("b"),
        repeat: 1,
        workload: StressOptions::default(),
        binary: bin,
        serve_extra: vec![],
        boot_timeout: Duration::from_secs(60),
        command: "test".into(),
        progress: false,
    };
    let stop = async {
        // Stop once the server has started (it writes its pid first).
        while !pidfile.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let result = run_ab_until(&opts, stop).await.unwrap();
    assert!(result.is_none(), "the run was stopped");
    let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !gone(&pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the stand-in server {pid} still runs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

//! Booting a server for an A/B arm fails clearly: a binary that exits early, one that prints no
//! URL, and one whose `/health` never answers each give an error naming the arm and showing the
//! server's stderr. Stand-in "servers" are small shell scripts (skipped where there is no sh).

use dsv4_stress::ab::{AbError, ServerProcess, serve_args};
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

//! End-to-end tests of `dsv4 profile export --target sglang` (identical to the golden files of
//! dsv4-config) and `dsv4 serve --engine sglang` (checks python3 and sglang, then execs).

mod common;

use common::{dsv4, run};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dsv4-config/tests/golden")
        .join(name)
}

#[test]
fn export_prints_the_golden_file_of_every_shipped_profile_and_format() {
    let dir = tempfile::tempdir().unwrap();
    for profile in ["dev-cpu", "reference", "prod-fp8", "prod-bf16"] {
        for format in ["sh", "systemd", "json"] {
            let out = run(dsv4(
                dir.path(),
                &[
                    "profile", "export", profile, "--target", "sglang", "--format", format,
                ],
            ));
            assert!(out.status.success(), "{profile} {format}");
            let expected = std::fs::read_to_string(golden(&format!("{profile}.{format}")))
                .expect("golden file");
            assert_eq!(
                String::from_utf8(out.stdout).unwrap(),
                expected,
                "{profile}.{format}"
            );
        }
    }
}

#[test]
fn export_warns_on_stderr_too_and_respects_set() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dsv4(
        dir.path(),
        &[
            "--profile",
            "prod-bf16",
            "profile",
            "export",
            "--target",
            "sglang",
            "--format",
            "json",
            "--set",
            "exec.multi_stream_overlap=false",
        ],
    ));
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("warning: not reproduced on SGLang: numerics.index_k_dtype = bf16"),
        "{stderr}"
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["profile"], "prod-bf16");
    assert_eq!(doc["env"][0]["value"], "0");
    // With overlap off the incident warning is gone.
    assert_eq!(doc["profile_warnings"], serde_json::json!([]));
}

#[test]
fn export_needs_a_target_and_a_valid_profile() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dsv4(dir.path(), &["profile", "export", "prod-fp8"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--target"));
    let out = run(dsv4(
        dir.path(),
        &[
            "profile",
            "export",
            "prod-fp8",
            "--target",
            "sglang",
            "--set",
            "cache.prefix_cache=false",
        ],
    ));
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("[hicache-needs-prefix-cache]"), "{e}");
}

#[test]
fn serve_with_sglang_refuses_the_native_server_flags() {
    // The native server is tested in tests/server_e2e.rs.
    let dir = tempfile::tempdir().unwrap();
    let out = run(dsv4(
        dir.path(),
        &["serve", "--engine", "sglang", "--port", "9000"],
    ));
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("--set server.port=8001"), "{e}");
}

#[test]
fn serve_refuses_a_profile_sglang_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dsv4(dir.path(), &["serve", "--engine", "sglang"]));
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(
        e.contains("profile `dev-cpu` cannot run on SGLang: model.path = tiny"),
        "{e}"
    );
    assert!(e.contains("dsv4 model init-tiny"), "{e}");
}

/// Write an executable `python3` script into `dir`.
#[cfg(unix)]
fn fake_python(dir: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("python3");
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[cfg(unix)]
#[test]
fn serve_with_sglang_checks_the_import_then_execs_the_exported_command() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |bin: &Path| {
        let mut cmd = dsv4(
            dir.path(),
            &["--profile", "prod-fp8", "serve", "--engine", "sglang"],
        );
        cmd.env("PATH", bin);
        run(cmd)
    };

    // No python3 at all.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = serve(&empty);
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("cannot run `python3` to start SGLang"), "{e}");
    assert!(
        e.contains("dsv4 profile export prod-fp8 --target sglang --format sh"),
        "{e}"
    );

    // python3 without sglang.
    let missing = dir.path().join("missing");
    std::fs::create_dir(&missing).unwrap();
    fake_python(
        &missing,
        "echo 'Traceback (most recent call last):' >&2\n\
         echo \"ModuleNotFoundError: No module named 'sglang'\" >&2\nexit 1\n",
    );
    let out = serve(&missing);
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("SGLang is not available"), "{e}");
    assert!(e.contains("No module named 'sglang'"), "{e}");

    // python3 with sglang: the import check passes, then the command replaces dsv4.
    let present = dir.path().join("present");
    std::fs::create_dir(&present).unwrap();
    fake_python(
        &present,
        "if [ \"$1\" = \"-c\" ]; then exit 0; fi\n\
         echo \"ARGV $*\"\necho \"OVERLAP=$SGLANG_OPT_USE_MULTI_STREAM_OVERLAP\"\n",
    );
    let out = serve(&present);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains(
            "ARGV -m sglang.launch_server --model-path /models/DeepSeek-V4-Flash \
             --kv-cache-dtype fp8_e4m3"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("--reasoning-parser deepseek-v4 --enable-priority-scheduling\n"),
        "{stdout}"
    );
    assert!(stdout.contains("OVERLAP=1"), "{stdout}");
    assert!(
        stderr.contains("warning: not reproduced on SGLang: server.max_request_bytes"),
        "{stderr}"
    );
}

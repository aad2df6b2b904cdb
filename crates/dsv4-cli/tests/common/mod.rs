//! Helpers shared by the CLI's end-to-end tests: run the built `dsv4` binary isolated from the
//! caller's `DSV4_*` environment and check its exit status and output.
#![allow(dead_code)] // each test binary uses its own subset

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// The binary, run in `cwd` (so only the embedded profiles and `cwd/profiles` are found) with no
/// `DSV4_*` variables inherited from the caller.
pub fn dsv4(cwd: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsv4"));
    cmd.current_dir(cwd).args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("DSV4_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Run a command and collect its output.
pub fn run(mut cmd: Command) -> Output {
    cmd.output().expect("the dsv4 binary runs")
}

/// Run a command that must succeed; its stdout.
pub fn ok(cmd: Command) -> String {
    let out = run(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dsv4 failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Run a command that must fail; its stderr.
pub fn fails(cmd: Command) -> String {
    let out = run(cmd);
    assert!(!out.status.success(), "dsv4 should have failed");
    String::from_utf8(out.stderr).unwrap()
}

/// Run a command that must succeed and print one JSON document.
pub fn json(cmd: Command) -> Value {
    let text = ok(cmd);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

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

/// Whether a backend that needs something this machine may lack can run: `probe` is its
/// registry probe's answer. Prints the reason and skips (false), except under CI=true, where a
/// missing requirement fails the test.
pub fn can_run(test: &str, backend: &str, probe: Result<(), String>) -> bool {
    match probe {
        Ok(()) => true,
        Err(reason) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and the {backend} backend cannot run: {reason}");
            }
            eprintln!("SKIP {test}: {reason}");
            false
        }
    }
}

/// Run `dsv4 args` (with `env` set) that must succeed and print `result: PASS`; its stdout.
pub fn diff_passes(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = dsv4(&std::env::temp_dir(), args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run(cmd);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("result: PASS"),
        "dsv4 {args:?} {env:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Every numerics combination: (kv cache dtype, index-K dtype, activation quantization).
pub fn every_numerics() -> Vec<[&'static str; 3]> {
    let mut v = Vec::new();
    for kv in ["bf16", "fp8"] {
        for ik in ["bf16", "fp8", "fp4"] {
            for act in ["none", "fp8"] {
                v.push([kv, ik, act]);
            }
        }
    }
    v
}

/// Six combinations that hold every pair of two knobs' values (a pairwise covering of
/// [`every_numerics`]): for a large model, where the full product costs too much test time.
pub const PAIRWISE_NUMERICS: [[&str; 3]; 6] = [
    ["bf16", "bf16", "none"],
    ["fp8", "bf16", "fp8"],
    ["bf16", "fp8", "fp8"],
    ["fp8", "fp8", "none"],
    ["bf16", "fp4", "fp8"],
    ["fp8", "fp4", "none"],
];

/// The combinations of `combos` with the kv cache dtype `kv`: one test per kv dtype splits a
/// long numerics sweep into two halves that the test harness runs in parallel.
pub fn with_kv(combos: &[[&'static str; 3]], kv: &str) -> Vec<[&'static str; 3]> {
    combos.iter().filter(|c| c[0] == kv).copied().collect()
}

/// `dsv4 diff --model --against candidate` (`extra` before the subcommand) over `tokens` prompt
/// tokens and 2 decode steps in each of the numerics combinations `combos`, each passing with no
/// divergence; `check(stdout, what)` asserts more.
pub fn model_diff_in_numerics(
    candidate: &str,
    extra: &[&str],
    tokens: &str,
    combos: &[[&str; 3]],
    check: impl Fn(&str, &str),
) {
    for [kv, ik, act] in combos {
        let sets = [
            format!("numerics.kv_cache_dtype={kv}"),
            format!("numerics.index_k_dtype={ik}"),
            format!("numerics.act_quant={act}"),
        ];
        let mut args = extra.to_vec();
        for s in &sets {
            args.extend(["--set", s.as_str()]);
        }
        args.extend([
            "diff",
            "--model",
            "--against",
            candidate,
            "--tokens",
            tokens,
            "--decode",
            "2",
        ]);
        let out = diff_passes(&args, &[]);
        let what = format!("{candidate} {extra:?} kv={kv} index_k={ik} act={act}");
        assert!(out.contains("first divergence: none"), "{what}:\n{out}");
        check(&out, &what);
    }
}

//! End-to-end tests of `dsv4 diff`: JSON output and exit status, a candidate that differs only by
//! a numerics override, the cpu backend's f32 sums, unknown backends, and case listing.

use serde_json::Value;
use std::process::{Command, Output};

/// The binary with whitespace-separated `args` and no `DSV4_*` variables inherited from the caller.
fn dsv4(args: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsv4"));
    cmd.args(args.split_whitespace());
    for (k, _) in std::env::vars() {
        if k.starts_with("DSV4_") {
            cmd.env_remove(k);
        }
    }
    cmd.output().expect("the dsv4 binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn reference_against_itself_on_one_op_exits_0_with_parsable_json() {
    let out = dsv4("diff --backend reference --against reference --json -o rms_norm");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(doc["schema"], "dsv4.diff/1");
    assert_eq!(doc["passed"], true);
    assert_eq!(doc["candidate"]["backend"], "reference");
    let cases = doc["ops"]["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for c in cases {
        assert_eq!(c["op"], "rms_norm");
        assert_eq!(c["status"], "pass");
        assert_eq!(c["metric"], "nmse");
        assert_eq!(c["value"], 0.0);
    }
    assert_eq!(doc["model"], Value::Null);
}

#[test]
fn a_numerics_override_on_the_candidate_is_found_and_exits_1() {
    let common = "diff --backend reference --against reference --model --tokens 6 --decode 1";
    let out = dsv4(common);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("first divergence: none"));

    let out = dsv4(&format!(
        "{common} --against-set numerics.kv_cache_dtype=fp8"
    ));
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("FIRST DIVERGENCE") && stdout.contains("attn.o"),
        "{stdout}"
    );
    assert!(stdout.contains("kv=fp8"), "{stdout}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("first divergence at prefill layers.0.attn.o"),
        "{stderr}"
    );
}

#[test]
fn cpu_f32_sums_reach_the_backend_stay_within_tolerance_and_are_reported() {
    let common = "diff --backend reference --against cpu --model --tokens 40 --decode 2 --json";
    let run = |extra: &str| {
        let out = dsv4(&format!("{common} {extra}"));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).expect("stdout is JSON")
    };
    // f64 sums (the default): the reference's logits to the bit on the tiny model.
    let f64_doc = run("");
    assert_eq!(f64_doc["candidate"]["sums"], "f64");
    assert_eq!(f64_doc["oracle"]["sums"], Value::Null);
    assert_eq!(f64_doc["model"]["logits"]["max_abs"], 0.0);
    // f32 sums: other bits, within every tap's tolerance, the same argmax everywhere.
    let f32_doc = run("--against-set backend.cpu_sums=f32");
    assert_eq!(f32_doc["candidate"]["sums"], "f32");
    assert_eq!(f32_doc["passed"], true);
    let logits = &f32_doc["model"]["logits"];
    assert!(logits["max_abs"].as_f64().unwrap() > 0.0, "{logits}");
    assert_eq!(logits["argmax_agreement"], 1.0, "{logits}");
}

#[test]
fn unknown_backends_are_named_with_the_registered_ones() {
    let out = dsv4("diff --against no-such-backend -o swiglu");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("unknown backend `no-such-backend` (registered: ")
            && stderr.contains("reference")
            && stderr.contains("--against"),
        "{stderr}"
    );
    // The default candidate is `cpu`: it either runs or is reported as missing by name.
    let out = dsv4("diff -o swiglu");
    if !out.status.success() {
        let stderr = text(&out.stderr);
        assert!(stderr.contains("unknown backend `cpu`"), "{stderr}");
    }
}

#[test]
fn list_prints_the_selected_case_names_and_bad_filters_fail() {
    let out = dsv4("diff --list -o topk -p flash");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let names = text(&out.stdout);
    assert!(!names.is_empty());
    assert!(
        names.lines().all(|l| l.starts_with("topk/flash/")),
        "{names}"
    );
    let out = dsv4("diff --list -o no_such_op");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("unknown op `no_such_op`"));
}

#[test]
fn out_writes_the_json_beside_the_table_and_an_unwritable_path_fails_first() {
    let dir = std::env::temp_dir().join(format!("dsv4-diff-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("report.json");
    let out = dsv4(&format!(
        "diff --against reference --model --tokens 6 --decode 1 --out {}",
        file.display()
    ));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("first divergence: none"),
        "the table still prints"
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(doc["schema"], "dsv4.diff/1");
    assert_eq!(doc["model"]["logits"]["rows"], 7);
    assert_eq!(doc["model"]["pinned"], true);
    // A run that fails leaves the earlier report as it was.
    let out = dsv4(&format!(
        "diff --against reference --model --tokens 6 --decode 100000000 --out {}",
        file.display()
    ));
    assert_eq!(out.status.code(), Some(1));
    let kept: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(kept, doc);
    // A path in a missing directory fails before the (long) diff runs.
    let bad = dir.join("missing").join("report.json");
    let out = dsv4(&format!(
        "diff --against reference --model --out {}",
        bad.display()
    ));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("cannot write the report to"), "{stderr}");
    assert!(!text(&out.stdout).contains("model:"), "nothing ran");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn batched_vs_solo_passes_clean_and_names_the_first_op_a_stream_fault_breaks() {
    let common =
        "--profile rehearsal diff --mode batched-vs-solo --backend cpu --tokens 64 --decode 8";
    let out = dsv4(common);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(
            "mode batched-vs-solo: oracle alone, candidate in every step with 3 other sequences"
        ) && stdout.contains("batched with 3 others in every step")
            && stdout.contains("first divergence: none"),
        "{stdout}"
    );
    // The MoE sum no longer waits for the shared-expert stream: the captured, overlapped
    // decode steps of a batch depart.
    let out = dsv4(&format!("--set debug.inject=missing-stream-event {common}"));
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("FIRST DIVERGENCE  decode") && stdout.contains("moe.out"),
        "{stdout}"
    );
    assert!(text(&out.stderr).contains("model diff failed: first divergence at decode"));
    // The header names the count asked for, and none at all is refused before anything runs.
    let out = dsv4(&format!("{common} --neighbours 1"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("candidate in every step with 1 other sequence (")
            && text(&out.stdout).contains("batched with 1 other in every step"),
        "{}",
        text(&out.stdout)
    );
    let out = dsv4(&format!("{common} --neighbours 0"));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("needs at least one other sequence"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&out.stdout).contains("model:"), "nothing ran");
}

//! `exec.overlap_schedule` reaches the engine through `generate --batch`, and the overlap
//! scheduler generates the tokens of the plain run.

use std::process::Command;

/// `dsv4 [--set …] generate --batch FILE`: (success, stdout, stderr).
fn batch(sets: &[&str], file: &std::path::Path) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsv4"));
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd
        .arg("generate")
        .arg("--batch")
        .arg(file)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn batch_requests_give_the_same_tokens_with_overlap_scheduling() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("req.jsonl");
    std::fs::write(
        &file,
        "{\"id\": 1, \"prompt\": \"hello\", \"max_tokens\": 6}\n\
         {\"id\": 2, \"prompt\": \"bye now\", \"max_tokens\": 3}\n\
         {\"id\": 3, \"prompt\": \"a longer prompt than the others\", \"max_tokens\": 5}\n",
    )
    .unwrap();
    let tokens = |out: &str| -> Vec<serde_json::Value> {
        out.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["tokens"].clone())
            .collect()
    };
    let (ok, plain, err) = batch(&["cache.max_total_tokens=4096"], &file);
    assert!(ok, "{err}");
    let (ok, overlapped, err) = batch(
        &["cache.max_total_tokens=4096", "exec.overlap_schedule=true"],
        &file,
    );
    assert!(ok, "exec.overlap_schedule: {err}");
    assert_eq!(tokens(&plain).len(), 3);
    for t in tokens(&plain) {
        assert!(t.as_array().is_some_and(|a| !a.is_empty()), "{t}");
    }
    assert_eq!(tokens(&overlapped), tokens(&plain));
}

#[test]
fn the_stale_page_reuse_fault_is_reported_by_the_canary() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("req.jsonl");
    std::fs::write(
        &file,
        "{\"id\": 1, \"prompt\": \"hello\", \"max_tokens\": 6}\n\
         {\"id\": 2, \"prompt\": \"bye now\", \"max_tokens\": 3}\n",
    )
    .unwrap();
    let base = ["cache.max_total_tokens=4096", "exec.overlap_schedule=true"];
    let canary = "debug.canary=index_k,kv,state";
    let (ok, _, err) = batch(&[base[0], base[1], canary], &file);
    assert!(ok, "{err}");
    assert!(
        !err.contains("canary finding"),
        "silent on the clean run: {err}"
    );
    let (ok, _, err) = batch(
        &[base[0], base[1], canary, "debug.inject=stale-page-reuse"],
        &file,
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("held by none of the step's requests"),
        "the ownership check names the stale writes: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

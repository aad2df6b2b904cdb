//! The profile's execution knobs reach the engine: captured plans, multi-stream overlap and the
//! canary change how a step runs, never what it computes.

use std::process::Command;

fn generate(sets: &[&str], batch: Option<&std::path::Path>) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsv4"));
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.arg("generate");
    match batch {
        Some(file) => cmd.arg("--batch").arg(file),
        None => cmd.args(["--prompt", "hello there", "--max-tokens", "8", "--json"]),
    };
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn completion_ids(stdout: &str) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_str(stdout).unwrap();
    v["completion_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn captured_and_overlap_modes_generate_the_eager_tokens() {
    let (ok, base, err) = generate(&[], None);
    assert!(ok, "{err}");
    let modes: [&[&str]; 3] = [
        &["exec.cuda_graph=true"],
        &["exec.multi_stream_overlap=true"],
        &[
            "exec.cuda_graph=true",
            "exec.multi_stream_overlap=true",
            "debug.canary=index_k,kv,state",
        ],
    ];
    for sets in modes {
        let (ok, out, err) = generate(sets, None);
        assert!(ok, "{sets:?}: {err}");
        assert_eq!(completion_ids(&out), completion_ids(&base), "{sets:?}");
    }
}

#[test]
fn batch_requests_run_with_the_canary_on_and_match_the_plain_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("req.jsonl");
    std::fs::write(
        &file,
        "{\"id\": 1, \"prompt\": \"hello\", \"max_tokens\": 6}\n{\"id\": 2, \"prompt\": \"bye now\", \"max_tokens\": 6}\n",
    )
    .unwrap();
    let tokens = |out: &str| -> Vec<serde_json::Value> {
        out.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["tokens"].clone())
            .collect()
    };
    let (ok, plain, err) = generate(&["cache.max_total_tokens=4096"], Some(&file));
    assert!(ok, "{err}");
    let (ok, checked, err) = generate(
        &[
            "cache.max_total_tokens=4096",
            "debug.canary=index_k,kv,state",
            "exec.multi_stream_overlap=true",
        ],
        Some(&file),
    );
    assert!(ok, "{err}");
    assert_eq!(tokens(&checked), tokens(&plain));
    assert_eq!(tokens(&plain).len(), 2);
}

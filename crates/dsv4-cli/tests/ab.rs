//! `dsv4 ab` end to end against dsv4's own server: A = the multi-stream aliasing fault (captured
//! graphs, multi-stream overlap, an arena that ignores cross-stream lifetimes), B = the same with
//! the incident's fix (`exec.multi_stream_overlap=false`). The real binary boots a fresh server
//! per arm per repeat (A B A B) and the solo oracle finds the corrupted answers; the fix must
//! show with p < 0.05 and the bundle must be one the ledger reads. Small sessions keep it short
//! (the workload's prompts are ~2,300 tokens of tool schemas each, so it is not instant on 2 cores).
//! 32 one-turn sessions per arm: about 40% of them fail under the fault, and p < 0.05 needs 6
//! failures with B at 0, so a chance miss is rarer than 1 in 100.
//! Also: bad arms are refused before anything boots.

mod common;

use common::{dsv4, fails};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};

/// A `dsv4 serve --port 0` started by the test (killed when dropped).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `dsv4 serve --port 0` in `cwd`; the process and its URL (from its first stdout line).
fn serve(cwd: &Path) -> (Running, String) {
    let mut cmd = dsv4(cwd, &["serve", "--port", "0"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = Running(cmd.spawn().expect("dsv4 serve starts"));
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first line").unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {first:?}"))
        .to_string();
    std::thread::spawn(move || for _ in lines {});
    (child, url)
}

#[test]
fn ab_shows_the_fix_of_the_aliasing_fault_with_p_below_0_05() {
    let dir = tempfile::tempdir().unwrap();
    let bundle_path = dir.path().join("ab.json");
    let bundle_arg = bundle_path.to_str().unwrap();
    #[rustfmt::skip]
    let args = [
        "ab", "--a", "dev-cpu",
        "--a-set", "exec.cuda_graph=true",
        "--a-set", "exec.multi_stream_overlap=true",
        "--a-set", "debug.inject=arena-ignores-streams",
        "--b-set", "exec.multi_stream_overlap=false",
        "--oracle", "solo", "--stop-before-markup", "--forced-tool-rate", "0",
        "--sessions", "16", "--concurrency", "16", "--turns", "1", "--max-tokens", "4",
        "--growth-chars", "20", "--repeat", "2", "--boot-timeout", "120s",
        "--json", bundle_arg,
    ];
    let out = dsv4(dir.path(), &args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dsv4 ab failed:\n{stderr}");
    println!("{stdout}");
    assert!(stdout.contains("Fisher's exact test"), "{stdout}");
    // Progress went to stderr: four boots, interleaved.
    let boots: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(": booting "))
        .collect();
    assert_eq!(boots.len(), 4, "{stderr}");
    for (line, arm) in boots.iter().zip(["arm A", "arm B", "arm A", "arm B"]) {
        assert!(line.contains(arm), "{line}");
    }

    let text = std::fs::read(&bundle_path).unwrap();
    let bundle: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(bundle["format"], "dsv4-ab/1");
    assert_eq!(bundle["a"]["label"], "exec.multi_stream_overlap=true");
    assert_eq!(bundle["b"]["label"], "exec.multi_stream_overlap=false");
    let runs = bundle["runs"].as_array().unwrap();
    let order: Vec<(&str, u64)> = runs
        .iter()
        .map(|r| (r["arm"].as_str().unwrap(), r["repeat"].as_u64().unwrap()))
        .collect();
    assert_eq!(order, [("A", 0), ("B", 0), ("A", 1), ("B", 1)]);
    for r in runs {
        assert_eq!(r["booted"], true);
        assert_eq!(r["server_exit"], "exit status: 0", "{}", r["server_exit"]);
        assert_eq!(r["report"]["records"].as_array().unwrap().len(), 16);
    }
    // B's resolved configuration records where the fix came from.
    let settings = bundle["b"]["config"]["settings"].as_array().unwrap();
    let overlap = settings
        .iter()
        .find(|s| s["key"] == "exec.multi_stream_overlap")
        .unwrap();
    assert_eq!(overlap["value"], false);
    assert_eq!(overlap["origin"]["kind"], "set");

    // The ledger lifts the same numbers.
    let summary = dsv4_ledger::evidence::ab_summary(&text, Path::new("ab.json"))
        .unwrap()
        .expect("a dsv4-ab/1 bundle");
    assert_eq!(summary.a.sessions, 32);
    assert_eq!(summary.b.sessions, 32);
    assert_eq!(summary.b.failures, 0, "the fix must remove every failure");
    assert!(summary.a.failures > 0, "the fault must show");
    assert!(
        summary.p_value < 0.05,
        "A {}/32 vs B {}/32: p = {}",
        summary.a.failures,
        summary.b.failures,
        summary.p_value
    );
    assert!(
        summary.command.starts_with("dsv4 ab --a dev-cpu"),
        "{}",
        summary.command
    );
}

#[test]
fn bad_arms_are_refused_before_anything_boots() {
    let dir = tempfile::tempdir().unwrap();
    let e = fails(dsv4(dir.path(), &["ab", "--a", "dev-cpu"]));
    assert!(e.contains("arm B would be identical to A"), "{e}");
    let e = fails(dsv4(
        dir.path(),
        &[
            "ab",
            "--a-set",
            "exec.no_such_key=1",
            "--b-set",
            "exec.cuda_graph=true",
        ],
    ));
    assert!(e.contains("arm A") && e.contains("no_such_key"), "{e}");
    let e = fails(dsv4(
        dir.path(),
        &[
            "ab",
            "--a",
            "http://127.0.0.1:9",
            "--a-set",
            "exec.cuda_graph=true",
        ],
    ));
    assert!(
        e.contains("--a-set cannot change a server given by URL"),
        "{e}"
    );
    let e = fails(dsv4(dir.path(), &["ab", "--a", "http://127.0.0.1:9"]));
    assert!(e.contains("give --b"), "{e}");
    let e = fails(dsv4(
        dir.path(),
        &["ab", "--b-set", "exec.cuda_graph=false"],
    ));
    assert!(e.contains("resolve to the same configuration"), "{e}");
    let e = fails(dsv4(
        dir.path(),
        &["ab", "--b-set", "exec.cuda_graph=true", "--repeat", "0"],
    ));
    assert!(e.contains("--repeat must be at least 1"), "{e}");
}

#[test]
fn an_arm_can_be_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = serve(dir.path());
    let bundle_path = dir.path().join("ab.json");
    #[rustfmt::skip]
    let args = [
        "ab", "--a", "dev-cpu", "--b", &url,
        "--stop-before-markup", "--forced-tool-rate", "0",
        "--sessions", "2", "--concurrency", "2", "--turns", "1", "--max-tokens", "2",
        "--growth-chars", "20", "--boot-timeout", "120s",
        "--json", bundle_path.to_str().unwrap(),
    ];
    let out = dsv4(dir.path(), &args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "dsv4 ab failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("note: B ran against {url}, which was not booted")),
        "{stdout}"
    );
    let bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bundle_path).unwrap()).unwrap();
    assert_eq!(bundle["a"]["label"], "dev-cpu");
    assert_eq!(bundle["b"]["label"], url.as_str());
    assert_eq!(bundle["b"]["target"]["kind"], "url");
    assert_eq!(bundle["b"]["config"], serde_json::Value::Null);
    let runs = bundle["runs"].as_array().unwrap();
    assert_eq!(
        (runs[0]["booted"].as_bool(), runs[1]["booted"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(runs[1]["url"], url.as_str());
    assert!(runs[1]["server_command"].is_null());
    assert_eq!(bundle["a"]["sessions"], 2);
    assert_eq!(bundle["b"]["sessions"], 2);
}

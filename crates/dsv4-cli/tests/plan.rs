//! End-to-end tests of `dsv4 plan show` and `dsv4 plan check`: every shipped profile's plans
//! verify clean in every batch bucket; with the arena fault injected the check fails and names
//! both launches of a race.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn dsv4(args: &[&str]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsv4"));
    cmd.current_dir(root).args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("DSV4_") {
            cmd.env_remove(k);
        }
    }
    cmd.output().expect("the dsv4 binary runs")
}

fn json(args: &[&str]) -> (bool, Value) {
    let out = dsv4(args);
    let text = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (out.status.success(), v)
}

#[test]
fn every_shipped_profile_passes_in_every_bucket() {
    let (ok, list) = json(&["profile", "list", "--json"]);
    assert!(ok, "{list}");
    let profiles: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert!(profiles.len() >= 5, "{profiles:?}");
    for profile in profiles.iter().map(String::as_str) {
        let (ok, v) = json(&["plan", "check", "--profile", profile, "--json"]);
        assert!(ok, "{profile}: {v}");
        assert_eq!(v["passed"], true, "{profile}");
        let plans = v["plans"].as_array().unwrap();
        assert!(
            plans
                .iter()
                .all(|p| p["verdict"]["findings"] == Value::Array(vec![]))
        );
        if profile.starts_with("prod") {
            let captured: Vec<u64> = plans
                .iter()
                .filter(|p| p["captured"] == true)
                .map(|p| p["rows"].as_u64().unwrap())
                .collect();
            assert_eq!(
                captured,
                [1, 2, 4, 8, 16, 32, 64, 128],
                "{profile}: every bucket"
            );
            assert!(plans.iter().all(|p| p["overlap"] == true));
        }
    }
}

#[test]
fn the_arena_fault_fails_the_check_with_both_launches_named() {
    let (ok, v) = json(&[
        "plan",
        "check",
        "--profile",
        "rehearsal",
        "--set",
        "debug.inject=arena-ignores-streams",
        "--config",
        "tiny",
        "--batch",
        "4",
        "--prefill-rows",
        "0",
        "--json",
    ]);
    assert!(!ok, "the check fails");
    assert_eq!(v["passed"], false);
    let f = &v["plans"][0]["verdict"]["findings"][0];
    assert_eq!(f["kind"], "race");
    for side in [&f["first"], &f["second"]] {
        for key in ["scope", "op", "stream", "buffer"] {
            assert!(
                side[key].as_str().is_some_and(|s| !s.is_empty()),
                "{key}: {f}"
            );
        }
        assert!(side["arena"].is_array(), "{f}");
    }
    assert_ne!(f["first"]["stream"], f["second"]["stream"]);
    let text = dsv4(&[
        "plan",
        "check",
        "--profile",
        "rehearsal",
        "--set",
        "debug.inject=arena-ignores-streams",
        "--config",
        "tiny",
        "--batch",
        "4",
        "--involving",
        "indexer_weights",
        "--limit",
        "100",
    ]);
    let out = String::from_utf8_lossy(&text.stdout);
    let shown = out.matches("RACE:").count();
    assert!(
        shown > 0 && shown == out.matches("stream indexer_weights").count(),
        "{out}"
    );
    assert!(out.contains("RACE: no ordering between"), "{out}");
    assert!(
        out.contains("by streams: ") && out.contains("indexer"),
        "{out}"
    );
    assert!(String::from_utf8_lossy(&text.stderr).contains("plans have hazards"));
    // A prefix no stream has is refused with the streams named, not read as "no findings".
    let typo = dsv4(&[
        "plan",
        "check",
        "--profile",
        "rehearsal",
        "--config",
        "tiny",
        "--batch",
        "4",
        "--involving",
        "indexr",
    ]);
    let err = String::from_utf8_lossy(&typo.stderr);
    assert!(!typo.status.success(), "{err}");
    assert!(
        err.contains("--involving `indexr`") && err.contains("main") && err.contains("indexer"),
        "{err}"
    );
}

#[test]
fn the_missing_event_fault_is_a_race_between_the_shared_expert_and_the_moe_sum() {
    let args = |inject: &'static str| {
        [
            "plan",
            "check",
            "--profile",
            "rehearsal",
            "--set",
            inject,
            "--config",
            "tiny",
            "--batch",
            "2",
            "--json",
        ]
    };
    let (ok, v) = json(&args("debug.inject=missing-stream-event"));
    assert!(!ok, "the check fails");
    let plans = v["plans"].as_array().expect("plans");
    for p in plans {
        let findings = p["verdict"]["findings"].as_array().expect("findings");
        let races: Vec<_> = findings.iter().filter(|f| f["kind"] == "race").collect();
        assert!(!races.is_empty(), "{p}");
        for f in races {
            let ops = [&f["first"]["op"], &f["second"]["op"]];
            assert!(
                ops.contains(&&"moe.shared".into()) && ops.contains(&&"moe.out".into()),
                "every race is the dropped wait: {f}"
            );
        }
    }
    let (ok, v) = json(&args("debug.inject="));
    assert!(ok, "the same plans without the fault pass: {v}");
}

#[test]
fn show_prints_streams_events_and_arena_offsets() {
    let out = dsv4(&[
        "plan",
        "show",
        "--profile",
        "prod-fp8",
        "--config",
        "tiny",
        "--batch",
        "3",
        "--buffers",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("decode of batch 3, captured bucket 4"),
        "{text}"
    );
    for needle in [
        "indexer_q",
        "layers.1.q_lora_ready",
        "arena offset",
        "attn.swa_store",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    let (ok, v) = json(&[
        "plan",
        "show",
        "--profile",
        "dev-cpu",
        "--batch",
        "2",
        "--prefill",
        "--json",
    ]);
    assert!(ok);
    assert_eq!(v["streams"], serde_json::json!(["main"]));
    assert!(v["launches"].as_array().unwrap().len() > 50);
    assert_eq!(v["placement"]["kind"], "fresh");
}

#[test]
fn show_prefill_with_fewer_logit_rows_gathers_them_before_the_head() {
    let show = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "show",
            "--profile",
            "dev-cpu",
            "--config",
            "tiny",
            "--batch",
            "8",
        ];
        args.extend_from_slice(extra);
        dsv4(&args)
    };
    let names = |v: &Value| -> Vec<String> {
        v["launches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap().to_string())
            .collect()
    };
    let logits_bytes = |v: &Value| {
        v["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == "logits")
            .map(|b| b["bytes"].as_u64().unwrap())
    };
    let parse = |o: Output| -> Value { serde_json::from_slice(&o.stdout).unwrap() };
    let all = parse(show(&["--prefill", "--json"]));
    let two = parse(show(&["--prefill", "--logit-rows", "2", "--json"]));
    let none = parse(show(&["--prefill", "--logit-rows", "0", "--json"]));
    let tail = |v: &Value| names(v)[names(v).len() - 4..].to_vec();
    assert_eq!(tail(&two), ["head_rows", "hc_head", "norm", "logits"]);
    assert!(!names(&all).contains(&"head_rows".to_string()));
    assert_eq!(names(&none).len() + 3, names(&all).len(), "no head at all");
    assert_eq!(logits_bytes(&all), Some(8 * 384 * 4));
    assert_eq!(logits_bytes(&two), Some(2 * 384 * 4));
    assert_eq!(logits_bytes(&none), None);
    let text = show(&["--prefill", "--logit-rows", "2"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("prefill of 8 rows, logits of 2, eager")
    );
    for (extra, says) in [
        (
            &["--prefill", "--logit-rows", "9"][..],
            "--logit-rows 9 is more than the step's 8 rows",
        ),
        (&["--logit-rows", "2"][..], "--prefill"),
    ] {
        let out = show(extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{extra:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn show_lists_the_order_a_device_runs_with_host_launches_last() {
    let (ok, v) = json(&[
        "plan",
        "show",
        "--profile",
        "dev-cpu",
        "--config",
        "tiny",
        "--batch",
        "2",
        "--json",
        "--device-order",
    ]);
    assert!(ok, "{v}");
    let launches = v["plan"]["launches"].as_array().unwrap();
    let order: Vec<usize> = v["device_order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..launches.len()).collect::<Vec<_>>(),
        "a permutation"
    );
    let at = |scope: &str, name: &str| {
        let i = launches
            .iter()
            .position(|l| l["scope"] == scope && l["name"] == name)
            .unwrap_or_else(|| panic!("{scope} {name}"));
        order.iter().position(|&k| k == i).unwrap()
    };
    // Layer 1 (ratio 4): every projection runs before its first host launch, and the host
    // launches run back to back up to attention.
    let s = "layers.1";
    assert!(at(s, "indexer.weights") < at(s, "locate"));
    let run = [
        "locate",
        "attn.swa_store",
        "compressor.pool",
        "indexer.compressor.pool",
        "indexer.topk",
        "attn.o",
    ];
    for w in run.windows(2) {
        assert_eq!(at(s, w[0]) + 1, at(s, w[1]), "{} then {}", w[0], w[1]);
    }
    let text = dsv4(&["plan", "show", "--config", "tiny", "--device-order"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("in the order the serial executor runs it on a device"),
        "{text}"
    );
    // Without the flag the JSON is the plan itself, in list order.
    let (ok, plain) = json(&["plan", "show", "--config", "tiny", "--json"]);
    assert!(ok && plain["launches"].is_array() && plain.get("device_order").is_none());
}

#[test]
fn diff_mode_shorthands_pass_clean_and_catch_the_arena_fault() {
    let base = [
        "diff",
        "--backend",
        "cpu",
        "--tokens",
        "8",
        "--decode",
        "3",
        "--json",
    ];
    for mode in ["captured-vs-eager", "overlap-vs-serial"] {
        let mut args = base.to_vec();
        args.extend(["--mode", mode]);
        let (ok, v) = json(&args);
        assert!(ok, "{mode}: {v}");
        assert_eq!(v["passed"], true, "{mode}");
    }
    let mut args = base.to_vec();
    args.extend([
        "--mode",
        "captured-vs-eager",
        "--set",
        "exec.multi_stream_overlap=true",
        "--against-set",
        "debug.inject=arena-ignores-streams",
    ]);
    let (ok, v) = json(&args);
    assert!(!ok, "the faulty arena diverges: {v}");
    assert_eq!(v["passed"], false);
    let out = dsv4(&[
        "diff",
        "--mode",
        "captured-vs-eager",
        "--tokens",
        "4",
        "--decode",
        "1",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("graphs-unsupported"),
        "the reference runs no captured plans: {err}"
    );
}

#[cfg(unix)]
#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // Far more than a pipe holds, so the writer is still writing when the reader leaves.
    let mut child = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .current_dir(root)
        .args(["plan", "show", "--profile", "prod-fp8", "--config", "small"])
        .args(["--prefill", "--batch", "64", "--buffers", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the dsv4 binary runs");
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    const SIGPIPE: i32 = 13; // Linux and the BSDs
    assert_eq!(out.status.signal(), Some(SIGPIPE), "{:?}", out.status);
}

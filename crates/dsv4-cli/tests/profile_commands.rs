//! End-to-end tests of `dsv4 profile list | show | explain | diff` and of validation as every
//! command sees it (errors stop the command, warnings go to stderr).

mod common;

use common::{dsv4, fails, json, ok, run};
use dsv4_config::schema::KEYS;
use serde_json::Value;
use std::path::Path;

#[test]
fn list_shows_every_shipped_profile_with_its_purpose() {
    let dir = tempfile::tempdir().unwrap();
    let text = ok(dsv4(dir.path(), &["profile", "list"]));
    let names: Vec<&str> = text
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        ["dev-cpu", "prod-bf16", "prod-fp8", "reference", "rehearsal"]
    );
    assert!(text.contains("dev-cpu (default)"), "{text}");
    assert!(text.contains("embedded:prod-bf16.toml  prod-fp8"), "{text}");

    std::fs::create_dir(dir.path().join("profiles")).unwrap();
    std::fs::write(
        dir.path().join("profiles/mine.toml"),
        "# Mine.\nextends = \"reference\"\n",
    )
    .unwrap();
    let doc = json(dsv4(dir.path(), &["profile", "list", "--json"]));
    let entries = doc.as_array().unwrap();
    assert_eq!(entries.len(), 6);
    let mine = entries.iter().find(|e| e["name"] == "mine").unwrap();
    assert_eq!(mine["extends"], "reference");
    assert_eq!(mine["summary"], "Mine.");
    assert!(mine["source"].as_str().unwrap().ends_with("mine.toml"));
    let prod = entries.iter().find(|e| e["name"] == "prod-fp8").unwrap();
    assert!(
        prod["summary"]
            .as_str()
            .unwrap()
            .contains("DeepSeek-V4-Flash")
    );
    assert_eq!(prod["default"], false);
}

#[test]
fn explain_prod_bf16_shows_every_key_with_value_source_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let text = ok(dsv4(dir.path(), &["profile", "explain", "prod-bf16"]));
    assert!(text.contains("the long-context recall fix"), "{text}");
    assert!(
        text.contains("files, base first: embedded:prod-fp8.toml <- embedded:prod-bf16.toml"),
        "{text}"
    );
    for spec in KEYS {
        let at = text
            .find(&format!("\n{} = ", spec.key))
            .unwrap_or_else(|| panic!("explain lacks {}: {text}", spec.key));
        let block = &text[at..];
        let block = &block[..block[1..].find("\n\n").map_or(block.len(), |e| e + 1)];
        assert!(block.contains("    source: "), "{} has no source", spec.key);
        assert!(block.contains(spec.doc), "{} has no description", spec.key);
    }
    assert!(text.contains(
        "numerics.index_k_dtype = bf16\n    source: embedded:prod-bf16.toml:14\n    why:    long-context recall fix"
    ), "{text}");
    assert!(
        text.contains("warnings (1):\n  - [incident-combination]"),
        "{text}"
    );

    let doc = json(dsv4(
        dir.path(),
        &["profile", "explain", "prod-bf16", "--json"],
    ));
    let settings = doc["settings"].as_array().unwrap();
    assert_eq!(settings.len(), KEYS.len());
    for s in settings {
        assert!(s["source"].is_string() && s["what"].is_string(), "{s}");
    }
    let ik = settings
        .iter()
        .find(|s| s["key"] == "numerics.index_k_dtype")
        .unwrap();
    assert_eq!(ik["value"], "bf16");
    assert!(ik["why"].as_str().unwrap().contains("recall"));
    assert_eq!(doc["findings"][0]["rule"], "incident-combination");
    assert_eq!(doc["findings"][0]["severity"], "warning");
    assert!(
        doc["description"]
            .as_str()
            .unwrap()
            .starts_with("prod-fp8 with bf16")
    );
}

#[test]
fn explain_key_shows_only_that_key_and_a_key_given_as_a_profile_says_how() {
    let dir = tempfile::tempdir().unwrap();
    let text = ok(dsv4(
        dir.path(),
        &[
            "profile",
            "explain",
            "prod-bf16",
            "--key",
            "numerics.index_k_dtype",
            "--key",
            "exec.cuda_graph",
        ],
    ));
    let shown: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" = ") && !l.starts_with(' '))
        .collect();
    assert_eq!(
        shown,
        ["numerics.index_k_dtype = bf16", "exec.cuda_graph = true"],
        "{text}"
    );
    assert!(
        text.contains("    why:    long-context recall fix"),
        "{text}"
    );
    // The findings are still the whole profile's.
    assert!(
        text.contains("warnings (1):\n  - [incident-combination]"),
        "{text}"
    );
    let doc = json(dsv4(
        dir.path(),
        &[
            "profile",
            "explain",
            "prod-bf16",
            "--key",
            "backend.kind",
            "--json",
        ],
    ));
    let settings = doc["settings"].as_array().unwrap();
    assert_eq!(settings.len(), 1, "{doc}");
    assert_eq!(settings[0]["value"], "cuda-sm120");

    let e = fails(dsv4(
        dir.path(),
        &["profile", "explain", "backend.cuda_decode"],
    ));
    assert!(
        e.contains("`backend.cuda_decode` is a configuration key, not a profile")
            && e.contains("dsv4 profile explain --key backend.cuda_decode"),
        "{e}"
    );
    let e = fails(dsv4(
        dir.path(),
        &["profile", "explain", "--key", "exec.cuda_graphs"],
    ));
    assert!(
        e.contains("unknown key `exec.cuda_graphs` in --key: did you mean `exec.cuda_graph`?"),
        "{e}"
    );
}

#[test]
fn diff_prod_fp8_prod_bf16_is_exactly_the_index_key_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let text = ok(dsv4(
        dir.path(),
        &["profile", "diff", "prod-fp8", "prod-bf16"],
    ));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "prod-fp8 -> prod-bf16: 1 key(s) differ");
    assert!(lines[2].starts_with("numerics.index_k_dtype  fp8  (embedded:prod-fp8.toml:"));
    assert!(
        lines[2].ends_with("bf16  (embedded:prod-bf16.toml:14)"),
        "{text}"
    );

    let doc = json(dsv4(
        dir.path(),
        &[
            "profile",
            "diff",
            "prod-fp8",
            "prod-bf16",
            "--json",
            "--set",
            "exec.threads=4",
        ],
    ));
    let diffs = doc["differences"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "{doc}");
    assert_eq!(diffs[0]["key"], "numerics.index_k_dtype");
    assert_eq!(diffs[0]["a"]["value"], "fp8");
    assert_eq!(diffs[0]["b"]["value"], "bf16");
    assert_eq!(diffs[0]["b"]["source"], "embedded:prod-bf16.toml:14");
    assert_eq!(doc["files_b"][0], "embedded:prod-fp8.toml");

    let same = ok(dsv4(
        dir.path(),
        &["profile", "diff", "reference", "reference"],
    ));
    assert_eq!(same, "reference and reference: no differences\n");
}

#[test]
fn show_and_explain_display_an_invalid_profile_then_fail() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "profile",
        "show",
        "prod-fp8",
        "--set",
        "exec.cuda_graph=false",
    ];
    let out = run(dsv4(dir.path(), &args));
    assert!(!out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(has_row(&stdout, "exec.cuda_graph", "false"), "{stdout}");
    assert!(
        stdout.contains("errors (1):\n  - [overlap-needs-graphs]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("exec.cuda_graph = false  (--set exec.cuda_graph=false)"),
        "{stdout}"
    );
    assert!(stdout.contains("exec.multi_stream_overlap = true  (embedded:prod-fp8.toml:"));
    assert!(
        stderr.contains("profile `prod-fp8` is invalid: 1 validation error"),
        "{stderr}"
    );

    let mut json_args = args.to_vec();
    json_args[1] = "explain";
    json_args.push("--json");
    let out = run(dsv4(dir.path(), &json_args));
    assert!(!out.status.success());
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["findings"][0]["severity"], "error");
    assert_eq!(
        doc["findings"][0]["keys"],
        serde_json::json!([
            "exec.multi_stream_overlap",
            "exec.cuda_graph",
            "backend.kind"
        ])
    );
}

#[test]
fn running_commands_stop_on_errors_and_print_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dsv4(
        dir.path(),
        &[
            "--profile",
            "reference",
            "generate",
            "--prompt",
            "hi",
            "--set",
            "exec.multi_stream_overlap=true",
        ],
    ));
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("[streams-unsupported]"), "{e}");
    assert!(
        e.contains("exec.multi_stream_overlap = true  (--set"),
        "{e}"
    );
    assert!(
        e.contains("backend.kind = reference  (embedded:reference.toml:"),
        "{e}"
    );

    let config =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dsv4-model/tests/data/flash-config.json");
    let out = run(dsv4(
        dir.path(),
        &[
            "model",
            "inspect",
            "--config",
            config.to_str().unwrap(),
            "--set",
            "server.host=0.0.0.0",
        ],
    ));
    assert!(out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("warning: [open-without-api-key]"), "{e}");
}

#[test]
fn secrets_never_reach_show_explain_or_diff() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["profile", "show", "--json"],
        vec!["profile", "explain"],
        vec!["profile", "diff", "dev-cpu", "reference"],
    ] {
        let mut cmd = dsv4(dir.path(), &args);
        cmd.args(["--set", "server.api_key=hunter2"]);
        let out = ok(cmd);
        assert!(!out.contains("hunter2"), "{args:?}: {out}");
    }
    let mut cmd = dsv4(dir.path(), &["profile", "show"]);
    cmd.env("DSV4_SERVER__API_KEY", "hunter2");
    let out = ok(cmd);
    assert!(has_row(&out, "server.api_key", "<redacted>"), "{out}");
}

/// Whether `profile show` output has a row for `key` with `value` (columns are padded to the
/// longest key).
fn has_row(out: &str, key: &str, value: &str) -> bool {
    out.lines().any(|l| {
        let mut words = l.split_whitespace();
        words.next() == Some(key) && words.next() == Some(value)
    })
}

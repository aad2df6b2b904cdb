//! `dsv4 profile explain` names the validated ledger record that justifies a value.

use std::path::Path;
use std::process::Command;

fn dsv4(cwd: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .current_dir(cwd)
        .args(args)
        .output()
        .unwrap()
}

/// A repository with one committed profile (multi-stream overlap on) and an evidence file.
fn repo(dir: &Path) {
    let repo = git2::Repository::init(dir).unwrap();
    let mut cfg = repo.config().unwrap();
    cfg.set_str("user.name", "Tess Ter").unwrap();
    cfg.set_str("user.email", "tess@example.com").unwrap();
    std::fs::create_dir_all(dir.join("profiles")).unwrap();
    let profile = "[backend]\nkind = \"cpu\"\n\n[exec]\nmulti_stream_overlap = true\n";
    std::fs::write(dir.join("profiles/p.toml"), profile).unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(Path::new("profiles/p.toml")).unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("Tess Ter", "tess@example.com").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "init", &tree, &[])
        .unwrap();
    std::fs::write(
        dir.join("ab.log"),
        "overlap on: 12/80 corrupted; off: 0/80\n",
    )
    .unwrap();
}

fn ledger_of(explain_json: &[u8], key: &str) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_slice(explain_json).unwrap();
    let s = doc["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .unwrap()
        .clone();
    s["ledger"].as_str().map(str::to_string)
}

#[test]
fn explain_shows_the_record_that_justifies_a_value() {
    let dir = tempfile::tempdir().unwrap();
    repo(dir.path());
    let before = dsv4(
        dir.path(),
        &["--profile", "p", "profile", "explain", "p", "--json"],
    );
    assert!(
        before.status.success(),
        "{}",
        String::from_utf8_lossy(&before.stderr)
    );
    assert_eq!(ledger_of(&before.stdout, "exec.multi_stream_overlap"), None);

    let rec = dsv4(
        dir.path(),
        &[
            "--profile",
            "p",
            "--set",
            "exec.multi_stream_overlap=false",
            "ledger",
            "record",
            "--incident",
            "inc",
            "--status",
            "validated",
            "--title",
            "Overlap off",
            "--from",
            "true",
            "--evidence",
            "ab.log",
        ],
    );
    assert!(
        rec.status.success(),
        "{}",
        String::from_utf8_lossy(&rec.stderr)
    );

    let after = dsv4(
        dir.path(),
        &["--profile", "p", "profile", "explain", "p", "--json"],
    );
    assert!(
        after.status.success(),
        "{}",
        String::from_utf8_lossy(&after.stderr)
    );
    let justified =
        ledger_of(&after.stdout, "exec.multi_stream_overlap").expect("a justifying record");
    assert!(justified.ends_with(": Overlap off"), "{justified}");
    // Keys no record touched stay unjustified.
    assert_eq!(ledger_of(&after.stdout, "backend.kind"), None);
    let text = dsv4(dir.path(), &["--profile", "p", "profile", "explain", "p"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("    ledger: {justified}")), "{text}");
}

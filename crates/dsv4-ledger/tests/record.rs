//! `record`: one commit with the right tree and trailers; the user's index and working tree
//! survive; every refusal writes nothing.

mod common;

use common::{Fixture, PROFILE};
use dsv4_ledger::{LedgerError, Status, record};
use std::path::Path;

#[test]
fn record_makes_one_commit_with_exactly_the_ledger_files() {
    let fx = Fixture::new();
    let before = fx.head();
    let out = record(&fx.root, &fx.request()).unwrap();
    let repo = fx.repo();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    assert_eq!(head.id().to_string(), out.commit);
    assert_eq!(head.parent_count(), 1);
    assert_eq!(head.parent_id(0).unwrap(), before);

    // The tree differs from the parent's by exactly the ledger's files.
    let diff = repo
        .diff_tree_to_tree(
            Some(&head.parent(0).unwrap().tree().unwrap()),
            Some(&head.tree().unwrap()),
            None,
        )
        .unwrap();
    let mut changed: Vec<String> = diff
        .deltas()
        .map(|d| d.new_file().path().unwrap().display().to_string())
        .collect();
    changed.sort();
    let id = &out.record.id;
    let mut expected = vec![
        "docs/incidents/overlap-corruption.md".to_string(),
        format!("ledger/entries/{id}.toml"),
        format!("ledger/evidence/{id}/ab.json"),
        "profiles/prod.toml".to_string(),
    ];
    expected.sort();
    assert_eq!(changed, expected);

    // The profile edit kept comments and layout.
    let profile = std::fs::read_to_string(fx.root.join("profiles/prod.toml")).unwrap();
    assert_eq!(
        profile,
        PROFILE.replace(
            "multi_stream_overlap = true",
            "multi_stream_overlap = false"
        )
    );

    // Subject and trailers.
    let msg = head.message().unwrap();
    assert!(
        msg.starts_with("ledger(prod): exec.multi_stream_overlap true→false [validated]\n"),
        "{msg}"
    );
    let trailers = dsv4_ledger::commit::trailers(msg);
    let get = |k: &str| {
        trailers
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("Ledger-Id").as_deref(), Some(id.as_str()));
    assert_eq!(get("Incident").as_deref(), Some("overlap-corruption"));
    assert_eq!(get("Profile").as_deref(), Some("prod"));
    assert_eq!(
        get("Change").as_deref(),
        Some("exec.multi_stream_overlap true→false")
    );
    assert_eq!(get("Status").as_deref(), Some("validated"));
    assert!(get("Evidence").unwrap().contains("sha256:"));
    assert!(
        msg.contains("overlap=true 12/200 (6.0% [3.5%, 10.2%])"),
        "{msg}"
    );

    // The record lifted the A/B numbers; the working tree is clean afterwards.
    let rec = &out.record;
    assert_eq!(rec.evidence[0].ab.as_ref().unwrap().b.failures, 0);
    let statuses = repo.statuses(None).unwrap();
    assert_eq!(
        statuses.iter().filter(|s| !s.status().is_ignored()).count(),
        0
    );
    assert!(dsv4_ledger::verify(&fx.root).unwrap().ok(false));
}

#[test]
fn user_staged_and_unstaged_changes_survive() {
    let fx = Fixture::new();
    let repo = fx.repo();
    std::fs::write(fx.root.join("notes.txt"), "staged edit\n").unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(Path::new("notes.txt")).unwrap();
    index.write().unwrap();
    std::fs::write(fx.root.join("other.txt"), "unstaged edit\n").unwrap();
    std::fs::write(fx.root.join("untracked.txt"), "new\n").unwrap();
    let staged_blob = index.get_path(Path::new("notes.txt"), 0).unwrap().id;

    let out = record(&fx.root, &fx.request()).unwrap();

    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let tree = head.tree().unwrap();
    // The commit did not pick up the user's edits...
    let notes = repo
        .find_blob(tree.get_path(Path::new("notes.txt")).unwrap().id())
        .unwrap();
    assert_eq!(notes.content(), b"notes\n");
    assert!(tree.get_path(Path::new("untracked.txt")).is_err());
    // ...and they are all still there, staged and unstaged as before.
    let mut index = repo.index().unwrap();
    index.read(true).unwrap();
    assert_eq!(
        index.get_path(Path::new("notes.txt"), 0).unwrap().id,
        staged_blob
    );
    assert_eq!(
        std::fs::read_to_string(fx.root.join("notes.txt")).unwrap(),
        "staged edit\n"
    );
    assert_eq!(
        std::fs::read_to_string(fx.root.join("other.txt")).unwrap(),
        "unstaged edit\n"
    );
    assert_eq!(
        std::fs::read_to_string(fx.root.join("untracked.txt")).unwrap(),
        "new\n"
    );
    let st = |p: &str| repo.status_file(Path::new(p)).unwrap();
    assert_eq!(st("notes.txt"), git2::Status::INDEX_MODIFIED);
    assert_eq!(st("other.txt"), git2::Status::WT_MODIFIED);
    assert_eq!(st("untracked.txt"), git2::Status::WT_NEW);
    for f in &out.files {
        assert!(st(f).is_empty(), "{f} is not clean: {:?}", st(f));
    }
}

/// Run a request that must be refused; nothing in the working tree, index or HEAD may change.
fn refused(fx: &Fixture, req: &dsv4_ledger::RecordRequest) -> LedgerError {
    let before = fx.snapshot();
    let head = fx.repo().head().ok().and_then(|h| h.target());
    let index = std::fs::read(fx.root.join(".git/index")).ok();
    let err = record(&fx.root, req).unwrap_err();
    assert_eq!(
        fx.snapshot(),
        before,
        "the working tree changed after: {err}"
    );
    assert_eq!(fx.repo().head().ok().and_then(|h| h.target()), head);
    assert_eq!(std::fs::read(fx.root.join(".git/index")).ok(), index);
    err
}

#[test]
fn refusals_write_nothing() {
    let fx = Fixture::new();

    let mut req = fx.request();
    req.from = Some("false".into());
    let err = refused(&fx, &req);
    assert!(matches!(err, LedgerError::WrongFrom { .. }), "{err}");
    assert!(err.to_string().contains("is true (from"), "{err}");

    let mut req = fx.request();
    req.evidence = vec![fx.root.join("missing.json").display().to_string()];
    assert!(refused(&fx, &req).to_string().contains("missing.json"));

    // A directory, and a file over the size limit (sparse: nothing is really written).
    let mut req = fx.request();
    req.evidence = vec![fx.root.join("profiles").display().to_string()];
    assert!(
        refused(&fx, &req)
            .to_string()
            .contains("not a regular file")
    );
    let big = tempfile::NamedTempFile::new().unwrap();
    big.as_file()
        .set_len(dsv4_ledger::MAX_EVIDENCE_BYTES + 1)
        .unwrap();
    let mut req = fx.request();
    req.evidence = vec![big.path().display().to_string()];
    assert!(refused(&fx, &req).to_string().contains("at most 64 MiB"));

    let mut req = fx.request();
    req.evidence = vec![format!("{}@sha256:{}", fx.bundle.display(), "0".repeat(64))];
    assert!(refused(&fx, &req).to_string().contains("sha256 is"));

    let mut req = fx.request();
    req.evidence.clear();
    assert!(refused(&fx, &req).to_string().contains("needs --evidence"));

    let mut req = fx.request();
    req.set = Some("exec.multi_stream_overlap=maybe".into());
    refused(&fx, &req);

    let mut req = fx.request();
    req.set = Some("exec.no_such_key=1".into());
    refused(&fx, &req);

    for title in ["", "two\nlines", "carriage\rreturn"] {
        let mut req = fx.request();
        req.title = title.into();
        assert!(
            refused(&fx, &req)
                .to_string()
                .contains("one non-empty line")
        );
    }
    let mut req = fx.request();
    req.title = "x".repeat(dsv4_ledger::MAX_TITLE_CHARS + 1);
    assert!(refused(&fx, &req).to_string().contains("keep it to 200"));

    let mut req = fx.request();
    req.supersedes = vec!["20990101T000000Z-000000000000".into()];
    assert!(matches!(refused(&fx, &req), LedgerError::UnknownId(_)));

    // An uncommitted edit of the profile itself.
    std::fs::write(
        fx.root.join("profiles/prod.toml"),
        format!("{PROFILE}# local\n"),
    )
    .unwrap();
    assert!(
        refused(&fx, &fx.request())
            .to_string()
            .contains("uncommitted")
    );
    std::fs::write(fx.root.join("profiles/prod.toml"), PROFILE).unwrap();

    // Detached HEAD, unless allowed.
    let repo = fx.repo();
    let head = fx.head();
    repo.set_head_detached(head).unwrap();
    assert!(matches!(refused(&fx, &fx.request()), LedgerError::Head(_)));
    let mut req = fx.request();
    req.allow_detached = true;
    record(&fx.root, &req).unwrap();
    assert_ne!(fx.head(), head);
}

#[test]
fn unborn_head_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    git2::Repository::init(dir.path()).unwrap();
    let fx_req = dsv4_ledger::RecordRequest {
        profile: None,
        set: None,
        from: None,
        evidence: Vec::new(),
        incident: "x".into(),
        status: Status::Proposed,
        title: "t".into(),
        hypothesis: String::new(),
        supersedes: Vec::new(),
        allow_detached: false,
        date: None,
    };
    let err = record(dir.path(), &fx_req).unwrap_err();
    assert!(matches!(err, LedgerError::Head(_)), "{err}");
    assert!(
        std::fs::read_dir(dir.path())
            .unwrap()
            .all(|e| e.unwrap().file_name() == ".git")
    );
}

#[test]
fn evidence_hash_check_accepts_the_right_hash_and_refuses_duplicates() {
    let fx = Fixture::new();
    let sum = dsv4_ledger::evidence::sha256(&std::fs::read(&fx.bundle).unwrap());
    let mut req = fx.request();
    req.evidence = vec![
        fx.bundle.display().to_string(),
        fx.bundle.display().to_string(),
    ];
    assert!(
        refused(&fx, &req)
            .to_string()
            .contains("two evidence files")
    );
    let mut req = fx.request();
    req.set = Some("exec.multi_stream_overlap=false".into());
    req.profile = None;
    assert!(
        refused(&fx, &req)
            .to_string()
            .contains("--set needs --profile")
    );
    let mut req = fx.request();
    req.evidence = vec![format!("{}@sha256:{sum}", fx.bundle.display())];
    let out = record(&fx.root, &req).unwrap();
    assert_eq!(out.record.evidence[0].sha256, sum);
}

#[test]
fn unborn_head_records_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init(dir.path()).unwrap();
    let mut cfg = repo.config().unwrap();
    cfg.set_str("user.name", "Tess Ter").unwrap();
    cfg.set_str("user.email", "tess@example.com").unwrap();
    let req = dsv4_ledger::RecordRequest {
        profile: None,
        set: None,
        from: None,
        evidence: Vec::new(),
        incident: "first".into(),
        status: Status::Proposed,
        title: "A first hunch".into(),
        hypothesis: "the cache is too small".into(),
        supersedes: Vec::new(),
        allow_detached: true,
        date: Some("2026-11-29T19:00:00Z".into()),
    };
    let out = record(dir.path(), &req).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    assert_eq!(head.parent_count(), 0);
    assert_eq!(head.id().to_string(), out.commit);
    assert_eq!(out.record.kind, dsv4_ledger::Kind::Hypothesis);
    assert!(
        head.message()
            .unwrap()
            .starts_with("ledger(first): A first hunch [proposed]\n")
    );
    assert_eq!(head.tree().unwrap().len(), 2, "ledger/ and docs/ only");
}

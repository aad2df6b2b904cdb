//! `verify` catches tampered evidence, dangling and cyclic supersedes links, trailer mismatches,
//! stale rendered documents and hand-edited profile values; rendering shows falsified hypotheses.

mod common;

use common::Fixture;
use dsv4_ledger::{Ledger, Status, record, render_all, verify};
use git2::Signature;
use std::path::Path;

fn checks(fx: &Fixture) -> Vec<&'static str> {
    verify(&fx.root)
        .unwrap()
        .problems
        .iter()
        .map(|p| p.check)
        .collect()
}

#[test]
fn clean_ledger_verifies() {
    let fx = Fixture::new();
    record(&fx.root, &fx.request()).unwrap();
    let report = verify(&fx.root).unwrap();
    assert_eq!(report.records, 1);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn tampered_evidence_is_caught() {
    let fx = Fixture::new();
    let out = record(&fx.root, &fx.request()).unwrap();
    let path = fx.root.join(&out.record.evidence[0].path);
    std::fs::write(&path, b"{}").unwrap();
    assert_eq!(checks(&fx), vec!["evidence"]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(checks(&fx), vec!["evidence"]);
}

#[test]
fn dangling_and_cyclic_supersedes_are_caught() {
    let fx = Fixture::new();
    let a = record(&fx.root, &fx.request()).unwrap().record;
    let entry = fx.root.join(format!("ledger/entries/{}.toml", a.id));
    let text = std::fs::read_to_string(&entry).unwrap();
    let dangling = text.replace(
        "supersedes = []",
        "supersedes = [\"20990101T000000Z-000000000000\"]",
    );
    assert_ne!(dangling, text);
    std::fs::write(&entry, dangling).unwrap();
    let found = verify(&fx.root).unwrap().problems;
    assert!(
        found
            .iter()
            .any(|p| p.check == "supersedes" && p.message.contains("does not exist")),
        "{found:?}"
    );

    // B supersedes A, then A is edited to supersede B: a cycle.
    std::fs::write(&entry, &text).unwrap();
    let mut req = fx.request();
    req.set = None;
    req.status = Status::Falsified;
    req.supersedes = vec![a.id.clone()];
    req.date = Some("2026-11-29T20:00:00Z".into());
    let b = record(&fx.root, &req).unwrap().record;
    assert!(verify(&fx.root).unwrap().problems.is_empty());
    let cyclic = text.replace("supersedes = []", &format!("supersedes = [\"{}\"]", b.id));
    std::fs::write(&entry, cyclic).unwrap();
    let found = verify(&fx.root).unwrap().problems;
    assert!(
        found.iter().any(|p| p.message.contains("cycle")),
        "{found:?}"
    );
    // The edited record no longer matches its commit's trailers either.
    assert!(found.iter().any(|p| p.check == "trailers"), "{found:?}");
}

#[test]
fn stale_rendered_doc_is_caught_and_render_fixes_it() {
    let fx = Fixture::new();
    record(&fx.root, &fx.request()).unwrap();
    let doc = fx.root.join("docs/incidents/overlap-corruption.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    std::fs::write(&doc, format!("{text}hand edit\n")).unwrap();
    assert_eq!(checks(&fx), vec!["render"]);
    let ledger = Ledger::load(&fx.root).unwrap();
    for (path, text) in render_all(&ledger).unwrap() {
        std::fs::write(fx.root.join(path), text).unwrap();
    }
    assert!(checks(&fx).is_empty());
    assert_eq!(std::fs::read_to_string(&doc).unwrap(), text);
}

#[test]
fn hand_edited_profile_value_is_unjustified() {
    let fx = Fixture::new();
    record(&fx.root, &fx.request()).unwrap();
    let mut req = fx.request();
    req.set = Some("exec.cuda_graph_max_bs=64".into());
    req.from = None;
    req.date = Some("2026-11-29T19:40:00Z".into());
    record(&fx.root, &req).unwrap();
    let unjustified = |fx: &Fixture| -> Vec<String> {
        verify(&fx.root)
            .unwrap()
            .unjustified
            .into_iter()
            .map(|p| p.message)
            .collect()
    };
    let before = unjustified(&fx);
    assert!(
        !before.iter().any(|m| m.contains("cuda_graph_max_bs")),
        "{before:?}"
    );
    assert!(
        !before.iter().any(|m| m.contains("multi_stream_overlap")),
        "{before:?}"
    );

    // Edit a value by hand and commit it without the ledger.
    let path = fx.root.join("profiles/prod.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("[exec]\n", "[exec]\noverlap_schedule = true\n"),
    )
    .unwrap();
    let repo = fx.repo();
    let mut index = repo.index().unwrap();
    index.add_path(Path::new("profiles/prod.toml")).unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = Signature::now("Tess Ter", "tess@example.com").unwrap();
    let parent = repo.head().unwrap().peel_to_commit().unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "quick fix", &tree, &[&parent])
        .unwrap();

    let after = unjustified(&fx);
    assert!(
        after
            .iter()
            .any(|m| m.contains("exec.overlap_schedule = true")),
        "{after:?}"
    );
    let report = verify(&fx.root).unwrap();
    assert!(report.ok(false));
    assert!(!report.ok(true));
}

#[test]
fn falsified_hypothesis_is_struck_through_with_its_evidence() {
    let fx = Fixture::new();
    let mut req = fx.request();
    req.set = None;
    req.status = Status::Proposed;
    req.evidence.clear();
    req.title = "Suspect the fp8 indexer".into();
    req.hypothesis = "fp8 index keys lose recall".into();
    req.date = Some("2026-11-29T19:00:00Z".into());
    let h = record(&fx.root, &req).unwrap().record;

    let mut req = fx.request();
    req.set = None;
    req.status = Status::Falsified;
    req.title = "bf16 index keys do not help".into();
    req.hypothesis = String::new();
    req.supersedes = vec![h.id[..20].to_string()];
    req.date = Some("2026-11-29T19:10:00Z".into());
    let f = record(&fx.root, &req).unwrap().record;
    assert_eq!(f.supersedes, vec![h.id.clone()]);

    record(&fx.root, &fx.request()).unwrap();
    let doc =
        std::fs::read_to_string(fx.root.join("docs/incidents/overlap-corruption.md")).unwrap();
    assert!(doc.contains("**Status:** mitigated"), "{doc}");
    assert!(
        doc.contains("~~fp8 index keys lose recall~~ — falsified by"),
        "{doc}"
    );
    assert!(doc.contains(&format!("superseded by `{}`", f.id)), "{doc}");
    assert!(doc.contains("overlap=true: 12/200 [3.5%, 10.2%]"), "{doc}");
    assert!(
        doc.contains("dsv4 ab --profile prod --set exec.multi_stream_overlap=false"),
        "{doc}"
    );
    assert!(doc.contains("Side-stream buffers alias"), "{doc}");
    assert!(verify(&fx.root).unwrap().problems.is_empty());
}

#[test]
fn a_broken_template_is_an_error_not_a_panic() {
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.root.join("ledger/templates")).unwrap();
    std::fs::write(
        fx.root.join("ledger/templates/incident.md.j2"),
        "{{ no_such_field }}\n",
    )
    .unwrap();
    let before = fx.head();
    let files = fx.snapshot();
    let err = record(&fx.root, &fx.request()).unwrap_err();
    assert_eq!(fx.snapshot(), files);
    assert!(
        err.to_string().contains("no_such_field") || err.to_string().contains("undefined"),
        "{err}"
    );
    assert_eq!(fx.head(), before);
}

#[test]
fn edited_and_unparsable_records_are_caught() {
    let fx = Fixture::new();
    let a = record(&fx.root, &fx.request()).unwrap().record;
    let entry = fx.root.join(format!("ledger/entries/{}.toml", a.id));
    let text = std::fs::read_to_string(&entry).unwrap();
    let edited = text.replace("Turn off multi-stream overlap", "Something else");
    assert_ne!(edited, text);
    std::fs::write(&entry, edited).unwrap();
    let found = verify(&fx.root).unwrap().problems;
    assert!(
        found
            .iter()
            .any(|p| p.check == "record" && p.message.contains("edited")),
        "{found:?}"
    );
    std::fs::write(&entry, "id = 3\n").unwrap();
    let found = verify(&fx.root).unwrap().problems;
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].message.contains("not a ledger record"),
        "{found:?}"
    );
}

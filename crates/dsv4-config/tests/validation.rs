//! Typed layering of the bool, float and list kinds; validation through resolution (errors name
//! every key with value and source; warnings are carried); the "why" comments of profile files.

use dsv4_config::{
    CanaryPool, ConfigError, Fault, Profile, ProfileSearch, ResolveOptions, Severity,
};
use std::path::Path;

fn opts(dir: &Path, profile: &str) -> ResolveOptions {
    ResolveOptions {
        profile: profile.to_string(),
        search: ProfileSearch {
            profile_dir: Some(dir.to_path_buf()),
            local_dir: None,
            embedded: true,
        },
        env: Vec::new(),
        sets: Vec::new(),
    }
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn bool_float_and_list_values_layer_with_provenance() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "p.toml",
        "[cache]\nhicache = true\nhicache_ratio = 3\n\n[debug]\ninject = [\n  \"skip-index-k-transfer-wait\",\n]\n",
    );
    let r = Profile::resolve(&opts(dir.path(), "p")).unwrap();
    assert!(r.profile.cache.hicache);
    assert_eq!(r.profile.cache.hicache_ratio, 3.0);
    assert_eq!(r.profile.debug.inject, [Fault::SkipIndexKTransferWait]);
    let inject = r.setting("debug.inject").unwrap();
    assert_eq!(inject.value_text(), "[skip-index-k-transfer-wait]");
    assert!(
        inject.origin.to_string().ends_with("p.toml:6"),
        "{}",
        inject.origin
    );

    let mut o = opts(dir.path(), "p");
    o.env = vec![("DSV4_CACHE__HICACHE_RATIO".into(), "1.5".into())];
    o.sets = vec![
        "debug.inject=".into(),
        "exec.cuda_graph=true".into(),
        "exec.cuda_graph=false".into(),
    ];
    let r = Profile::resolve(&o).unwrap();
    assert_eq!(r.profile.cache.hicache_ratio, 1.5);
    assert_eq!(
        r.setting("cache.hicache_ratio").unwrap().origin.to_string(),
        "env DSV4_CACHE__HICACHE_RATIO"
    );
    assert!(r.profile.debug.inject.is_empty());
    assert!(!r.profile.exec.cuda_graph);
    assert_eq!(
        r.setting("exec.cuda_graph").unwrap().origin.to_string(),
        "--set exec.cuda_graph=false"
    );
}

#[test]
fn bad_typed_values_name_key_value_and_allowed_values() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ok.toml", "");
    for (set, expected) in [
        ("exec.cuda_graph=yes", "true or false"),
        ("cache.hicache_ratio=0", "a number greater than 0"),
        ("server.port=0", "an integer from 1 to 65535"),
        ("debug.inject=crash", "arena-ignores-streams"),
        ("scheduler.schedule_policy=lifo", "one of: fcfs, lpm"),
    ] {
        let mut o = opts(dir.path(), "ok");
        o.sets = vec![set.into()];
        let e = Profile::resolve(&o).unwrap_err().to_string();
        let (key, value) = set.split_once('=').unwrap();
        assert!(e.contains(&format!("`{key}`")), "{e}");
        assert!(e.contains(&format!("`{value}`")), "{e}");
        assert!(e.contains(expected), "{e}");
    }
    write(dir.path(), "b.toml", "[exec]\ncuda_graph = \"true\"\n");
    let e = Profile::resolve(&opts(dir.path(), "b"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("b.toml:2") && e.contains("true or false"), "{e}");
}

#[test]
fn validation_errors_name_both_keys_with_values_and_sources() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "gpu.toml",
        "extends = \"prod-fp8\"\n[exec]\ncuda_graph = false\n",
    );
    let err = Profile::resolve(&opts(dir.path(), "gpu")).unwrap_err();
    assert!(
        matches!(err, ConfigError::Invalid { count: 1, .. }),
        "{err}"
    );
    let e = err.to_string();
    assert!(e.contains("[overlap-needs-graphs]"), "{e}");
    assert!(
        e.contains("exec.multi_stream_overlap = true  (embedded:prod-fp8.toml:"),
        "{e}"
    );
    assert!(e.contains("exec.cuda_graph = false  ("), "{e}");
    assert!(e.contains("gpu.toml:3)"), "{e}");

    // assemble keeps the error as a finding instead of failing
    let r = dsv4_config::assemble(&opts(dir.path(), "gpu")).unwrap();
    assert_eq!(r.findings_of(Severity::Error).count(), 1);

    // two problems at once are both listed
    let mut o = opts(dir.path(), "reference");
    o.sets = vec![
        "cache.hicache=true".into(),
        "cache.prefix_cache=false".into(),
        "cache.page_size=48".into(),
    ];
    let e = Profile::resolve(&o).unwrap_err().to_string();
    assert!(e.contains("2 problem(s)"), "{e}");
    assert!(e.contains("--set cache.prefix_cache=false"), "{e}");
    assert!(
        e.contains("[page-size-power-of-two]") && e.contains("--set cache.page_size=48"),
        "{e}"
    );
}

#[test]
fn warnings_are_carried_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(dir.path(), "dev-cpu");
    o.sets = vec!["server.host=0.0.0.0".into()];
    let r = Profile::resolve(&o).unwrap();
    let rules: Vec<&str> = r.findings.iter().map(|f| f.rule).collect();
    assert_eq!(rules, ["open-without-api-key"]);
    let described = r.describe(&r.findings[0]);
    assert!(
        described.contains("server.host = 0.0.0.0  (--set server.host=0.0.0.0)"),
        "{described}"
    );
    assert!(
        described.contains("server.api_key = (unset)  (default)"),
        "{described}"
    );
}

#[test]
fn comments_next_to_keys_become_their_why() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "why.toml",
        "# Purpose line.\n#\n# More.\n\n[exec]\n# Measured on 2 cores:\nthreads = 2 # see ledger 12\n",
    );
    let r = Profile::resolve(&opts(dir.path(), "why")).unwrap();
    assert_eq!(r.description, "Purpose line.\n\nMore.");
    let s = r.setting("exec.threads").unwrap();
    assert_eq!(
        s.comment.as_deref(),
        Some("Measured on 2 cores: see ledger 12")
    );
    assert_eq!(r.setting("model.path").unwrap().comment, None);
}

#[test]
fn faults_are_refused_in_production_profiles_and_their_children() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "mine.toml", "extends = \"prod-bf16\"\n");
    for profile in ["prod-bf16", "prod-fp8", "mine"] {
        let mut o = opts(dir.path(), profile);
        o.sets = vec!["debug.inject=arena-ignores-streams".into()];
        let e = Profile::resolve(&o).unwrap_err().to_string();
        assert!(e.contains("[faults-in-production]"), "{profile}: {e}");
        assert!(e.contains("is in its chain prod-fp8"), "{profile}: {e}");
        // Without the fault the same profile resolves.
        assert!(
            Profile::resolve(&opts(dir.path(), profile)).is_ok(),
            "{profile}"
        );
    }
    let mut o = opts(dir.path(), "rehearsal");
    o.sets = vec!["debug.inject=arena-ignores-streams".into()];
    let r = Profile::resolve(&o).unwrap();
    assert_eq!(r.profile.debug.inject, [Fault::ArenaIgnoresStreams]);
}

#[test]
fn the_canary_is_a_list_of_pools() {
    let dir = tempfile::tempdir().unwrap();
    let r = Profile::resolve(&opts(dir.path(), "rehearsal")).unwrap();
    assert_eq!(
        r.profile.debug.canary,
        [CanaryPool::IndexK, CanaryPool::Kv, CanaryPool::State]
    );
    let mut o = opts(dir.path(), "dev-cpu");
    o.sets = vec!["debug.canary=true".into()];
    let e = Profile::resolve(&o).unwrap_err().to_string();
    assert!(e.contains("index_k"), "{e}");
    o.sets = vec!["debug.canary=index_k".into()];
    assert_eq!(
        Profile::resolve(&o).unwrap().profile.debug.canary,
        [CanaryPool::IndexK]
    );
}

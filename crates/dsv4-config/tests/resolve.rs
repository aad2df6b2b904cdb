//! Layering, provenance, `extends` chains and error messages of profile resolution, on temporary
//! profile directories (no test touches the process environment).

use dsv4_config::catalog::EMBEDDED_PROFILES;
use dsv4_config::{ConfigError, Origin, Profile, ProfileSearch, ResolveOptions, Resolved};
use std::path::Path;

/// A search over one temporary directory only (no ./profiles, no embedded profiles).
fn only_dir(dir: &Path) -> ProfileSearch {
    ProfileSearch {
        profile_dir: Some(dir.to_path_buf()),
        local_dir: None,
        embedded: false,
    }
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

fn opts(dir: &Path, profile: &str) -> ResolveOptions {
    ResolveOptions {
        profile: profile.to_string(),
        search: only_dir(dir),
        env: Vec::new(),
        sets: Vec::new(),
    }
}

fn resolve(o: &ResolveOptions) -> Resolved {
    Profile::resolve(o).unwrap_or_else(|e| panic!("resolve failed: {e}"))
}

fn err(o: &ResolveOptions) -> String {
    match Profile::resolve(o) {
        Ok(r) => panic!("expected an error, got {:?}", r.profile),
        Err(e) => e.to_string(),
    }
}

fn origin(r: &Resolved, key: &str) -> String {
    r.setting(key).unwrap().origin.to_string()
}

const BASE: &str = "# base\n[numerics]\nkv_cache_dtype = \"fp8\"\nindex_k_dtype = \"fp8\"\n\
                    act_quant = \"fp8\"\n\n[exec]\nthreads = 2\n";

#[test]
fn each_layer_overrides_the_one_below_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.toml", BASE);
    let mut o = opts(dir.path(), "base");
    o.env = vec![
        ("DSV4_NUMERICS__INDEX_K_DTYPE".into(), "fp4".into()),
        ("DSV4_NUMERICS__ACT_QUANT".into(), "none".into()),
        ("DSV4_LOG".into(), "debug".into()),
        ("PATH".into(), "/bin".into()),
    ];
    o.sets = vec!["numerics.act_quant=fp8".into(), "exec.threads=3".into()];
    let r = resolve(&o);
    let file = dir.path().join("base.toml").display().to_string();

    // default: untouched by any layer
    assert_eq!(r.profile.model.seed, 0);
    assert_eq!(r.setting("model.seed").unwrap().origin, Origin::Default);
    // file over default, with the line of the key
    assert_eq!(r.profile.numerics.kv_cache_dtype.to_string(), "fp8");
    assert_eq!(
        r.setting("numerics.kv_cache_dtype").unwrap().origin,
        Origin::File {
            file: file.clone(),
            line: Some(3)
        }
    );
    // env over file
    assert_eq!(r.profile.numerics.index_k_dtype.to_string(), "fp4");
    assert_eq!(
        origin(&r, "numerics.index_k_dtype"),
        "env DSV4_NUMERICS__INDEX_K_DTYPE"
    );
    // --set over env over file
    assert_eq!(r.profile.numerics.act_quant.to_string(), "fp8");
    assert_eq!(
        origin(&r, "numerics.act_quant"),
        "--set numerics.act_quant=fp8"
    );
    assert_eq!(r.profile.exec.threads, 3);
    assert_eq!(origin(&r, "exec.threads"), "--set exec.threads=3");
    assert_eq!(r.files, [file]);
}

#[test]
fn later_set_wins_and_empty_unsets_an_optional_key() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "gpu.toml",
        "[backend]\nkind = \"cuda-sm120\"\ndevice = \"1\"\n",
    );
    let mut o = opts(dir.path(), "gpu");
    assert_eq!(resolve(&o).profile.backend.device.as_deref(), Some("1"));
    o.sets = vec!["backend.device=0".into(), "backend.device=".into()];
    let r = resolve(&o);
    assert_eq!(r.profile.backend.device, None);
    assert_eq!(r.setting("backend.device").unwrap().value_text(), "(unset)");
    assert_eq!(origin(&r, "backend.device"), "--set backend.device=");
}

#[test]
fn extends_chain_applies_base_first() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.toml", BASE);
    write(
        dir.path(),
        "mid.toml",
        "extends = \"base\"\n[numerics]\nindex_k_dtype = \"bf16\"\n",
    );
    write(
        dir.path(),
        "top.toml",
        "# top\nextends = \"mid.toml\"\n\n[exec]\nthreads = 8\n",
    );
    let r = resolve(&opts(dir.path(), "top"));
    let names: Vec<String> = r
        .files
        .iter()
        .map(|f| {
            Path::new(f)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(names, ["base.toml", "mid.toml", "top.toml"]);
    assert_eq!(r.profile.exec.threads, 8);
    assert!(origin(&r, "exec.threads").ends_with("top.toml:5"));
    assert_eq!(r.profile.numerics.index_k_dtype.to_string(), "bf16");
    assert!(origin(&r, "numerics.index_k_dtype").ends_with("mid.toml:3"));
    assert_eq!(r.profile.numerics.kv_cache_dtype.to_string(), "fp8");
    assert!(origin(&r, "numerics.kv_cache_dtype").ends_with("base.toml:3"));
}

#[test]
fn extends_cycles_are_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.toml", "extends = \"b\"\n");
    write(dir.path(), "b.toml", "extends = \"a\"\n");
    write(dir.path(), "self.toml", "extends = \"self.toml\"\n");
    let e = err(&opts(dir.path(), "a"));
    assert!(e.contains("cycle: a -> b -> a"), "{e}");
    let e = err(&opts(dir.path(), "self"));
    assert!(e.contains("cycle: self -> self.toml"), "{e}");
    write(dir.path(), "num.toml", "extends = 3\n");
    let e = err(&opts(dir.path(), "num"));
    assert!(e.contains("`extends` must be a profile name"), "{e}");
}

#[test]
fn unknown_keys_name_their_origin_and_suggest() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "typo.toml",
        "[numerics]\nkv_cache_dtyp = \"fp8\"\n",
    );
    write(
        dir.path(),
        "section.toml",
        "\n[numeric]\nkv_cache_dtype = \"fp8\"\n",
    );
    let e = err(&opts(dir.path(), "typo"));
    assert!(e.contains("unknown key `numerics.kv_cache_dtyp`"), "{e}");
    assert!(e.contains("typo.toml:2"), "{e}");
    assert!(e.contains("did you mean `numerics.kv_cache_dtype`"), "{e}");
    let e = err(&opts(dir.path(), "section"));
    assert!(
        e.contains("unknown key `numeric`") && e.contains("section.toml:2"),
        "{e}"
    );
    assert!(e.contains("did you mean `[numerics]`"), "{e}");

    write(dir.path(), "ok.toml", "");
    let mut o = opts(dir.path(), "ok");
    o.env = vec![("DSV4_EXEC__THREAD".into(), "2".into())];
    let e = err(&o);
    assert!(e.contains("environment variable DSV4_EXEC__THREAD"), "{e}");
    assert!(e.contains("did you mean `exec.threads`"), "{e}");

    let mut o = opts(dir.path(), "ok");
    o.sets = vec!["numerics.index_k_dtpe=fp4".into()];
    let e = err(&o);
    assert!(e.contains("--set numerics.index_k_dtpe=fp4"), "{e}");
    assert!(e.contains("did you mean `numerics.index_k_dtype`"), "{e}");
}

#[test]
fn bad_values_name_key_value_and_allowed_values() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ok.toml", "");
    let mut o = opts(dir.path(), "ok");
    o.sets = vec!["numerics.kv_cache_dtype=fp16".into()];
    let e = err(&o);
    assert!(
        e.contains("`fp16`") && e.contains("`numerics.kv_cache_dtype`"),
        "{e}"
    );
    assert!(e.contains("one of: bf16, fp8"), "{e}");

    o.sets = vec!["cache.max_total_tokens=-1".into()];
    let e = err(&o);
    assert!(
        e.contains("`-1`") && e.contains("non-negative integer"),
        "{e}"
    );

    // Past MAX_THREADS: spawning 20 000 workers took minutes before anything ran.
    for v in ["-1", "100000"] {
        o.sets = vec![format!("exec.threads={v}")];
        let e = err(&o);
        assert!(
            e.contains(&format!("`{v}`")) && e.contains("an integer from 0 to 1024"),
            "{e}"
        );
    }

    o.sets = vec!["exec.executor=random".into()];
    let e = err(&o);
    assert!(
        e.contains("`random`") && e.contains("`exec.executor`"),
        "{e}"
    );
    assert!(
        e.contains("one of: auto, serial, interleaved, threaded"),
        "{e}"
    );

    o.sets = vec!["backend.kind=cdua".into()];
    let e = err(&o);
    assert!(e.contains("reference, cpu, wgpu, cuda-sm120"), "{e}");

    write(dir.path(), "bad.toml", "[exec]\nthreads = \"four\"\n");
    let e = err(&opts(dir.path(), "bad"));
    assert!(e.contains("bad.toml:2") && e.contains("`four`"), "{e}");
    assert!(e.contains("an integer from 0 to 1024"), "{e}");

    write(dir.path(), "flat.toml", "numerics = \"fp8\"\n");
    let e = err(&opts(dir.path(), "flat"));
    assert!(e.contains("a table `[numerics]`"), "{e}");

    write(dir.path(), "syntax.toml", "[exec\n");
    let e = err(&opts(dir.path(), "syntax"));
    assert!(e.contains("syntax.toml is not valid TOML"), "{e}");
}

#[test]
fn unknown_profiles_list_the_available_ones() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "alpha.toml", "");
    let mut o = opts(dir.path(), "nope");
    o.search.embedded = true;
    let e = err(&o);
    assert!(e.contains("unknown profile `nope`"), "{e}");
    assert!(
        e.contains("alpha, dev-cpu, prod-bf16, prod-fp8, reference"),
        "{e}"
    );

    let mut o = opts(dir.path(), "alpha");
    o.search.profile_dir = Some(dir.path().join("missing"));
    let e = err(&o);
    assert!(
        e.contains("does not exist") && e.contains("DSV4_PROFILE_DIR"),
        "{e}"
    );

    let e = err(&opts(dir.path(), "no/such/file.toml"));
    assert!(
        e.contains("cannot read profile file no/such/file.toml"),
        "{e}"
    );
}

#[test]
fn profile_dir_shadows_embedded_and_paths_work() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "dev-cpu.toml", "[exec]\nthreads = 5\n");
    let mut o = opts(dir.path(), "dev-cpu");
    o.search.embedded = true;
    assert_eq!(resolve(&o).profile.exec.threads, 5);

    let path = dir.path().join("dev-cpu.toml").display().to_string();
    let mut o = ResolveOptions::new(path);
    o.search.local_dir = None;
    assert_eq!(resolve(&o).profile.exec.threads, 5);
}

#[test]
fn embedded_profiles_parse_and_pin_every_key() {
    for (name, _) in EMBEDDED_PROFILES {
        let mut o = ResolveOptions::new(*name);
        o.search.local_dir = None;
        let r = resolve(&o);
        assert_eq!(r.files.last(), Some(&format!("embedded:{name}.toml")));
        assert!(!r.description.is_empty(), "{name} has no comment block");
        for s in &r.settings {
            // An unset optional key ("backend chooses", no API key, no bootstrap) has no spelling.
            if s.value.is_null() {
                continue;
            }
            assert!(
                matches!(s.origin, Origin::File { line: Some(_), .. }),
                "{name}: {} comes from {}",
                s.key,
                s.origin
            );
        }
    }
}

#[test]
fn shipped_profiles_say_what_they_are_for() {
    let get = |name: &str| {
        let mut o = ResolveOptions::new(name);
        o.search.local_dir = None;
        resolve(&o)
    };
    for name in ["dev-cpu", "reference"] {
        let r = get(name);
        assert_eq!(r.profile.model.path, "tiny", "{name}");
        assert!(r.findings.is_empty(), "{name}: {:?}", r.findings);
    }
    assert_eq!(get("reference").profile.backend.kind, "reference");
    // dev-cpu runs on the host: reference until the cpu backend is its default.
    assert!(["reference", "cpu"].contains(&get("dev-cpu").profile.backend.kind.as_str()));
    let fp8 = get("prod-fp8");
    let p = &fp8.profile;
    assert_eq!(p.backend.kind, "cuda-sm120");
    assert_eq!(p.numerics.kv_cache_dtype.to_string(), "fp8");
    assert_eq!(p.numerics.index_k_dtype.to_string(), "fp8");
    assert!(p.exec.cuda_graph && p.exec.multi_stream_overlap && p.exec.overlap_schedule);
    assert!(p.cache.hicache && p.cache.prefix_cache);
    assert!(fp8.findings.is_empty(), "{:?}", fp8.findings);

    let bf16 = get("prod-bf16");
    assert_eq!(
        bf16.files,
        ["embedded:prod-fp8.toml", "embedded:prod-bf16.toml"]
    );
    assert_eq!(bf16.profile.numerics.index_k_dtype.to_string(), "bf16");
    let why = bf16.setting("numerics.index_k_dtype").unwrap();
    assert!(
        why.comment.as_deref().unwrap().contains("recall"),
        "{why:?}"
    );
    let rules: Vec<&str> = bf16.findings.iter().map(|f| f.rule).collect();
    assert_eq!(rules, ["incident-combination"]);
    let diff = dsv4_config::compare::diff(&fp8, &bf16);
    let keys: Vec<&str> = diff.iter().map(|d| d.key).collect();
    assert_eq!(keys, ["numerics.index_k_dtype"]);
}

#[test]
fn errors_are_typed() {
    let mut o = ResolveOptions::new("dev-cpu");
    o.search.local_dir = None;
    o.sets = vec!["exec".into()];
    assert!(matches!(
        Profile::resolve(&o),
        Err(ConfigError::BadSet { .. })
    ));
    o.sets = vec!["exec=1".into()];
    let e = Profile::resolve(&o).unwrap_err().to_string();
    assert!(
        e.contains("`exec` is a section; set one of its keys: exec.cuda_graph,"),
        "{e}"
    );
}

//! End-to-end tests of the `dsv4` binary: profiles, `--set`, errors, `model init-tiny`, `model inspect`,
//! `bench` option checks, `kernels`; `run-batch` is in `run_batch.rs`.

mod common;

use common::{dsv4, fails, json, ok};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The `source` of one key in `profile show --json`.
fn source_of(doc: &Value, key: &str) -> String {
    doc["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .unwrap_or_else(|| panic!("no {key} in {doc}"))["source"]
        .as_str()
        .unwrap()
        .to_string()
}

fn flash_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dsv4-model/tests/data/flash-config.json")
}

#[test]
fn profile_show_layers_env_and_set_over_the_embedded_default() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = dsv4(
        dir.path(),
        &[
            "-vv",
            "profile",
            "show",
            "--json",
            "--set",
            "exec.threads=3",
        ],
    );
    cmd.env("DSV4_NUMERICS__KV_CACHE_DTYPE", "fp8")
        .env("DSV4_LOG", "debug");
    let doc = json(cmd);
    assert_eq!(doc["profile"], "dev-cpu");
    assert_eq!(doc["files"][0], "embedded:dev-cpu.toml");
    assert_eq!(doc["resolved"]["numerics"]["kv_cache_dtype"], "fp8");
    assert_eq!(
        source_of(&doc, "numerics.kv_cache_dtype"),
        "env DSV4_NUMERICS__KV_CACHE_DTYPE"
    );
    assert_eq!(doc["resolved"]["exec"]["threads"], 3);
    assert_eq!(source_of(&doc, "exec.threads"), "--set exec.threads=3");
    assert!(source_of(&doc, "model.path").starts_with("embedded:dev-cpu.toml:"));
    assert_eq!(source_of(&doc, "backend.device"), "default");
}

#[test]
fn profiles_come_from_profile_dir_then_local_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("profiles")).unwrap();
    std::fs::write(
        dir.path().join("profiles/local.toml"),
        "extends = \"reference\"\n[exec]\nthreads = 4\n",
    )
    .unwrap();
    let extra = dir.path().join("extra");
    std::fs::create_dir(&extra).unwrap();
    std::fs::write(extra.join("local.toml"), "[exec]\nthreads = 9\n").unwrap();

    let text = ok(dsv4(dir.path(), &["profile", "show", "local"]));
    assert!(text.contains("profiles/local.toml:3"), "{text}");
    assert!(text.contains("embedded:reference.toml"), "{text}");

    let mut cmd = dsv4(dir.path(), &["profile", "show", "--json", "local"]);
    cmd.env("DSV4_PROFILE_DIR", &extra);
    assert_eq!(json(cmd)["resolved"]["exec"]["threads"], 9);
}

#[test]
fn bad_set_values_and_keys_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let e = fails(dsv4(
        dir.path(),
        &["profile", "show", "--set", "numerics.kv_cache_dtype=fp16"],
    ));
    assert!(
        e.contains("`fp16`") && e.contains("numerics.kv_cache_dtype"),
        "{e}"
    );
    assert!(e.contains("one of: bf16, fp8"), "{e}");

    let e = fails(dsv4(
        dir.path(),
        &["profile", "show", "--set", "numerics.kv_cache=fp8"],
    ));
    assert!(e.contains("did you mean `numerics.kv_cache_dtype`"), "{e}");

    let mut cmd = dsv4(dir.path(), &["profile", "show"]);
    cmd.env("DSV4_EXEC__THREADS", "many");
    let e = fails(cmd);
    assert!(
        e.contains("DSV4_EXEC__THREADS") && e.contains("an integer from 0 to 1024"),
        "{e}"
    );
}

#[test]
fn bench_refuses_bad_options_before_measuring_anything() {
    let dir = tempfile::tempdir().unwrap();
    for (args, want) in [
        (
            &["--configs", "tiny,huge"][..],
            "unknown bench config `huge`",
        ),
        (&["--prefill-tokens", "0"][..], "at least 1 token"),
        (
            &["--contexts", "1024,70000"][..],
            "context 70000 is outside",
        ),
        (&["--serving-concurrency", "1,0"][..], "every concurrency"),
        (
            &[
                "--serving-prompt-tokens",
                "64",
                "--serving-shared-prefix",
                "65",
            ][..],
            "longer than the prompt",
        ),
        (
            &["--serving", "--serving-concurrency", "0"][..],
            "every concurrency",
        ),
        (&["--out", "gone/bench.json"][..], "does not exist"),
        (&["--backend", "nope"][..], "unknown backend `nope`"),
    ] {
        let e = fails(dsv4(dir.path(), &[&["bench"][..], args].concat()));
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!e.contains("measuring the machine"), "{args:?}: {e}");
    }
}

#[test]
fn unknown_profile_lists_the_available_ones() {
    let dir = tempfile::tempdir().unwrap();
    let e = fails(dsv4(
        dir.path(),
        &["--profile", "prod-fp9", "profile", "show"],
    ));
    assert!(e.contains("unknown profile `prod-fp9`"), "{e}");
    assert!(
        e.contains("available profiles: dev-cpu, prod-bf16, prod-fp8, reference"),
        "{e}"
    );
}

#[test]
fn init_tiny_writes_the_three_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let text = ok(dsv4(
        dir.path(),
        &[
            "model",
            "init-tiny",
            "--out",
            out.to_str().unwrap(),
            "--seed",
            "3",
        ],
    ));
    assert!(text.contains("seed 3"), "{text}");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["vocab_size"], 384);
    let weights = std::fs::metadata(out.join("model.safetensors")).unwrap();
    assert!(weights.len() > 1_000_000, "{} bytes", weights.len());
    let tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer.json")).unwrap())
            .unwrap();
    assert!(tokenizer["model"].is_object(), "{tokenizer}");

    // The written checkpoint is inspectable like any other.
    let doc = json(dsv4(
        dir.path(),
        &[
            "model",
            "inspect",
            "--model",
            out.to_str().unwrap(),
            "--json",
        ],
    ));
    assert_eq!(doc["layers"], 4);

    // Without its tokenizer.json the checkpoint is refused before any weight is loaded and, for
    // serve, before the port opens (nothing printed on stdout).
    std::fs::remove_file(out.join("tokenizer.json")).unwrap();
    let model = out.to_str().unwrap();
    for args in [
        &["serve", "--port", "0", "--model", model][..],
        &["generate", "--prompt", "hi", "--model", model][..],
    ] {
        let o = common::run(dsv4(dir.path(), args));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr.contains("tokenizer.json"), "{args:?}: {stderr}");
        assert!(
            o.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

#[test]
fn inspect_flash_gives_published_counts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = flash_config();
    let doc = json(dsv4(
        dir.path(),
        &[
            "model",
            "inspect",
            "--config",
            cfg.to_str().unwrap(),
            "--json",
        ],
    ));
    let total = doc["params"]["total"].as_f64().unwrap();
    let active = doc["params"]["active"].as_f64().unwrap();
    assert!((total / 284e9 - 1.0).abs() <= 0.01, "total {total}");
    assert!((active / 13e9 - 1.0).abs() <= 0.03, "active {active}");
    assert_eq!(doc["params"]["embedding"], 129_280u64 * 4096);
    assert!(doc["params"]["mtp"].as_u64().unwrap() > 0);
    assert_eq!(doc["cache"]["kv_cache_dtype"], "bf16");

    let text = ok(dsv4(
        dir.path(),
        &["model", "inspect", "--config", cfg.to_str().unwrap()],
    ));
    assert!(
        text.contains("284.") || text.contains("283.") || text.contains("285."),
        "{text}"
    );
}

#[test]
fn inspect_cache_bytes_follow_the_profile_numerics() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = flash_config();
    let cfg = cfg.to_str().unwrap();
    let entry = |doc: &Value, name: &str| {
        doc["cache"]["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap()["entry_bytes"]
            .as_u64()
            .unwrap()
    };
    let bf16 = json(dsv4(
        dir.path(),
        &["model", "inspect", "--config", cfg, "--json"],
    ));
    assert_eq!(entry(&bf16, "swa_kv"), 1024);
    assert_eq!(entry(&bf16, "c4_index_k"), 256);
    let fp8 = json(dsv4(
        dir.path(),
        &[
            "model",
            "inspect",
            "--config",
            cfg,
            "--json",
            "--set",
            "numerics.kv_cache_dtype=fp8",
            "--set",
            "numerics.index_k_dtype=fp4",
        ],
    ));
    assert_eq!(entry(&fp8, "swa_kv"), 584);
    assert_eq!(entry(&fp8, "c4_index_k"), 68);
    assert_eq!(fp8["cache"]["index_k_dtype"], "fp4");
}

#[test]
fn inspect_reports_a_missing_config() {
    let dir = tempfile::tempdir().unwrap();
    let e = fails(dsv4(
        dir.path(),
        &["model", "inspect", "--model", "no-such-dir"],
    ));
    assert!(e.contains("no-such-dir"), "{e}");
}

#[test]
fn generate_runs_the_embedded_tiny_model_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "generate",
        "--prompt",
        "hello",
        "--max-tokens",
        "4",
        "--json",
    ];
    let a = json(dsv4(dir.path(), &args));
    let b = json(dsv4(dir.path(), &args));
    assert_eq!(a, b);
    assert_eq!(a["prompt_ids"][0], 0, "BOS first: {a}");
    let n = a["completion_ids"].as_array().unwrap().len();
    assert!(n == 4 || (n < 4 && a["finish_reason"] == "eos"), "{a}");
    // A run that would outgrow the context is refused before the prefill, with the room left.
    let e = fails(dsv4(
        dir.path(),
        &["generate", "--prompt", "hello", "--max-tokens", "70000"],
    ));
    assert!(
        e.contains("--max-tokens (70000)") && e.contains("at most 65530"),
        "{e}"
    );
}

#[test]
fn a_backend_that_cannot_run_here_is_reported_with_the_reason() {
    // cuda-sm120 is linked into the binary but needs an NVIDIA driver and GPU.
    if let Ok(()) = dsv4_backend_cuda::cuda::probe() {
        eprintln!(
            "SKIP a_backend_that_cannot_run_here_is_reported_with_the_reason: a CUDA device is present"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let e = fails(dsv4(
        dir.path(),
        &[
            "generate",
            "--prompt",
            "hi",
            "--set",
            "backend.kind=cuda-sm120",
        ],
    ));
    let reason = dsv4_backend_cuda::cuda::probe().unwrap_err();
    assert!(
        e.contains("backend `cuda-sm120` is not available here") && e.contains(&reason),
        "{e}"
    );
}

#[test]
fn kernels_compile_checks_every_architecture_before_compiling() {
    let dir = tempfile::tempdir().unwrap();
    // Checked before NVRTC is even looked for: these fail the same on any machine.
    for arch in ["7.5", "sm_75", "nine", "90"] {
        let e = fails(dsv4(
            dir.path(),
            &["kernels", "compile", "--arch", "9.0", "--arch", arch],
        ));
        assert!(
            e.contains(&format!("--arch: `{arch}` is not a compute capability"))
                && e.contains("sm_80 or newer, e.g. 9.0"),
            "{arch}: {e}"
        );
    }
    let e = fails(dsv4(dir.path(), &["kernels", "compile"]));
    assert!(e.contains("--arch <CC>"), "{e}");
    let e = fails(dsv4(
        dir.path(),
        &["kernels", "compile", "--arch", "9.0", "--sums", "f16"],
    ));
    assert!(e.contains("possible values: auto, f64, f32, both"), "{e}");
    assert!(!dir.path().join("cuda-kernels").exists(), "nothing written");
}

#[test]
fn kernels_list_tells_current_from_stale_and_prunes_the_stale() {
    use dsv4_backend_cuda::kernel_cache::path_in;
    let dir = tempfile::tempdir().unwrap();
    let listing = |extra: &[&str]| {
        let mut args = vec!["kernels", "list", "--cache-dir", "cache", "--json"];
        args.extend_from_slice(extra);
        json(dsv4(dir.path(), &args))
    };
    assert_eq!(
        listing(&[])["cubins"],
        serde_json::json!([]),
        "no cache yet"
    );
    let cache = dir.path().join("cache");
    let current = path_in(&cache, (9, 0), true);
    let stale = current.with_file_name("sm_90-f64-00000000deadbeef.cubin");
    std::fs::create_dir_all(current.parent().unwrap()).unwrap();
    std::fs::write(&current, b"\x7fELF this build").unwrap();
    std::fs::write(&stale, b"\x7fELF an older build").unwrap();
    let doc = listing(&[]);
    let states: Vec<(&str, &str)> = doc["cubins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["arch"].as_str().unwrap(), c["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("sm_90", "current"), ("sm_90", "stale")]);
    let doc = listing(&["--prune"]);
    assert_eq!(doc["pruned_bytes"], 19, "the stale file's bytes");
    assert!(
        current.is_file() && !stale.exists(),
        "only the stale CUBIN goes"
    );
    let text = ok(dsv4(
        dir.path(),
        &["kernels", "list", "--cache-dir", "cache"],
    ));
    assert!(text.starts_with("sm_90   f64  current"), "{text}");
}

//! Export to SGLang: golden files for every shipped profile in every format (regenerate with
//! `DSV4_BLESS=1 cargo test -p dsv4-config --test export`), and the properties every export has.

use dsv4_config::catalog::EMBEDDED_PROFILES;
use dsv4_config::export::render::{Format, render};
use dsv4_config::export::{SglangCommand, sglang};
use dsv4_config::schema::{KEYS, REDACTED};
use dsv4_config::{Profile, ResolveOptions, Resolved};
use std::path::PathBuf;

/// A shipped profile resolved from the embedded copies only, with extra `--set` arguments.
fn shipped(name: &str, sets: &[&str]) -> Resolved {
    let mut o = ResolveOptions::new(name);
    o.search.local_dir = None;
    o.sets = sets.iter().map(|s| s.to_string()).collect();
    Profile::resolve(&o).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn golden_exports_of_every_shipped_profile_in_every_format() {
    let bless = std::env::var("DSV4_BLESS").is_ok_and(|v| v == "1");
    let mut problems = Vec::new();
    for (name, _) in EMBEDDED_PROFILES {
        let cmd = sglang(&shipped(name, &[]));
        for format in Format::ALL {
            let text = render(&cmd, format);
            let path = golden_dir().join(format!("{name}.{format}"));
            if bless {
                std::fs::write(&path, &text).unwrap();
                continue;
            }
            match std::fs::read_to_string(&path) {
                Ok(golden) if golden == text => {}
                Ok(golden) => problems.push(format!(
                    "{} differs from the export:\n--- golden ---\n{golden}--- now ---\n{text}",
                    path.display()
                )),
                Err(e) => problems.push(format!("{}: {e}", path.display())),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n\nIf the change is intended, run `DSV4_BLESS=1 cargo test -p dsv4-config --test \
         export` and review the diff.",
        problems.join("\n\n")
    );
}

fn argv_text(cmd: &SglangCommand) -> String {
    cmd.argv().join(" ")
}

#[test]
fn prod_fp8_maps_every_knob_the_issue_names() {
    let cmd = sglang(&shipped("prod-fp8", &[]));
    assert!(cmd.runnable());
    let argv = argv_text(&cmd);
    for part in [
        "python3 -m sglang.launch_server",
        "--model-path /models/DeepSeek-V4-Flash",
        "--kv-cache-dtype fp8_e4m3",
        "--cuda-graph-max-bs 128",
        "--page-size 64",
        "--enable-hierarchical-cache",
        "--hicache-ratio 2.0",
        "--max-running-requests 128",
        "--chunked-prefill-size 8192",
        "--tool-call-parser deepseekv4",
        "--reasoning-parser deepseek-v4",
    ] {
        assert!(argv.contains(part), "{part} missing from {argv}");
    }
    for absent in [
        "--disable-cuda-graph",
        "--disable-overlap-schedule",
        "--enable-deepseek-v4-fp4-indexer",
        "--disaggregation-mode",
    ] {
        assert!(!argv.contains(absent), "{absent} in {argv}");
    }
    assert_eq!(
        cmd.env,
        [(
            "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP".to_string(),
            "1".to_string()
        )]
    );
    // Only max_request_bytes has no equivalent in prod-fp8.
    let warned: Vec<&str> = cmd.warnings.iter().map(|w| w.key).collect();
    assert_eq!(warned, ["server.max_request_bytes"]);
    assert_eq!(cmd.keys.len(), KEYS.len());
}

#[test]
fn switched_off_features_become_flags_and_env() {
    let cmd = sglang(&shipped(
        "prod-fp8",
        &[
            "exec.multi_stream_overlap=false",
            "exec.overlap_schedule=false",
            "exec.cuda_graph=false",
            "exec.cuda_graph_max_bs=0",
            "numerics.index_k_dtype=fp4",
            "cache.hicache=false",
            "cache.prefix_cache=false",
        ],
    ));
    let argv = argv_text(&cmd);
    for part in [
        "--disable-cuda-graph",
        "--disable-overlap-schedule",
        "--enable-deepseek-v4-fp4-indexer",
        "--disable-radix-cache",
    ] {
        assert!(argv.contains(part), "{part} missing from {argv}");
    }
    assert!(
        !argv.contains("--hicache-ratio") && !argv.contains("--cuda-graph-max-bs"),
        "{argv}"
    );
    assert_eq!(cmd.env[0].1, "0");
}

#[test]
fn request_priority_and_priority_preemption_map_to_sglang_flags() {
    let case = |sets: &[&str]| {
        let cmd = sglang(&shipped("prod-fp8", sets));
        let warned: Vec<&str> = cmd.warnings.iter().map(|w| w.key).collect();
        let warned = warned.contains(&"scheduler.priority_preemption");
        (argv_text(&cmd), warned)
    };
    let flags = [
        "--enable-priority-scheduling",
        "--abort-on-priority-when-disabled",
        "--disable-priority-preemption",
    ];
    let has = |argv: &str| flags.map(|f| argv.contains(f));
    // Shipped: priorities used, no preemption for them.
    let (argv, warned) = case(&[]);
    assert_eq!(has(&argv), [true, false, true], "{argv}");
    assert!(
        argv.contains("--priority-scheduling-preemption-threshold 10"),
        "{argv}"
    );
    assert!(!warned);
    let (argv, warned) = case(&[
        "scheduler.priority_preemption=true",
        "scheduler.priority_preemption_threshold=2",
    ]);
    assert_eq!(has(&argv), [true, false, false], "{argv}");
    assert!(
        argv.contains("--priority-scheduling-preemption-threshold 2"),
        "{argv}"
    );
    assert!(!warned);
    let (argv, warned) = case(&["server.request_priority=ignore"]);
    assert_eq!(has(&argv), [false, false, false], "{argv}");
    assert!(!warned);
    let (argv, warned) = case(&["server.request_priority=refuse"]);
    assert_eq!(has(&argv), [false, true, false], "{argv}");
    assert!(!warned);
    // Preemption for the server's own priorities alone has no SGLang equivalent.
    let (_, warned) = case(&[
        "server.request_priority=ignore",
        "scheduler.priority_preemption=true",
    ]);
    assert!(warned);
}

#[test]
fn unmapped_knobs_are_warnings_in_every_format() {
    let cmd = sglang(&shipped("prod-bf16", &["exec.threads=4"]));
    let keys: Vec<&str> = cmd.warnings.iter().map(|w| w.key).collect();
    assert_eq!(
        keys,
        [
            "numerics.index_k_dtype",
            "exec.threads",
            "server.max_request_bytes"
        ]
    );
    assert!(cmd.warnings[0].message.contains("patched SGLang"));
    assert_eq!(cmd.profile_warnings[0].rule, "incident-combination");
    for format in Format::ALL {
        let text = render(&cmd, format);
        assert!(
            text.contains("no bf16 index-key option"),
            "{format}: {text}"
        );
        assert!(text.contains("incident-combination"), "{format}");
        assert!(text.contains("exec.threads"), "{format}");
    }
}

#[test]
fn the_tiny_model_blocks_the_command_in_every_format() {
    let cmd = sglang(&shipped("dev-cpu", &[]));
    assert!(!cmd.runnable());
    assert_eq!(cmd.blockers[0].key, "model.path");
    assert!(!argv_text(&cmd).contains("--model-path"));
    assert!(render(&cmd, Format::Sh).contains("exit 1\n"));
    assert!(render(&cmd, Format::Systemd).contains("ExecStartPre=/bin/false"));
    assert!(render(&cmd, Format::Json).contains("\"runnable\": false"));
    // The reference backend itself has no SGLang equivalent: a warning, not a blocker.
    assert!(cmd.warnings.iter().any(|w| w.key == "backend.kind"));
    let fixed = sglang(&shipped("dev-cpu", &["model.path=/ckpt/tiny"]));
    assert!(fixed.runnable());
    assert!(argv_text(&fixed).contains("--model-path /ckpt/tiny"));
}

#[test]
fn secrets_launch_but_are_never_displayed() {
    let cmd = sglang(&shipped("prod-fp8", &["server.api_key=s3cr3t k"]));
    assert!(cmd.argv().iter().any(|a| a == "s3cr3t k"));
    let key = cmd.keys.iter().find(|k| k.key == "server.api_key").unwrap();
    assert_eq!(key.value, REDACTED);
    assert_eq!(key.sglang, format!("--api-key {REDACTED}"));
    assert!(key.source.ends_with(REDACTED), "{}", key.source);
    let sh = render(&cmd, Format::Sh);
    assert!(sh.contains("--api-key 's3cr3t k'"), "{sh}");
    assert_eq!(sh.matches("s3cr3t").count(), 1, "{sh}");
    let systemd = render(&cmd, Format::Systemd);
    assert!(systemd.contains("--api-key \"s3cr3t k\""), "{systemd}");
}

#[test]
fn disaggregation_and_devices_map() {
    let cmd = sglang(&shipped(
        "prod-fp8",
        &[
            "disagg.mode=prefill",
            "disagg.bootstrap=10.0.0.2:8998",
            "exec.overlap_schedule=false",
            "backend.device=1",
        ],
    ));
    let argv = argv_text(&cmd);
    assert!(argv.contains("--disaggregation-mode prefill"), "{argv}");
    assert!(
        argv.contains("--disaggregation-bootstrap-port 8998"),
        "{argv}"
    );
    assert!(
        cmd.env
            .contains(&("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string()))
    );
    let decode = sglang(&shipped(
        "prod-fp8",
        &[
            "disagg.mode=decode",
            "disagg.bootstrap=10.0.0.2:8998",
            "exec.overlap_schedule=false",
        ],
    ));
    assert!(!argv_text(&decode).contains("bootstrap-port"));
    assert!(decode.warnings.iter().any(|w| w.key == "disagg.bootstrap"));
}

#[test]
fn json_export_parses_and_lists_every_key() {
    let cmd = sglang(&shipped("prod-bf16", &[]));
    let doc: serde_json::Value = serde_json::from_str(&render(&cmd, Format::Json)).unwrap();
    assert_eq!(doc["target"], "sglang");
    assert_eq!(doc["argv"][0], "python3");
    assert_eq!(doc["keys"].as_array().unwrap().len(), KEYS.len());
    assert_eq!(doc["env"][0]["name"], "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP");
    assert_eq!(doc["warnings"][0]["key"], "numerics.index_k_dtype");
}

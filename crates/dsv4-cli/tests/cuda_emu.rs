//! The cuda-sm120 kernels end to end through the `dsv4` binary, on the CPU emulator (`cuda-emu`):
//! the op sweep and tiny-model diffs against the reference in every numerics combination (and
//! on the tensor-core linears, `DSV4_CUDA_LINEAR=mma`), the
//! execution-mode diffs (plan streams on the emulator's device streams; a missing event fails
//! the overlap diff), generation (also by `cuda-sm120` on the emulated driver,
//! `DSV4_CUDA_DRIVER=emu`), and the device section of `dsv4 bench`. The same binary
//! runs the same kernels on a GPU as `cuda-sm120` (backends/cuda-sm120/device-check.sh).
//!
//! Needs a host C++ compiler (the emulator builds the kernels with it). Without one each test
//! prints why and skips, except under CI=true, where that is a failure.

mod common;

use common::{can_run, diff_passes, dsv4, every_numerics, json, model_diff_in_numerics, with_kv};

/// `dsv4 diff --ops` of the emulated kernels against the reference.
const OP_SWEEP: [&str; 6] = [
    "diff",
    "--backend",
    "reference",
    "--against",
    "cuda-emu",
    "--ops",
];

/// `dsv4 diff --model` of the emulated kernels on the tiny model: 72 prompt tokens, 2 decode
/// steps.
const TINY_MODEL_DIFF: [&str; 10] = [
    "diff",
    "--backend",
    "reference",
    "--against",
    "cuda-emu",
    "--model",
    "--tokens",
    "72",
    "--decode",
    "2",
];

/// What `dsv4 diff --ops` prints when every case of the default sweep passed (its size taken
/// from the sweep itself, so a new op's cases count without an edit here).
fn every_case_passed() -> String {
    let opts = dsv4_diff::ops::OpsOptions::default();
    let n = dsv4_diff::ops::list_cases(&opts)
        .expect("the default sweep lists")
        .len();
    assert!(n > 150, "the default sweep has only {n} cases");
    format!("{n} pass, 0 fail")
}

fn available(test: &str) -> bool {
    can_run(test, "cuda-emu", dsv4_backend_cuda::emu::probe())
}

#[test]
fn the_op_sweep_passes_with_f64_and_f32_accumulation() {
    if !available("the_op_sweep_passes_with_f64_and_f32_accumulation") {
        return;
    }
    let out = diff_passes(&OP_SWEEP, &[("DSV4_CUDA_ACC", "f64")]);
    assert!(out.contains(&every_case_passed()), "{out}");
    diff_passes(&OP_SWEEP, &[("DSV4_CUDA_ACC", "f32")]);
}

#[test]
fn the_tensor_core_linears_pass_the_op_sweep_and_the_tiny_model_diff() {
    if !available("the_tensor_core_linears_pass_the_op_sweep_and_the_tiny_model_diff") {
        return;
    }
    // DSV4_CUDA_LINEAR=mma: the linears on mma.sync tiles (f32 sums), emulated through the PTX
    // fragment layout; within the f32 tolerances, as the SIMT kernels with f32 sums.
    let env = [("DSV4_CUDA_LINEAR", "mma"), ("DSV4_CUDA_ACC", "f32")];
    let out = diff_passes(&OP_SWEEP, &env);
    assert!(out.contains(&every_case_passed()), "{out}");
    // The same from the profile's knobs: with f64 sums the SIMT linears give the reference's
    // logits bit for bit (tiny_model_matches_bitwise), the tensor-core ones do not, so a
    // difference shows that backend.cuda_linear reached the backend. 136 tokens: a C128 entry,
    // and near-tied indexer scores at layer 3 that the mma sums break the other way; with
    // attention pinned to the oracle's selections the diff judges those flips and passes.
    let knobs = [
        "--set",
        "backend.cuda_linear=mma",
        "--set",
        "backend.cuda_sums=f64",
    ];
    let mut args: Vec<&str> = knobs.iter().chain(&TINY_MODEL_DIFF).copied().collect();
    let at = args.iter().position(|a| *a == "72").unwrap();
    args[at] = "136";
    let out = diff_passes(&args, &[]);
    assert!(
        !out.contains("max abs 0,"),
        "the mma linears did not run:\n{out}"
    );
}

#[test]
fn the_page_cache_knob_changes_the_traffic_and_not_the_logits() {
    if !available("the_page_cache_knob_changes_the_traffic_and_not_the_logits") {
        return;
    }
    // The tiny-model diff with the cache off (`0`: every call uploads the rows it reads) and at
    // the backend's default: the same logits against the reference, fewer bytes uploaded. At
    // 300 tokens, past the SWA ring's wrap and with two C128 entries (at 72 the saving is
    // 2%, docs/cuda.md).
    let run = |mib: &str, more: &[&str]| {
        let set = format!("backend.cuda_page_cache_mib={mib}");
        let mut args = vec!["--set", set.as_str()];
        args.extend(more);
        args.extend(TINY_MODEL_DIFF);
        let at = args.iter().position(|a| *a == "72").unwrap();
        args[at] = "300";
        args.push("--json");
        let report = json(dsv4(&std::env::temp_dir(), &args));
        assert_eq!(report["passed"], true, "{mib}: {report}");
        let model = &report["model"];
        let uploaded = model["candidate_device"]["write_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{mib}: no upload count in {model}"));
        (model["logits"].clone(), uploaded)
    };
    let (logits_off, off) = run("0", &[]);
    // With the canary on the KV and index-K pools every call also checks the cached entries
    // it reads against the pages (a read-back, no upload), so the same run proves the copies.
    let (logits_on, on) = run("auto", &["--set", "debug.canary=kv,index_k"]);
    assert_eq!(logits_off, logits_on, "the cache changed the logits");
    assert!(on < off, "the cache uploaded {on} bytes, {off} without it");
    eprintln!("tiny model diff: {off} bytes uploaded without the page cache, {on} with it");
}

#[test]
fn reversed_threads_and_blocks_give_the_same_results() {
    if !available("reversed_threads_and_blocks_give_the_same_results") {
        return;
    }
    // The emulator runs a block's threads one after another between barriers, and blocks one
    // after another, so a thread that reads what a lower thread (or block) wrote without a
    // barrier sees it here and maybe not on a GPU; in reverse order it never does, and a missing
    // barrier changes the results. (The other thing a GPU punishes and a CPU forgives, an access
    // not aligned to its size, fails every emulated launch: emu/runtime.cpp.)
    let flags = [("DSV4_EMU_CXXFLAGS", "-DDSV4_EMU_REVERSE")];
    let out = diff_passes(&OP_SWEEP, &flags);
    assert!(out.contains(&every_case_passed()), "{out}");
    let out = diff_passes(&TINY_MODEL_DIFF, &flags);
    assert!(out.contains("max abs 0,"), "logits differ:\n{out}");
}

/// The tiny model against the reference in every numerics combination with the kv cache dtype
/// `kv` (a test per kv dtype, so the two halves run in parallel), over 72 prompt tokens: 18
/// entries in the C4 layers, so the indexer's top-16 really selects. f64 accumulation gives the
/// reference's logits bit for bit.
fn tiny_model_matches_bitwise(test: &str, kv: &str) {
    if !available(test) {
        return;
    }
    let combos = with_kv(&every_numerics(), kv);
    model_diff_in_numerics("cuda-emu", &[], "72", &combos, |out, what| {
        assert!(out.contains("max abs 0,"), "{what}: logits differ:\n{out}");
    });
}

#[test]
fn the_tiny_model_with_a_bf16_kv_cache_matches_the_reference_in_every_other_knob() {
    tiny_model_matches_bitwise(
        "the_tiny_model_with_a_bf16_kv_cache_matches_the_reference_in_every_other_knob",
        "bf16",
    );
}

#[test]
fn the_tiny_model_with_an_fp8_kv_cache_matches_the_reference_in_every_other_knob() {
    tiny_model_matches_bitwise(
        "the_tiny_model_with_an_fp8_kv_cache_matches_the_reference_in_every_other_knob",
        "fp8",
    );
}

/// `dsv4 diff --mode <mode> --backend cuda-emu` over 24 tokens and 4 decode steps, with captured
/// plans on and `sets` (more `--set` overrides).
fn mode_diff(mode: &str, sets: &[&str]) -> std::process::Command {
    let mut args = vec![
        "--set",
        "backend.kind=cuda-emu",
        "--set",
        "exec.cuda_graph=true",
    ];
    sets.iter().for_each(|s| args.extend(["--set", s]));
    args.extend([
        "diff",
        "--mode",
        mode,
        "--backend",
        "cuda-emu",
        "--tokens",
        "24",
        "--decode",
        "4",
    ]);
    dsv4(&std::env::temp_dir(), &args)
}

#[test]
fn captured_and_overlapped_plans_compute_the_eager_bits() {
    if !available("captured_and_overlapped_plans_compute_the_eager_bits") {
        return;
    }
    for mode in ["captured-vs-eager", "overlap-vs-serial"] {
        let out = common::run(mode_diff(mode, &[]));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("first divergence: none"),
            "{mode}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The captured side's decode steps replay device graphs (two steps to build them).
        let graphs = stdout
            .lines()
            .find_map(|l| l.strip_prefix("candidate device: "))
            .and_then(|l| l.split(" inside ").nth(1))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{mode}: no candidate device line:\n{stdout}"));
        assert!(
            graphs > 0,
            "{mode}: the candidate launched no graphs:\n{stdout}"
        );
    }
}

#[test]
fn a_missing_stream_event_fails_the_overlap_diff_at_the_moe_sum() {
    if !available("a_missing_stream_event_fails_the_overlap_diff_at_the_moe_sum") {
        return;
    }
    // Without the shared expert's event the MoE sum may run first: under the interleaving
    // executor and on the device streams (backends/cuda-sm120/tests/streams.rs shows the
    // streams alone catching it in serial issue order).
    let out = common::run(mode_diff(
        "overlap-vs-serial",
        &["debug.inject=missing-stream-event"],
    ));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let first = stdout
        .lines()
        .find(|l| l.starts_with("FIRST DIVERGENCE"))
        .unwrap_or_else(|| panic!("no divergence reported:\n{stdout}"));
    assert!(first.contains("moe.out"), "{first}");
}

#[test]
fn generation_on_the_emulated_kernels_gives_the_reference_tokens() {
    if !available("generation_on_the_emulated_kernels_gives_the_reference_tokens") {
        return;
    }
    let ids = |kind: &str, env: &[(&str, &str)]| {
        let mut cmd = dsv4(
            &std::env::temp_dir(),
            &[
                "--set",
                &format!("backend.kind={kind}"),
                "generate",
                "--prompt",
                "hello there",
                "--max-tokens",
                "8",
                "--json",
            ],
        );
        cmd.envs(env.iter().copied());
        let out = common::run(cmd);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{kind}: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        (v["completion_ids"].clone(), stderr)
    };
    let (emu, _) = ids("cuda-emu", &[]);
    assert_eq!(emu.as_array().map(Vec::len), Some(8), "{emu}");
    assert_eq!(emu, ids("reference", &[]).0);
    // cuda-sm120 itself, its driver calls on the emulated driver, as a Blackwell part (NVRTC
    // compiles an sm_120 CUBIN; backends/cuda-sm120/tests/driver_emu.rs runs sm_90), with f64
    // accumulation for the emulator's bits.
    let nvrtc = dsv4_backend_cuda::nvrtc::nvrtc_probe();
    if can_run(
        "generation on the emulated driver",
        "cuda-sm120 (emulated driver)",
        nvrtc,
    ) {
        let env = [
            ("DSV4_CUDA_DRIVER", "emu"),
            ("DSV4_CUDA_EMU_CC", "12.0"),
            ("DSV4_CUDA_ACC", "f64"),
        ];
        let (gpu, stderr) = ids("cuda-sm120", &env);
        assert_eq!(gpu, emu, "{stderr}");
        assert!(
            !stderr.contains("dsv4 emulated driver:"),
            "refused calls: {stderr}"
        );
    }
}

#[test]
fn kernels_compiled_ahead_or_once_run_from_the_cache_without_nvrtc() {
    if !available("kernels_compiled_ahead_or_once_run_from_the_cache_without_nvrtc")
        || !can_run(
            "kernels_compiled_ahead_or_once_run_from_the_cache_without_nvrtc",
            "cuda-sm120 (emulated driver)",
            dsv4_backend_cuda::nvrtc::nvrtc_probe(),
        )
    {
        return;
    }
    // A relative cache directory (taken from the working directory, as a user would give it).
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("kernel-cache");
    let run = |cached_only: bool| {
        let mut cmd = dsv4(
            dir.path(),
            &[
                "--set",
                "backend.kind=cuda-sm120",
                "generate",
                "--prompt",
                "hello there",
                "--max-tokens",
                "4",
                "--json",
            ],
        );
        cmd.env("DSV4_CACHE_DIR", "kernel-cache")
            .env("DSV4_CUDA_DRIVER", "emu");
        if cached_only {
            cmd.env("DSV4_CUDA_KERNELS", "cached");
        }
        common::run(cmd)
    };
    // Nothing cached yet: cached-only is a clear error naming what to do.
    let out = run(true);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{e}");
    assert!(
        e.contains("DSV4_CUDA_KERNELS=cached and no cached CUBIN for sm_90 (f64 accumulation)")
            && e.contains("`dsv4 kernels compile --arch 9.0 --sums f64`"),
        "{e}"
    );
    // That command fills the cache without a GPU (auto sums: f64 on sm_90)...
    let doc: serde_json::Value = serde_json::from_slice(
        &common::run(dsv4(
            dir.path(),
            &[
                "kernels",
                "compile",
                "--arch",
                "sm_90",
                "--cache-dir",
                "kernel-cache",
                "--json",
            ],
        ))
        .stdout,
    )
    .expect("JSON");
    let cubin = &doc["cubins"][0];
    assert_eq!(
        (&cubin["arch"], &cubin["sums"]),
        (&"sm_90".into(), &"f64".into())
    );
    let path = std::path::PathBuf::from(cubin["path"].as_str().unwrap());
    assert!(path.starts_with(&cache), "{path:?} in {cache:?}");
    let ahead = std::fs::read(&path).unwrap();
    assert_eq!(ahead.len() as u64, cubin["bytes"].as_u64().unwrap());
    let kernels = cubin["kernels"].as_array().unwrap();
    assert!(
        kernels
            .iter()
            .any(|k| k["name"] == "linear_fp8_mma" && k["registers"].as_u64() > Some(0)),
        "ptxas's report of every kernel: {cubin}"
    );
    // ... and cached-only runs from it.
    let precompiled = run(true);
    assert!(
        precompiled.status.success(),
        "{}",
        String::from_utf8_lossy(&precompiled.stderr)
    );
    // Without a cache, one run with NVRTC compiles and caches the same file; then no compiler
    // is needed.
    std::fs::remove_dir_all(&cache).unwrap();
    let compiled = run(false);
    assert!(
        compiled.status.success(),
        "{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        ahead,
        "the backend caches the command's CUBIN, bit for bit, under the same name"
    );
    let cubins = std::fs::read_dir(cache.join("cuda-kernels"))
        .unwrap()
        .count();
    assert_eq!(cubins, 1, "one cached CUBIN");
    let cached = run(true);
    assert!(
        cached.status.success(),
        "{}",
        String::from_utf8_lossy(&cached.stderr)
    );
    let ids = |o: &std::process::Output| {
        serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("JSON")["completion_ids"]
            .clone()
    };
    assert_eq!(ids(&cached), ids(&compiled));
    assert_eq!(ids(&precompiled), ids(&compiled));
}

#[test]
fn bench_reports_the_device_section_for_a_cuda_backend() {
    if !available("bench_reports_the_device_section_for_a_cuda_backend") {
        return;
    }
    // The fp8 decode kernels of a shape other than the default (DSV4_CUDA_DECODE); the
    // markdown on stdout, the JSON in a file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.json");
    let mut cmd = dsv4(
        dir.path(),
        &[
            "bench",
            "--backend",
            "cuda-emu",
            "--no-machine",
            "--no-ops",
            "--no-e2e",
            "--no-serving",
            "--out",
            path.to_str().unwrap(),
        ],
    );
    cmd.env("DSV4_CUDA_DECODE", "fp8=c4w4");
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let md = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let d = &v["device"][0];
    assert_eq!(d["backend"], "cuda-emu", "{v}");
    assert_eq!(d["peaks"]["emulated"], true, "{d}");
    assert!(
        d["peaks"]["copy_gbs"].as_f64().is_some_and(|x| x > 0.0),
        "{d}"
    );
    let linear = d["linear"].as_array().expect("linear cases");
    assert!(!linear.is_empty());
    for t in linear {
        assert!(
            t["of_copy_bandwidth"].as_f64().is_some_and(f64::is_finite),
            "{t}"
        );
    }
    // Every case on the SIMT kernels, and again on tensor cores.
    let on = |path: &str| linear.iter().filter(|t| t["path"] == path).count();
    assert_eq!(on("simt"), on("mma"), "{v}");
    assert_eq!(on("simt") + on("mma"), linear.len(), "{v}");
    // The one-row SIMT rows name their shape; every fp8 and MXFP4 decode case is timed on
    // each compiled shape, the backend's (the environment's c4w4 for fp8) marked.
    for t in linear {
        let decode = t["rows"] == 1 && t["path"] == "simt";
        let fp8 = t["case"]
            .as_str()
            .is_some_and(|c| c.starts_with("gemv_fp8"));
        // c4w4: fp8's by the environment, MXFP4's and bf16's by default.
        let want = if decode {
            serde_json::json!("c4w4")
        } else {
            serde_json::Value::Null
        };
        assert_eq!(t["shape"], want, "{t}");
        if !decode
            || t["case"]
                .as_str()
                .is_some_and(|c| c.starts_with("gemv_bf16"))
        {
            continue;
        }
        let shapes: Vec<&serde_json::Value> = d["decode_shapes"]
            .as_array()
            .expect("decode shapes")
            .iter()
            .filter(|s| s["case"] == t["case"])
            .collect();
        let names: Vec<&str> = shapes.iter().filter_map(|s| s["shape"].as_str()).collect();
        let compiled: &[&str] = if fp8 {
            &["c2w8", "c2w4", "c4w4", "c1w8", "c2w8p2", "c2w8p3", "c1w8p3"]
        } else {
            &["c4w4", "c2w4", "c2w8", "c2w4p2", "c1w8p3"]
        };
        assert_eq!(names, compiled, "{t}");
        for s in shapes {
            assert_eq!(s["selected"], s["shape"] == want, "{s}");
            assert!(s["speedup"].as_f64().is_some_and(|x| x > 0.0), "{s}");
        }
    }
    // The suggested shapes: per format, another shape only where its slowest case beats the
    // backend's by the margin, read back from the rows (the emulator's times mean nothing, so
    // whichever shape it picks, the rule must hold).
    let sg = &d["decode_suggestion"];
    let mut value = Vec::new();
    for (format, current) in [("fp8", "c4w4"), ("mxfp4", "c4w4")] {
        let choice = sg["formats"]
            .as_array()
            .expect("suggested formats")
            .iter()
            .find(|f| f["format"] == format)
            .unwrap_or_else(|| panic!("no {format} in {sg}"));
        assert_eq!(choice["current"], current, "{sg}");
        let rows: Vec<&serde_json::Value> = d["decode_shapes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["format"] == format)
            .collect();
        let worst = |shape: &str| {
            rows.iter()
                .filter(|r| r["shape"] == shape)
                .filter_map(|r| r["speedup"].as_f64())
                .fold(f64::INFINITY, f64::min)
        };
        let best_other = rows
            .iter()
            .filter_map(|r| r["shape"].as_str())
            .filter(|s| *s != current)
            .map(|s| (s, worst(s)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        assert_eq!(choice["runner_up"]["shape"], best_other.0, "{sg}");
        assert_eq!(
            choice["runner_up"]["worst_speedup"].as_f64(),
            Some(best_other.1),
            "{sg}"
        );
        let shape = choice["shape"].as_str().unwrap();
        if best_other.1 >= 1.02 {
            assert_eq!(shape, best_other.0, "{sg}");
            assert_eq!(choice["worst_speedup"].as_f64(), Some(best_other.1), "{sg}");
        } else {
            assert_eq!(shape, current, "{sg}");
        }
        value.push(format!("{format}={shape}"));
    }
    assert_eq!(sg["cuda_decode"], value.join(","), "{sg}");
    // The markdown names it as a --set line.
    assert!(
        md.contains(&format!("`--set backend.cuda_decode={}`", value.join(","))),
        "{md}"
    );
    // A MoE layer with the routing on the device against host-built groups.
    let r = &d["routing"];
    for key in [
        "device_seconds",
        "route_seconds",
        "host_grouped_seconds",
        "ratio",
    ] {
        assert!(
            r[key].as_f64().is_some_and(|x| x > 0.0 && x.is_finite()),
            "{key}: {r}"
        );
    }
}

//! The wgpu backend end to end through the `dsv4` binary: the op sweep and tiny-model diffs
//! against the reference, and `dsv4 serve --set backend.kind=wgpu` answering a chat completion.
//!
//! Needs a wgpu adapter (on CPU-only Linux: Mesa's lavapipe, `apt-get install
//! mesa-vulkan-drivers libvulkan1`). Without one each test prints why and skips, except under
//! CI=true, where a missing adapter is a failure.

mod common;

use common::{
    PAIRWISE_NUMERICS, can_run, diff_passes, dsv4, every_numerics, model_diff_in_numerics, run,
    with_kv,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Whether the wgpu backend can run here; prints the reason and skips (or fails under CI).
fn available(test: &str) -> bool {
    can_run(test, "wgpu", dsv4_backend_wgpu::probe())
}

#[test]
fn the_op_sweep_passes_against_the_reference() {
    if !available("the_op_sweep_passes_against_the_reference") {
        return;
    }
    let args = [
        "diff",
        "--backend",
        "reference",
        "--against",
        "wgpu",
        "--ops",
    ];
    diff_passes(&args, &[]);
    // The f32 accumulation path of devices without SHADER_F64 passes the op tolerances too.
    diff_passes(&args, &[(dsv4_backend_wgpu::FORCE_F32_ENV, "1")]);
}

#[test]
fn the_tiny_model_matches_the_reference_in_every_numerics_combination() {
    if !available("the_tiny_model_matches_the_reference_in_every_numerics_combination") {
        return;
    }
    // 72 prompt tokens: 18 entries in the C4 layers, so the indexer's top-16 really selects.
    model_diff_in_numerics("wgpu", &[], "72", &every_numerics(), |_, _| {});
}

/// The small config (hidden 1024, 32 experts, 8 layers) with random weights, at scale, against
/// the reference in the pairwise numerics combinations with the kv cache dtype `kv` (a test per
/// kv dtype, so the two halves run in parallel). The full product of numerics knobs is the tiny
/// test's job; [`PAIRWISE_NUMERICS`] holds every pair of values, and a short prompt keeps each
/// half on lavapipe to under a minute (compression and top-k selection at length are the tiny
/// test's job too; scripts/diff-all-numerics.sh wgpu runs all twelve over 192 tokens).
fn small_config_matches(test: &str, kv: &str) {
    if !available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("small");
    let model = model.to_str().unwrap();
    let out = run(dsv4(
        dir.path(),
        &["model", "init-random", "--config", "small", "--out", model],
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = format!("model.path={model}");
    let combos = with_kv(&PAIRWISE_NUMERICS, kv);
    model_diff_in_numerics("wgpu", &["--set", &path], "24", &combos, |_, _| {});
}

#[test]
fn the_small_config_with_a_bf16_kv_cache_matches_the_reference_in_pairwise_numerics() {
    small_config_matches(
        "the_small_config_with_a_bf16_kv_cache_matches_the_reference_in_pairwise_numerics",
        "bf16",
    );
}

#[test]
fn the_small_config_with_an_fp8_kv_cache_matches_the_reference_in_pairwise_numerics() {
    small_config_matches(
        "the_small_config_with_an_fp8_kv_cache_matches_the_reference_in_pairwise_numerics",
        "fp8",
    );
}

#[test]
fn serve_on_wgpu_answers_a_chat_completion() {
    if !available("serve_on_wgpu_answers_a_chat_completion") {
        return;
    }
    let mut cmd = dsv4(
        &std::env::temp_dir(),
        &["--set", "backend.kind=wgpu", "serve", "--port", "0"],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("dsv4 serve starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first line").unwrap();
    std::thread::spawn(move || for _ in lines {});
    let addr = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .unwrap_or_else(|| panic!("no URL in {first:?}"))
        .trim_end_matches('/')
        .to_string();
    let body =
        r#"{"model":"dsv4-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
    let deadline = Instant::now() + Duration::from_secs(120);
    let answer = loop {
        let attempt = TcpStream::connect(&addr).and_then(|mut s| {
            write!(
                s,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        });
        match attempt {
            Ok(a) if a.starts_with("HTTP/1.1 200") => break a,
            other => {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("no chat completion from dsv4 serve on wgpu: {other:?}");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let json = &answer[answer.find("\r\n\r\n").expect("a body") + 4..];
    let doc: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(doc["object"], "chat.completion", "{doc}");
    assert!(doc["choices"][0]["message"].is_object(), "{doc}");
    assert!(
        doc["usage"]["completion_tokens"].as_u64().unwrap_or(0) >= 1,
        "{doc}"
    );
}

//! The CUDA backends' knobs through the `dsv4` binary: each `backend.cuda_*` profile key checked
//! and required to agree with its `DSV4_CUDA_*` environment variable, and every bad value of the
//! backend's environment variables (driver, kernel source, emulated schedule and capability,
//! linear path, decode shapes) a clear error.
//!
//! Needs a host C++ compiler (the emulator builds the kernels with it), and NVRTC for the knobs
//! read after the backend's probe. Without them the tests print why and skip, except under
//! CI=true, where that is a failure.

mod common;

use common::{can_run, dsv4};

fn available(test: &str) -> bool {
    can_run(test, "cuda-emu", dsv4_backend_cuda::emu::probe())
}

#[test]
fn cuda_knobs_in_the_profile_are_checked_and_must_agree_with_the_environment() {
    if !available("cuda_knobs_in_the_profile_are_checked_and_must_agree_with_the_environment") {
        return;
    }
    let fails_with = |sets: &[&str], env: &[(&str, &str)], want: &str| {
        let mut args = vec!["--set", "backend.kind=cuda-emu"];
        sets.iter().for_each(|s| args.extend(["--set", s]));
        args.extend(["generate", "--prompt", "hi", "--max-tokens", "1"]);
        let mut cmd = dsv4(&std::env::temp_dir(), &args);
        cmd.envs(env.iter().copied());
        let e = common::fails(cmd);
        assert!(e.contains(want), "{sets:?} {env:?}: {e}");
    };
    fails_with(
        &["backend.cuda_sums=f16"],
        &[],
        "bad value `f16` for `backend.cuda_sums` in --set backend.cuda_sums=f16: expected one of: \
         auto, f64, f32",
    );
    fails_with(
        &["backend.cuda_linear=wmma"],
        &[],
        "bad value `wmma` for `backend.cuda_linear` in --set backend.cuda_linear=wmma: expected \
         one of: auto, simt, mma",
    );
    fails_with(
        &["backend.cuda_sums=f32"],
        &[("DSV4_CUDA_ACC", "f64")],
        "backend.cuda_sums = f32 but DSV4_CUDA_ACC=f64",
    );
    fails_with(
        &["backend.cuda_linear=simt"],
        &[("DSV4_CUDA_LINEAR", "mma")],
        "backend.cuda_linear = simt but DSV4_CUDA_LINEAR=mma",
    );
    fails_with(
        &["backend.cuda_routing=gpu"],
        &[],
        "bad value `gpu` for `backend.cuda_routing` in --set backend.cuda_routing=gpu: expected \
         one of: auto, device, host",
    );
    fails_with(
        &["backend.cuda_routing=host"],
        &[("DSV4_CUDA_ROUTING", "device")],
        "backend.cuda_routing = host but DSV4_CUDA_ROUTING=device",
    );
    fails_with(
        &[],
        &[("DSV4_CUDA_ROUTING", "gpu")],
        "DSV4_CUDA_ROUTING=gpu: expected device or host",
    );
    fails_with(
        &["backend.cuda_attention=gpu"],
        &[],
        "bad value `gpu` for `backend.cuda_attention` in --set backend.cuda_attention=gpu: \
         expected one of: auto, device, host",
    );
    fails_with(
        &["backend.cuda_attention=device"],
        &[("DSV4_CUDA_ATTENTION", "host")],
        "backend.cuda_attention = device but DSV4_CUDA_ATTENTION=host",
    );
    fails_with(
        &[],
        &[("DSV4_CUDA_ATTENTION", "on")],
        "DSV4_CUDA_ATTENTION=on: expected device or host",
    );
    fails_with(
        &["backend.cuda_page_cache_mib=1G"],
        &[],
        "bad value `1G` for `backend.cuda_page_cache_mib` in --set \
         backend.cuda_page_cache_mib=1G: expected \"auto\" or a non-negative integer",
    );
    fails_with(
        &["backend.cuda_page_cache_mib=512"],
        &[("DSV4_CUDA_PAGE_CACHE_MIB", "0")],
        "backend.cuda_page_cache_mib = 512 but DSV4_CUDA_PAGE_CACHE_MIB=0",
    );
    fails_with(
        &["backend.cuda_decode=fp8=c2w16"],
        &[],
        "backend.cuda_decode = fp8=c2w16: no fp8 decode kernels of shape c2w16: compiled are \
         c2w8, c2w4, c4w4, c1w8, c2w8p2, c2w8p3, c1w8p3",
    );
    fails_with(
        &["backend.cuda_decode=mxfp4=c1w8p3"],
        &[("DSV4_CUDA_DECODE", "mxfp4=c2w4")],
        "backend.cuda_decode = fp8=c2w8,mxfp4=c1w8p3 but DSV4_CUDA_DECODE=fp8=c2w8,mxfp4=c2w4",
    );
}

#[test]
fn an_unknown_driver_choice_schedule_capability_or_kernel_source_is_a_clear_error() {
    let fails_with = |env: &[(&str, &str)], want: &str| {
        let mut cmd = dsv4(
            &std::env::temp_dir(),
            &[
                "--set",
                "backend.kind=cuda-sm120",
                "generate",
                "--prompt",
                "hi",
            ],
        );
        cmd.envs(env.iter().copied());
        let e = common::fails(cmd);
        assert!(e.contains(want), "{env:?}: {e}");
    };
    fails_with(
        &[("DSV4_CUDA_DRIVER", "gpu-please")],
        "DSV4_CUDA_DRIVER=gpu-please: expected `emu`",
    );
    fails_with(
        &[
            ("DSV4_CUDA_DRIVER", "emu"),
            ("DSV4_CUDA_KERNELS", "sometimes"),
        ],
        "DSV4_CUDA_KERNELS=sometimes: expected `auto`",
    );
    fails_with(
        &[
            ("DSV4_CUDA_DRIVER", "emu"),
            ("DSV4_CUDA_EMU_SCHEDULE", "random"),
        ],
        "DSV4_CUDA_EMU_SCHEDULE=random: expected `deferred`",
    );
    for cc in ["7.5", "nine", "9"] {
        fails_with(
            &[("DSV4_CUDA_DRIVER", "emu"), ("DSV4_CUDA_EMU_CC", cc)],
            &format!("DSV4_CUDA_EMU_CC={cc}: `{cc}` is not a compute capability"),
        );
    }
    // The linear and decode knobs are read once the backend's probe has found NVRTC (without
    // it, that is the error).
    if !can_run(
        "an_unknown_driver_choice_schedule_capability_or_kernel_source_is_a_clear_error \
         (linear and decode knobs)",
        "cuda-sm120 (emulated driver)",
        dsv4_backend_cuda::nvrtc::nvrtc_probe(),
    ) {
        return;
    }
    fails_with(
        &[("DSV4_CUDA_DRIVER", "emu"), ("DSV4_CUDA_LINEAR", "wmma")],
        "DSV4_CUDA_LINEAR=wmma: unknown linear path `wmma`: expected simt or mma",
    );
    fails_with(
        &[
            ("DSV4_CUDA_DRIVER", "emu"),
            ("DSV4_CUDA_DECODE", "fp8=c8w4"),
        ],
        "DSV4_CUDA_DECODE=fp8=c8w4: no fp8 decode kernels of shape c8w4: compiled are c2w8, \
         c2w4, c4w4, c1w8, c2w8p2, c2w8p3, c1w8p3",
    );
}

//! The CI compile check of the CUDA kernels: NVRTC compiles them for sm_80, sm_90 and sm_120 in
//! both accumulation modes without a single error or warning, and the PTX has an entry for every
//! kernel. Needs only libnvrtc (no GPU): `python3 -m pip install nvidia-cuda-nvrtc-cu12`.
//! Skips with a reason when NVRTC is missing, except under CI=true, where that fails.

#![cfg(feature = "cuda")]

mod common;

use common::can_run;
use common::selftest::selftest_tu;

use dsv4_backend_cuda::{CudaError, kernels, nvrtc};

const ARCHS: [(u32, u32); 3] = [(8, 0), (9, 0), (12, 0)];

fn available(test: &str) -> bool {
    can_run(test, "NVRTC", nvrtc::nvrtc_probe())
}

fn assert_entries(ptx: &str, names: &[String], what: &str) {
    for name in names {
        assert!(
            ptx.contains(&format!(".entry {name}(")),
            "{what}: the PTX has no entry for kernel `{name}`"
        );
    }
}

#[test]
fn the_kernels_compile_without_warnings_for_every_architecture() {
    if !available("the_kernels_compile_without_warnings_for_every_architecture") {
        return;
    }
    let names = kernels::kernel_names();
    for arch in ARCHS {
        for acc_f64 in [true, false] {
            let what = format!("sm_{}{} acc_f64={acc_f64}", arch.0, arch.1);
            let ptx = nvrtc::compile_ptx(arch, acc_f64).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(ptx.contains(".version"), "{what}: not PTX:\n{ptx}");
            assert!(
                ptx.contains(&format!(".target sm_{}{}", arch.0, arch.1)),
                "{what}: wrong target"
            );
            assert_entries(&ptx, &names, &what);
        }
    }
}

#[test]
fn the_emulator_selftest_kernels_are_valid_cuda() {
    // The emulator's shim (emu/shim.h) and NVRTC must accept the same dialect: the selftest
    // kernels use every construct of it.
    if !available("the_emulator_selftest_kernels_are_valid_cuda") {
        return;
    }
    let tu = selftest_tu();
    let names: Vec<String> = tu
        .match_indices("__global__ void ")
        .map(|(i, _)| {
            let rest = &tu[i + "__global__ void ".len()..];
            rest[..rest.find('(').unwrap()].trim().to_string()
        })
        .collect();
    assert!(names.len() >= 8, "{names:?}");
    for arch in ARCHS {
        for acc_f64 in [true, false] {
            let what = format!("selftest sm_{}{} acc_f64={acc_f64}", arch.0, arch.1);
            let ptx = nvrtc::compile_source(&tu, "selftest.cu", arch, acc_f64)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_entries(&ptx, &names, &what);
        }
    }
}

#[test]
fn a_warning_fails_the_compile_with_the_log() {
    if !available("a_warning_fails_the_compile_with_the_log") {
        return;
    }
    let src = "extern \"C\" __global__ void k(float* o) { int unused_thing; o[0] = 1.0f; }\n";
    match nvrtc::compile_source(src, "warn.cu", (9, 0), true) {
        Err(CudaError::Compile { target, log }) => {
            assert_eq!(target, "sm_90");
            assert!(
                log.contains("warn.cu") && log.contains("unused_thing"),
                "{log}"
            );
        }
        other => panic!("expected the warning to fail the compile, got {other:?}"),
    }
    let src = "extern \"C\" __global__ void k(float* o) { o[0] = not_declared; }\n";
    match nvrtc::compile_source(src, "err.cu", (12, 0), false) {
        Err(CudaError::Compile { target, log }) => {
            assert_eq!(target, "sm_120");
            assert!(log.contains("not_declared"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn cubins_assemble_for_real_architectures() {
    if !available("cubins_assemble_for_real_architectures") {
        return;
    }
    let names = kernels::kernel_names();
    // sm_90 with both sums: the fp8 decode kernels' occupancy bounds depend on the sums
    // (linear.cu), and the bounds that spilled did so on sm_90 (and sm_80).
    for (arch, f64_sums) in [((9, 0), true), ((9, 0), false), ((12, 0), false)] {
        let what = format!(
            "sm_{}{} ({} sums)",
            arch.0,
            arch.1,
            if f64_sums { "f64" } else { "f32" }
        );
        let (cubin, resources) = nvrtc::compile_cubin_with_resources(arch, f64_sums)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "{what}: not an ELF image");
        // ptxas reports every kernel, and none spills registers to local memory (the table:
        // `dsv4 kernels compile --arch 9.0 --resources`).
        for name in &names {
            let k = resources
                .iter()
                .find(|k| &k.name == name)
                .unwrap_or_else(|| panic!("{what}: no ptxas report for `{name}`"));
            assert!(
                (1..=255).contains(&k.registers),
                "{what}: {name} uses {} registers",
                k.registers
            );
            assert_eq!(
                (k.spill_stores, k.spill_loads),
                (0, 0),
                "{what}: {name} spills registers"
            );
        }
    }
}

/// Static shared memory per kernel, from the PTX: NVRTC declares each kernel's `__shared__`
/// arrays at module scope as `.shared [.align A] .<type><bits> _ZZ<len><kernel>E<var>[N];`.
/// Arrays not named after a kernel (there should be none) count against every kernel.
fn shared_bytes_per_kernel(ptx: &str) -> (std::collections::HashMap<String, usize>, usize) {
    let mut per = std::collections::HashMap::new();
    let mut unowned = 0;
    for line in ptx
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(".shared "))
    {
        let toks: Vec<&str> = line.trim_end_matches(';').split_whitespace().collect();
        let ty = toks.iter().find(|t| {
            t.len() > 2 && t.starts_with('.') && t[2..].chars().all(|c| c.is_ascii_digit())
        });
        let bits: usize = ty.map_or(8, |t| t[2..].parse().unwrap());
        let decl = toks.last().unwrap();
        let (name, count) = match decl.split_once('[') {
            Some((n, c)) => (n, c.trim_end_matches(']').parse::<usize>().unwrap_or(1)),
            None => (*decl, 1),
        };
        let bytes = count * bits / 8;
        let kernel = name.strip_prefix("_ZZ").and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let len: usize = digits.parse().ok()?;
            rest.get(digits.len()..digits.len() + len)
                .map(str::to_string)
        });
        match kernel {
            Some(k) => *per.entry(k).or_insert(0) += bytes,
            None => unowned += bytes,
        }
    }
    (per, unowned)
}

#[test]
fn every_kernel_fits_the_static_shared_memory_limit() {
    if !available("every_kernel_fits_the_static_shared_memory_limit") {
        return;
    }
    const LIMIT: usize = 48 * 1024; // static __shared__ per block, every architecture
    for (arch, acc_f64) in [((9, 0), true), ((12, 0), false)] {
        let ptx = nvrtc::compile_ptx(arch, acc_f64).unwrap();
        let (per, unowned) = shared_bytes_per_kernel(&ptx);
        for name in kernels::kernel_names() {
            let bytes = per.get(&name).copied().unwrap_or(0) + unowned;
            assert!(
                bytes <= LIMIT,
                "kernel {name} uses {bytes} bytes of static shared memory (limit {LIMIT}) on sm_{}{}",
                arch.0,
                arch.1
            );
        }
    }
    // The parser itself, on the two declaration shapes NVRTC emits.
    let (per, unowned) = shared_bytes_per_kernel(
        "\t.shared .align 8 .b8 _ZZ8rms_normE4part[64];\n.shared .align 4 .f32 _ZZ3fooE1s[10];\n.shared .b32 g[4];",
    );
    assert_eq!((per["rms_norm"], per["foo"], unowned), (64, 40, 16));
}

//! Availability of the two registry entries: `cuda-sm120` reports why it cannot run (no driver,
//! no GPU) without panicking, and `cuda-emu` runs wherever a C++ compiler is.

use dsv4_kernels::{BackendOptions, KernelError, registry};

fn create_err(name: &str, opts: &BackendOptions) -> KernelError {
    match registry::create(name, opts) {
        Ok(b) => panic!("{name} was created: {}", b.name()),
        Err(e) => e,
    }
}

#[test]
fn both_backends_are_registered() {
    dsv4_backend_cuda::link();
    let names = registry::names();
    for n in [dsv4_backend_cuda::NAME, dsv4_backend_cuda::EMU_NAME] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
}

#[cfg(feature = "cuda")]
#[test]
fn without_a_driver_the_gpu_backend_is_unavailable_with_the_reason() {
    let probe = dsv4_backend_cuda::cuda::probe();
    if probe.is_ok() {
        // A machine with a GPU: a bad selector is still an error naming it.
        let opts = BackendOptions {
            device: Some("first".into()),
            ..Default::default()
        };
        let e = create_err(dsv4_backend_cuda::NAME, &opts).to_string();
        assert!(e.contains("`first`"), "{e}");
        eprintln!("a CUDA device is present; the no-driver checks do not apply");
        return;
    }
    let reason = probe.unwrap_err();
    if std::path::Path::new("/proc/driver/nvidia").exists() {
        eprintln!("NVIDIA driver present but unusable here: {reason}");
    } else {
        assert!(reason.contains("libcuda"), "{reason}");
    }
    assert_eq!(
        dsv4_backend_cuda::cuda::probe(),
        Err(reason.clone()),
        "cached"
    );
    match create_err(dsv4_backend_cuda::NAME, &BackendOptions::default()) {
        KernelError::Unavailable { name, reason: r } => {
            assert_eq!(name, "cuda-sm120");
            assert_eq!(r, reason);
        }
        other => panic!("expected Unavailable, got {other}"),
    }
    let e = dsv4_backend_cuda::cuda::open(0, None).unwrap_err();
    assert!(
        matches!(e, dsv4_backend_cuda::CudaError::Unavailable(_)),
        "{e}"
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_cuda_feature_the_gpu_backend_says_so() {
    match create_err(dsv4_backend_cuda::NAME, &BackendOptions::default()) {
        KernelError::Unavailable { reason, .. } => {
            assert!(
                reason.contains("built without the `cuda` feature"),
                "{reason}"
            )
        }
        other => panic!("expected Unavailable, got {other}"),
    }
}

#[test]
fn the_emulator_entry_creates_a_backend_where_a_compiler_is() {
    match dsv4_backend_cuda::emu::probe() {
        Ok(()) => {
            let b = registry::create(dsv4_backend_cuda::EMU_NAME, &BackendOptions::default())
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(b.name(), "cuda-emu");
        }
        Err(reason) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and the cuda-emu emulator cannot run: {reason}");
            }
            assert!(reason.contains("apt-get install g++"), "{reason}");
            let e = create_err(dsv4_backend_cuda::EMU_NAME, &BackendOptions::default());
            assert!(matches!(e, KernelError::Unavailable { .. }), "{e}");
        }
    }
}

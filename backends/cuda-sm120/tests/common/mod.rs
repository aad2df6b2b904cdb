//! What the crate's tests share: skipping a test when the machine lacks what it needs.
#![allow(dead_code)] // each test binary uses its own subset

/// Whether `what` (the emulator, NVRTC) is available, `probe` being its probe's answer. Prints the
/// reason and skips (false), except under CI=true, where a missing requirement fails the test.
pub fn can_run(test: &str, what: &str, probe: Result<(), String>) -> bool {
    match probe {
        Ok(()) => true,
        Err(reason) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and {what} cannot run: {reason}");
            }
            eprintln!("SKIP {test}: {reason}");
            false
        }
    }
}

/// Whether the CPU emulator can run here (see [`can_run`]).
pub fn emu_available(test: &str) -> bool {
    can_run(test, "the cuda emulator", dsv4_backend_cuda::emu::probe())
}

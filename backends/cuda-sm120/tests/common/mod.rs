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

/// The logits' bits of a 16-token prefill and four decode steps of the tiny model `m` under
/// `exec`, and the device traffic of each decode step.
pub fn tiny_decode(
    m: &dsv4_model::Model,
    exec: &dsv4_model::forward::ExecOptions,
) -> (Vec<u32>, Vec<dsv4_kernels::DeviceStats>) {
    let mut seq = m.new_sequence();
    let (mut bits, mut stats) = (Vec::new(), Vec::new());
    let prompt: Vec<u32> = (0..16).map(|i| 3 + 7 * i).collect();
    for (i, step) in [&prompt[..], &[11], &[12], &[13], &[14]].iter().enumerate() {
        let (out, report) = m
            .forward_step(
                &mut [&mut seq],
                &[step],
                exec,
                &mut dsv4_model::forward::Taps::none(),
            )
            .expect("step");
        bits.extend(out[0].logits.iter().map(|x| x.to_bits()));
        if i > 0 {
            stats.push(report.device.expect("device traffic is reported"));
        }
    }
    (bits, stats)
}

/// The execution modes a decode test compares, named: eager (serial, not captured), captured
/// (graphs on a device backend) and captured with overlap streams on the threaded executor.
pub fn exec_modes() -> [(&'static str, dsv4_model::forward::ExecOptions); 3] {
    use dsv4_model::forward::{ExecOptions, Executor};
    let eager = ExecOptions {
        captured: false,
        executor: Executor::Serial,
        ..Default::default()
    };
    let captured = ExecOptions {
        captured: true,
        ..eager.clone()
    };
    let threaded = ExecOptions {
        overlap: true,
        executor: Executor::Threaded,
        ..captured.clone()
    };
    [
        ("eager", eager),
        ("captured", captured),
        ("threaded overlap", threaded),
    ]
}

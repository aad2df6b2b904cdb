//! A kernel fault on the emulated driver (`DSV4_CUDA_DRIVER=emu`), as on a GPU: with the default
//! deferred schedule the launch itself succeeds (its work is queued) and the next
//! synchronisation reports `CUDA_ERROR_ILLEGAL_ADDRESS`; with `DSV4_CUDA_EMU_SCHEDULE=issue` the
//! launch reports it. Either way the fault is sticky: every later call fails with it. In a test
//! binary of its own, since a sticky fault leaves the process's driver unusable.
//!
//! Needs NVRTC and a host C++ compiler; without them the test prints why and skips, except under
//! CI=true, where that is a failure.

#![cfg(feature = "cuda")]

mod common;

use common::can_run;
use dsv4_backend_cuda::cuda::{self, DriverLib};
use dsv4_backend_cuda::{KArg, NAME, open_backend};
use dsv4_kernels::BackendOptions;

#[test]
fn a_fault_in_queued_work_is_reported_by_the_next_wait_and_sticks() {
    cuda::select_driver(DriverLib::Emulated).expect("nothing chose another driver");
    let test = "a_fault_in_queued_work_is_reported_by_the_next_wait_and_sticks";
    if !can_run(test, "the emulated CUDA driver", cuda::probe()) {
        return;
    }
    let be = open_backend(NAME, &BackendOptions::default()).expect("open cuda-sm120");
    let dev = be.device();
    // 16 bytes hold 4 floats; scaling 20 writes 64 bytes past the end, into the guard bytes.
    let x = dev.alloc(16).expect("alloc");
    let args = [KArg::Buf(&x), KArg::U64(20), KArg::F64(2.0)];
    // SAFETY: scale_f64's parameters; the overrun lands in the driver's guard bytes, which it
    // checks after the kernel (the point of this test).
    let launched = unsafe { dev.launch("scale_f64", (1, 1, 1), (32, 1, 1), &args) };
    let fault = if cuda::emulated_schedule_deferred() == Ok(true) {
        launched.expect("the launch is queued: nothing has run yet");
        dev.synchronize()
            .expect_err("the synchronisation runs the kernel and reports its fault")
    } else {
        launched.expect_err("issued at once, the launch reports its fault")
    };
    assert!(
        fault.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{fault}"
    );
    let messages = cuda::emulated_driver_failures();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("kernel scale_f64 wrote outside the allocation")),
        "{messages:?}"
    );
    // Sticky: a later allocation, launch or synchronisation fails with the same error.
    let later = [
        dev.alloc(16).map(drop),
        dev.synchronize(),
        dev.upload(&[1, 2, 3, 4]).map(drop),
    ];
    for r in later {
        let e = r.expect_err("the fault is sticky");
        assert!(e.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    }
}

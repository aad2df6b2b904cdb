//! The errors a cuda-emu launch reports instead of hanging or corrupting memory, each the
//! emulator's stand-in for what a GPU would do: a thread leaving before a barrier, a deadlock,
//! CUDA's launch limits, a compile error, a write outside a buffer, a misaligned access.

mod common;

use common::emu_available;
use common::selftest::{f32s, own_dev, u32s};
use dsv4_backend_cuda::{CudaError, KArg, emu};

fn available(test: &str) -> bool {
    emu_available(test)
}

#[test]
fn a_thread_exiting_before_a_barrier_is_an_error_not_a_hang() {
    if !available("a_thread_exiting_before_a_barrier_is_an_error_not_a_hang") {
        return;
    }
    let d = &own_dev();
    let out = d.alloc(64 * 4).unwrap();
    let e = unsafe {
        d.launch(
            "st_exit_before_barrier",
            (2, 1, 1),
            (64, 1, 1),
            &[KArg::Buf(&out)],
        )
    }
    .and_then(|()| d.synchronize())
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("st_exit_before_barrier")
            && msg.contains("thread (5,0,0)")
            && msg.contains("exited while others wait at __syncthreads"),
        "{msg}"
    );
    let e = unsafe {
        d.launch(
            "st_split_barrier",
            (1, 1, 1),
            (64, 1, 1),
            &[KArg::Buf(&out)],
        )
    }
    .and_then(|()| d.synchronize())
    .unwrap_err();
    assert!(e.to_string().contains("deadlock"), "{e}");
    // The device still works after failed launches (their fibers are restarted).
    let fill = d.alloc(100 * 4).unwrap();
    unsafe {
        d.launch(
            "st_fill",
            (1, 1, 1),
            (128, 1, 1),
            &[KArg::Buf(&fill), KArg::U32(100)],
        )
    }
    .unwrap();
    assert_eq!(u32s(d, &fill, 100), (0..100).collect::<Vec<u32>>());
}

#[test]
fn invalid_launch_shapes_and_unknown_kernels_are_errors() {
    if !available("invalid_launch_shapes_and_unknown_kernels_are_errors") {
        return;
    }
    let d = &own_dev();
    let out = d.alloc(4096).unwrap();
    let e = unsafe { d.launch("no_such_kernel", (1, 1, 1), (32, 1, 1), &[KArg::Buf(&out)]) }
        .unwrap_err();
    assert_eq!(e, CudaError::NoSuchKernel("no_such_kernel".into()));
    let args = [KArg::Buf(&out), KArg::U32(0)];
    let e = unsafe { d.launch("st_fill", (1, 1, 1), (1025, 1, 1), &args) }.unwrap_err();
    assert!(e.to_string().contains("invalid block"), "{e}");
    let e = unsafe { d.launch("st_fill", (1, 70000, 1), (32, 1, 1), &args) }.unwrap_err();
    assert!(e.to_string().contains("invalid grid"), "{e}");
}

#[test]
fn a_compile_error_surfaces_the_compiler_log() {
    if !available("a_compile_error_surfaces_the_compiler_log") {
        return;
    }
    let tu = "#line 1 \"broken.cu\"\nextern \"C\" __global__ void broken(float* o) {\n  o[0] = undeclared_thing;\n}\n";
    match emu::open_with_source(tu, true) {
        Err(CudaError::Compile { target, log }) => {
            assert_eq!(target, "cuda-emu (c++)");
            assert!(
                log.contains("broken.cu:2") && log.contains("undeclared_thing"),
                "{log}"
            );
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn a_write_outside_a_buffer_fails_the_launch() {
    if !available("a_write_outside_a_buffer_fails_the_launch") {
        return;
    }
    let d = &own_dev();
    let out = d.alloc(64).unwrap();
    let other = d.upload(&[1u8; 32]).unwrap();
    for (index, want) in [
        (16, "1 to 4 bytes after the end of a 64-byte buffer"),
        (-1, "4 to 1 bytes before a 64-byte buffer"),
    ] {
        let args = [KArg::Buf(&out), KArg::I32(index)];
        let e = unsafe { d.launch("st_write_at", (1, 1, 1), (32, 1, 1), &args) }
            .and_then(|()| d.synchronize())
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("st_write_at wrote outside") && msg.contains(want),
            "{msg}"
        );
    }
    // In bounds it works, and the guards were restored.
    let args = [KArg::Buf(&out), KArg::I32(15)];
    unsafe { d.launch("st_write_at", (1, 1, 1), (32, 1, 1), &args) }.unwrap();
    assert_eq!(u32s(d, &out, 16)[15], 7);
    let mut got = [0u8; 32];
    d.download(&other, &mut got).unwrap();
    assert_eq!(got, [1u8; 32]);
}

#[test]
fn a_misaligned_access_fails_the_launch_as_on_a_gpu() {
    if !available("a_misaligned_access_fails_the_launch_as_on_a_gpu") {
        return;
    }
    let d = &own_dev();
    let floats: Vec<u8> = (0..24u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let bytes = d.upload(&floats).unwrap();
    let out = d.alloc(4).unwrap();
    let launch = |at: u32, store_at: u32| {
        let args = [
            KArg::Buf(&bytes),
            KArg::U32(at),
            KArg::U32(store_at),
            KArg::Buf(&out),
        ];
        unsafe { d.launch("st_vector_at", (1, 1, 1), (32, 1, 1), &args) }
            .and_then(|()| d.synchronize())
    };
    // Aligned: floats 4..8 summed, and the store lands.
    launch(16, 8).unwrap();
    assert_eq!(f32s(d, &out, 1)[0], 4.0 + 5.0 + 6.0 + 7.0);
    let mut all = [0u8; 96];
    d.download(&bytes, &mut all).unwrap();
    assert_eq!(u64::from_le_bytes(all[72..80].try_into().unwrap()), 42);
    // A 16-byte load from an 8-aligned address, and an 8-byte store to a 4-aligned one.
    for (at, store_at, want) in [
        (8, 0, ["misaligned access", "st_vec4", "16-byte alignment"]),
        (32, 4, ["misaligned store", "u64", "8-byte alignment"]),
    ] {
        let msg = launch(at, store_at).unwrap_err().to_string();
        for w in want.iter().chain(&[
            "st_vector_at",
            "thread (1,0,0) of block (0,0,0)",
            "selftest.cu:",
            "CUDA_ERROR_MISALIGNED_ADDRESS",
        ]) {
            assert!(msg.contains(w), "{w:?} missing from: {msg}");
        }
    }
    // The emulator goes on after a failed launch (a GPU's context would not).
    launch(0, 0).unwrap();
    assert_eq!(f32s(d, &out, 1)[0], 0.0 + 1.0 + 2.0 + 3.0);
}

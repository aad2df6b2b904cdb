//! The emulator's self-test kernels (kernels/selftest.cu, never loaded by the backend) and
//! reading their results back: shared by tests/emu_runtime.rs and tests/emu_errors.rs.

use dsv4_backend_cuda::{DevBuf, Device, emu, kernels};

const SELFTEST: &str = include_str!("../../kernels/selftest.cu");

/// The kernel headers + selftest.cu as one translation unit, built as kernels.rs builds the
/// real one.
pub fn selftest_tu() -> String {
    kernels::translation_unit_of(&[("selftest.cu", SELFTEST)])
}

/// A device of its own, for a test whose launches fail on purpose: a queued launch's failure
/// goes to whoever next waits for the device, which on a shared one may be another test.
pub fn own_dev() -> Device {
    emu::open_with_source(&selftest_tu(), true).unwrap()
}

/// `n` u32s read back from `b`.
pub fn u32s(d: &Device, b: &DevBuf, n: usize) -> Vec<u32> {
    let mut bytes = vec![0u8; n * 4];
    d.download(b, &mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `n` f32s read back from `b`.
pub fn f32s(d: &Device, b: &DevBuf, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    d.download_f32(b, &mut v).unwrap();
    v
}

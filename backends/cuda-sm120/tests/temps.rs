//! The host ops' temporaries (`Device::temp`, `Device::temp_upload`), on the CPU emulator, whose
//! created streams queue their work until something waits for it: a dropped temporary is reused
//! by the next one of its size class on the same stream without any wait — zeroed, and with
//! the queued work of its last user still reading what that user put there, because the reuse
//! is ordered after it on the stream — and never by another stream.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::emu_available;
use dsv4_backend_cuda::device::{DEFAULT_STREAM, f32_bytes};
use dsv4_backend_cuda::{DevBuf, Device, KArg, emu};

fn floats(dev: &Device, b: &DevBuf, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dev.download_f32(b, &mut out).unwrap();
    out
}

/// Queue out = a + b over `n` floats on the calling thread's stream.
fn add(dev: &Device, a: &DevBuf, b: &DevBuf, out: &DevBuf, n: usize) {
    let args = [
        KArg::Buf(a),
        KArg::Buf(b),
        KArg::Buf(out),
        KArg::U64(n as u64),
    ];
    // SAFETY: add_f32(const float*, const float*, float*, u64); every buffer holds n floats.
    unsafe { dev.launch("add_f32", (1, 1, 1), (256, 1, 1), &args) }.unwrap();
}

#[test]
fn a_temporary_is_reused_in_stream_order_zeroed_and_only_on_its_stream() {
    if !emu_available("a_temporary_is_reused_in_stream_order_zeroed_and_only_on_its_stream") {
        return;
    }
    let dev = emu::open(true).expect("open the emulator");
    let s = dev.stream_create().unwrap();
    dev.set_stream(s);
    // On a created stream nothing runs until a wait: the add below is still queued when its
    // input goes back to the pool and is handed out again with other contents.
    let a = dev.temp_upload(f32_bytes(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    let b = dev.temp_upload(f32_bytes(&[10.0; 4])).unwrap();
    let out = dev.temp(16).unwrap();
    let a_ptr = a.ptr();
    add(&dev, &a, &b, &out, 4);
    drop(a);
    let again = dev.temp_upload(f32_bytes(&[-7.0; 4])).unwrap();
    assert_eq!(
        again.ptr(),
        a_ptr,
        "the same class on the same stream reuses the buffer"
    );
    assert_eq!(
        floats(&dev, &out, 4),
        [11.0, 12.0, 13.0, 14.0],
        "the queued add read the old contents: the new upload is ordered after it"
    );
    assert_eq!(floats(&dev, &again, 4), [-7.0; 4]);
    drop(again);
    // A reused temporary starts zeroed, like a fresh one.
    let zeroed = dev.temp(16).unwrap();
    assert_eq!(zeroed.ptr(), a_ptr);
    assert_eq!(floats(&dev, &zeroed, 4), [0.0; 4]);
    drop(zeroed);
    // Another stream never gets it: its work is not ordered after this stream's.
    dev.set_stream(DEFAULT_STREAM);
    let other = dev.temp(16).unwrap();
    assert_ne!(other.ptr(), a_ptr);
    assert!(dev.pooled_temp_bytes() > 0);
    drop((b, out, other));
    dev.synchronize().unwrap();
    // SAFETY: the stream came from stream_create and its work has finished.
    unsafe { dev.stream_destroy(s) };
}

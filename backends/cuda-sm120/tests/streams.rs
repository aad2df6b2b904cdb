//! A plan's streams and events on the device (`DeviceOps::streams`), on the CPU emulator, whose
//! created streams run queued work in an adversarial order (the most recently issued runnable
//! item first): an event orders two streams' work, a missing event lets the later-issued work run
//! first, reads wait for every stream, and a returned stream set serves the next execution. On
//! the tiny model, overlap plans on device streams compute the serial plan's bits, and the
//! `missing-stream-event` fault corrupts them there even in serial issue order, which hides it
//! on the host path.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::{backend, emu_available};
use dsv4_core::Numerics;
use dsv4_kernels::{Backend, DevSlice, DeviceOps, DeviceStreams};
use dsv4_model::forward::{ExecOptions, Executor, Fault};
use dsv4_model::{ModelSource, load_model};
use std::sync::Arc;

fn buffer(d: &dyn DeviceOps, words: usize) -> DevSlice {
    DevSlice::whole(d.alloc(words).expect("alloc"), words)
}

/// On stream 1: a = [1, 2, 3, 4], then a *= 10, then record event 0 (when `ordered`). On stream
/// 0: wait for event 0 (when `ordered`), then out = a + b. Returns out as read back.
fn producer_consumer(d: &dyn DeviceOps, st: &dyn DeviceStreams, ordered: bool) -> Vec<f32> {
    let (a, b, out) = (buffer(d, 4), buffer(d, 4), buffer(d, 4));
    d.write(b, &[0.5; 4]).unwrap();
    st.enter(1).unwrap();
    d.write(a, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    d.scale(a, 10.0).unwrap();
    if ordered {
        st.record(0).unwrap();
    }
    st.enter(0).unwrap();
    if ordered {
        st.wait(0).unwrap();
    }
    d.add(a, b, out).unwrap();
    st.leave();
    st.join().unwrap();
    let v = d.read(out).unwrap();
    [a, b, out].into_iter().for_each(|s| d.free(s.buf));
    v
}

fn streams(d: &dyn DeviceOps, n: usize, events: usize) -> Arc<dyn DeviceStreams> {
    d.streams(n, events)
        .expect("streams")
        .expect("the CUDA backend maps plan streams to device streams")
}

#[test]
fn an_event_orders_two_streams_and_without_it_the_later_work_runs_first() {
    if !emu_available("an_event_orders_two_streams_and_without_it_the_later_work_runs_first") {
        return;
    }
    let be = backend(true);
    let d = Backend::device(&be).unwrap();
    let st = streams(d, 2, 1);
    assert_eq!(producer_consumer(d, &*st, true), [10.5, 20.5, 30.5, 40.5]);
    // Without the event nothing orders the sum (issued last, on stream 0, entered from stream
    // 1) after stream 1's copy and scale, nor after the default stream's zeroing of the three
    // buffers: it runs first, on garbage, and the zeroing of `out` then wipes its result. On a
    // GPU the result would depend on timing; here it is certain.
    assert_eq!(producer_consumer(d, &*st, false), [0.0; 4]);
}

#[test]
fn a_read_waits_for_every_stream_and_a_returned_set_serves_the_next_execution() {
    if !emu_available("a_read_waits_for_every_stream_and_a_returned_set_serves_the_next_execution")
    {
        return;
    }
    let be = backend(true);
    let d = Backend::device(&be).unwrap();
    let st = streams(d, 3, 2);
    let a = buffer(d, 4);
    st.enter(2).unwrap();
    d.write(a, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    d.scale(a, 2.0).unwrap();
    st.leave();
    // No join and no event: the read itself waits for stream 2's queued work.
    assert_eq!(d.read(a).unwrap(), [2.0, 4.0, 6.0, 8.0]);
    st.join().unwrap();
    drop(st);
    // The set went back to the pool; the next execution's (smaller) set is taken from it.
    let again = streams(d, 2, 1);
    assert_eq!(
        producer_consumer(d, &*again, true),
        [10.5, 20.5, 30.5, 40.5]
    );
    d.free(a.buf);
}

#[test]
fn unknown_streams_and_events_are_errors_not_panics() {
    if !emu_available("unknown_streams_and_events_are_errors_not_panics") {
        return;
    }
    let be = backend(true);
    let d = Backend::device(&be).unwrap();
    let st = streams(d, 2, 1);
    let e = st.enter(2).unwrap_err().to_string();
    assert!(e.contains("plan stream 2 does not exist"), "{e}");
    let e = st.record(1).unwrap_err().to_string();
    assert!(e.contains("plan event 1 does not exist"), "{e}");
    assert!(st.wait(7).is_err());
    // The thread still issues to the default stream: ops work as before.
    let a = buffer(d, 4);
    d.write(a, &[1.0; 4]).unwrap();
    assert_eq!(d.read(a).unwrap(), [1.0; 4]);
    d.free(a.buf);
}

#[test]
fn queued_parameter_copies_read_their_own_host_bytes() {
    if !emu_available("queued_parameter_copies_read_their_own_host_bytes") {
        return;
    }
    // On a created stream the gathers' index copies stay queued until the join and read the
    // page-locked mirror only then: each must still find its own indices there.
    let be = backend(true);
    let d = Backend::device(&be).expect("device op set");
    let st = streams(d, 1, 0);
    let src = buffer(d, 8);
    d.write(src, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
        .unwrap();
    let orders: [[u32; 4]; 3] = [[7, 6, 5, 4], [0, 0, 1, 1], [3, 1, 4, 1]];
    let outs: Vec<DevSlice> = (0..3).map(|_| buffer(d, 4)).collect();
    st.enter(0).unwrap();
    for (idx, out) in orders.iter().zip(&outs) {
        d.gather_rows(src, idx, 1, *out).unwrap();
    }
    st.leave();
    st.join().unwrap();
    for (idx, out) in orders.iter().zip(&outs) {
        let want: Vec<f32> = idx.iter().map(|&i| i as f32).collect();
        assert_eq!(d.read(*out).unwrap(), want);
    }
    outs.iter().chain([&src]).for_each(|s| d.free(s.buf));
}

/// The logits' bits of the tiny model's prefill and decode steps under `exec`.
fn logits_bits(m: &dsv4_model::Model, exec: &ExecOptions) -> Vec<u32> {
    common::tiny_decode(m, exec).0
}

#[test]
fn overlap_plans_on_device_streams_give_the_serial_bits_and_a_missing_event_does_not() {
    if !emu_available(
        "overlap_plans_on_device_streams_give_the_serial_bits_and_a_missing_event_does_not",
    ) {
        return;
    }
    let be: Arc<dyn Backend> = Arc::new(backend(true));
    let m = load_model(&ModelSource::Tiny { seed: 0 }, be, Numerics::default()).unwrap();
    // Serial issue order throughout: only the device streams can reorder work.
    let serial = ExecOptions {
        captured: true,
        executor: Executor::Serial,
        ..Default::default()
    };
    let want = logits_bits(&m, &serial);
    let overlap = ExecOptions {
        overlap: true,
        ..serial.clone()
    };
    assert!(
        logits_bits(&m, &overlap) == want,
        "overlap on device streams computes the serial bits"
    );
    let faulty = ExecOptions {
        faults: [Fault::MissingStreamEvent].into(),
        ..overlap.clone()
    };
    assert!(
        logits_bits(&m, &faulty) != want,
        "without the shared expert's event the device streams reorder the MoE sum"
    );
    let on_host = ExecOptions {
        host_activations: true,
        ..faulty
    };
    assert!(
        logits_bits(&m, &on_host) == want,
        "through host slices serial issue order hides the missing event"
    );
}

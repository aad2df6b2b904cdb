//! The `cuda-sm120` device's own code (`src/cuda.rs`: cudarc's driver calls, NVRTC's CUBIN,
//! streams, events, page-locked memory, graphs) run without a GPU, on the emulated driver
//! (`emu/driver*.cpp`, `DSV4_CUDA_DRIVER=emu`), which checks each call as a driver would and runs
//! the kernels on the CPU: the op sweep passes against the reference, the tiny model's decode
//! steps give exactly the bits of the `cuda-emu` device (the same kernels on the same CPU), in
//! eager, captured (graphs built and replayed) and threaded-overlap execution, and not one driver
//! call fails (a plan missing an event gets other bits); a block needing more registers than a GPU has is refused as a GPU refuses it, and
//! a launch with a pointer into freed memory is refused. Work is asynchronous as on a GPU: the
//! legacy stream and plan streams are ordered by events only, copies from page-locked memory
//! read it when they run, pageable sources are staged when the copy is issued, and a destroyed
//! stream's queued work still runs.
//!
//! Needs NVRTC and a host C++ compiler; without them each test prints why and skips, except
//! under CI=true, where that is a failure.

#![cfg(feature = "cuda")]

mod common;

use common::{attend, can_run, exec_modes, kv_pages, tiny_decode};
use dsv4_backend_cuda::cuda::{self, DriverLib};
use dsv4_backend_cuda::device::DEFAULT_STREAM;
use dsv4_backend_cuda::{CudaBackend, CudaError, EMU_NAME, KArg, NAME, emu, open_backend};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::Numerics;
use dsv4_diff::ops::{OpsOptions, run_ops};
use dsv4_diff::report::Status;
use dsv4_kernels::{Backend, BackendOptions, DevSlice, DeviceOps, row_check};
use dsv4_model::forward::{ExecOptions, Executor, Fault};
use dsv4_model::{ModelSource, load_model};
use std::sync::{Arc, Mutex, MutexGuard};

/// One test at a time in this binary: the emulated driver is one per process, and a free or a
/// context synchronisation in one test runs every stream's queued work, so a test asserting that
/// work is still queued (as a GPU may leave it) would see another test's flush.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the driver for this test alone (a failed test does not block the others).
fn exclusive() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The GPU backend on the emulated driver, or None (skipped) when NVRTC or a compiler is missing.
fn gpu_backend(test: &str) -> Option<CudaBackend> {
    cuda::select_driver(DriverLib::Emulated).expect("nothing chose another driver");
    if !can_run(test, "the emulated CUDA driver", cuda::probe()) {
        return None;
    }
    Some(open_backend(NAME, &BackendOptions::default()).expect("open cuda-sm120"))
}

/// The calls tests here make fail on purpose (`a_block_needing_more_registers_...`,
/// `a_launch_reading_freed_memory_...`).
const DELIBERATE: [&str; 2] = [
    "launching linear_fp8_r8: 1024 threads",
    "launching scale_f64: argument 0",
];

/// No driver call has failed in this process so far (but the deliberate ones).
fn assert_clean(what: &str) {
    let failed: Vec<String> = cuda::emulated_driver_failures()
        .into_iter()
        .filter(|m| !DELIBERATE.iter().any(|d| m.starts_with(d)))
        .collect();
    assert!(
        failed.is_empty(),
        "{what}: driver calls failed: {failed:#?}"
    );
}

#[test]
fn the_device_opens_on_the_emulated_driver_and_says_so() {
    let _driver = exclusive();
    let Some(be) = gpu_backend("the_device_opens_on_the_emulated_driver_and_says_so") else {
        return;
    };
    let info = be.device().info();
    assert!(info.name.contains("emulated driver"), "{info:?}");
    assert_eq!(Ok(info.capability), cuda::emulated_capability());
    assert!(
        info.emulated,
        "reports and the bench must not mistake it for a GPU"
    );
    let acc = std::env::var("DSV4_CUDA_ACC");
    let want_f64 = acc
        .as_deref()
        .map_or(cuda::default_acc_f64(info.capability), |a| a == "f64");
    assert_eq!(info.f64_accumulation, want_f64, "{info:?}");
    // Out of device memory is the backend's clear error, not a driver failure.
    match be.device().alloc(16 << 30) {
        Err(CudaError::TooLarge { what }) => {
            assert!(what.contains("out of device memory"), "{what}")
        }
        other => panic!("a 16 GiB allocation on an 8 GiB device: {other:?}"),
    }
    assert_clean("open");
}

#[test]
fn a_block_needing_more_registers_than_the_gpu_has_is_refused_as_a_gpu_would() {
    let _driver = exclusive();
    let Some(be) =
        gpu_backend("a_block_needing_more_registers_than_the_gpu_has_is_refused_as_a_gpu_would")
    else {
        return;
    };
    if cuda::emulated_capability() != Ok((9, 0)) {
        eprintln!("SKIP: the register counts this test relies on are sm_90's");
        return;
    }
    // linear_fp8_r8 uses more than 64 registers per thread for sm_90 (ptxas's count, read from
    // the CUBIN), so 1024 threads need more than a block's 64K; the backend launches 128. With
    // no output columns the kernel itself does nothing.
    let dev = be.device();
    let bufs: Vec<_> = (0..4).map(|_| dev.alloc(256).expect("alloc")).collect();
    let launch = |threads: u32| {
        let mut args = bufs.iter().map(KArg::Buf).collect::<Vec<_>>();
        args.extend([
            KArg::U32(0),
            KArg::U32(0),
            KArg::U32(0),
            KArg::U32(0),
            KArg::U32(0),
        ]);
        // SAFETY: the arguments follow linear_fp8_r8's parameters; with out_dim 0 and rows 0
        // it reads and writes nothing.
        unsafe { dev.launch("linear_fp8_r8", (1, 1, 1), (threads, 1, 1), &args) }
    };
    launch(128).expect("the backend's own block size fits");
    let e = launch(1024).expect_err("1024 threads exceed the register file");
    assert!(
        e.to_string().contains("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
        "{e}"
    );
    let refused = cuda::emulated_driver_failures();
    assert!(
        refused.iter().any(|m| m.starts_with(DELIBERATE[0])),
        "{refused:?}"
    );
    // Not sticky (as on a GPU): the device still works.
    launch(128).expect("a launch after the refused one");
    dev.synchronize().expect("synchronize");
}

#[test]
fn a_launch_reading_freed_memory_is_refused() {
    let _driver = exclusive();
    let Some(be) = gpu_backend("a_launch_reading_freed_memory_is_refused") else {
        return;
    };
    let dev = be.device();
    // Another test's allocation may take the freed memory over at once (then it is live and
    // the launch is fine): a few tries, of which one must be refused.
    let refused = (0..4).any(|_| {
        let buf = dev.alloc(48 << 20).expect("alloc");
        let stale = buf.at();
        drop(buf);
        let args = [KArg::Ptr(stale), KArg::U64(0), KArg::F64(1.0)];
        // SAFETY: scale_f64's parameters; with n = 0 it touches nothing even if it ran.
        match unsafe { dev.launch("scale_f64", (1, 1, 1), (32, 1, 1), &args) } {
            Ok(()) => false,
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
                true
            }
        }
    });
    assert!(refused, "a pointer into freed memory was never refused");
    let messages = cuda::emulated_driver_failures();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with(DELIBERATE[1]) && m.contains("freed device memory")),
        "{messages:?}"
    );
    dev.synchronize().expect("the refusal is not sticky");
}

#[test]
fn the_op_sweep_passes_through_the_driver_calls() {
    let _driver = exclusive();
    let Some(be) = gpu_backend("the_op_sweep_passes_through_the_driver_calls") else {
        return;
    };
    let report = run_ops(&ReferenceBackend, &be, &OpsOptions::default()).expect("op sweep");
    let failed: Vec<_> = report
        .cases
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| format!("{} {}={:?}", c.name, c.metric.name(), c.value))
        .collect();
    assert!(
        report.passed() && failed.is_empty(),
        "cases off the reference: {failed:?}"
    );
    assert!(report.cases.len() > 100, "{} cases", report.cases.len());
    assert_clean("op sweep");
}

#[test]
fn decode_steps_give_the_emulator_devices_bits_eager_captured_and_overlapped() {
    let _driver = exclusive();
    let Some(gpu) =
        gpu_backend("decode_steps_give_the_emulator_devices_bits_eager_captured_and_overlapped")
    else {
        return;
    };
    let emu_be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let load = |be: Arc<dyn Backend>| {
        load_model(&ModelSource::Tiny { seed: 0 }, be, Numerics::default()).expect("tiny model")
    };
    let [(_, eager), ..] = exec_modes();
    let (want, _) = tiny_decode(&load(Arc::new(emu_be)), &eager);
    let m = load(Arc::new(gpu));
    for (what, exec) in exec_modes() {
        let (bits, stats) = tiny_decode(&m, &exec);
        assert!(
            bits == want,
            "{what}: the driver path gives the emulator device's bits"
        );
        let last = stats.last().expect("decode steps");
        if what != "eager" {
            assert!(
                last.graph_launches > 0,
                "{what}: the fourth decode step replays CUDA graphs: {last:?}"
            );
        }
        assert_clean(what);
    }
    if cuda::emulated_schedule_deferred() == Ok(true) {
        // Issued by one thread in plan order, only the driver's queues can reorder the work: a
        // plan missing the shared expert's event gets the MoE sum wrong, as it might on a GPU.
        let faulty = ExecOptions {
            overlap: true,
            executor: Executor::Serial,
            faults: [Fault::MissingStreamEvent].into(),
            ..exec_modes()[1].1.clone()
        };
        assert!(
            tiny_decode(&m, &faulty).0 != want,
            "without the shared expert's event the driver's queues reorder the MoE sum"
        );
    }
}

/// [`gpu_backend`], when the driver defers work (else the test is skipped: with
/// `DSV4_CUDA_EMU_SCHEDULE=issue` work runs as it is issued).
fn deferred_backend(test: &str) -> Option<CudaBackend> {
    let be = gpu_backend(test)?;
    if cuda::emulated_schedule_deferred() == Ok(false) {
        eprintln!("SKIP {test}: DSV4_CUDA_EMU_SCHEDULE=issue runs work as it is issued");
        return None;
    }
    Some(be)
}

fn words(d: &dyn DeviceOps, n: usize) -> DevSlice {
    DevSlice::whole(d.alloc(n).expect("alloc"), n)
}

/// On the thread's default (legacy) stream: a = [1, 2, 3, 4], then a *= 10. Then on plan
/// stream 0 (a non-blocking stream), with no event: out = a + 0.5. Returns out as read back.
fn legacy_then_plan_stream(d: &dyn DeviceOps) -> Vec<f32> {
    let st = d.streams(1, 0).expect("streams").expect("plan streams");
    let (a, b, out) = (words(d, 4), words(d, 4), words(d, 4));
    d.write(b, &[0.5; 4]).unwrap();
    d.write(a, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    d.scale(a, 10.0).unwrap();
    st.enter(0).unwrap();
    d.add(a, b, out).unwrap();
    st.leave();
    st.join().unwrap();
    let v = d.read(out).unwrap();
    [a, b, out].into_iter().for_each(|s| d.free(s.buf));
    v
}

#[test]
fn work_queues_as_on_a_gpu_and_plan_streams_wait_for_the_default_streams_earlier_work() {
    let _driver = exclusive();
    let Some(be) = deferred_backend(
        "work_queues_as_on_a_gpu_and_plan_streams_wait_for_the_default_streams_earlier_work",
    ) else {
        return;
    };
    let dev = be.device();
    let x = dev.upload_f32(&[1.0, 2.0, 3.0, 4.0]).expect("upload");
    let s = dev.stream_create().expect("stream");
    let scale = |by: f64| {
        let args = [KArg::Buf(&x), KArg::U64(4), KArg::F64(by)];
        // SAFETY: scale_f64's parameters; x holds 4 floats.
        unsafe { dev.launch("scale_f64", (1, 1, 1), (32, 1, 1), &args) }.expect("launch")
    };
    let read_on_s = || {
        dev.set_stream(s);
        let mut v = [0f32; 4];
        dev.download_f32(&x, &mut v).expect("download");
        dev.set_stream(DEFAULT_STREAM);
        v
    };
    // The legacy stream's scale is still queued: a non-blocking stream's read does not wait.
    scale(10.0);
    assert_eq!(read_on_s(), [1.0, 2.0, 3.0, 4.0]);
    // An event recorded after a second scale: the read waits for both.
    let e = dev.event_create().expect("event");
    scale(10.0);
    dev.event_record(e).expect("record");
    dev.set_stream(s);
    dev.wait_event(e).expect("wait");
    dev.set_stream(DEFAULT_STREAM);
    assert_eq!(read_on_s(), [100.0, 200.0, 300.0, 400.0]);
    // SAFETY: created above and not used afterwards.
    unsafe {
        dev.event_destroy(e);
        dev.stream_destroy(s);
    }
    // A plan stream entered from the default stream waits for its earlier work (the buffers'
    // zeroing and writes, the scale) without any event of the plan's.
    let d = Backend::device(&be).expect("device op set");
    assert_eq!(legacy_then_plan_stream(d), [10.5, 20.5, 30.5, 40.5]);
    assert_clean("legacy and plan streams");
}

#[test]
fn copies_from_page_locked_memory_read_it_when_they_run_and_pageable_ones_when_issued() {
    let _driver = exclusive();
    let Some(be) = deferred_backend(
        "copies_from_page_locked_memory_read_it_when_they_run_and_pageable_ones_when_issued",
    ) else {
        return;
    };
    let dev = be.device();
    let s = dev.stream_create().expect("stream");
    dev.set_stream(s);
    // Zeroed on the created stream, so before the copies there.
    let (pinned_dst, pageable_dst) = (dev.alloc(8).unwrap(), dev.alloc(8).unwrap());
    let mut host = dev.host_alloc(8).expect("page-locked memory");
    let mut pageable = vec![1u8; 8];
    host.write(0, &[1; 8]).unwrap();
    dev.stage(pinned_dst.at(), &host, 0, 8).unwrap();
    dev.write(&pageable_dst, &pageable).unwrap();
    // Both copies are still queued on the created stream; change both sources.
    host.write(0, &[2; 8]).unwrap();
    pageable.fill(2);
    dev.set_stream(DEFAULT_STREAM);
    dev.synchronize().unwrap();
    let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
    dev.download(&pinned_dst, &mut a).unwrap();
    dev.download(&pageable_dst, &mut b).unwrap();
    assert_eq!(
        a, [2; 8],
        "the page-locked source is read when the copy runs"
    );
    assert_eq!(
        b, [1; 8],
        "a pageable source is staged when the copy is issued"
    );
    // A stream destroyed with work still queued: the work runs all the same.
    let s = dev.stream_create().expect("stream");
    dev.set_stream(s);
    dev.write(&pageable_dst, &[3; 8]).unwrap();
    // SAFETY: created above and not used afterwards.
    unsafe { dev.stream_destroy(s) };
    dev.set_stream(DEFAULT_STREAM);
    dev.synchronize().unwrap();
    dev.download(&pageable_dst, &mut b).unwrap();
    assert_eq!(b, [3; 8]);
    assert_clean("page-locked copies");
}

#[test]
fn page_arenas_leave_the_memory_reserve_free() {
    let _driver = exclusive();
    let Some(be) = gpu_backend("page_arenas_leave_the_memory_reserve_free") else {
        return;
    };
    // The emulated driver reports its memory and what its allocations leave free, as
    // cuDeviceTotalMem and cuMemGetInfo do on a GPU: by default the page arenas leave a
    // sixteenth of it, and a new arena size keeps that.
    let sixteenth = (be.device().info().memory_bytes / 16) as usize;
    assert!(sixteenth > 0);
    assert_eq!(be.page_cache_reserve(), sixteenth);
    let (fmt, mut pages) = kv_pages(&be, 256);
    let page = fmt.page_bytes();
    let be = be.with_growing_page_cache(3 * page, 6 * page);
    assert_eq!(
        be.page_cache_reserve(),
        sixteenth,
        "a new size keeps the reserve"
    );
    let free = || {
        let free = be.device().free_memory().expect("the driver says");
        usize::try_from(free).expect("fits")
    };
    let want = |pages: &[Vec<u8>]| attend(&be, &fmt, pages, &[]);
    let (untagged_bits, untagged) = want(&pages);
    let mut tags = row_check::fresh_tags(3);
    // Room for two pages above the reserve, and the first arena takes three: not made, and the
    // call uploads its rows as without tags.
    be.set_page_cache_reserve(free() - 2 * page);
    assert_eq!(attend(&be, &fmt, &pages, &tags), (untagged_bits, untagged));
    assert_eq!(
        (be.page_cache_held(), be.page_cache_short_of_memory()),
        (0, 1)
    );
    // Room for four: the arena is made at three pages.
    be.set_page_cache_reserve(free() - 4 * page);
    assert_eq!(attend(&be, &fmt, &pages, &tags).0, want(&pages).0);
    assert_eq!(be.page_cache_held(), 3 * page);
    // A changed page needs a fourth slot. Doubling takes six more pages while the old three
    // are still held, past the room for five: the arena grows to the four the call needs.
    be.set_page_cache_reserve(free() - 5 * page);
    let change = |pages: &mut Vec<Vec<u8>>, tags: &mut Vec<_>, p: usize, v: f32| {
        be.cache_store(&fmt, &mut pages[p], 2, &[v; 192])
            .expect("a slot");
        tags[p] = row_check::fresh_tags(1)[0];
    };
    change(&mut pages, &mut tags, 0, 0.5);
    assert_eq!(attend(&be, &fmt, &pages, &tags).0, want(&pages).0);
    assert_eq!(
        (be.page_cache_held(), be.page_cache_short_of_memory()),
        (4 * page, 2)
    );
    // No room at all: it keeps its size and reuses its least recently used slot.
    be.set_page_cache_reserve(free());
    change(&mut pages, &mut tags, 1, -0.5);
    assert_eq!(attend(&be, &fmt, &pages, &tags).0, want(&pages).0);
    assert_eq!(
        (be.page_cache_held(), be.page_cache_short_of_memory()),
        (4 * page, 3)
    );
    // A call reading five pages, one more than the arena's slots, which cannot grow: it takes
    // the upload path (no slot it reads is reused within it).
    let mut five = pages.clone();
    five.extend(kv_pages(&be, 256).1.into_iter().take(2));
    let five_tags: Vec<_> = tags
        .iter()
        .copied()
        .chain(row_check::fresh_tags(2))
        .collect();
    assert_eq!(
        attend(&be, &fmt, &five, &five_tags),
        attend(&be, &fmt, &five, &[])
    );
    assert_eq!(be.page_cache_held(), 4 * page);
    // Without a reserve it grows to its ceiling.
    be.set_page_cache_reserve(0);
    change(&mut pages, &mut tags, 2, 0.25);
    assert_eq!(attend(&be, &fmt, &pages, &tags).0, want(&pages).0);
    assert_eq!(be.page_cache_held(), 6 * page);
    assert_clean("page arenas and the memory reserve");
}

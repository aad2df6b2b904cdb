//! Attention into device memory (`DeviceOps::paged_attention`) on the CPU emulator, whose
//! streams run queued work in an adversarial order: the call reads nothing back, so its
//! launches may still be queued when another stream's call reuses the page cache's slots they
//! read. That call must wait for them (the event the first call records), or the first output
//! is computed from the second call's pages. Also: the output equals the host op's, and a
//! backend set to attend from host copies refuses the op.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::{attend, attend_operands, bits, emu_available, kv_pages};
use dsv4_backend_cuda::{CudaBackend, EMU_NAME, emu};
use dsv4_kernels::{Backend, DevSlice, DeviceOps, PageTag, PagedAttention, RowFormat, row_check};

/// Two heads of 192 (the `kv_pages` entries), sinks and scale as `common::attend` uses.
const SINK: [f32; 2] = [0.5, -0.5];
const SCALE: f32 = 0.07;

/// `common::attend`'s call (two queries over every slot of `pages`, the second skipping the
/// first page's) with its queries and output in device memory: the output slice.
fn attend_on_device(
    dev: &dyn DeviceOps,
    fmt: &RowFormat,
    pages: &[Vec<u8>],
    tags: &[PageTag],
) -> DevSlice {
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let (rows, ids, q, starts) = attend_operands(pages.len());
    let keys = PagedAttention {
        fmt,
        pages: &refs,
        tags,
        origins: &[],
        rows: &rows,
        key_ids: &ids,
        key_starts: &starts,
        sink: &SINK,
        scale: SCALE,
    };
    let qs = DevSlice::whole(dev.alloc(q.len()).expect("alloc"), q.len());
    let out = DevSlice::whole(dev.alloc(q.len()).expect("alloc"), q.len());
    dev.write(qs, &q).expect("write q");
    dev.paged_attention(&keys, qs, out)
        .expect("paged_attention");
    out
}

/// Pages of other contents than `kv_pages`' (every value negated).
fn other_pages(be: &CudaBackend, fmt: &RowFormat) -> Vec<Vec<u8>> {
    (0..3)
        .map(|p| {
            let mut page = vec![0u8; fmt.page_bytes()];
            for slot in 0..8 {
                let v: Vec<f32> = (0..192)
                    .map(|i| 1.5 - ((i * 5 + slot * 3 + p * 7) % 13) as f32 * 0.25)
                    .collect();
                be.cache_store(fmt, &mut page, slot, &v).expect("a slot");
            }
            page
        })
        .collect()
}

#[test]
fn attention_into_device_memory_equals_the_host_op() {
    if !emu_available("attention_into_device_memory_equals_the_host_op") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let (fmt, pages) = kv_pages(&be, 8);
    let (want, _) = attend(&be, &fmt, &pages, &[]);
    let dev = Backend::device(&be).expect("device ops");
    assert!(
        dev.attends_on_device(),
        "cuda attends on the device by default"
    );
    for tags in [vec![], row_check::fresh_tags(3)] {
        let before = dev.stats();
        let out = attend_on_device(dev, &fmt, &pages, &tags);
        let moved = dev.stats().since(&before);
        assert_eq!(moved.reads, 0, "tags {tags:?}: nothing read back");
        assert_eq!(bits(&dev.read(out).unwrap()), want, "tags {tags:?}");
    }
}

#[test]
fn another_streams_call_waits_for_the_slots_a_device_call_reads() {
    if !emu_available("another_streams_call_waits_for_the_slots_a_device_call_reads") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"));
    let (fmt, pages) = kv_pages(&be, 8);
    let other = other_pages(&be, &fmt);
    let (want, _) = attend(&be, &fmt, &pages, &[]);
    let (want_other, _) = attend(&be, &fmt, &other, &[]);
    assert_ne!(want, want_other);
    // Three page slots: the second call's three fresh pages take every slot the first reads.
    let be = be.with_page_cache(3 * fmt.entry_bytes() * 8);
    let dev = Backend::device(&be).expect("device ops");
    let st = dev.streams(2, 0).unwrap().expect("device streams");
    st.enter(0).unwrap();
    // Stream 0 brings the pages into the cache (and has run), then reads them again: that
    // call uploads nothing, so only its launches wait in stream 0's queue.
    let tags = row_check::fresh_tags(3);
    let warm = attend_on_device(dev, &fmt, &pages, &tags);
    assert_eq!(
        bits(&dev.read(warm).unwrap()),
        want,
        "the call that fills the cache"
    );
    let first = attend_on_device(dev, &fmt, &pages, &tags);
    // Stream 1 reuses the slots: through the host op (its output read back, which runs
    // stream 1's work now), then through the device op.
    st.enter(1).unwrap();
    let (got_other, _) = attend(&be, &fmt, &other, &row_check::fresh_tags(3));
    assert_eq!(got_other, want_other, "the host op on stream 1");
    let second = attend_on_device(dev, &fmt, &other, &row_check::fresh_tags(3));
    // Stream 1's output first (its work waits for stream 0's reads, not the reverse).
    assert_eq!(
        bits(&dev.read(second).unwrap()),
        want_other,
        "stream 1's device call"
    );
    st.enter(0).unwrap();
    assert!(
        bits(&dev.read(first).unwrap()) == want,
        "stream 0's call read the slots stream 1 reused before its launches ran"
    );
    st.leave();
    st.join().unwrap();
}

#[test]
fn a_backend_attending_from_host_copies_refuses_the_device_op() {
    if !emu_available("a_backend_attending_from_host_copies_refuses_the_device_op") {
        return;
    }
    let be = CudaBackend::new(EMU_NAME, emu::open(true).expect("open the emulator"))
        .with_device_attention(false);
    let (fmt, pages) = kv_pages(&be, 8);
    let dev = Backend::device(&be).expect("device ops");
    assert!(!dev.attends_on_device());
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let keys = PagedAttention {
        fmt: &fmt,
        pages: &refs,
        tags: &[],
        origins: &[],
        rows: &[(0, 0)],
        key_ids: &[0],
        key_starts: &[0, 1],
        sink: &SINK,
        scale: SCALE,
    };
    let q = DevSlice::whole(dev.alloc(384).unwrap(), 384);
    let out = DevSlice::whole(dev.alloc(384).unwrap(), 384);
    let e = dev.paged_attention(&keys, q, out).unwrap_err();
    assert!(e.to_string().contains("cuda_attention = host"), "{e}");
}

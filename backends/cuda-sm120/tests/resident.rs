//! The device-resident op set (`DeviceOps`) on the CPU emulator: every op bitwise equal to the
//! host op of the same name (f64 and f32 accumulation), inconsistent operands answered with
//! `KernelError::Device` instead of a panic, and honest traffic counters.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::{backend, bits, emu_available, random_weight as weight};
use dsv4_backend_cuda::{CudaBackend, EMU_NAME};
use dsv4_core::{IndexKDtype, SplitMix64};
use dsv4_kernels::device::Copy2d;
use dsv4_kernels::{
    Backend, DevSlice, DeviceOps, HcParams, KernelError, Linear, MhcPre, RopeTable, WeightFormat,
};

fn dev(be: &CudaBackend) -> &dyn DeviceOps {
    Backend::device(be).expect("the CUDA backend has a device op set")
}

fn rand(rng: &mut SplitMix64, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform_sym(a)).collect()
}

/// `data` in a fresh buffer, at word 64 (a 256-byte offset, as plan arenas place slices).
fn put(d: &dyn DeviceOps, data: &[f32]) -> DevSlice {
    let buf = d.alloc(data.len() + 128).expect("alloc");
    let s = DevSlice::whole(buf, data.len() + 128).sub(64, data.len());
    d.write(s, data).expect("write");
    s
}

fn zeros(d: &dyn DeviceOps, n: usize) -> DevSlice {
    put(d, &vec![0.0; n])
}

#[track_caller]
fn same(d: &dyn DeviceOps, got: DevSlice, want: &[f32], what: &str) {
    let got = d.read(got).expect("read");
    assert_eq!(bits(&got), bits(want), "{what}: device and host ops differ");
}

fn check_row_ops(be: &CudaBackend, rng: &mut SplitMix64) {
    let d = dev(be);
    // linear: padded (in not a multiple of a chunk) and direct inputs, one row and a batch.
    for (format, out, inp) in [
        (WeightFormat::F32, 37, 67),
        (WeightFormat::Bf16, 45, 64),
        (WeightFormat::Fp8Block, 130, 333),
        (WeightFormat::Mxfp4, 77, 320),
    ] {
        let w = weight(rng, format, out, inp);
        for rows in [1, 9] {
            let x = rand(rng, rows * inp, 2.0);
            let mut want = vec![0f32; rows * out];
            be.linear(&w, &x, rows, &mut want);
            let (xs, os) = (put(d, &x), zeros(d, rows * out));
            d.linear(&w, xs, rows, os).expect("linear");
            same(d, os, &want, &format!("linear {format:?} rows {rows}"));
        }
    }
    let (rows, dim) = (3, 300);
    let x = rand(rng, rows * dim, 3.0);
    let mut want = x.clone();
    be.act_quant_fp8(&mut want, dim);
    let xs = put(d, &x);
    d.act_quant_fp8(xs, dim).expect("act_quant_fp8");
    same(d, xs, &want, "act_quant_fp8");

    let w = rand(rng, dim, 1.5);
    for weight in [Some(&w[..]), None] {
        let mut want = vec![0f32; rows * dim];
        be.rms_norm(&x, weight, dim, 1e-6, &mut want);
        let (xs, os) = (put(d, &x), zeros(d, rows * dim));
        d.rms_norm(xs, weight, dim, 1e-6, os).expect("rms_norm");
        same(d, os, &want, "rms_norm");
    }

    let table = RopeTable {
        rd: 64,
        freqs: (0..32).map(|i| 10000f64.powf(-(i as f64) / 32.0)).collect(),
    };
    let (rows, dim) = (4, 192);
    let x = rand(rng, rows * dim, 1.0);
    let positions = [0, 7, 4096, 1 << 20];
    for inverse in [false, true] {
        let mut want = x.clone();
        be.rope(&mut want, dim, &positions, &table, inverse);
        let xs = put(d, &x);
        d.rope(xs, dim, &positions, &table, inverse).expect("rope");
        same(d, xs, &want, "rope");
    }

    let x = rand(rng, 5 * 128, 1.0);
    let mut want = x.clone();
    be.hadamard(&mut want, 128);
    let xs = put(d, &x);
    d.hadamard(xs, 128).expect("hadamard");
    same(d, xs, &want, "hadamard");

    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
        let x = rand(rng, 3 * 96, 4.0);
        let mut want = x.clone();
        be.round_index_rows(dtype, &mut want, 96);
        let xs = put(d, &x);
        d.round_index_rows(dtype, xs, 96).expect("round_index_rows");
        same(d, xs, &want, &format!("round_index_rows {dtype:?}"));
    }

    let (width, weights) = (70, [0.5f32, -1.25, 3.0]);
    let (g, u) = (rand(rng, 3 * width, 12.0), rand(rng, 3 * width, 12.0));
    let mut want = vec![0f32; 3 * width];
    for (r, &wr) in weights.iter().enumerate() {
        let rg = r * width..(r + 1) * width;
        be.swiglu(&g[rg.clone()], &u[rg.clone()], 7.0, wr, &mut want[rg]);
    }
    let (gs, us, os) = (put(d, &g), put(d, &u), zeros(d, 3 * width));
    d.swiglu_rows(gs, us, 7.0, &weights, width, os)
        .expect("swiglu_rows");
    same(d, os, &want, "swiglu_rows");
}

fn check_mhc(be: &CudaBackend, rng: &mut SplitMix64) {
    let d = dev(be);
    let (m, dd, t) = (4, 64, 3);
    let nout = (2 + m) * m;
    let (fn_w, base) = (rand(rng, nout * m * dd, 0.05), rand(rng, nout, 0.5));
    let scale = [0.7f32, 0.9, 1.1];
    let p = HcParams {
        fn_w: &fn_w,
        base: &base,
        scale: &scale,
        m,
        d: dd,
        norm_eps: 1e-6,
        hc_eps: 1e-6,
        sinkhorn_iters: 20,
    };
    let x = rand(rng, t * m * dd, 2.0);
    let want = be.mhc_pre(&p, &x, t);
    let xs = put(d, &x);
    let (us, ps, cs) = (zeros(d, t * dd), zeros(d, t * m), zeros(d, t * m * m));
    d.mhc_pre(&p, xs, t, us, ps, cs).expect("mhc_pre");
    same(d, us, &want.u, "mhc_pre u");
    same(d, ps, &want.post, "mhc_pre post");
    same(d, cs, &want.comb, "mhc_pre comb");

    let y = rand(rng, t * dd, 1.0);
    let pre = MhcPre {
        u: vec![],
        post: want.post.clone(),
        comb: want.comb.clone(),
    };
    let mut out = vec![0f32; t * m * dd];
    be.mhc_post(&x, &y, &pre, m, dd, &mut out);
    let (ys, os) = (put(d, &y), zeros(d, t * m * dd));
    d.mhc_post(xs, ys, ps, cs, m, dd, os).expect("mhc_post");
    same(d, os, &out, "mhc_post");

    let hp = HcParams {
        fn_w: &fn_w[..m * m * dd],
        base: &base[..m],
        scale: &scale[..1],
        ..p
    };
    let mut want = vec![0f32; t * dd];
    be.hc_head(&hp, &x, t, &mut want);
    let os = zeros(d, t * dd);
    d.hc_head(&hp, xs, t, os).expect("hc_head");
    same(d, os, &want, "hc_head");
}

fn check_moves(be: &CudaBackend, rng: &mut SplitMix64) {
    let d = dev(be);
    let src = rand(rng, 6 * 40, 5.0);
    let dst0 = rand(rng, 5 * 50, 5.0);
    let shape = Copy2d {
        rows: 5,
        width: 17,
        src_stride: 40,
        src_col: 3,
        dst_stride: 50,
        dst_col: 31,
    };
    let mut want = dst0.clone();
    for r in 0..5 {
        for c in 0..17 {
            want[r * 50 + 31 + c] = src[r * 40 + 3 + c];
        }
    }
    let (ss, ds) = (put(d, &src), put(d, &dst0));
    d.copy2d(ss, ds, shape).expect("copy2d");
    same(d, ds, &want, "copy2d");
    // Within one buffer: columns 0..20 to 20..40 of the same rows.
    let within = Copy2d {
        rows: 6,
        width: 20,
        src_stride: 40,
        src_col: 0,
        dst_stride: 40,
        dst_col: 20,
    };
    let mut want = src.clone();
    for r in 0..6 {
        for c in 0..20 {
            want[r * 40 + 20 + c] = src[r * 40 + c];
        }
    }
    d.copy2d(ss, ss, within).expect("copy2d within a slice");
    same(d, ss, &want, "copy2d within a slice");

    let (width, table) = (24, rand(rng, 7 * 24, 5.0));
    let idx = [6u32, 0, 3, 3];
    let mut want = Vec::new();
    for &i in &idx {
        want.extend_from_slice(&table[i as usize * width..(i as usize + 1) * width]);
    }
    let (ts, gs) = (put(d, &table), zeros(d, idx.len() * width));
    d.gather_rows(ts, &idx, width, gs).expect("gather_rows");
    same(d, gs, &want, "gather_rows");

    let rows = rand(rng, 3 * width, 5.0);
    let sidx = [5u32, 1, 2];
    let mut want = table.clone();
    for (r, &i) in sidx.iter().enumerate() {
        for c in 0..width {
            want[i as usize * width + c] += rows[r * width + c];
        }
    }
    let rs = put(d, &rows);
    d.scatter_add_rows(rs, &sidx, width, ts)
        .expect("scatter_add_rows");
    same(d, ts, &want, "scatter_add_rows");

    let (a, b) = (rand(rng, 333, 9.0), rand(rng, 333, 9.0));
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let (as_, bs, os) = (put(d, &a), put(d, &b), zeros(d, 333));
    d.add(as_, bs, os).expect("add");
    same(d, os, &want, "add");
    d.add(as_, bs, as_).expect("add in place");
    same(d, as_, &want, "add in place");

    let s = 1.0 / 3.0f64.sqrt();
    let want: Vec<f32> = b.iter().map(|&x| (f64::from(x) * s) as f32).collect();
    d.scale(bs, s).expect("scale");
    same(d, bs, &want, "scale");
}

#[test]
fn resident_ops_equal_the_host_ops_bitwise() {
    if !emu_available("resident_ops_equal_the_host_ops_bitwise") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = backend(acc_f64);
        let mut rng = SplitMix64::new(11);
        check_row_ops(&be, &mut rng);
        check_mhc(&be, &mut rng);
        check_moves(&be, &mut rng);
    }
}

fn is_device_err<T: std::fmt::Debug>(r: Result<T, KernelError>, what: &str) {
    match r {
        Err(KernelError::Device { message }) => assert!(!message.is_empty(), "{what}"),
        other => panic!("{what}: expected KernelError::Device, got {other:?}"),
    }
}

#[test]
fn inconsistent_operands_are_errors_not_panics() {
    if !emu_available("inconsistent_operands_are_errors_not_panics") {
        return;
    }
    let be = backend(true);
    let d = dev(&be);
    let buf = d.alloc(1024).expect("alloc");
    let whole = DevSlice::whole(buf, 1024);
    is_device_err(d.alloc(0), "alloc of 0 words");
    is_device_err(
        d.write(whole.sub(0, 8), &[0.0; 7]),
        "write of the wrong length",
    );
    is_device_err(
        d.read(DevSlice {
            buf,
            off: 1000,
            len: 100,
        }),
        "read past the buffer",
    );
    is_device_err(d.scale(whole.sub(1, 8), 2.0), "misaligned offset");
    let gone = d.alloc(16).expect("alloc");
    d.free(gone);
    is_device_err(d.scale(DevSlice::whole(gone, 16), 2.0), "a freed buffer");
    is_device_err(
        d.add(whole.sub(0, 8), whole.sub(64, 9), whole.sub(128, 8)),
        "add of different lengths",
    );
    is_device_err(
        d.act_quant_fp8(whole.sub(0, 100), 64),
        "rows of the wrong width",
    );
    is_device_err(
        d.hadamard(whole.sub(0, 96), 96),
        "a Hadamard width not a power of two",
    );
    let w = Linear::from_f32("w", 4, 8, &[0.5; 32]).expect("weight");
    is_device_err(
        d.linear(&w, whole.sub(0, 16), 3, whole.sub(64, 12)),
        "linear x length",
    );
    is_device_err(
        d.linear(&w, whole.sub(0, 16), 2, whole.sub(4, 8)),
        "linear output overlapping its input",
    );
    is_device_err(
        d.rms_norm(
            whole.sub(0, 64),
            Some(&[1.0; 8]),
            32,
            1e-6,
            whole.sub(64, 64),
        ),
        "an rms_norm weight shorter than the width",
    );
    is_device_err(
        d.gather_rows(whole.sub(0, 64), &[4], 16, whole.sub(64, 16)),
        "a gather index past the table",
    );
    is_device_err(
        d.scatter_add_rows(whole.sub(0, 32), &[1, 1], 16, whole.sub(64, 64)),
        "a repeated scatter index",
    );
    let bad = Copy2d {
        rows: 4,
        width: 8,
        src_stride: 8,
        src_col: 1,
        dst_stride: 8,
        dst_col: 0,
    };
    is_device_err(
        d.copy2d(whole.sub(0, 32), whole.sub(64, 32), bad),
        "copy2d past the source",
    );
    is_device_err(
        d.copy2d(whole.sub(0, 40), whole.sub(4, 40), Copy2d::contiguous(32)),
        "copy2d onto itself",
    );
    let table = RopeTable {
        rd: 8,
        freqs: vec![1.0; 4],
    };
    is_device_err(
        d.rope(whole.sub(0, 32), 16, &[1], &table, false),
        "rope with too few positions",
    );
    is_device_err(
        d.swiglu_rows(
            whole.sub(0, 16),
            whole.sub(16, 16),
            7.0,
            &[1.0; 3],
            8,
            whole.sub(64, 24),
        ),
        "swiglu_rows of the wrong length",
    );
    is_device_err(
        d.mhc_post(
            whole.sub(0, 8),
            whole.sub(16, 4),
            whole.sub(32, 2),
            whole.sub(48, 4),
            2,
            4,
            whole.sub(64, 7),
        ),
        "mhc_post output of the wrong length",
    );
    // Routing: routes overlapping the scores, the routed experts' output overlapping their
    // work, and a routes slice of the wrong shape.
    is_device_err(
        d.route_experts(
            whole.sub(0, 16),
            8,
            2,
            dsv4_kernels::RouteChoice::Biased(&[0.0; 8]),
            1.0,
            whole.sub(8, 8),
        ),
        "routes overlapping the scores",
    );
    let (w1, w2) = (
        Linear::from_f32("w1", 8, 16, &[0.5; 128]).expect("weight"),
        Linear::from_f32("w2", 16, 8, &[0.5; 128]).expect("weight"),
    );
    let experts = dsv4_kernels::RoutedExperts {
        w1: &[&w1, &w1],
        w3: &[&w1, &w1],
        w2: &[&w2, &w2],
        k: 1,
        limit: 7.0,
        quant: false,
    };
    let work = experts.work_words(1, 16, 8);
    let routes = whole.sub(128, 2);
    d.write(routes, &[f32::from_bits(1), 1.0]).expect("write");
    is_device_err(
        d.routed_experts(
            &experts,
            whole.sub(0, 16),
            routes,
            whole.sub(192, work),
            whole.sub(192, 16),
        ),
        "routed experts writing over their work",
    );
    is_device_err(
        d.routed_experts(
            &experts,
            whole.sub(0, 16),
            whole.sub(128, 3),
            whole.sub(192, work),
            whole.sub(64, 16),
        ),
        "routes that are not rows of k experts",
    );
    d.routed_experts(
        &experts,
        whole.sub(0, 16),
        routes,
        whole.sub(192, work),
        whole.sub(64, 16),
    )
    .expect("the same call with consistent operands");
    // The device still works after all that.
    d.write(whole.sub(0, 4), &[1.0, 2.0, 3.0, 4.0])
        .expect("write");
    d.scale(whole.sub(0, 4), 2.0).expect("scale");
    assert_eq!(d.read(whole.sub(0, 4)).expect("read"), [2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn the_routing_knob_reaches_the_device_op_set() {
    if !emu_available("the_routing_knob_reaches_the_device_op_set") {
        return;
    }
    // `backend.cuda_routing` (BackendOptions::device_routing): the device routes unless told
    // to route on the host, and then refuses the routing ops rather than run them.
    for (choice, on) in [(None, true), (Some(true), true), (Some(false), false)] {
        let opts = dsv4_kernels::BackendOptions {
            device_routing: choice,
            ..Default::default()
        };
        let be = dsv4_backend_cuda::open_backend(EMU_NAME, &opts).expect("open the emulator");
        let d = dev(&be);
        assert_eq!(d.routes_on_device(), on, "{choice:?}");
        let (s, r) = (put(d, &[0.5; 8]), zeros(d, 4));
        let routed = d.route_experts(
            s,
            8,
            2,
            dsv4_kernels::RouteChoice::Biased(&[0.0; 8]),
            1.0,
            r,
        );
        assert_eq!(routed.is_ok(), on, "{choice:?}: {routed:?}");
    }
}

#[test]
fn the_attention_knob_reaches_the_device_op_set() {
    if !emu_available("the_attention_knob_reaches_the_device_op_set") {
        return;
    }
    // `backend.cuda_attention` (BackendOptions::device_attention): the device attends unless
    // told to attend from host copies, and then refuses the op rather than run it.
    for (choice, on) in [(None, true), (Some(true), true), (Some(false), false)] {
        let opts = dsv4_kernels::BackendOptions {
            device_attention: choice,
            ..Default::default()
        };
        let be = dsv4_backend_cuda::open_backend(EMU_NAME, &opts).expect("open the emulator");
        let d = dev(&be);
        assert_eq!(d.attends_on_device(), on, "{choice:?}");
        let layout =
            dsv4_core::cache::KvLayout::from_head_dims(dsv4_core::KvCacheDtype::Bf16, 10, 4, 2)
                .expect("a layout");
        let fmt = dsv4_kernels::RowFormat::Kv(layout);
        let page = vec![0u8; fmt.page_bytes()];
        let keys = dsv4_kernels::PagedAttention {
            fmt: &fmt,
            pages: &[&page],
            tags: &[],
            origins: &[],
            rows: &[(0, 1)],
            key_ids: &[0],
            key_starts: &[0, 1],
            sink: &[0.5],
            scale: 0.3,
        };
        let (q, o) = (put(d, &[0.25; 10]), zeros(d, 10));
        let attended = d.paged_attention(&keys, q, o);
        assert_eq!(attended.is_ok(), on, "{choice:?}: {attended:?}");
    }
}

#[test]
fn stats_count_the_traffic() {
    if !emu_available("stats_count_the_traffic") {
        return;
    }
    let be = backend(true);
    let d = dev(&be);
    assert_eq!(d.offset_alignment(), 16);
    let s0 = d.stats();
    let buf = d.alloc(4096).expect("alloc");
    let x = DevSlice::whole(buf, 4096);
    d.write(x.sub(0, 256), &[0.25; 256]).expect("write");
    let norm = vec![1.5f32; 256];
    let table = RopeTable {
        rd: 16,
        freqs: vec![0.5; 8],
    };
    let step = || {
        d.rms_norm(x.sub(0, 256), Some(&norm), 128, 1e-6, x.sub(256, 256))
            .expect("rms_norm");
        d.rope(x.sub(256, 256), 128, &[3, 4], &table, false)
            .expect("rope");
        d.swiglu_rows(
            x.sub(0, 256),
            x.sub(256, 256),
            7.0,
            &[1.0, 2.0],
            128,
            x.sub(512, 256),
        )
        .expect("swiglu_rows");
        d.scale(x.sub(512, 256), 0.5).expect("scale");
        d.flush().expect("flush");
        d.read(x.sub(512, 8)).expect("read")
    };
    let first = step();
    let s1 = d.stats().since(&s0);
    assert_eq!(s1.dispatches, 4, "{s1:?}");
    assert_eq!(
        (s1.reads, s1.read_bytes, s1.submissions),
        (1, 32, 1),
        "{s1:?}"
    );
    // the activation write, the norm weight and rope θ (both cached from now on), the rope
    // positions and the swiglu row weights
    assert_eq!(s1.writes, 5, "{s1:?}");
    assert_eq!(
        s1.write_bytes,
        256 * 4 + 128 * 4 + 8 * 8 + 2 * 8 + 2 * 4,
        "{s1:?}"
    );
    // the buffer, the cached norm weight and θ, the parameter arena
    assert_eq!(s1.allocs, 4, "{s1:?}");
    let again = step();
    assert_eq!(bits(&first), bits(&again));
    let s2 = d.stats().since(&s0).since(&s1);
    assert_eq!(
        (
            s2.dispatches,
            s2.reads,
            s2.submissions,
            s2.writes,
            s2.allocs
        ),
        (4, 1, 1, 2, 0),
        "a repeated step allocates nothing and uploads only positions and row weights: {s2:?}"
    );
}

#[test]
fn the_device_op_set_conforms_to_the_host_ops() {
    if !emu_available("the_device_op_set_conforms_to_the_host_ops") {
        return;
    }
    for acc_f64 in [true, false] {
        let fails = dsv4_kernels::device_check::conformance(&backend(acc_f64));
        assert!(
            fails.is_empty(),
            "f64 accumulation {acc_f64}:\n{}",
            fails.join("\n")
        );
    }
}

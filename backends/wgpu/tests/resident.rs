//! The device-resident op set (`DeviceOps`) of the wgpu backend: every op gives the bits of the
//! host op of the same name (the shared conformance check, in f64 and forced-f32 mode, plus a
//! whole chain of ops whose operands all live in one arena buffer, as a captured plan's do);
//! writes are ordered with queued dispatches; an identical second sequence of ops creates no
//! new bind groups; bad slices are errors. Skips with the reason when no adapter exists, except
//! under CI=true.

mod common;

use common::{backend, values};

use dsv4_core::IndexKDtype;
use dsv4_kernels::device_check::conformance;
use dsv4_kernels::{
    Backend, Copy2d, DevBufId, DevSlice, DeviceOps, HcParams, Linear, MhcPre, RopeTable,
};

fn same_bits(name: &str, host: &[f32], dev: &[f32]) {
    assert_eq!(host.len(), dev.len(), "{name}: lengths differ");
    let bad = host
        .iter()
        .zip(dev)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(
        bad,
        0,
        "{name}: {bad} of {} values differ from the host op",
        host.len()
    );
}

#[test]
fn the_device_ops_conform_in_f64_and_in_f32() {
    for allow_f64 in [true, false] {
        let Some(gpu) = backend(allow_f64) else {
            return;
        };
        let fails = conformance(&gpu);
        assert!(
            fails.is_empty(),
            "f64 allowed: {allow_f64}; {} failures:\n{}",
            fails.len(),
            fails.join("\n")
        );
    }
}

/// Operands carved out of one arena buffer at 256-byte offsets, as a captured plan lays out.
struct Arena {
    buf: DevBufId,
    next: usize,
}

impl Arena {
    fn new(dev: &dyn DeviceOps, words: usize) -> Self {
        Self {
            buf: dev.alloc(words).unwrap(),
            next: 64,
        }
    }

    fn take(&mut self, len: usize) -> DevSlice {
        let s = DevSlice {
            buf: self.buf,
            off: self.next,
            len,
        };
        self.next = (self.next + len).next_multiple_of(64);
        s
    }

    fn put(&mut self, dev: &dyn DeviceOps, v: &[f32]) -> DevSlice {
        let s = self.take(v.len());
        dev.write(s, v).unwrap();
        s
    }
}

const ROWS: usize = 3;
const DIM: usize = 256;
const OUT: usize = 160;
const HALF: usize = OUT / 2;
const M: usize = 4;
const D: usize = 64;
const T: usize = 3;
const POS: [usize; 3] = [7, 1000, 4095];
const ROW_W: [f32; 3] = [0.5, 1.25, -0.75];

/// The fixed inputs of the sequence.
struct Inputs {
    x: Vec<f32>,
    nw: Vec<f32>,
    w: Linear,
    table: RopeTable,
    fn_w: Vec<f32>,
    base: Vec<f32>,
    head_fn: Vec<f32>,
    head_base: Vec<f32>,
}

impl Inputs {
    fn new() -> Self {
        Self {
            x: values(ROWS * DIM, 1),
            nw: values(DIM, 2),
            w: Linear::from_f32("w", OUT, DIM, &values(OUT * DIM, 3)).unwrap(),
            table: RopeTable::plain(64, 10000.0),
            fn_w: values((2 + M) * M * M * D, 11),
            base: values((2 + M) * M, 12),
            head_fn: values(M * M * D, 14),
            head_base: values(M, 13),
        }
    }

    fn pre(&self) -> HcParams<'_> {
        HcParams {
            fn_w: &self.fn_w,
            base: &self.base,
            scale: &[0.5, 0.8, 1.1],
            m: M,
            d: D,
            norm_eps: 1e-6,
            hc_eps: 1e-6,
            sinkhorn_iters: 20,
        }
    }

    fn head(&self) -> HcParams<'_> {
        HcParams {
            fn_w: &self.head_fn,
            base: &self.head_base,
            scale: &[0.9],
            ..self.pre()
        }
    }
}

/// The sequence through the host ops: (label, result) per checked value.
fn host_side(gpu: &dyn Backend, i: &Inputs) -> Vec<(&'static str, Vec<f32>)> {
    let x = &i.x;
    let mut n = vec![0.0; ROWS * DIM];
    gpu.rms_norm(x, Some(&i.nw), DIM, 1e-6, &mut n);
    let mut h = vec![0.0; ROWS * OUT];
    gpu.linear(&i.w, &n, ROWS, &mut h);
    let mut s: Vec<f32> = n.iter().zip(x).map(|(a, b)| a + b).collect();
    s.iter_mut().for_each(|v| *v = (f64::from(*v) * 0.3) as f32);
    gpu.act_quant_fp8(&mut s, DIM);
    let mut r = x.clone();
    gpu.rope(&mut r, DIM, &POS, &i.table, false);
    gpu.hadamard(&mut r, DIM);
    gpu.round_index_rows(IndexKDtype::Fp4, &mut r, DIM);
    let mut sw = vec![0.0; ROWS * HALF];
    for (k, wt) in ROW_W.iter().enumerate() {
        let g = &h[k * OUT..k * OUT + HALF];
        let u = &h[k * OUT + HALF..(k + 1) * OUT];
        gpu.swiglu(g, u, 0.7, *wt, &mut sw[k * HALF..(k + 1) * HALF]);
    }
    let mut sc = sw.clone();
    for (dst, src) in [(1usize, 2usize), (2, 0)] {
        for c in 0..HALF {
            sc[dst * HALF + c] += sw[src * HALF + c];
        }
    }
    let xs = &x[..T * M * D];
    let pre = gpu.mhc_pre(&i.pre(), xs, T);
    let mut post = vec![0.0; T * M * D];
    let pc = MhcPre {
        u: vec![],
        post: pre.post.clone(),
        comb: pre.comb.clone(),
    };
    gpu.mhc_post(xs, &pre.u, &pc, M, D, &mut post);
    let mut head = vec![0.0; T * D];
    gpu.hc_head(&i.head(), xs, T, &mut head);
    vec![
        ("rms_norm", n),
        ("linear", h),
        ("add→scale→act_quant", s),
        ("copy→rope→hadamard→round_index", r),
        ("copy2d→swiglu_rows→gather→scatter_add", sc),
        ("mhc_pre u", pre.u),
        ("mhc_pre post", pre.post),
        ("mhc_pre comb", pre.comb),
        ("mhc_post", post),
        ("hc_head", head),
    ]
}

/// The same sequence through the device ops, every operand in `arena` (nothing read back);
/// the slices holding the checked values, in `host_side`'s order.
fn device_side(dev: &dyn DeviceOps, i: &Inputs, arena: &mut Arena) -> Vec<DevSlice> {
    let dx = arena.put(dev, &i.x);
    let dn = arena.take(ROWS * DIM);
    dev.rms_norm(dx, Some(&i.nw), DIM, 1e-6, dn).unwrap();
    let dh = arena.take(ROWS * OUT);
    dev.linear(&i.w, dn, ROWS, dh).unwrap();
    let ds = arena.take(ROWS * DIM);
    dev.add(dn, dx, ds).unwrap();
    dev.scale(ds, 0.3).unwrap();
    dev.act_quant_fp8(ds, DIM).unwrap();
    let dr = arena.take(ROWS * DIM);
    dev.copy2d(dx, dr, Copy2d::contiguous(ROWS * DIM)).unwrap();
    dev.rope(dr, DIM, &POS, &i.table, false).unwrap();
    dev.hadamard(dr, DIM).unwrap();
    dev.round_index_rows(IndexKDtype::Fp4, dr, DIM).unwrap();
    let (dg, du) = (arena.take(ROWS * HALF), arena.take(ROWS * HALF));
    let shape = Copy2d {
        rows: ROWS,
        width: HALF,
        src_stride: OUT,
        src_col: 0,
        dst_stride: HALF,
        dst_col: 0,
    };
    dev.copy2d(dh, dg, shape).unwrap();
    dev.copy2d(
        dh,
        du,
        Copy2d {
            src_col: HALF,
            ..shape
        },
    )
    .unwrap();
    let dsw = arena.take(ROWS * HALF);
    dev.swiglu_rows(dg, du, 0.7, &ROW_W, HALF, dsw).unwrap();
    let dga = arena.take(2 * HALF);
    dev.gather_rows(dsw, &[2, 0], HALF, dga).unwrap();
    dev.scatter_add_rows(dga, &[1, 2], HALF, dsw).unwrap();
    let dxs = DevSlice {
        len: T * M * D,
        ..dx
    };
    let (du2, dpost, dcomb) = (arena.take(T * D), arena.take(T * M), arena.take(T * M * M));
    dev.mhc_pre(&i.pre(), dxs, T, du2, dpost, dcomb).unwrap();
    let dpo = arena.take(T * M * D);
    dev.mhc_post(dxs, du2, dpost, dcomb, M, D, dpo).unwrap();
    let dhead = arena.take(T * D);
    dev.hc_head(&i.head(), dxs, T, dhead).unwrap();
    vec![dn, dh, ds, dr, dsw, du2, dpost, dcomb, dpo, dhead]
}

fn verify(dev: &dyn DeviceOps, host: &[(&str, Vec<f32>)], slices: &[DevSlice]) {
    for ((label, h), s) in host.iter().zip(slices) {
        same_bits(label, h, &dev.read(*s).unwrap());
    }
}

#[test]
fn ops_on_one_arena_match_the_host_ops_and_a_replay_reuses_every_setup() {
    for allow_f64 in [true, false] {
        let Some(gpu) = backend(allow_f64) else {
            return;
        };
        let dev = gpu.device().expect("wgpu has device ops");
        let inputs = Inputs::new();
        let host = host_side(&gpu, &inputs);
        let mut arena = Arena::new(dev, 1 << 16);
        let first = device_side(dev, &inputs, &mut arena);
        verify(dev, &host, &first);
        // The same sequence again on the same arena offsets (a captured plan's replay): one
        // submission (the read), and every dispatch setup reused.
        let s0 = dev.stats();
        let mut again = Arena {
            buf: arena.buf,
            next: 64,
        };
        let second = device_side(dev, &inputs, &mut again);
        assert_eq!(first, second);
        let _ = dev.read(*second.last().unwrap()).unwrap();
        let d = dev.stats().since(&s0);
        eprintln!("f64 {allow_f64}: replay {d:?}");
        verify(dev, &host, &second);
        assert_eq!(d.setups_created, 0, "{d:?}");
        assert_eq!(d.setups_reused, d.dispatches, "{d:?}");
        // Without f64, scale by 0.3 (not an f32) runs on the host: one more read and write.
        let fallback = u64::from(!gpu.adapter().f64_accumulation);
        assert_eq!(
            (d.submissions, d.reads, d.allocs),
            (1 + fallback, 1 + fallback, 0),
            "{d:?}"
        );
        assert!(d.dispatches >= 19, "{d:?}");
    }
}

#[test]
fn a_write_after_a_queued_dispatch_does_not_change_what_it_read() {
    let Some(gpu) = backend(true) else { return };
    let dev = gpu.device().unwrap();
    let n = 300;
    let (a, b) = (values(n, 31), values(n, 32));
    let mut arena = Arena::new(dev, 4096);
    let (da, dsum, dcopy) = (arena.put(dev, &a), arena.take(n), arena.take(n));
    // Queue: sum = a + a; copy = a; then overwrite a, all before any submission.
    dev.add(da, da, dsum).unwrap();
    dev.copy2d(da, dcopy, Copy2d::contiguous(n)).unwrap();
    dev.write(da, &b).unwrap();
    // And a dispatch after the write sees the new values.
    let dlater = arena.take(n);
    dev.add(da, da, dlater).unwrap();
    let s0 = dev.stats();
    let sum = dev.read(dsum).unwrap();
    assert_eq!(dev.stats().since(&s0).submissions, 1);
    let twice = |v: &[f32]| v.iter().map(|x| x + x).collect::<Vec<f32>>();
    same_bits("a + a queued before the write", &twice(&a), &sum);
    same_bits(
        "copy queued before the write",
        &a,
        &dev.read(dcopy).unwrap(),
    );
    same_bits("a after the write", &b, &dev.read(da).unwrap());
    same_bits(
        "b + b queued after the write",
        &twice(&b),
        &dev.read(dlater).unwrap(),
    );
    // The same across a flush: flushed work keeps its order with later writes.
    dev.scale(dsum, 2.0).unwrap();
    dev.flush().unwrap();
    dev.write(dsum, &a).unwrap();
    same_bits("write after a flushed scale", &a, &dev.read(dsum).unwrap());
}

#[test]
fn bad_slices_are_errors_not_panics() {
    let Some(mut gpu) = backend(true) else { return };
    let dev = gpu.device().unwrap();
    let align = dev.offset_alignment();
    eprintln!("offset alignment: {align} bytes");
    assert!(align >= 4 && 256 % align == 0);
    let buf = dev.alloc(4096).unwrap();
    let at = |off: usize, len: usize| DevSlice { buf, off, len };
    if align > 4 {
        let e = dev.add(at(1, 64), at(256, 64), at(512, 64)).unwrap_err();
        assert!(e.to_string().contains("alignment"), "{e}");
        assert!(dev.write(at(1, 4), &[0.0; 4]).is_err());
        assert!(dev.read(at(1, 4)).is_err());
    }
    assert!(
        dev.add(at(0, 64), at(256, 64), at(4064, 64)).is_err(),
        "past the end"
    );
    assert!(
        dev.add(at(0, 64), at(256, 63), at(512, 64)).is_err(),
        "lengths"
    );
    assert!(dev.alloc(0).is_err());
    dev.free(buf);
    assert!(dev.read(at(0, 4)).is_err(), "freed");
    assert!(
        dev.scatter_add_rows(at(0, 8), &[0, 0], 4, at(8, 8))
            .is_err()
    );
    // A slice larger than one binding: an error, not a wgpu validation panic.
    gpu.cap_binding_bytes(1024);
    let dev = gpu.device().unwrap();
    let big = dev.alloc(1024).unwrap();
    let e = dev
        .add(
            DevSlice::whole(big, 512),
            DevSlice::whole(big, 512),
            DevSlice::whole(big, 512),
        )
        .unwrap_err();
    assert!(e.to_string().contains("binding"), "{e}");
    // ... though reads and writes of it (copies, not bindings) work.
    dev.write(DevSlice::whole(big, 1024), &values(1024, 5))
        .unwrap();
    same_bits(
        "big read",
        &values(1024, 5),
        &dev.read(DevSlice::whole(big, 1024)).unwrap(),
    );
}

#[test]
fn scale_runs_on_the_device_unless_f32_cannot_match() {
    for allow_f64 in [true, false] {
        let Some(gpu) = backend(allow_f64) else {
            return;
        };
        let dev = gpu.device().unwrap();
        let x = values(500, 41);
        for s in [2.0, 0.3, 1.0 / 3.0, 1e300, -0.0] {
            let buf = dev.alloc(500).unwrap();
            let sl = DevSlice::whole(buf, 500);
            dev.write(sl, &x).unwrap();
            let s0 = dev.stats();
            dev.scale(sl, s).unwrap();
            let d = dev.stats().since(&s0);
            // -0.0 is scaled on the host (the three-part sum would lose its sign).
            let on_host = s.to_bits() == (-0.0f64).to_bits()
                || ((s as f32) as f64 != s && !(allow_f64 && s.abs() < 1e30));
            assert_eq!(
                d.reads,
                u64::from(on_host),
                "s = {s}, f64 {allow_f64}: {d:?}"
            );
            assert_eq!(d.dispatches, u64::from(!on_host), "s = {s}: {d:?}");
            let host: Vec<f32> = x.iter().map(|v| (f64::from(*v) * s) as f32).collect();
            same_bits(&format!("scale by {s}"), &host, &dev.read(sl).unwrap());
            dev.free(buf);
        }
    }
}

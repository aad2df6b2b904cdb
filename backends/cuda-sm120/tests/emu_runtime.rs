//! Self-tests of the cuda-emu CPU emulator (src/emu.rs, emu/shim.h, emu/runtime.cpp) on the
//! test-only kernels of kernels/selftest.cu: barriers and shared memory, shuffles, warp
//! reductions, grid indices, atomics, parameter passing (the errors a launch reports are in
//! tests/emu_errors.rs).

mod common;

use common::emu_available;
use common::selftest::{f32s, selftest_tu, u32s};

use dsv4_backend_cuda::{CudaError, DevBuf, Device, KArg, emu};
use std::sync::OnceLock;

fn available(test: &str) -> bool {
    emu_available(test)
}

fn dev(acc_f64: bool) -> &'static Device {
    static F64: OnceLock<Device> = OnceLock::new();
    static F32: OnceLock<Device> = OnceLock::new();
    let cell = if acc_f64 { &F64 } else { &F32 };
    cell.get_or_init(|| emu::open_with_source(&selftest_tu(), acc_f64).unwrap())
}

fn u64s(d: &Device, b: &DevBuf, n: usize) -> Vec<u64> {
    let mut bytes = vec![0u8; n * 8];
    d.download(b, &mut bytes).unwrap();
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f64s(d: &Device, b: &DevBuf, n: usize) -> Vec<f64> {
    u64s(d, b, n).into_iter().map(f64::from_bits).collect()
}

fn f64_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Deterministic pseudo-random floats in [-1, 1).
fn floats(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn syncthreads_orders_shared_memory_across_warps_and_blocks() {
    if !available("syncthreads_orders_shared_memory_across_warps_and_blocks") {
        return;
    }
    let d = dev(true);
    let (blocks, threads) = (3u32, 256u32);
    let out = d.alloc((blocks * threads) as usize * 4).unwrap();
    unsafe {
        d.launch(
            "st_shared_rounds",
            (blocks, 1, 1),
            (threads, 1, 1),
            &[KArg::Buf(&out)],
        )
    }
    .unwrap();
    let got = u32s(d, &out, (blocks * threads) as usize);
    for b in 0..blocks {
        let s0: Vec<u32> = (0..threads).map(|t| b * 1000 + t * 3 + 1).collect();
        let a: Vec<u32> = (0..threads)
            .map(|t| s0[((t + 37) % threads) as usize] + s0[(threads - 1 - t) as usize])
            .collect();
        for t in 0..threads {
            let want = a[((t + 100) % threads) as usize] ^ (a[t as usize] << 1);
            assert_eq!(
                got[(b * threads + t) as usize],
                want,
                "block {b} thread {t}"
            );
        }
    }
}

#[test]
fn shuffles_exchange_every_type_by_xor_and_index() {
    if !available("shuffles_exchange_every_type_by_xor_and_index") {
        return;
    }
    let d = dev(false);
    let n = 128usize;
    let fin = floats(n, 7);
    let din: Vec<f64> = floats(n, 8)
        .iter()
        .map(|&v| f64::from(v) * 1e-3 + 1e-12)
        .collect();
    let fb = d.upload_f32(&fin).unwrap();
    let db = d.upload(&f64_bytes(&din)).unwrap();
    for (mask, src) in [(1u32, 0u32), (16, 5), (7, 31), (31, 13)] {
        let outs: Vec<DevBuf> = [4, 4, 8, 8, 4, 4]
            .iter()
            .map(|w| d.alloc(n * w).unwrap())
            .collect();
        let mut args = vec![KArg::Buf(&fb), KArg::Buf(&db)];
        args.extend(outs.iter().map(KArg::Buf));
        args.extend([KArg::U32(mask), KArg::U32(src)]);
        unsafe { d.launch("st_shuffles", (2, 1, 1), (64, 1, 1), &args) }.unwrap();
        let (fx, fi) = (f32s(d, &outs[0], n), f32s(d, &outs[1], n));
        let (dx, di) = (f64s(d, &outs[2], n), f64s(d, &outs[3], n));
        let (ix, ui) = (u32s(d, &outs[4], n), u32s(d, &outs[5], n));
        for g in 0..n {
            let warp = g / 32 * 32;
            let x = warp + ((g % 32) ^ mask as usize);
            let i = warp + ((g % 32) * 7 + src as usize) % 32;
            assert_eq!(
                fx[g].to_bits(),
                fin[x].to_bits(),
                "float xor {mask} lane {g}"
            );
            assert_eq!(fi[g].to_bits(), fin[i].to_bits(), "float idx lane {g}");
            assert_eq!(dx[g].to_bits(), din[x].to_bits(), "double xor lane {g}");
            assert_eq!(di[g].to_bits(), din[i].to_bits(), "double idx lane {g}");
            assert_eq!(ix[g] as i32, (x as i32) * -3, "int xor lane {g}");
            assert_eq!(ui[g], i as u32 * 5, "unsigned idx lane {g}");
        }
    }
}

/// warp_sum's xor butterfly, sequentially: at each step lane l adds lane l ^ o's value.
fn butterfly<T: Copy + std::ops::Add<Output = T>>(mut v: Vec<T>) -> Vec<T> {
    let mut o = 16;
    while o > 0 {
        v = (0..32).map(|l| v[l] + v[l ^ o]).collect();
        o >>= 1;
    }
    v
}

#[test]
fn warp_sum_matches_its_sequential_butterfly_in_both_accumulations() {
    if !available("warp_sum_matches_its_sequential_butterfly_in_both_accumulations") {
        return;
    }
    let n = 96usize;
    let x = floats(n, 3);
    for acc_f64 in [true, false] {
        let d = dev(acc_f64);
        let xb = d.upload_f32(&x).unwrap();
        let sum = d.alloc(n * 8).unwrap();
        let mx = d.alloc(n * 4).unwrap();
        unsafe {
            d.launch(
                "st_warp_reduce",
                (1, 1, 1),
                (n as u32, 1, 1),
                &[KArg::Buf(&xb), KArg::Buf(&sum), KArg::Buf(&mx)],
            )
        }
        .unwrap();
        let maxes = f32s(d, &mx, n);
        for w in 0..n / 32 {
            let lanes = &x[w * 32..w * 32 + 32];
            let want_max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let seq: f64 = lanes.iter().map(|&v| f64::from(v)).sum();
            if acc_f64 {
                let got = f64s(d, &sum, n);
                let want = butterfly(lanes.iter().map(|&v| f64::from(v)).collect());
                for l in 0..32 {
                    assert_eq!(
                        got[w * 32 + l].to_bits(),
                        want[l].to_bits(),
                        "warp {w} lane {l}"
                    );
                    assert!(
                        (got[w * 32 + l] - seq).abs() < 1e-12,
                        "f64 sum vs sequential"
                    );
                }
            } else {
                let got = f32s(d, &sum, n);
                let want = butterfly(lanes.to_vec());
                for l in 0..32 {
                    assert_eq!(
                        got[w * 32 + l].to_bits(),
                        want[l].to_bits(),
                        "warp {w} lane {l}"
                    );
                    assert!((f64::from(got[w * 32 + l]) - seq).abs() < 1e-5, "f32 sum");
                }
            }
            for l in 0..32 {
                assert_eq!(maxes[w * 32 + l], want_max, "warp {w} lane {l} max");
            }
        }
    }
}

#[test]
fn grid_and_block_indices_cover_3d_launches() {
    if !available("grid_and_block_indices_cover_3d_launches") {
        return;
    }
    let d = dev(true);
    for (grid, block) in [
        ((3u32, 2u32, 2u32), (4u32, 3u32, 2u32)),
        ((5, 4, 1), (32, 2, 1)),
    ] {
        let threads = block.0 * block.1 * block.2;
        let total = (grid.0 * grid.1 * grid.2 * threads) as usize;
        let out = d.alloc(total * 16).unwrap();
        unsafe { d.launch("st_indices", grid, block, &[KArg::Buf(&out)]) }.unwrap();
        let got = u32s(d, &out, total * 4);
        let pack = |a: u32, b: u32, c: u32| a | (b << 10) | (c << 20);
        let mut k = 0;
        for bz in 0..grid.2 {
            for by in 0..grid.1 {
                for bx in 0..grid.0 {
                    for tz in 0..block.2 {
                        for ty in 0..block.1 {
                            for tx in 0..block.0 {
                                let want = [
                                    pack(tx, ty, tz),
                                    pack(bx, by, bz),
                                    pack(block.0, block.1, block.2),
                                    pack(grid.0, grid.1, grid.2),
                                ];
                                assert_eq!(got[k * 4..k * 4 + 4], want, "thread {k}");
                                k += 1;
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn integer_atomics_count_sum_and_max() {
    if !available("integer_atomics_count_sum_and_max") {
        return;
    }
    let d = dev(true);
    let (blocks, threads) = (4u32, 96u32);
    let n = (blocks * threads) as usize;
    let count = d.alloc(4).unwrap();
    let total = d.alloc(8).unwrap();
    let maxv = d.alloc(4).unwrap();
    let order = d.alloc(n * 4).unwrap();
    let args = [
        KArg::Buf(&count),
        KArg::Buf(&total),
        KArg::Buf(&maxv),
        KArg::Buf(&order),
    ];
    unsafe { d.launch("st_atomics", (blocks, 1, 1), (threads, 1, 1), &args) }.unwrap();
    assert_eq!(u32s(d, &count, 1)[0], n as u32);
    let want_total: u64 = (0..n as u64).map(|g| g * (1u64 << 32) + 1).sum();
    assert_eq!(u64s(d, &total, 1)[0], want_total);
    let want_max = (0..n as u32)
        .map(|g| g.wrapping_mul(2_654_435_761) >> 7)
        .max();
    assert_eq!(Some(u32s(d, &maxv, 1)[0]), want_max);
    let mut seen = u32s(d, &order, n);
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..n as u32).collect::<Vec<_>>(),
        "every ticket taken once"
    );
}

#[test]
fn scalar_parameters_math_and_bit_casts() {
    if !available("scalar_parameters_math_and_bit_casts") {
        return;
    }
    let d = dev(true);
    let (x, y, big, neg) = (1.75f32, 2.5f64, 0x0000_0009_0000_0004u64, -5i32);
    let f = d.alloc(7 * 4).unwrap();
    let db = d.alloc(3 * 8).unwrap();
    let u = d.alloc(6 * 4).unwrap();
    let args = [
        KArg::Buf(&f),
        KArg::Buf(&db),
        KArg::Buf(&u),
        KArg::U64(big),
        KArg::I32(neg),
        KArg::F32(x),
        KArg::F64(y),
    ];
    unsafe { d.launch("st_math", (1, 1, 1), (32, 1, 1), &args) }.unwrap();
    let (fv, dv, uv) = (f32s(d, &f, 7), f64s(d, &db, 3), u32s(d, &u, 6));
    assert_eq!(fv[0], x.sqrt());
    assert_eq!(fv[1], f64::from(x).exp() as f32);
    assert_eq!(
        fv[2],
        x.max(-x) + x.min(2.0) + x.abs() + x.floor() + x.ceil()
    );
    assert_eq!(fv[3], x.min(0.5) + x.max(0.5) + x * 8.0 + x.mul_add(x, 1.0));
    assert_eq!(fv[4].to_bits(), x.to_bits() + 1);
    assert_eq!(fv[5], -x);
    let t = x.tanh() + x.ln_1p() + x.ln() + x.sin() + x.cos() + x.exp() + x.sqrt();
    assert!(
        (fv[6] - t).abs() <= 4.0 * f32::EPSILON * t.abs(),
        "{} vs {t}",
        fv[6]
    );
    let t = y.sqrt() + y.ln() + y.ln_1p() + y.sin() + y.cos() + y + y.max(1.0) + y.min(1.0);
    assert!(
        (dv[0] - t).abs() <= 8.0 * f64::EPSILON * t.abs(),
        "{} vs {t}",
        dv[0]
    );
    assert_eq!(dv[1].to_bits(), y.to_bits() + 1);
    let t = y / 4.0 + y.floor() + y.ceil() + y.tanh() + y.mul_add(y, 1.0) + y.exp();
    assert!(
        (dv[2] - t).abs() <= 8.0 * f64::EPSILON * t.abs(),
        "{} vs {t}",
        dv[2]
    );
    assert_eq!(uv[0], ((-5i32) as u32).wrapping_add(3 * 16));
    assert_eq!(uv[1], 4 + 9 * 65536);
    assert_eq!(uv[2], 2 + 4); // x - x is 0, not NaN
    assert_eq!(uv[3], uv[1]);
    assert_eq!(uv[4], 9);
    assert_eq!(uv[5] as i32, neg);
}

#[test]
fn a_zero_size_grid_launches_nothing() {
    if !available("a_zero_size_grid_launches_nothing") {
        return;
    }
    let d = dev(true);
    let out = d.upload(&[0xAB; 64]).unwrap();
    for grid in [(0, 1, 1), (4, 0, 1), (4, 1, 0)] {
        unsafe {
            d.launch(
                "st_fill",
                grid,
                (16, 1, 1),
                &[KArg::Buf(&out), KArg::U32(16)],
            )
        }
        .unwrap();
    }
    let mut got = [0u8; 64];
    d.download(&out, &mut got).unwrap();
    assert_eq!(got, [0xAB; 64]);
}

#[test]
fn many_threads_without_barriers_run_fast() {
    if !available("many_threads_without_barriers_run_fast") {
        return;
    }
    let d = dev(true);
    let n = 256 * 1024usize;
    let out = d.alloc(n * 4).unwrap();
    let args = [KArg::Buf(&out), KArg::U32(n as u32)];
    unsafe { d.launch("st_fill", (256, 1, 1), (1024, 1, 1), &args) }.unwrap(); // warm the stacks
    let t = std::time::Instant::now();
    unsafe { d.launch("st_fill", (256, 1, 1), (1024, 1, 1), &args) }.unwrap();
    let dt = t.elapsed();
    eprintln!(
        "256x1024-thread launch without barriers: {:.1} ms ({:.1} ns per thread)",
        dt.as_secs_f64() * 1e3,
        dt.as_secs_f64() * 1e9 / n as f64
    );
    assert_eq!(u32s(d, &out, n), (0..n as u32).collect::<Vec<_>>());
    // The same number of threads through 10 warp shuffles each (warp_sum + warp_max).
    let x = d.upload_f32(&floats(n, 5)).unwrap();
    let sum = d.alloc(n * 8).unwrap();
    let mx = d.alloc(n * 4).unwrap();
    let args = [KArg::Buf(&x), KArg::Buf(&sum), KArg::Buf(&mx)];
    let t = std::time::Instant::now();
    unsafe { d.launch("st_warp_reduce", (1024, 1, 1), (256, 1, 1), &args) }.unwrap();
    let dt = t.elapsed();
    eprintln!(
        "256x1024 threads with 10 shuffles each: {:.1} ms ({:.1} ns per thread-shuffle)",
        dt.as_secs_f64() * 1e3,
        dt.as_secs_f64() * 1e9 / (n * 10) as f64
    );
}

#[test]
fn the_backend_kernels_build_and_the_device_reports_itself() {
    if !available("the_backend_kernels_build_and_the_device_reports_itself") {
        return;
    }
    for acc_f64 in [true, false] {
        let d = emu::open(acc_f64).unwrap();
        let info = d.info();
        assert_eq!(info.name, emu::DEVICE_NAME);
        assert_eq!(info.capability, (12, 0));
        assert!(info.emulated);
        assert_eq!(info.f64_accumulation, acc_f64);
        // Host memory round trip, and a bounds check on raw copies.
        let b = d.upload(&[1, 2, 3, 4, 5]).unwrap();
        let mut got = [0u8; 5];
        d.download(&b, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3, 4, 5]);
        assert!(d.write(&b, &[0; 6]).is_err());
        let e = unsafe { d.launch("no_such_kernel", (1, 1, 1), (1, 1, 1), &[]) }.unwrap_err();
        assert_eq!(e, CudaError::NoSuchKernel("no_such_kernel".into()));
    }
}

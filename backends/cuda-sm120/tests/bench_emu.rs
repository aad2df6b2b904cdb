//! The device bench (`dsv4 bench --backend cuda-sm120`) on the CPU emulator: its kernels do what
//! they claim (the copy kernel copies) and the report's numbers are finite and consistent. The
//! emulator's timings mean nothing; this proves the path a GPU run takes.
//!
//! Needs a host C++ compiler; without one each test prints why and skips, except under CI=true.

mod common;

use common::emu_available;

use dsv4_backend_cuda::{CudaBackend, DecodeShape, EMU_NAME, KArg, LinearPath, bench, emu};
use dsv4_kernels::WeightFormat;

fn available(test: &str) -> bool {
    emu_available(test)
}

#[test]
fn the_copy_kernel_copies_every_vector_and_nothing_beyond() {
    if !available("the_copy_kernel_copies_every_vector_and_nothing_beyond") {
        return;
    }
    let dev = emu::open(true).unwrap();
    let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let a = dev.upload(&src).unwrap();
    let b = dev.alloc(src.len()).unwrap();
    // 200 of the 256 vectors, on fewer threads than vectors (the grid-stride loop).
    unsafe {
        dev.launch(
            "bench_copy",
            (3, 1, 1),
            (32, 1, 1),
            &[KArg::Buf(&a), KArg::Buf(&b), KArg::U64(200)],
        )
        .unwrap()
    };
    let mut got = vec![0u8; src.len()];
    dev.download(&b, &mut got).unwrap();
    assert_eq!(got[..3200], src[..3200]);
    assert!(got[3200..].iter().all(|&x| x == 0), "wrote past n_vec");
}

#[test]
fn the_device_bench_reports_finite_fractions_of_its_own_peaks() {
    if !available("the_device_bench_reports_finite_fractions_of_its_own_peaks") {
        return;
    }
    let backend = CudaBackend::new(EMU_NAME, emu::open(true).unwrap());
    let r = bench::run(&backend).unwrap();
    assert!(r.peaks.emulated);
    assert!(r.peaks.copy_gbs.is_finite() && r.peaks.copy_gbs > 0.0);
    assert!(r.peaks.fma_f32_tflops.is_finite() && r.peaks.fma_f32_tflops > 0.0);
    assert_eq!(r.peaks.mma_bf16_tflops, None, "no mma on the emulator");
    assert_eq!(r.linear.len(), 8);
    assert_eq!(
        r.linear
            .iter()
            .map(|t| (t.groups, t.path))
            .collect::<Vec<_>>(),
        [1, 1, 2, 2, 1, 1, 1, 1]
            .into_iter()
            .zip([LinearPath::Simt, LinearPath::Mma].into_iter().cycle())
            .collect::<Vec<_>>(),
        "a plain fp8 GEMV, the grouped experts' GEMV, an MXFP4 GEMV, a prefill GEMM, each on \
         SIMT and tensor cores"
    );
    // The three decode cases on each of their format's shapes, in DecodeShape::compiled's
    // order, the default marked.
    let cases: Vec<&[bench::ShapeTiming]> =
        r.decode_shapes.chunk_by(|a, b| a.case == b.case).collect();
    assert_eq!(cases.len(), 3, "{:?}", r.decode_shapes);
    for case in cases {
        let format = if case[0].case.starts_with("gemv_mxfp4") {
            WeightFormat::Mxfp4
        } else {
            WeightFormat::Fp8Block
        };
        let names: Vec<String> = DecodeShape::compiled(format)
            .iter()
            .map(|s| s.name())
            .collect();
        assert_eq!(
            case.iter().map(|s| s.shape.clone()).collect::<Vec<_>>(),
            names,
            "{case:?}"
        );
        let selected: Vec<&str> = case
            .iter()
            .filter(|s| s.selected)
            .map(|s| s.shape.as_str())
            .collect();
        assert_eq!(selected, [names[0].as_str()], "{case:?}");
        for s in case {
            assert!(s.seconds > 0.0 && s.speedup > 0.0, "{s:?}");
            assert!(!s.selected || s.speedup == 1.0, "{s:?}");
        }
    }
    for t in &r.linear {
        assert!(t.seconds > 0.0 && t.seconds.is_finite(), "{t:?}");
        let ratio = t.weight_gbs / r.peaks.copy_gbs;
        assert!(
            (t.of_copy_bandwidth - ratio).abs() <= 1e-12 * ratio,
            "{t:?}"
        );
        // Both timings: the graph replay (the emulated driver builds graphs too) and the
        // launches one by one, each with its own fraction of the copy bandwidth.
        assert!(t.graphed, "the calls replayed as a graph: {t:?}");
        assert!(
            t.launched_seconds > 0.0 && t.launched_seconds.is_finite(),
            "{t:?}"
        );
        let launched = t.weight_bytes as f64 / t.launched_seconds / 1e9 / r.peaks.copy_gbs;
        assert!(
            (t.launched_of_copy_bandwidth - launched).abs() <= 1e-12 * launched,
            "{t:?}"
        );
        assert!(t.of_matrix_rate.is_none());
        assert_eq!(
            t.copies, 2,
            "the emulator rotates through two copies: {t:?}"
        );
    }
    assert!(r.peaks.fma_f64_tflops.is_finite() && r.peaks.fma_f64_tflops > 0.0);
    assert!(r.peaks.f64_sums, "the emulator was opened with f64 sums");
    assert_eq!(
        r.kernels.len(),
        3,
        "the paged indexer, paged attention, mHC mixing: {:?}",
        r.kernels
    );
    for k in &r.kernels {
        assert!(
            k.seconds > 0.0 && k.seconds.is_finite() && k.multiplies > 0.0,
            "{k:?}"
        );
        let rate = 2.0 * k.tera_multiplies / r.peaks.fma_f64_tflops;
        assert!((k.of_fma_rate - rate).abs() <= 1e-12 * rate, "{k:?}");
    }
    // A MoE layer both ways: every time measured, the ratio theirs, routes within the layer.
    let m = &r.routing;
    for v in [m.device_seconds, m.route_seconds, m.host_grouped_seconds] {
        assert!(v > 0.0 && v.is_finite(), "{m:?}");
    }
    assert!(
        (m.ratio - m.device_seconds / m.host_grouped_seconds).abs() <= 1e-12 * m.ratio,
        "{m:?}"
    );
    assert!(m.case.contains("k = 2, 3 tokens"), "{m:?}");
    // The weights the bench timed stay resident for the next call.
    assert!(backend.resident_weight_bytes() >= 256 * 256);
}

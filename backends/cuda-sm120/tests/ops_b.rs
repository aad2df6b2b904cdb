//! The mHC, attention-side, top-k and checksum kernels (kernels/{mhc,attention,topk,checksum}.cu)
//! on the CPU emulator against the reference backend: the diff harness's op sweep with both
//! accumulation settings, a ≤ 1-ulp check with f64 accumulation, a top-k property test on
//! adversarial scores, the canary checksum, and batch invariance of mhc_pre / hc_head.
//!
//! Needs a host C++ compiler (`apt-get install g++`); without one each test prints why and
//! skips, except under CI=true, where that is a failure.

mod common;

use common::emu_available;

use dsv4_backend_cuda::{CudaBackend, EMU_NAME, emu};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::SplitMix64;
use dsv4_core::cache::page_checksum;
use dsv4_diff::Status;
use dsv4_diff::ops::{OpsOptions, run_ops};
use dsv4_kernels::{Backend, HcParams};

/// The emulated backend with f64 (`acc_f64`) or f32 accumulation, or None (printing why) when
/// the emulator cannot run here; under CI=true that panics instead.
fn backend(test: &str, acc_f64: bool) -> Option<CudaBackend> {
    if !emu_available(test) {
        return None;
    }
    let dev = emu::open(acc_f64).unwrap_or_else(|e| panic!("{test}: opening the emulator: {e}"));
    Some(CudaBackend::new(EMU_NAME, dev))
}

const OPS: [&str; 7] = [
    "mhc_pre",
    "mhc_post",
    "hc_head",
    "softmax_pool",
    "indexer_scores",
    "topk",
    "sparse_attention",
];

fn sweep(test: &str, acc_f64: bool) {
    let Some(cand) = backend(test, acc_f64) else {
        return;
    };
    for seed in [0u64, 7] {
        let opts = OpsOptions {
            ops: OPS.iter().map(|s| s.to_string()).collect(),
            seed,
            full: true,
            ..Default::default()
        };
        let report = run_ops(&ReferenceBackend, &cand, &opts).expect("op sweep");
        let bad: Vec<String> = report
            .cases
            .iter()
            .filter(|c| c.status != Status::Pass)
            .map(|c| {
                format!(
                    "{} {:?} value {:?}: {:?}",
                    c.name, c.status, c.value, c.detail
                )
            })
            .collect();
        assert!(
            bad.is_empty() && report.summary.fail == 0,
            "seed {seed}, acc f64 {acc_f64}:\n{}",
            bad.join("\n")
        );
        assert!(report.summary.pass >= 35, "{:?}", report.summary);
    }
}

#[test]
fn op_sweep_passes_with_f64_accumulation() {
    sweep("op_sweep_passes_with_f64_accumulation", true);
}

#[test]
fn op_sweep_passes_with_f32_accumulation() {
    sweep("op_sweep_passes_with_f32_accumulation", false);
}

/// Distance in units in the last place (0 for equal values, incl. ±0 and two NaNs).
fn ulps(a: f32, b: f32) -> u64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0;
    }
    let ord = |x: f32| {
        let i = x.to_bits() as i32;
        i64::from(if i < 0 { i32::MIN - i } else { i })
    };
    (ord(a) - ord(b)).unsigned_abs()
}

fn assert_ulps(what: &str, want: &[f32], got: &[f32], max: u64) {
    assert_eq!(want.len(), got.len(), "{what}: length");
    let (mut worst, mut at) = (0, 0);
    for (i, (&w, &g)) in want.iter().zip(got).enumerate() {
        let u = ulps(w, g);
        if u > worst {
            (worst, at) = (u, i);
        }
    }
    assert!(
        worst <= max,
        "{what}: {worst} ulps at {at}: reference {} vs cuda {}",
        want[at],
        got[at]
    );
}

fn uniform(rng: &mut SplitMix64, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform_sym(a)).collect()
}

struct Hc {
    fn_w: Vec<f32>,
    base: Vec<f32>,
    scale: Vec<f32>,
    m: usize,
    d: usize,
}

impl Hc {
    fn new(rng: &mut SplitMix64, m: usize, d: usize, head: bool) -> Self {
        let nout = if head { m } else { (2 + m) * m };
        Hc {
            fn_w: uniform(rng, nout * m * d, 1.0 / ((m * d) as f32).sqrt()),
            base: uniform(rng, nout, 1.0),
            scale: uniform(rng, if head { 1 } else { 3 }, 0.5)
                .iter()
                .map(|v| v + 1.25)
                .collect(),
            m,
            d,
        }
    }
    fn params(&self) -> HcParams<'_> {
        HcParams {
            fn_w: &self.fn_w,
            base: &self.base,
            scale: &self.scale,
            m: self.m,
            d: self.d,
            norm_eps: 1e-6,
            hc_eps: 1e-6,
            sinkhorn_iters: 20,
        }
    }
}

/// With f64 accumulation every sum of these kernels runs in the reference's order except the
/// mHC mixing dot products (a block-wide reduction), so only mhc_pre / hc_head may differ, by
/// at most one ulp.
#[test]
fn f64_accumulation_is_within_one_ulp_of_the_reference() {
    let Some(cand) = backend("f64_accumulation_is_within_one_ulp_of_the_reference", true) else {
        return;
    };
    let r = ReferenceBackend;
    let mut rng = SplitMix64::new(11);
    // mHC, including M = 8 (the largest the kernels take) and M = 1.
    for (t, m, d) in [(3, 4, 256), (2, 8, 40), (2, 1, 17)] {
        let hc = Hc::new(&mut rng, m, d, false);
        let x = uniform(&mut rng, t * m * d, 3.0);
        let (want, got) = (
            r.mhc_pre(&hc.params(), &x, t),
            cand.mhc_pre(&hc.params(), &x, t),
        );
        assert_ulps("mhc_pre u", &want.u, &got.u, 1);
        assert_ulps("mhc_pre post", &want.post, &got.post, 1);
        assert_ulps("mhc_pre comb", &want.comb, &got.comb, 1);
        let y = uniform(&mut rng, t * d, 1.0);
        let (mut o1, mut o2) = (vec![0f32; t * m * d], vec![0f32; t * m * d]);
        r.mhc_post(&x, &y, &want, m, d, &mut o1);
        cand.mhc_post(&x, &y, &want, m, d, &mut o2);
        assert_ulps("mhc_post", &o1, &o2, 0);
        let head = Hc::new(&mut rng, m, d, true);
        let (mut h1, mut h2) = (vec![0f32; t * d], vec![0f32; t * d]);
        r.hc_head(&head.params(), &x, t, &mut h1);
        cand.hc_head(&head.params(), &x, t, &mut h2);
        assert_ulps("hc_head", &h1, &h2, 1);
    }
    // Pooling with masked rows and a fully masked column.
    let (rows, width) = (9, 70);
    let a = uniform(&mut rng, rows * width, 1.0);
    let mut z = uniform(&mut rng, rows * width, 4.0);
    for (i, v) in z.iter_mut().enumerate() {
        if i % width == 0 || i % 5 == 0 {
            *v = f32::NEG_INFINITY;
        }
    }
    // A NaN logit (the column's max ignores it, its weight is NaN) and a +∞ one.
    z[2 * width + 1] = f32::NAN;
    z[3 * width + 2] = f32::INFINITY;
    let (mut p1, mut p2) = (vec![1f32; width], vec![2f32; width]);
    r.softmax_pool(&a, &z, rows, width, &mut p1);
    cand.softmax_pool(&a, &z, rows, width, &mut p2);
    assert_ulps("softmax_pool", &p1, &p2, 0);
    // Indexer scores with dims in and beyond the register tile, queries staged in shared memory
    // in several passes (70·128, and 9·512 over 200 keys: a block with keys and idle threads),
    // and a dim too wide to stage (600: the queries are read from global memory).
    for (heads, dim, n) in [
        (4, 128, 19),
        (3, 300, 9),
        (70, 128, 5),
        (9, 512, 200),
        (2, 600, 7),
    ] {
        let q = uniform(&mut rng, heads * dim, 1.0);
        let w = uniform(&mut rng, heads, 1.0);
        let keys = uniform(&mut rng, n * dim, 1.0);
        let (mut s1, mut s2) = (vec![0f32; n], vec![0f32; n]);
        r.indexer_scores(&q, &w, dim, &keys, &mut s1);
        cand.indexer_scores(&q, &w, dim, &keys, &mut s2);
        assert_ulps("indexer_scores", &s1, &s2, 0);
    }
    // Sparse attention, incl. hot logits, no keys at all, a large sink, heads not a multiple of 8,
    // full 8-head groups, and a dim too wide to stage a group's queries (520).
    for (heads, dim, n, qs) in [
        (4, 64, 33, 1.0),
        (2, 5, 7, 60.0),
        (3, 8, 0, 1.0),
        (2, 40, 300, 3.0),
        (11, 16, 20, 1.0),
        (16, 512, 9, 1.0),
        (3, 520, 6, 1.0),
    ] {
        let q = uniform(&mut rng, heads * dim, qs);
        let keys = uniform(&mut rng, n * dim, 1.0);
        let mut sink = uniform(&mut rng, heads, 2.0);
        sink[0] = 30.0;
        let scale = 1.0 / (dim as f32).sqrt();
        let (mut a1, mut a2) = (vec![0f32; heads * dim], vec![0f32; heads * dim]);
        r.sparse_attention(&q, dim, &keys, &sink, scale, &mut a1);
        cand.sparse_attention(&q, dim, &keys, &sink, scale, &mut a2);
        assert_ulps("sparse_attention", &a1, &a2, 0);
    }
}

#[test]
fn topk_equals_the_reference_on_adversarial_scores() {
    let Some(cand) = backend("topk_equals_the_reference_on_adversarial_scores", true) else {
        return;
    };
    let r = ReferenceBackend;
    let mut rng = SplitMix64::new(5);
    let specials = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::MAX,
        f32::MIN,
    ];
    let mut cases: Vec<(Vec<f32>, usize)> = Vec::new();
    for &n in &[
        1usize, 2, 31, 33, 511, 512, 513, 4095, 4096, 4097, 5000, 70_000,
    ] {
        // Mostly specials and a handful of distinct values: many ties everywhere.
        let s: Vec<f32> = (0..n)
            .map(|_| match rng.below(4) {
                0 => specials[rng.below(specials.len() as u64) as usize],
                1 => (rng.below(5) as f32) - 2.0,
                _ => rng.uniform_sym(3.0),
            })
            .collect();
        for k in [0, 1, n / 3, n.saturating_sub(1), n, n + 5] {
            cases.push((s.clone(), k));
        }
    }
    // All equal, all NaN, all −∞, two levels, and scores differing only in their last bits.
    for n in [100usize, 4100] {
        for s in [
            vec![1.5f32; n],
            vec![f32::NAN; n],
            vec![f32::NEG_INFINITY; n],
            (0..n)
                .map(|i| if i % 3 == 0 { 2.0 } else { -1.0 })
                .collect(),
            (0..n)
                .map(|i| f32::from_bits(0x3f80_0000 + (i as u32 * 7919) % 300))
                .collect(),
            (0..n)
                .map(|i| if i % 2 == 0 { -0.0 } else { 0.0 })
                .collect(),
        ] {
            for k in [1, 2, n / 2, n - 1, n] {
                cases.push((s.clone(), k));
            }
        }
    }
    // About a million scores (many chunks of the selection pass), coarse values: heavy ties.
    let big: Vec<f32> = (0..1_000_003)
        .map(|_| match rng.below(8) {
            0 => f32::NEG_INFINITY,
            1 => f32::NAN,
            _ => (rng.uniform_sym(8.0) * 16.0).round() / 16.0,
        })
        .collect();
    for k in [2048, 333_333] {
        cases.push((big.clone(), k));
    }
    for (s, k) in &cases {
        let want = r.topk(s, *k);
        let got = cand.topk(s, *k);
        assert!(
            want == got,
            "n {} k {k}: reference {} indices, cuda {}; first difference at {:?}",
            s.len(),
            want.len(),
            got.len(),
            want.iter().zip(&got).position(|(a, b)| a != b)
        );
    }
    assert!(cand.topk(&[], 3).is_empty());
}

#[test]
fn page_checksums_equal_the_canary_checksum() {
    let Some(cand) = backend("page_checksums_equal_the_canary_checksum", true) else {
        return;
    };
    let mut rng = SplitMix64::new(3);
    for (page, pages) in [(4096usize, 5usize), (1000, 7), (7, 13), (1, 3), (8, 2)] {
        let bytes: Vec<u8> = (0..page * pages).map(|_| rng.next_u64() as u8).collect();
        let want: Vec<u64> = bytes.chunks(page).map(page_checksum).collect();
        assert_eq!(
            cand.page_checksums(&bytes, page).unwrap(),
            want,
            "page_bytes {page}"
        );
    }
    assert_eq!(cand.page_checksums(&[], 4096).unwrap(), Vec::<u64>::new());
    assert!(cand.page_checksums(&[0u8; 10], 4).is_err());
    assert!(cand.page_checksums(&[0u8; 10], 0).is_err());
}

#[test]
fn a_token_gets_the_same_bits_alone_and_inside_a_batch() {
    for acc_f64 in [true, false] {
        let Some(cand) = backend(
            "a_token_gets_the_same_bits_alone_and_inside_a_batch",
            acc_f64,
        ) else {
            return;
        };
        let mut rng = SplitMix64::new(9);
        let (t, m, d) = (5, 4, 300);
        let hc = Hc::new(&mut rng, m, d, false);
        let head = Hc::new(&mut rng, m, d, true);
        let x = uniform(&mut rng, t * m * d, 2.0);
        let batch = cand.mhc_pre(&hc.params(), &x, t);
        let mut hb = vec![0f32; t * d];
        cand.hc_head(&head.params(), &x, t, &mut hb);
        for ti in 0..t {
            let xt = &x[ti * m * d..(ti + 1) * m * d];
            let one = cand.mhc_pre(&hc.params(), xt, 1);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&one.u),
                bits(&batch.u[ti * d..(ti + 1) * d]),
                "u, token {ti}"
            );
            assert_eq!(
                bits(&one.post),
                bits(&batch.post[ti * m..(ti + 1) * m]),
                "post {ti}"
            );
            assert_eq!(
                bits(&one.comb),
                bits(&batch.comb[ti * m * m..(ti + 1) * m * m]),
                "comb {ti}"
            );
            let mut h1 = vec![0f32; d];
            cand.hc_head(&head.params(), xt, 1, &mut h1);
            assert_eq!(bits(&h1), bits(&hb[ti * d..(ti + 1) * d]), "hc_head {ti}");
        }
    }
}

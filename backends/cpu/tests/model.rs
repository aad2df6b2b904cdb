//! The embedded tiny model on the cpu backend: close to the reference backend, and bitwise
//! batch-invariant (prefill vs decode vs chunked prefill, batched vs alone, 1 vs 2 threads).

mod common;

use common::{rel_l2, same_bits};
use dsv4_backend_cpu::{CpuBackend, Sums};
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::{ActQuant, IndexKDtype, KvCacheDtype, Numerics, SplitMix64, Tensor};
use dsv4_kernels::Backend;
use dsv4_model::{Model, ModelConfig, SequenceState};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

fn tensors() -> &'static HashMap<String, Tensor> {
    static T: OnceLock<HashMap<String, Tensor>> = OnceLock::new();
    T.get_or_init(|| {
        dsv4_model::tiny::generate_weights(&ModelConfig::tiny(), 0)
            .unwrap()
            .into_iter()
            .collect()
    })
}

fn model(backend: Arc<dyn Backend>, numerics: Numerics) -> Model {
    Model::load(ModelConfig::tiny(), tensors(), backend, numerics).unwrap()
}

fn cpu(threads: usize) -> Arc<dyn Backend> {
    cpu_with(threads, Sums::F64)
}

fn cpu_with(threads: usize, sums: Sums) -> Arc<dyn Backend> {
    Arc::new(CpuBackend::new(threads).unwrap().with_sums(sums))
}

fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut g = SplitMix64::new(seed);
    (0..n).map(|_| 2 + g.below(380) as u32).collect()
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0
}

/// Rows of `vocab` logits whose argmax is the same in `got` and `want`.
fn same_argmax_rows(got: &[f32], want: &[f32], vocab: usize) -> usize {
    got.chunks(vocab)
        .zip(want.chunks(vocab))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count()
}

const ALL_FP8: Numerics = Numerics {
    kv_cache_dtype: KvCacheDtype::Fp8,
    index_k_dtype: IndexKDtype::Fp8,
    act_quant: ActQuant::Fp8,
};

/// Prefill of 100 tokens on both backends. Spec-level bound: relative L2 ≤ 1e-4 and the same
/// argmax on ≥ 99 % of rows. The cpu backend accumulates in f64 like the reference, so every op
/// rounds to the reference's f32 values but for rare ties, and no cache or activation rounding
/// flips: we hold it to 1e-6 (an f32 implementation lands near 1e-4 here, through bf16 and e4m3
/// rounding flips).
#[test]
fn prefill_logits_match_the_reference_backend() {
    for numerics in [Numerics::default(), ALL_FP8] {
        for seed in 1..=3 {
            let toks = tokens(100, seed);
            let run = |be: Arc<dyn Backend>| {
                let m = model(be, numerics);
                m.forward(&mut m.new_sequence(), &toks).unwrap()
            };
            let (got, want) = (run(cpu(2)), run(Arc::new(ReferenceBackend)));
            let e = rel_l2(&got.logits, &want.logits);
            assert!(e <= 1e-6, "{numerics}, prompt {seed}: relative L2 {e:e}");
            let agree = same_argmax_rows(&got.logits, &want.logits, got.vocab);
            assert!(
                agree >= 99,
                "{numerics}, prompt {seed}: argmax agrees on {agree}/100 rows"
            );
            assert_eq!(
                got.topk, want.topk,
                "{numerics}, prompt {seed}: indexer selections"
            );
        }
    }
}

/// With f32 sums (`backend.cpu_sums = "f32"`) the linears round along the way, so bf16/e4m3
/// rounding and near-tied top-k choices may flip: held to the spec-level bound (relative L2 ≤
/// 1e-4, the same argmax on ≥ 99 % of rows) and most indexer selections the reference's.
#[test]
fn f32_sums_stay_within_the_spec_bound_of_the_reference() {
    for numerics in [Numerics::default(), ALL_FP8] {
        let toks = tokens(100, 1);
        let run = |be: Arc<dyn Backend>| {
            let m = model(be, numerics);
            m.forward(&mut m.new_sequence(), &toks).unwrap()
        };
        let (got, want) = (run(cpu_with(2, Sums::F32)), run(Arc::new(ReferenceBackend)));
        let e = rel_l2(&got.logits, &want.logits);
        assert!(e > 0.0 && e <= 1e-4, "{numerics}: relative L2 {e:e}");
        let agree = same_argmax_rows(&got.logits, &want.logits, got.vocab);
        assert!(agree >= 99, "{numerics}: argmax agrees on {agree}/100 rows");
        let (mut same, mut all) = (0, 0);
        for (l, sets) in &want.topk {
            for (a, b) in sets.iter().zip(&got.topk[l]) {
                all += 1;
                same += usize::from(a == b);
            }
        }
        assert!(
            same * 100 >= all * 95,
            "{numerics}: {same}/{all} index sets the same"
        );
    }
}

#[test]
fn prefill_decode_and_chunked_prefill_are_bitwise_equal() {
    for sums in [Sums::F64, Sums::F32] {
        prefill_decode_and_chunked_prefill_with(sums);
    }
}

fn prefill_decode_and_chunked_prefill_with(sums: Sums) {
    let m = model(cpu_with(2, sums), ALL_FP8);
    let toks = tokens(100, 2);
    let full = m.forward(&mut m.new_sequence(), &toks).unwrap();
    let v = full.vocab;
    let mut st = m.new_sequence();
    for (i, &t) in toks.iter().enumerate() {
        let out = m.forward(&mut st, &[t]).unwrap();
        assert!(
            same_bits(&out.logits, &full.logits[i * v..(i + 1) * v]),
            "{sums:?} sums: decode step {i} differs from prefill row {i}"
        );
        for (l, sel) in &out.topk {
            assert_eq!(sel[0], full.topk[l][i], "layer {l} token {i}: index set");
        }
    }
    let mut st = m.new_sequence();
    let mut chunked = Vec::new();
    for c in toks.chunks(37) {
        chunked.extend(m.forward(&mut st, c).unwrap().logits);
    }
    assert!(
        same_bits(&chunked, &full.logits),
        "{sums:?} sums: chunked prefill differs"
    );
}

#[test]
fn batched_prompts_get_bitwise_their_solo_logits() {
    for sums in [Sums::F64, Sums::F32] {
        batched_prompts_with(sums);
    }
}

fn batched_prompts_with(sums: Sums) {
    let m = model(cpu_with(2, sums), Numerics::default());
    let prompts: Vec<Vec<u32>> = (0..8).map(|s| tokens(3 + 7 * s, 10 + s as u64)).collect();
    let follow = [5u32, 6];
    let solo: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut st = m.new_sequence();
            let mut l = m.forward(&mut st, p).unwrap().logits;
            for &f in &follow {
                l.extend(m.forward(&mut st, &[f]).unwrap().logits);
            }
            l
        })
        .collect();
    let mut states: Vec<SequenceState> = (0..8).map(|_| m.new_sequence()).collect();
    let mut got: Vec<Vec<f32>> = vec![Vec::new(); 8];
    let mut step = |toks: Vec<&[u32]>, states: &mut [SequenceState]| {
        let mut refs: Vec<&mut SequenceState> = states.iter_mut().collect();
        for (s, o) in m
            .forward_batch(&mut refs, &toks)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            got[s].extend(o.logits);
        }
    };
    step(prompts.iter().map(|p| p.as_slice()).collect(), &mut states);
    for f in 0..follow.len() {
        step(vec![&follow[f..f + 1]; 8], &mut states);
    }
    for s in 0..8 {
        assert!(
            same_bits(&got[s], &solo[s]),
            "{sums:?} sums, sequence {s}: batched differs from solo"
        );
    }
}

#[test]
fn one_and_two_threads_give_bitwise_equal_logits() {
    let toks = tokens(60, 3);
    let run = |threads: usize| {
        let m = model(cpu(threads), ALL_FP8);
        let mut st = m.new_sequence();
        let mut l = m.forward(&mut st, &toks).unwrap().logits;
        l.extend(m.forward(&mut st, &[9]).unwrap().logits);
        l
    };
    assert!(
        same_bits(&run(1), &run(2)),
        "thread count changed the logits"
    );
}

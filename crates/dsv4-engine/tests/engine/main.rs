//! Engine acceptance tests on the embedded tiny model with the reference backend: batch
//! invariance, pool accounting, overload, and the raw byte layouts of the pools.

mod accounting;
mod backends;
mod bench;
mod hicache;
mod in_batch_prefix;
mod invariance;
mod layout;
mod overlap;
mod overload;
mod plans;
mod priority;
mod prompt_logprobs;
mod queue_limit;
mod yields;

use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::{IndexKDtype, KvCacheDtype, Numerics, SplitMix64};
use dsv4_engine::{Completion, Request, SamplingParams};
use dsv4_model::{Model, ModelSource, load_model};
use std::sync::{Arc, OnceLock};

/// Quantized caches, so the pools hold the fp8 layouts of spec §4.
pub fn numerics() -> Numerics {
    Numerics {
        kv_cache_dtype: KvCacheDtype::Fp8,
        index_k_dtype: IndexKDtype::Fp8,
        ..Default::default()
    }
}

/// The tiny model on the reference backend (loaded once per test binary).
pub fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| {
        Arc::new(
            load_model(
                &ModelSource::Tiny { seed: 0 },
                Arc::new(ReferenceBackend),
                numerics(),
            )
            .expect("tiny model loads"),
        )
    })
    .clone()
}

/// `n` random token ids (never BOS/EOS) from `seed`.
pub fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut g = SplitMix64::new(seed);
    (0..n).map(|_| 2 + g.below(380) as u32).collect()
}

/// An 8-token prompt: BOS, then 7 tokens from `seed`.
pub fn prompt8(seed: u64) -> Vec<u32> {
    let mut p = vec![0];
    p.extend(tokens(7, seed));
    p
}

/// A greedy request that returns its logits.
pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        return_logits: true,
        ..Default::default()
    }
}

/// A solo run: generated tokens and the logits row of each.
pub type Solo = (Vec<u32>, Vec<Vec<f32>>);

/// The request run alone, straight on the model (owned caches, one prefill, then decodes):
/// the generated tokens and the logits row each was chosen from.
pub fn solo(model: &Model, prompt: &[u32], max_tokens: usize) -> Solo {
    let mut st = model.new_sequence();
    let out = model.forward(&mut st, prompt).unwrap();
    let v = out.vocab;
    let mut row = out.logits[out.logits.len() - v..].to_vec();
    let (mut toks, mut rows) = (Vec::new(), Vec::new());
    loop {
        let t = dsv4_engine::sampling::argmax(&row);
        if t == model.cfg.eos_token_id {
            break;
        }
        toks.push(t);
        rows.push(row.clone());
        if toks.len() == max_tokens {
            break;
        }
        row = model.forward(&mut st, &[t]).unwrap().logits;
    }
    (toks, rows)
}

/// Assert an engine completion equals the solo run bitwise (tokens and logits).
pub fn assert_same_as_solo(c: &Completion, solo: &Solo, what: &str) {
    assert_eq!(c.tokens, solo.0, "{what}: tokens differ from the solo run");
    assert_eq!(c.logits.len(), solo.1.len(), "{what}: logits rows");
    for (i, (a, b)) in c.logits.iter().zip(&solo.1).enumerate() {
        assert!(
            a.iter()
                .map(|x| x.to_bits())
                .eq(b.iter().map(|x| x.to_bits())),
            "{what}: logits of token {i} differ from the solo run"
        );
    }
}

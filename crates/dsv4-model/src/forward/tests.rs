//! Forward-pass tests on the embedded tiny model with the reference backend.

use super::compressor::WindowPool;
use super::state::CompressorRing;
use super::*;
use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::{IndexKDtype, KvCacheDtype, SplitMix64};
use std::collections::HashMap;
use std::sync::OnceLock;

fn tiny_tensors() -> &'static HashMap<String, dsv4_core::Tensor> {
    static T: OnceLock<HashMap<String, dsv4_core::Tensor>> = OnceLock::new();
    T.get_or_init(|| {
        crate::tiny::generate_weights(&ModelConfig::tiny(), 0)
            .unwrap()
            .into_iter()
            .collect()
    })
}

fn tiny_model(numerics: Numerics) -> Model {
    Model::load(
        ModelConfig::tiny(),
        tiny_tensors(),
        Arc::new(ReferenceBackend),
        numerics,
    )
    .unwrap()
}

fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut g = SplitMix64::new(seed);
    (0..n).map(|_| 2 + g.below(380) as u32).collect()
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Prefill of 300 tokens vs 300 decode steps: logits within 1e-5 relative, same index sets.
fn prefill_matches_decode(numerics: Numerics) {
    let model = tiny_model(numerics);
    let toks = tokens(300, 11);
    let mut st = model.new_sequence();
    let pre = model.forward(&mut st, &toks).unwrap();
    assert_eq!(st.pos, 300);
    let mut st2 = model.new_sequence();
    let v = pre.vocab;
    let mut dec_topk: BTreeMap<usize, Vec<Vec<u32>>> = BTreeMap::new();
    for (i, &tok) in toks.iter().enumerate() {
        let out = model.forward(&mut st2, &[tok]).unwrap();
        let (a, b) = (&out.logits[..], &pre.logits[i * v..(i + 1) * v]);
        assert!(
            a.iter().all(|x| x.is_finite()),
            "{numerics}: non-finite logits at {i}"
        );
        let e = rel_err(a, b);
        assert!(e <= 1e-5, "{numerics}: position {i}: relative error {e}");
        for (l, sel) in out.topk {
            dec_topk.entry(l).or_default().extend(sel);
        }
    }
    assert_eq!(dec_topk, pre.topk, "{numerics}: indexer selections differ");
    // The indexer really chose among more entries than it keeps (300/4 = 75 > index_topk 16).
    let last = &pre.topk.values().next().unwrap()[299];
    assert_eq!(last.len(), model.cfg.index_topk);
}

macro_rules! prefill_decode_tests {
    ($($name:ident: $kv:ident, $ik:ident, $aq:ident;)+) => {$(
        #[test]
        fn $name() {
            prefill_matches_decode(Numerics {
                kv_cache_dtype: KvCacheDtype::$kv,
                index_k_dtype: IndexKDtype::$ik,
                act_quant: ActQuant::$aq,
            });
        }
    )+};
}

prefill_decode_tests! {
    prefill_eq_decode_bf16_bf16_none: Bf16, Bf16, None;
    prefill_eq_decode_bf16_bf16_fp8: Bf16, Bf16, Fp8;
    prefill_eq_decode_bf16_fp8_none: Bf16, Fp8, None;
    prefill_eq_decode_bf16_fp8_fp8: Bf16, Fp8, Fp8;
    prefill_eq_decode_bf16_fp4_none: Bf16, Fp4, None;
    prefill_eq_decode_bf16_fp4_fp8: Bf16, Fp4, Fp8;
    prefill_eq_decode_fp8_bf16_none: Fp8, Bf16, None;
    prefill_eq_decode_fp8_bf16_fp8: Fp8, Bf16, Fp8;
    prefill_eq_decode_fp8_fp8_none: Fp8, Fp8, None;
    prefill_eq_decode_fp8_fp8_fp8: Fp8, Fp8, Fp8;
    prefill_eq_decode_fp8_fp4_none: Fp8, Fp4, None;
    prefill_eq_decode_fp8_fp4_fp8: Fp8, Fp4, Fp8;
}

#[test]
fn chunked_prefill_equals_one_prefill() {
    let model = tiny_model(Numerics::default());
    let toks = tokens(150, 5);
    let mut st = model.new_sequence();
    let full = model.forward(&mut st, &toks).unwrap();
    let mut st2 = model.new_sequence();
    let mut logits = Vec::new();
    for chunk in toks.chunks(37) {
        logits.extend(model.forward(&mut st2, chunk).unwrap().logits);
    }
    assert_eq!(logits, full.logits);
}

#[test]
fn numerics_knobs_change_the_result() {
    let toks = tokens(140, 3);
    let run = |n: Numerics| {
        tiny_model(n)
            .forward(&mut tiny_model(n).new_sequence(), &toks)
            .unwrap()
            .logits
    };
    let base = run(Numerics::default());
    let fp8kv = run(Numerics {
        kv_cache_dtype: KvCacheDtype::Fp8,
        ..Default::default()
    });
    let aq = run(Numerics {
        act_quant: ActQuant::Fp8,
        ..Default::default()
    });
    assert_ne!(base, fp8kv);
    assert_ne!(base, aq);
    // Quantization perturbs, it does not destroy: logits stay close.
    assert!(rel_err(&fp8kv, &base) < 0.2, "{}", rel_err(&fp8kv, &base));
    assert!(rel_err(&aq, &base) < 0.2, "{}", rel_err(&aq, &base));
}

#[test]
fn activations_stay_order_one_through_all_layers() {
    let model = tiny_model(Numerics::default());
    let mut worst: Vec<(String, f64)> = Vec::new();
    let mut f = |layer: &str, op: &str, v: &[f32]| {
        let rms = (v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        worst.push((format!("{layer}{op}"), rms));
    };
    {
        let mut taps = Taps::new(&mut f);
        let mut st = model.new_sequence();
        model
            .forward_with_taps(&mut st, &tokens(64, 9), &mut taps)
            .unwrap();
    }
    assert!(worst.len() > 40, "taps after every op of every layer");
    for (name, rms) in &worst {
        assert!(
            rms.is_finite() && *rms < 50.0 && *rms > 1e-4,
            "{name}: rms {rms}"
        );
    }
}

#[test]
fn compressed_entry_w_appears_exactly_when_its_last_token_is_processed() {
    let model = tiny_model(Numerics::default());
    let mut st = model.new_sequence();
    let ratios: Vec<usize> = model.weights.layers.iter().map(|b| b.ratio).collect();
    assert!(ratios.contains(&4) && ratios.contains(&128));
    for (p, tok) in tokens(260, 2).into_iter().enumerate() {
        model.forward(&mut st, &[tok]).unwrap();
        for (l, &r) in ratios.iter().enumerate() {
            if r == 0 {
                continue;
            }
            let n = st.layers[l].compressor.as_ref().unwrap().entries.len();
            assert_eq!(n, (p + 1) / r, "layer {l} (ratio {r}) after token {p}");
            if r == 4 {
                assert_eq!(
                    st.layers[l].indexer.as_ref().unwrap().entries.len(),
                    (p + 1) / 4
                );
            }
        }
    }
}

#[test]
fn c4_windows_overlap_the_previous_windows_first_halves() {
    // Uniform gates (z = 0): the pooled entry is the plain mean of its 8 rows.
    let be = ReferenceBackend;
    let d = 2;
    let mut ring = CompressorRing::new(8, 2 * d);
    let a_of = |p: usize| {
        vec![
            p as f32,
            10.0 * p as f32,
            100.0 + p as f32,
            1000.0 + p as f32,
        ]
    };
    let z = vec![0f32; 2 * d];
    // Both windows pool in one call.
    let mut pool = WindowPool::new(4, d);
    let mut done = Vec::new();
    for p in 0..8 {
        done.extend(pool.push(&mut ring, p, &a_of(p), &z));
    }
    assert_eq!(done, vec![0, 1]);
    let both = pool.finish(&be);
    // w = 0: rows 0..3 absent (z = −∞), rows 4..7 = second halves of tokens 0..3.
    assert_eq!(both[..2], [101.5, 1001.5]);
    // w = 1: first halves of tokens 0..3 and second halves of tokens 4..7.
    let mean = |v: [f32; 8]| v.iter().sum::<f32>() / 8.0;
    assert_eq!(
        both[2..],
        [
            mean([0., 1., 2., 3., 104., 105., 106., 107.]),
            mean([0., 10., 20., 30., 1004., 1005., 1006., 1007.])
        ]
    );
}

#[test]
fn a_window_pools_the_rows_it_had_when_it_completed() {
    // Ratio 2 in a 2-row ring: window 0's rows are overwritten by tokens 2 and 3 before the
    // step's windows pool, which must still see tokens 0 and 1.
    let be = ReferenceBackend;
    let mut ring = CompressorRing::new(2, 1);
    let mut pool = WindowPool::new(2, 1);
    let z = [0f32];
    let done: Vec<usize> = (0..4)
        .filter_map(|p| pool.push(&mut ring, p, &[p as f32], &z))
        .collect();
    assert_eq!(done, vec![0, 1]);
    assert_eq!(pool.finish(&be), vec![0.5, 2.5]);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let model = tiny_model(Numerics::default());
    let mut st = model.new_sequence();
    assert!(matches!(
        model.forward(&mut st, &[]),
        Err(ForwardError::Empty)
    ));
    let e = model.forward(&mut st, &[5, 384]).unwrap_err();
    assert!(
        e.to_string().contains("384") && e.to_string().contains("index 1"),
        "{e}"
    );
    assert_eq!(st.pos, 0, "a refused call leaves the sequence untouched");
    st.pos = model.cfg.max_position_embeddings;
    assert!(matches!(
        model.forward(&mut st, &[5]),
        Err(ForwardError::ContextFull { .. })
    ));
}

#[test]
fn mtp_draft_prefill_matches_decode() {
    let model = tiny_model(Numerics::default());
    let toks = tokens(40, 4);
    let mut st = model.new_sequence();
    let out = model.forward(&mut st, &toks[..39]).unwrap();
    let mut mtp = model.new_mtp_state().expect("tiny model has an MTP layer");
    let drafts = model
        .mtp_forward(&mut mtp, &out.residual, &toks[1..])
        .unwrap();
    let (m, d, v) = (
        model.cfg.hc_mult,
        model.cfg.hidden_size,
        model.cfg.vocab_size,
    );
    let mut mtp2 = model.new_mtp_state().unwrap();
    for i in 0..39 {
        let row = model
            .mtp_forward(
                &mut mtp2,
                &out.residual[i * m * d..(i + 1) * m * d],
                &toks[i + 1..i + 2],
            )
            .unwrap();
        assert!(rel_err(&row, &drafts[i * v..(i + 1) * v]) <= 1e-5);
    }
}

#[test]
fn batched_sequences_get_bitwise_the_logits_they_get_alone() {
    let model = tiny_model(Numerics {
        kv_cache_dtype: KvCacheDtype::Fp8,
        ..Default::default()
    });
    let prompts: Vec<Vec<u32>> = (0..8).map(|s| tokens(5 + 9 * s, 100 + s as u64)).collect();
    // Alone: prefill, then 3 decode steps of fixed tokens.
    let follow = [7u32, 8, 9];
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut st = model.new_sequence();
            let mut logits = model.forward(&mut st, p).unwrap().logits;
            for &f in &follow {
                logits.extend(model.forward(&mut st, &[f]).unwrap().logits);
            }
            logits
        })
        .collect();
    // Together: all prefills in one step, then the decode steps batched; sequence 0 joins late
    // (its prefill rides along with the others' first decode step).
    let mut states: Vec<SequenceState> = (0..8).map(|_| model.new_sequence()).collect();
    let mut got: Vec<Vec<f32>> = vec![Vec::new(); 8];
    {
        let (first, rest) = states.split_at_mut(1);
        let mut refs: Vec<&mut SequenceState> = rest.iter_mut().collect();
        let toks: Vec<&[u32]> = prompts[1..].iter().map(|p| p.as_slice()).collect();
        for (s, o) in model
            .forward_batch(&mut refs, &toks)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            got[s + 1].extend(o.logits);
        }
        let mut refs: Vec<&mut SequenceState> = first.iter_mut().chain(rest.iter_mut()).collect();
        let mut toks: Vec<&[u32]> = vec![prompts[0].as_slice()];
        toks.extend(std::iter::repeat_n(&follow[..1], 7));
        for (s, o) in model
            .forward_batch(&mut refs, &toks)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            got[s].extend(o.logits);
        }
    }
    for step in 0..3 {
        let mut refs: Vec<&mut SequenceState> = states.iter_mut().collect();
        let toks: Vec<&[u32]> = (0..8)
            .map(|s| {
                if s == 0 {
                    &follow[step..step + 1]
                } else if step < 2 {
                    &follow[step + 1..step + 2]
                } else {
                    &[]
                }
            })
            .collect();
        if step == 2 {
            // Sequence 0 still owes its last decode step; the others are done.
            let out = model.forward_batch(&mut refs[..1], &toks[..1]).unwrap();
            got[0].extend(out.into_iter().next().unwrap().logits);
            break;
        }
        for (s, o) in model
            .forward_batch(&mut refs, &toks)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            got[s].extend(o.logits);
        }
    }
    for s in 0..8 {
        assert_eq!(got[s].len(), alone[s].len(), "sequence {s}");
        assert!(
            got[s] == alone[s],
            "sequence {s}: batched logits differ from the solo run"
        );
    }
}

/// A forward call of `toks` on a fresh sequence with the indexer under `control`.
fn controlled(
    model: &Model,
    toks: &[u32],
    control: ChoiceControl<'_>,
) -> Result<ForwardOutput, ForwardError> {
    let mut st = model.new_sequence();
    model.forward_with_taps(&mut st, toks, &mut Taps::none().with_choices(control))
}

#[test]
fn recorded_indexer_scores_are_what_the_selection_ranks() {
    let model = tiny_model(Numerics::default());
    let toks = tokens(80, 5);
    let plain = controlled(&model, &toks, ChoiceControl::default()).unwrap();
    assert!(
        plain.indexer_scores.is_empty(),
        "scores only when asked for"
    );
    let rec = ChoiceControl {
        record_scores: true,
        ..ChoiceControl::default()
    };
    let out = controlled(&model, &toks, rec).unwrap();
    assert_eq!(out.logits, plain.logits, "recording scores changes nothing");
    assert_eq!(out.topk, plain.topk);
    assert_eq!(
        out.indexer_scores.keys().collect::<Vec<_>>(),
        vec![&1, &3],
        "the tiny model's ratio-4 layers"
    );
    let k = model.cfg.index_topk;
    for (l, rows) in &out.indexer_scores {
        assert_eq!(rows.len(), toks.len());
        for (t, s) in rows.iter().enumerate() {
            assert_eq!(
                s.len(),
                (t + 1) / 4,
                "layer {l}, token {t}: entries 0..⌊(p+1)/4⌋"
            );
            let ranked: Vec<u32> = ReferenceBackend
                .topk(s, k)
                .into_iter()
                .map(|j| j as u32)
                .collect();
            assert_eq!(out.topk[l][t], ranked, "layer {l}, token {t}");
        }
    }
    // 80 tokens: the last rows choose 16 of 20 entries, so the ranking is not trivial.
    assert!(out.indexer_scores[&1][79].len() > k);
}

#[test]
fn pinned_selections_steer_attention_but_not_the_reported_choice() {
    let model = tiny_model(Numerics::default());
    let toks = tokens(80, 5);
    let plain = controlled(&model, &toks, ChoiceControl::default()).unwrap();
    let pin = |pins| ChoiceControl {
        pinned: Some(pins),
        ..ChoiceControl::default()
    };
    // Pinned to its own choices, the call is bitwise the same.
    let same = controlled(&model, &toks, pin(&plain.topk)).unwrap();
    assert_eq!(same.logits, plain.logits);
    assert_eq!(same.topk, plain.topk);
    // Layer 1 pinned to one entry per token: other logits, but layer 1 still reports its
    // own choice (its indexer runs before the pinned attention).
    let mut one = BTreeMap::new();
    one.insert(
        1,
        (0..80usize)
            .map(|t| if t >= 3 { vec![0u32] } else { vec![] })
            .collect::<Selections>(),
    );
    let steered = controlled(&model, &toks, pin(&one)).unwrap();
    assert_ne!(
        steered.logits, plain.logits,
        "attention used the pinned entries"
    );
    assert_eq!(steered.topk[&1], plain.topk[&1]);
    // Pins the step cannot use are errors, not panics or silent wraps.
    let mut short = one.clone();
    short.get_mut(&1).unwrap().pop();
    let e = controlled(&model, &toks, pin(&short))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("layer 1's pinned selections cover 79 tokens, the step has 80"),
        "{e}"
    );
    let mut past = one.clone();
    past.get_mut(&1).unwrap()[10] = vec![2];
    let e = controlled(&model, &toks, pin(&past))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("layer 1, token 10: pinned entry 2 is past the 2 compressed entries"),
        "{e}"
    );
    let mut many = one.clone();
    many.get_mut(&1).unwrap()[79] = (0..17).collect();
    let e = controlled(&model, &toks, pin(&many))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("17 pinned entries, the indexer selects 16"),
        "{e}"
    );
}

#[test]
fn the_router_reports_its_choice_and_scores_and_follows_pinned_experts() {
    let model = tiny_model(Numerics::default());
    let toks = tokens(24, 8);
    let bare = controlled(&model, &toks, ChoiceControl::default()).unwrap();
    assert!(bare.experts.is_empty(), "choices only when asked for");
    let asked = ChoiceControl {
        record_experts: true,
        ..ChoiceControl::default()
    };
    let plain = controlled(&model, &toks, asked).unwrap();
    assert_eq!(
        plain.logits, bare.logits,
        "recording choices changes nothing"
    );
    // Layer 0 hash-routes (num_hash_layers = 1): nothing to choose, nothing reported.
    assert_eq!(plain.experts.keys().collect::<Vec<_>>(), vec![&1, &2, &3]);
    assert!(plain.router_scores.is_empty(), "scores only when asked for");
    let rec = ChoiceControl {
        record_scores: true,
        record_experts: true,
        ..ChoiceControl::default()
    };
    let out = controlled(&model, &toks, rec).unwrap();
    assert_eq!(out.logits, plain.logits, "recording scores changes nothing");
    let (e, k) = (model.cfg.n_routed_experts, model.cfg.num_experts_per_tok);
    for (l, rows) in &out.router_scores {
        assert_eq!(rows.len(), toks.len());
        for (t, s) in rows.iter().enumerate() {
            assert_eq!(s.len(), e);
            let ranked: Vec<u32> = ReferenceBackend
                .topk(s, k)
                .into_iter()
                .map(|j| j as u32)
                .collect();
            assert_eq!(out.experts[l][t], ranked, "layer {l}, token {t}");
        }
    }
    let pin = |pins| ChoiceControl {
        pinned_experts: Some(pins),
        record_experts: true,
        ..ChoiceControl::default()
    };
    let same = controlled(&model, &toks, pin(&plain.experts)).unwrap();
    assert_eq!(
        same.logits, plain.logits,
        "pinned to its own choice: the same bits"
    );
    // Layer 2 routed to experts it did not choose: other logits, the same reported choice there.
    let mut other = BTreeMap::new();
    let away: Selections = plain.experts[&2]
        .iter()
        .map(|c| (0..e as u32).filter(|j| !c.contains(j)).take(k).collect())
        .collect();
    other.insert(2, away);
    let steered = controlled(&model, &toks, pin(&other)).unwrap();
    assert_ne!(steered.logits, plain.logits);
    assert_eq!(steered.experts[&2], plain.experts[&2]);
    assert_eq!(
        steered.experts[&1], plain.experts[&1],
        "layers before it are untouched"
    );
    // Pins the step cannot use are errors.
    let err = |edit: &dyn Fn(&mut Selections)| {
        let mut bad = other.clone();
        edit(bad.get_mut(&2).unwrap());
        let control = ChoiceControl {
            pinned_experts: Some(&bad),
            ..ChoiceControl::default()
        };
        controlled(&model, &toks, control).unwrap_err().to_string()
    };
    let e1 = err(&|p| {
        p.pop();
    });
    assert!(
        e1.contains("layer 2's pinned experts cover 23 tokens, the step has 24"),
        "{e1}"
    );
    let e2 = err(&|p| p[5] = vec![3, 3]);
    assert!(
        e2.contains("layer 2, token 5: 2 pinned experts, the router chooses 2 distinct"),
        "{e2}"
    );
    let e3 = err(&|p| p[5] = vec![1]);
    assert!(e3.contains("token 5: 1 pinned experts"), "{e3}");
    let e4 = err(&|p| p[7] = vec![0, 8]);
    assert!(
        e4.contains("layer 2, token 7: pinned expert 8 is past the 8 experts"),
        "{e4}"
    );
}

//! The tiny model on the wgpu backend: a batch of sequences (prefill, then decode steps) gives
//! each sequence bit for bit the logits and indexer selections it gets alone, as on the cpu
//! backend, also when the batched prefill computes only some rows' logits (gathered on the
//! device). Skips with the reason when no adapter exists, except under CI=true.

use dsv4_backend_wgpu::WgpuBackend;
use dsv4_core::{ActQuant, IndexKDtype, KvCacheDtype, Numerics};
use dsv4_model::LogitRows;
use dsv4_model::forward::{ForwardOutput, Taps};
use dsv4_model::load::{ModelSource, load_model};
use std::sync::Arc;

#[test]
fn a_batch_gives_each_sequence_its_solo_logits() {
    let backend = match WgpuBackend::new(None, true) {
        Ok(b) => Arc::new(b),
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and the wgpu backend cannot run: {e}");
            }
            eprintln!("SKIP: the wgpu backend cannot run here: {e}");
            return;
        }
    };
    let numerics = Numerics {
        kv_cache_dtype: KvCacheDtype::Fp8,
        index_k_dtype: IndexKDtype::Fp8,
        act_quant: ActQuant::Fp8,
    };
    let model = load_model(&ModelSource::Tiny { seed: 0 }, backend, numerics).unwrap();
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|s| {
            (0..12 + 5 * s)
                .map(|i| (i * 7 + s * 13 + 1) % 200)
                .collect()
        })
        .collect();
    let steps = 3;
    let run_alone = |p: &Vec<u32>| -> Vec<ForwardOutput> {
        let mut st = model.new_sequence();
        let mut outs = vec![model.forward(&mut st, p).unwrap()];
        for k in 0..steps {
            outs.push(model.forward(&mut st, &[5 + k]).unwrap());
        }
        outs
    };
    let solo: Vec<Vec<ForwardOutput>> = prompts.iter().map(run_alone).collect();
    let mut states: Vec<_> = prompts.iter().map(|_| model.new_sequence()).collect();
    let mut batched: Vec<Vec<ForwardOutput>> = vec![Vec::new(); prompts.len()];
    {
        let mut refs: Vec<_> = states.iter_mut().collect();
        let slices: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
        // The last 2 rows of the first prompt, none of the second, every row of the third.
        let want = [2, 0, prompts[2].len()];
        let exec = model.exec().clone();
        let (outs, _) = model
            .forward_step(
                &mut refs,
                &slices,
                LogitRows::Last(&want),
                &exec,
                &mut Taps::none(),
            )
            .unwrap();
        for (i, o) in outs.into_iter().enumerate() {
            assert_eq!(o.logits.len(), want[i] * o.vocab, "sequence {i}");
            batched[i].push(o);
        }
    }
    for k in 0..steps {
        let next = [5 + k];
        let mut refs: Vec<_> = states.iter_mut().collect();
        let slices: Vec<&[u32]> = vec![&next[..]; prompts.len()];
        for (i, o) in model
            .forward_batch(&mut refs, &slices)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            batched[i].push(o);
        }
    }
    for (i, (a, b)) in solo.iter().zip(&batched).enumerate() {
        for (step, (x, y)) in a.iter().zip(b).enumerate() {
            // The batched prefill's logits are the solo prefill's last rows.
            let tail = &x.logits[x.logits.len() - y.logits.len()..];
            assert!(
                tail.iter()
                    .zip(&y.logits)
                    .all(|(p, q)| p.to_bits() == q.to_bits()),
                "sequence {i}, step {step}: batched logits differ from solo"
            );
            assert_eq!(
                x.topk, y.topk,
                "sequence {i}, step {step}: indexer selections"
            );
        }
    }
}

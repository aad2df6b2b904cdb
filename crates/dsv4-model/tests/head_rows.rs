//! A step that asks for fewer rows' logits than it computes ([`LogitRows::Last`]): the head
//! gathers those rows first, and each row's logits are bitwise what an every-row step gives,
//! on the host and on a device, in every executor. A step that does not ask for the residual
//! does not read it back.

use dsv4_backend_reference::ReferenceBackend;
use dsv4_core::{Numerics, SplitMix64};
use dsv4_kernels::HostResident;
use dsv4_model::forward::{ExecOptions, Executor, ForwardOutput, StepReport, Taps};
use dsv4_model::{ForwardError, LogitRows, Model, ModelSource, StepOutputs, load_model};
use std::sync::Arc;

fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut g = SplitMix64::new(seed);
    (0..n).map(|_| 2 + g.below(380) as u32).collect()
}

/// The tiny model on the reference backend, activations in host memory.
fn reference_model() -> Model {
    load_model(
        &ModelSource::Tiny { seed: 3 },
        Arc::new(ReferenceBackend),
        Numerics::default(),
    )
    .unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Prompts of 6, 1 and 9 tokens in one step, then one more chunk of 3, 2 and 1 tokens, with
/// `want` the logits each step asks for.
fn steps(
    m: &Model,
    exec: &ExecOptions,
    want: [LogitRows<'_>; 2],
) -> Vec<(Vec<ForwardOutput>, StepReport)> {
    let mut seqs: Vec<_> = (0..3).map(|_| m.new_sequence()).collect();
    let chunks = [
        [tokens(6, 1), tokens(1, 2), tokens(9, 3)],
        [tokens(3, 4), tokens(2, 5), tokens(1, 6)],
    ];
    chunks
        .iter()
        .zip(want)
        .map(|(chunk, want)| {
            let mut refs: Vec<_> = seqs.iter_mut().collect();
            let toks: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
            m.forward_step(&mut refs, &toks, want, exec, &mut Taps::none())
                .expect("step")
        })
        .collect()
}

#[test]
fn gathered_rows_are_the_every_row_steps_rows_bitwise_on_host_and_device() {
    let modes = [
        ("serial", ExecOptions::default()),
        (
            "overlap threaded",
            ExecOptions {
                overlap: true,
                executor: Executor::Threaded,
                ..ExecOptions::default()
            },
        ),
        (
            "overlap interleaved",
            ExecOptions {
                overlap: true,
                executor: Executor::Interleaved { seed: 4 },
                ..ExecOptions::default()
            },
        ),
    ];
    // Per step: the last rows each sequence asks for (a run that spans two sequences, one
    // that asks for nothing, one that asks for every row).
    let asks: [[usize; 3]; 2] = [[2, 1, 1], [0, 2, 1]];
    let device = Arc::new(HostResident::new(Arc::new(ReferenceBackend)));
    let m = load_model(&ModelSource::Tiny { seed: 3 }, device, Numerics::default()).unwrap();
    for (name, exec) in &modes {
        for host in [true, false] {
            let exec = ExecOptions {
                host_activations: host,
                ..exec.clone()
            };
            let what = format!("{name}, activations on the host: {host}");
            let all = steps(&m, &exec, [LogitRows::All; 2]);
            let some = steps(
                &m,
                &exec,
                [LogitRows::Last(&asks[0]), LogitRows::Last(&asks[1])],
            );
            for (step, ((a, ar), (s, sr))) in all.iter().zip(&some).enumerate() {
                let asked: usize = asks[step].iter().sum();
                assert_eq!(ar.logit_rows, ar.rows, "{what}: step {step}");
                assert_eq!(sr.logit_rows, asked, "{what}: step {step}: rows computed");
                assert_eq!(sr.launches, ar.launches + 1, "{what}: one gather launch");
                for (q, (a, s)) in a.iter().zip(s).enumerate() {
                    let k = asks[step][q];
                    let v = a.vocab;
                    assert_eq!(s.logits.len(), k * v, "{what}: step {step} seq {q}");
                    assert!(
                        bits(&s.logits) == bits(&a.logits[a.logits.len() - k * v..]),
                        "{what}: step {step} seq {q}: the last {k} rows' logits differ"
                    );
                    assert!(
                        bits(&s.residual) == bits(&a.residual),
                        "{what}: step {step} seq {q}: every row's residual differs"
                    );
                }
            }
        }
    }
}

#[test]
fn a_step_that_needs_no_logits_leaves_the_head_out() {
    let m = reference_model();
    let exec = ExecOptions::default();
    let some = steps(&m, &exec, [LogitRows::Last(&[0, 0, 0]), LogitRows::All]);
    let all = steps(&m, &exec, [LogitRows::All; 2]);
    assert_eq!(some[0].1.logit_rows, 0);
    assert_eq!(
        some[0].1.launches + 3,
        all[0].1.launches,
        "no hc_head, norm or logits launch"
    );
    assert!(some[0].0.iter().all(|o| o.logits.is_empty()));
    for (s, a) in some[0].0.iter().zip(&all[0].0) {
        assert!(
            bits(&s.residual) == bits(&a.residual),
            "the residual differs"
        );
    }
    // The caches advanced as usual: the next step's logits are the same.
    for (s, a) in some[1].0.iter().zip(&all[1].0) {
        assert!(
            bits(&s.logits) == bits(&a.logits),
            "the next step's logits differ"
        );
    }
}

#[test]
fn a_bad_logit_row_request_is_refused_and_changes_nothing() {
    let m = reference_model();
    let exec = ExecOptions::default();
    let (mut a, mut b) = (m.new_sequence(), m.new_sequence());
    let (ta, tb) = (tokens(4, 1), tokens(2, 2));
    for (want, says) in [
        (&[1usize][..], "give one count per sequence"),
        (
            &[1, 3][..],
            "sequence 1 runs 2 tokens but was asked for the logits of its last 3",
        ),
    ] {
        let err = m
            .forward_step(
                &mut [&mut a, &mut b],
                &[&ta, &tb],
                LogitRows::Last(want),
                &exec,
                &mut Taps::none(),
            )
            .unwrap_err();
        assert!(
            matches!(&err, ForwardError::Plan { message } if message.contains(says)),
            "{err}"
        );
        assert_eq!((a.pos, b.pos), (0, 0), "a refused step advances nothing");
    }
}

#[test]
fn a_step_that_does_not_ask_for_the_residual_reads_back_only_its_logits() {
    let device = Arc::new(HostResident::new(Arc::new(ReferenceBackend)));
    let m = load_model(&ModelSource::Tiny { seed: 3 }, device, Numerics::default()).unwrap();
    let exec = ExecOptions::default();
    let prompts = [tokens(6, 1), tokens(9, 2)];
    let run = |outputs: StepOutputs<'_>| {
        let (mut a, mut b) = (m.new_sequence(), m.new_sequence());
        let toks: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        m.forward_step(
            &mut [&mut a, &mut b],
            &toks,
            outputs,
            &exec,
            &mut Taps::none(),
        )
        .unwrap()
    };
    let last = [1, 1];
    let (with, wr) = run(LogitRows::Last(&last).into());
    let (without, wor) = run(StepOutputs {
        logits: LogitRows::Last(&last),
        residual: false,
    });
    let (hc, d) = (m.cfg.hc_mult, m.cfg.hidden_size);
    for (s, (w, wo)) in with.iter().zip(&without).enumerate() {
        assert_eq!(w.residual.len(), prompts[s].len() * hc * d);
        assert!(
            wo.residual.is_empty(),
            "sequence {s}: no residual asked for"
        );
        assert!(
            bits(&w.logits) == bits(&wo.logits),
            "sequence {s}: same logits"
        );
    }
    let read = |r: &StepReport| r.device.expect("device traffic").read_bytes;
    assert_eq!(
        read(&wr) - read(&wor),
        (15 * hc * d * 4) as u64,
        "the residual's bytes are the whole difference"
    );
}

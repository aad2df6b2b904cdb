//! Execution-mode diffs on one backend: captured vs eager and overlap vs serial (interleaved or
//! threaded) agree bitwise (every tap's tolerance is 0), and the arena fault on the interleaving
//! executor is caught as a divergence.

use dsv4_diff::{ModelOptions, SideConfig, run_model};
use dsv4_model::forward::{ExecOptions, Executor, Fault};

fn side(exec: ExecOptions) -> dsv4_diff::Side {
    dsv4_backend_reference::link();
    SideConfig {
        exec,
        ..SideConfig::default()
    }
    .open("side")
    .unwrap()
}

fn opts() -> ModelOptions {
    ModelOptions {
        prefill: 12,
        decode: 6,
        seed: 3,
        ..ModelOptions::default()
    }
}

#[test]
fn captured_and_overlap_modes_agree_bitwise_with_eager_serial() {
    let oracle = side(ExecOptions::default());
    for exec in [
        ExecOptions {
            captured: true,
            ..Default::default()
        },
        ExecOptions {
            overlap: true,
            captured: true,
            executor: Executor::Interleaved { seed: 4 },
            ..Default::default()
        },
        // Fresh buffers, one thread per stream: a launch moves out the operands it is the
        // last to use while launches on other streams run.
        ExecOptions {
            overlap: true,
            executor: Executor::Threaded,
            ..Default::default()
        },
        ExecOptions {
            overlap: true,
            executor: Executor::Interleaved { seed: 9 },
            ..Default::default()
        },
    ] {
        let m = run_model(&oracle, &side(exec.clone()), &opts()).unwrap();
        assert!(m.passed, "{exec:?}: {:?}", m.first_divergence);
        assert!(
            m.taps
                .iter()
                .all(|t| t.tolerance == 0.0 && t.max_abs == 0.0)
        );
    }
}

#[test]
fn the_arena_fault_shows_as_a_divergence() {
    let oracle = side(ExecOptions::default());
    let faulty = side(ExecOptions {
        overlap: true,
        captured: true,
        executor: Executor::Interleaved { seed: 0 },
        faults: [Fault::ArenaIgnoresStreams].into(),
        ..Default::default()
    });
    let m = run_model(&oracle, &faulty, &opts()).unwrap();
    assert!(!m.passed);
    let first = m.first_divergence.expect("a tap departs");
    assert!(
        first.call.starts_with("decode"),
        "captured plans run the decode steps: {first:?}"
    );
}

#[test]
fn a_sequence_batched_with_others_computes_its_solo_bits_unless_the_arena_aliases() {
    // Captured plans on interleaved side streams, as the incident ran: the probe alone decodes
    // in bucket 1, batched with three others in bucket 4.
    let incident = ExecOptions {
        overlap: true,
        captured: true,
        executor: Executor::Interleaved { seed: 0 },
        ..Default::default()
    };
    let batched = ModelOptions {
        neighbours: 3,
        ..opts()
    };
    let clean = side(incident.clone());
    let m = run_model(&clean, &clean, &batched).unwrap();
    assert!(m.passed, "{:?}", m.first_divergence);
    assert_eq!(
        (m.neighbours, m.pinned),
        (3, false),
        "no pins across a batch"
    );
    assert!(
        m.taps
            .iter()
            .all(|t| t.tolerance == 0.0 && t.max_abs == 0.0)
    );
    assert_eq!(m.logits.rows, 18, "the probe's rows only");
    // The incident's aliasing allocator on both sides: the captured decode steps diverge.
    let faulty = side(ExecOptions {
        faults: [Fault::ArenaIgnoresStreams].into(),
        ..incident
    });
    let m = run_model(&faulty, &faulty, &batched).unwrap();
    let first = m.first_divergence.expect("a tap departs");
    assert!(first.call.starts_with("decode"), "{first:?}");
}

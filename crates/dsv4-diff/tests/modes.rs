//! Execution-mode diffs on one backend: captured vs eager and overlap vs serial agree bitwise
//! (every tap's tolerance is 0), and the arena fault on the interleaving executor is caught as
//! a divergence.

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

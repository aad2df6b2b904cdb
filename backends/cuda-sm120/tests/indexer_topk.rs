//! `indexer_topk_rows` on the CPU emulator (`dsv4_kernels::row_check`): index for index what
//! the trait's composition (`indexer_scores_rows` then `topk_rows`, row by row) gives on the same
//! backend, with f64 and f32 accumulation, in one submission that reads back only the chosen
//! indices (never the scores); it panics where the composition does.
//!
//! The emulator needs a host C++ compiler; without one each test prints why and skips, except
//! under CI=true, where that is a failure.

mod common;

use common::emu_available;
use dsv4_backend_cuda::{CudaBackend, EMU_NAME, emu};
use dsv4_kernels::{Backend, row_check};

#[test]
fn the_selection_equals_scores_then_topk_in_one_submission() {
    if !emu_available("the_selection_equals_scores_then_topk_in_one_submission") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = CudaBackend::new(EMU_NAME, emu::open(acc_f64).expect("open the emulator"));
        let stats = || Backend::device(&be).expect("device ops").stats();
        let calls = row_check::indexer_topk_rows(&be, &stats).unwrap_or_else(|e| panic!("{e}"));
        for c in calls.iter().filter(|c| c.keys > 0 && c.selected > 0) {
            let what = format!("acc_f64={acc_f64} {}", c.what);
            assert_eq!(c.stats.submissions, 1, "{what}: {:?}", c.stats);
            assert_eq!(
                c.stats.read_bytes,
                c.selected as u64 * 4,
                "{what}: the indices only"
            );
        }
        row_check::indexer_topk_rows_panics(&be).unwrap_or_else(|e| panic!("{e}"));
    }
}

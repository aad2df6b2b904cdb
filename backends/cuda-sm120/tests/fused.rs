//! The fused host ops on the CPU emulator (`dsv4_kernels::row_check`), with f64 and f32
//! accumulation, each against the trait's composition on the same backend and in one
//! submission that reads back only its result:
//! - `indexer_topk_rows`: index for index what `indexer_scores_rows` then `topk_rows` choose,
//!   the scores never read back;
//! - `paged_indexer_topk_rows`: index for index what `cache_load_rows` then
//!   `indexer_topk_rows` choose, neither the decoded keys nor the scores read back; the same
//!   layout errors;
//! - `paged_attention_rows`: bit for bit what `cache_load_rows` then `sparse_attention_rows`
//!   give, the decoded keys never read back; the same layout errors.
//!
//! Both panic where the composition does.
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

#[test]
fn paged_attention_equals_load_then_attend_in_one_submission() {
    if !emu_available("paged_attention_equals_load_then_attend_in_one_submission") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = CudaBackend::new(EMU_NAME, emu::open(acc_f64).expect("open the emulator"));
        let stats = || Backend::device(&be).expect("device ops").stats();
        let calls = row_check::paged_attention_rows(&be, &stats).unwrap_or_else(|e| panic!("{e}"));
        assert!(calls.iter().any(|c| c.keys > 0), "no case with keys");
        for c in calls.iter().filter(|c| c.selected > 0) {
            let what = format!("acc_f64={acc_f64} {}", c.what);
            assert_eq!(c.stats.submissions, 1, "{what}: {:?}", c.stats);
            assert_eq!(
                c.stats.read_bytes,
                c.selected as u64 * 4,
                "{what}: the output only"
            );
        }
        row_check::paged_attention_rows_panics(&be).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn the_paged_selection_equals_load_then_select_in_one_submission() {
    if !emu_available("the_paged_selection_equals_load_then_select_in_one_submission") {
        return;
    }
    for acc_f64 in [true, false] {
        let be = CudaBackend::new(EMU_NAME, emu::open(acc_f64).expect("open the emulator"));
        let stats = || Backend::device(&be).expect("device ops").stats();
        let calls =
            row_check::paged_indexer_topk_rows(&be, &stats).unwrap_or_else(|e| panic!("{e}"));
        assert!(calls.iter().any(|c| c.selected > 0), "no case selects");
        for c in calls.iter().filter(|c| c.keys > 0 && c.selected > 0) {
            let what = format!("acc_f64={acc_f64} {}", c.what);
            assert_eq!(c.stats.submissions, 1, "{what}: {:?}", c.stats);
            assert_eq!(
                c.stats.read_bytes,
                c.selected as u64 * 4,
                "{what}: the indices only"
            );
        }
        row_check::paged_indexer_topk_rows_panics(&be).unwrap_or_else(|e| panic!("{e}"));
    }
}

//! The fused host ops on the device (`dsv4_kernels::row_check`), each against the trait's
//! composition on the same backend, in one submission:
//! - `indexer_topk_rows`: index for index what `indexer_scores_rows` then `topk_rows` choose,
//!   reading back only the selection flags, one per key (never the scores);
//! - `paged_indexer_topk_ranges` (the default): what `paged_indexer_topk_rows` chooses over the
//!   expanded ranges;
//! - `paged_indexer_topk_rows`: index for index what `cache_load_rows` then
//!   `indexer_topk_rows` choose, reading back only the selection flags (never the decoded keys
//!   or the scores); the same layout errors;
//! - `paged_attention_rows`: bit for bit what `cache_load_rows` then `sparse_attention_rows`
//!   give, reading back only the output (never the decoded keys); the same layout errors;
//! - `paged_attention_indexed` (the default): bit for bit what `paged_attention_rows` gives
//!   over the rows laid out id by id.
//!
//! Both panic where the composition does. Skips with the reason when no adapter exists, except
//! under CI=true.

mod common;

use common::{backend, stats};
use dsv4_kernels::row_check;

#[test]
fn the_selection_equals_scores_then_topk_in_one_submission() {
    let Some(gpu) = backend(true) else { return };
    let calls =
        row_check::indexer_topk_rows(&gpu, &|| stats(&gpu)).unwrap_or_else(|e| panic!("{e}"));
    for c in calls.iter().filter(|c| c.keys > 0 && c.selected > 0) {
        assert_eq!(c.stats.submissions, 1, "{}: {:?}", c.what, c.stats);
        assert_eq!(
            c.stats.read_bytes,
            c.keys as u64 * 4,
            "{}: one flag per key",
            c.what
        );
    }
    row_check::indexer_topk_rows_panics(&gpu).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn paged_attention_equals_load_then_attend_in_one_submission() {
    let Some(gpu) = backend(true) else { return };
    let calls =
        row_check::paged_attention_rows(&gpu, &|| stats(&gpu)).unwrap_or_else(|e| panic!("{e}"));
    assert!(calls.iter().any(|c| c.keys > 0), "no case with keys");
    for c in calls.iter().filter(|c| c.selected > 0) {
        assert_eq!(c.stats.submissions, 1, "{}: {:?}", c.what, c.stats);
        assert_eq!(
            c.stats.read_bytes,
            c.selected as u64 * 4,
            "{}: the output only",
            c.what
        );
    }
    row_check::paged_attention_rows_panics(&gpu).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_paged_selection_equals_load_then_select_in_one_submission() {
    let Some(gpu) = backend(true) else { return };
    let calls =
        row_check::paged_indexer_topk_rows(&gpu, &|| stats(&gpu)).unwrap_or_else(|e| panic!("{e}"));
    assert!(calls.iter().any(|c| c.selected > 0), "no case selects");
    for c in calls.iter().filter(|c| c.keys > 0 && c.selected > 0) {
        assert_eq!(c.stats.submissions, 1, "{}: {:?}", c.what, c.stats);
        assert_eq!(
            c.stats.read_bytes,
            c.keys as u64 * 4,
            "{}: one flag per key",
            c.what
        );
    }
    row_check::paged_indexer_topk_rows_panics(&gpu).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn shared_key_ranges_choose_as_the_expanded_rows_in_one_submission() {
    // wgpu takes the trait's default: the ranges laid out as rows, one paged selection.
    let Some(gpu) = backend(true) else { return };
    let calls = row_check::paged_indexer_topk_ranges(&gpu, &|| stats(&gpu))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(calls.iter().any(|c| c.selected > 0), "no case selects");
    for c in calls.iter().filter(|c| c.selected > 0) {
        assert_eq!(c.stats.submissions, 1, "{}: {:?}", c.what, c.stats);
    }
    row_check::paged_indexer_topk_ranges_panics(&gpu).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn shared_key_ids_attend_as_the_laid_out_rows_in_one_submission() {
    // wgpu takes the trait's default: the ids laid out as rows, one paged attention.
    let Some(gpu) = backend(true) else { return };
    let calls =
        row_check::paged_attention_indexed(&gpu, &|| stats(&gpu)).unwrap_or_else(|e| panic!("{e}"));
    assert!(calls.iter().any(|c| c.selected > 0), "no case attends");
    for c in calls.iter().filter(|c| c.selected > 0) {
        assert_eq!(c.stats.submissions, 1, "{}: {:?}", c.what, c.stats);
    }
    row_check::paged_attention_indexed_panics(&gpu).unwrap_or_else(|e| panic!("{e}"));
}

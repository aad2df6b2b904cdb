//! `indexer_topk_rows` on the device (`dsv4_kernels::row_check`): index for index what the
//! trait's composition (`indexer_scores_rows` then `topk_rows`, row by row) gives on the same
//! backend, in one submission that reads back only the selection flags, one per key (never the
//! scores); it panics where the composition does. Skips with the reason when no adapter exists,
//! except under CI=true.

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

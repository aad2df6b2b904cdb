//! Operand checks the GPU backends share, so both refuse exactly what the trait's row-by-row
//! definitions would slice out of range: [`IndexerRows`], the indexer's operands checked and
//! cut to what its queries use, and [`AttentionRows`], sparse attention's key ranges.

/// The indexer's operands (`indexer_scores_rows`, `indexer_topk_rows` and their paged form) cut
/// to what the queries use: their q and w rows, the key rows `first .. last` they score, and
/// the key ranges relative to `first`.
#[derive(Debug, Clone)]
pub struct IndexerRows<'a> {
    /// The queries' rows, [rows, heads, dim].
    pub q: &'a [f32],
    /// The queries' head weights, [rows, heads].
    pub w: &'a [f32],
    /// The key ranges relative to `first` (`starts[0]` = 0, one more entry than queries).
    pub starts: Vec<usize>,
    /// The first key row a query scores.
    pub first: usize,
    /// One past the last key row a query scores.
    pub last: usize,
}

impl<'a> IndexerRows<'a> {
    /// Check the operands of `what` as the row-by-row indexer would slice them — query r (heads
    /// = `w.len()` / queries) over key rows `key_starts[r] .. key_starts[r+1]` of `key_values`
    /// values of `dim`-wide keys, writing that range of an output of `out_len` scores when
    /// given — and cut them to what the queries use; `Ok(None)` for no queries. `Err` names the
    /// first row that would slice out of range (a decreasing range, keys or scores past the
    /// end, a short q).
    pub fn cut(
        what: &str,
        q: &'a [f32],
        w: &'a [f32],
        dim: usize,
        key_values: usize,
        key_starts: &[usize],
        out_len: Option<usize>,
    ) -> Result<Option<Self>, String> {
        let rows = key_starts.len().saturating_sub(1);
        if rows == 0 {
            return Ok(None);
        }
        let heads = w.len() / rows;
        let hd = heads * dim;
        for (r, k) in key_starts.windows(2).enumerate() {
            let in_keys = k[1].checked_mul(dim).is_some_and(|end| end <= key_values);
            if k[0] > k[1] || !in_keys || out_len.is_some_and(|n| k[1] > n) {
                return Err(format!(
                    "{what}: row {r} has keys {}..{} of {} ({out_len:?} outputs)",
                    k[0],
                    k[1],
                    key_values.checked_div(dim).unwrap_or(0),
                ));
            }
            if (r + 1) * hd > q.len() {
                return Err(format!(
                    "{what}: row {r} needs {} query values, got {}",
                    (r + 1) * hd,
                    q.len()
                ));
            }
        }
        let (first, last) = (key_starts[0], key_starts[rows]);
        Ok(Some(Self {
            q: &q[..rows * hd],
            w: &w[..rows * heads],
            starts: key_starts.iter().map(|&s| s - first).collect(),
            first,
            last,
        }))
    }

    /// The keys the queries score, of all `keys` (rows of `dim`).
    pub fn keys<'k>(&self, keys: &'k [f32], dim: usize) -> &'k [f32] {
        &keys[self.first * dim..self.last * dim]
    }
}

/// Items laid out range after range (`items[lo..hi]` for each of `ranges`, in order) and the
/// partition of the result by range (one more start than ranges): how shared keys with
/// per-query ranges become the per-query keys of `paged_indexer_topk_rows`. Panics on a
/// decreasing range or one past `items`, naming it.
pub fn expand_ranges<T: Copy>(items: &[T], ranges: &[(usize, usize)]) -> (Vec<T>, Vec<usize>) {
    let mut out = Vec::with_capacity(ranges.iter().map(|&(lo, hi)| hi.saturating_sub(lo)).sum());
    let mut starts = Vec::with_capacity(ranges.len() + 1);
    starts.push(0);
    for (r, &(lo, hi)) in ranges.iter().enumerate() {
        assert!(
            lo <= hi && hi <= items.len(),
            "key range {r} is {lo}..{hi} of {} rows",
            items.len()
        );
        out.extend_from_slice(&items[lo..hi]);
        starts.push(out.len());
    }
    (out, starts)
}

/// Append row `ids[i]` of `rows` (`width` values each) to `out` for each i in order: shared
/// key rows laid out per query (`sparse_attention_indexed`). Panics on an id past the rows.
pub fn extend_rows_by_id(out: &mut Vec<f32>, rows: &[f32], width: usize, ids: &[usize]) {
    out.reserve(ids.len() * width);
    for &i in ids {
        out.extend_from_slice(&rows[i * width..(i + 1) * width]);
    }
}

/// Sparse attention's key ranges (`sparse_attention_rows` and its paged form) checked and cut to
/// the key rows `first .. last` the queries attend over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionRows {
    /// The key ranges relative to `first` (`starts[0]` = 0, one more entry than queries).
    pub starts: Vec<usize>,
    /// The first key row a query attends over.
    pub first: usize,
    /// One past the last.
    pub last: usize,
}

impl AttentionRows {
    /// Check the operands of `what` as the row-by-row definition would slice them — query r
    /// (`hd` = heads · `dim` values of `q_len` and of `out_len`) over key rows `key_starts[r] ..
    /// key_starts[r+1]` of `key_values` values of `dim`-wide keys — and cut the ranges;
    /// `Ok(None)` when nothing is computed (no queries, or `hd` = 0). `Err` names the first row
    /// that would slice out of range (with `dim` > 0: a decreasing range or keys past the end;
    /// a short q or output).
    pub fn cut(
        what: &str,
        q_len: usize,
        out_len: usize,
        key_values: usize,
        dim: usize,
        hd: usize,
        key_starts: &[usize],
    ) -> Result<Option<Self>, String> {
        for (r, k) in key_starts.windows(2).enumerate() {
            let in_keys = k[1].checked_mul(dim).is_some_and(|end| end <= key_values);
            if dim > 0 && (k[0] > k[1] || !in_keys) {
                return Err(format!(
                    "{what}: row {r} has keys {}..{} of {}",
                    k[0],
                    k[1],
                    key_values / dim
                ));
            }
            if (r + 1) * hd > q_len || (r + 1) * hd > out_len {
                return Err(format!(
                    "{what}: row {r} needs {} query and output values, got {q_len} and {out_len}",
                    (r + 1) * hd
                ));
            }
        }
        let rows = key_starts.len().saturating_sub(1);
        if rows == 0 || hd == 0 {
            return Ok(None);
        }
        let (first, last) = (key_starts[0], key_starts[rows]);
        Ok(Some(Self {
            starts: key_starts.iter().map(|&s| s - first).collect(),
            first,
            last,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_keeps_what_the_queries_use_and_names_the_bad_row() {
        let q = [1.0f32; 2 * 3 * 4];
        let w = [1.0f32; 2 * 3];
        let r = IndexerRows::cut("op", &q, &w, 4, 40, &[2, 5, 9], None)
            .unwrap()
            .unwrap();
        assert_eq!((r.first, r.last, r.starts.clone()), (2, 9, vec![0, 3, 7]));
        assert_eq!(r.keys(&[0.0; 40], 4).len(), 28);
        assert!(
            IndexerRows::cut("op", &q, &w, 4, 40, &[0], None)
                .unwrap()
                .is_none()
        );
        let bad = |starts: &[usize], keys: usize, out: Option<usize>, qn: usize| {
            IndexerRows::cut("op", &q[..qn], &w, 4, keys, starts, out).unwrap_err()
        };
        assert!(bad(&[0, 4, 2], 40, None, 24).contains("row 1 has keys 4..2"));
        assert!(bad(&[0, 3, 11], 40, None, 24).contains("row 1 has keys 3..11 of 10"));
        assert!(bad(&[0, 3, 6], 40, Some(5), 24).contains("row 1"));
        assert!(bad(&[0, 3, 6], 40, None, 23).contains("row 1 needs 24 query values"));
        assert!(bad(&[0, usize::MAX], 40, None, 24).contains("row 0"));
    }

    #[test]
    fn attention_ranges_are_cut_and_refused_where_the_row_loop_would_slice_out_of_range() {
        let cut = |starts: &[usize], q: usize, out: usize, keys: usize, dim: usize| {
            AttentionRows::cut("op", q, out, keys, dim, 2 * dim, starts)
        };
        let r = cut(&[1, 3, 6], 16, 16, 24, 4).unwrap().unwrap();
        assert_eq!((r.first, r.last, r.starts), (1, 6, vec![0, 2, 5]));
        assert_eq!(cut(&[0], 0, 0, 0, 4), Ok(None));
        assert!(
            cut(&[0, 4, 2], 16, 16, 24, 4)
                .unwrap_err()
                .contains("row 1 has keys 4..2")
        );
        assert!(cut(&[0, 3, 7], 16, 16, 24, 4).unwrap_err().contains("of 6"));
        assert!(
            cut(&[0, 3, 6], 15, 16, 24, 4)
                .unwrap_err()
                .contains("row 1 needs 16")
        );
        assert!(
            cut(&[0, 3, 6], 16, 15, 24, 4)
                .unwrap_err()
                .contains("row 1 needs 16")
        );
        // Zero-width keys slice nothing: any ranges pass, and nothing is computed.
        assert_eq!(cut(&[5, 2], 0, 0, 0, 0), Ok(None));
    }
}

//! The op catalog: every op of the backend trait at tiny, odd and real Flash shapes, crossed with
//! the numerics knobs the op depends on (activation quantization for linears, storage dtype for
//! cache rows, index dtype for query rounding).

mod attention;
mod cache;
mod linear;
mod mhc;
mod rowwise;

use crate::ops::case::Case;

/// Every case, in a stable order (grouped by op as the trait lists them).
pub(crate) fn all_cases() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(linear::cases());
    v.extend(rowwise::cases());
    v.extend(mhc::cases());
    v.extend(attention::cases());
    v.extend(cache::cases());
    v.sort_by_key(|c| c.meta.op);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Op;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_every_op_has_tiny_odd_and_flash_cases() {
        let cases = all_cases();
        let names: HashSet<&str> = cases.iter().map(|c| c.meta.name.as_str()).collect();
        assert_eq!(names.len(), cases.len(), "duplicate case names");
        for op in Op::ALL {
            let classes: HashSet<String> = cases
                .iter()
                .filter(|c| c.meta.op == op)
                .map(|c| c.meta.class.to_string())
                .collect();
            assert!(classes.contains("odd"), "{op} has no odd case");
            assert!(classes.contains("flash"), "{op} has no flash case");
        }
        // Numerics-dependent ops cover every setting of their knob.
        let tags = |op: Op| -> HashSet<String> {
            cases
                .iter()
                .filter(|c| c.meta.op == op)
                .filter_map(|c| c.meta.numerics.clone())
                .collect()
        };
        assert_eq!(tags(Op::Linear).len(), 2);
        assert_eq!(tags(Op::RoundIndexRows).len(), 3);
        assert_eq!(tags(Op::CacheStore).len(), 5);
        assert_eq!(tags(Op::CacheLoad).len(), 5);
        assert_eq!(tags(Op::CacheLoadRows).len(), 5);
        assert_eq!(tags(Op::CacheEncodeRows).len(), 5);
        assert_eq!(tags(Op::PagedAttentionRows).len(), 2);
        assert_eq!(tags(Op::PagedAttentionIndexed).len(), 2);
        assert_eq!(tags(Op::PagedIndexerTopkRows).len(), 2);
        assert_eq!(tags(Op::PagedIndexerTopkRanges).len(), 2);
    }
}

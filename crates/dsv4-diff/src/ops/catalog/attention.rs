//! Cases of the attention-side ops: `softmax_pool` (compressor pooling, one window or many),
//! `indexer_scores`, `topk` and `sparse_attention`.

use crate::Op;
use crate::ops::case::{Case, Runner, SizeClass, uniform, uniform_std};
use crate::ops::harness::{GuardedF32, Problem, Produced, Ran, call};
use dsv4_core::SplitMix64;

/// How the gate logits of a pooling case are masked with −∞.
#[derive(Debug, Clone, Copy)]
enum Mask {
    /// None masked.
    None,
    /// The first `rows/2` rows masked (the first window of a ratio-4 compressor).
    FirstHalf,
    /// Column 0 fully masked (its output must be 0) and a few scattered entries.
    Scattered,
}

/// A pooling case: `windows` = None runs `softmax_pool` on one window, Some(n) runs
/// `softmax_pool_rows` on n windows of the same shape.
fn softmax_pool_case(
    class: SizeClass,
    windows: Option<usize>,
    rows: usize,
    width: usize,
    mask: Mask,
) -> Case {
    let tag = match mask {
        Mask::None => "",
        Mask::FirstHalf => ".first-half-masked",
        Mask::Scattered => ".masked",
    };
    let nw = windows.unwrap_or(1);
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let a = uniform(rng, nw * rows * width, 1.0);
        let mut z = uniform(rng, nw * rows * width, 4.0);
        for (i, v) in z.iter_mut().enumerate() {
            let (r, c) = ((i / width) % rows.max(1), i % width);
            let masked = match mask {
                Mask::None => false,
                Mask::FirstHalf => r < rows / 2,
                Mask::Scattered => {
                    c == 0 || (r * 7 + c * 3 + i / (rows * width)).is_multiple_of(11)
                }
            };
            if masked {
                *v = f32::NEG_INFINITY;
            }
        }
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(nw * width);
            let ((), elapsed) = call(|| match windows {
                None => be.softmax_pool(&a, &z, rows, width, out.slice_mut()),
                Some(n) => be.softmax_pool_rows(&a, &z, n, rows, width, out.slice_mut()),
            })?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let n = (nw * rows * width) as f64;
    let (op, label) = match windows {
        None => (Op::SoftmaxPool, format!("{rows}x{width}{tag}")),
        Some(w) => (Op::SoftmaxPoolRows, format!("{w}w.{rows}x{width}{tag}")),
    };
    Case::new(op, class, label, None, (4.0 * n, 8.0 * n), build)
}

fn indexer_case(class: SizeClass, heads: usize, dim: usize, n: usize) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let q = uniform_std(rng, heads * dim, 1.0);
        let w = uniform(rng, heads, 1.0 / (heads as f32).sqrt());
        let keys = uniform_std(rng, n * dim, 1.0);
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(n);
            let ((), elapsed) = call(|| be.indexer_scores(&q, &w, dim, &keys, out.slice_mut()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let (h, d, nf) = (heads as f64, dim as f64, n as f64);
    Case::new(
        Op::IndexerScores,
        class,
        format!("h{heads}.d{dim}.n{n}"),
        None,
        (2.0 * nf * h * (d + 1.0), 4.0 * (nf * d + h * d + h + nf)),
        build,
    )
}

fn topk_case(class: SizeClass, n: usize, k: usize, ties: bool) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let mut s = uniform(rng, n, 2.0);
        if ties {
            // Multiples of 1/4: many equal scores, so the lower-index rule decides.
            s.iter_mut().for_each(|v| *v = (*v * 4.0).round() / 4.0);
        }
        Ok(Box::new(move |be| {
            let (idx, elapsed) = call(|| be.topk(&s, k))?;
            if let Some(&bad) = idx.iter().find(|&&i| i >= n) {
                return Err(Problem::OpError(format!(
                    "index {bad} is outside {n} scores"
                )));
            }
            if idx.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Problem::OpError(
                    "indices are not strictly ascending".to_string(),
                ));
            }
            Ok(Ran {
                out: Produced::Indices(idx),
                elapsed,
            })
        }))
    });
    Case::new(
        Op::Topk,
        class,
        format!("n{n}.k{k}{}", if ties { ".ties" } else { "" }),
        None,
        (0.0, 4.0 * n as f64),
        build,
    )
}

fn attention_case(class: SizeClass, heads: usize, dim: usize, n: usize, hot: bool) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        // Unit-RMS queries and keys give logits of about N(0, 1); "hot" queries push them to
        // a few hundred, where a softmax without max subtraction overflows.
        let q = uniform_std(rng, heads * dim, if hot { 60.0 } else { 1.0 });
        let keys = uniform_std(rng, n * dim, 1.0);
        let sink = uniform(rng, heads, 2.0);
        let scale = 1.0 / (dim as f32).sqrt();
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(heads * dim);
            let ((), elapsed) =
                call(|| be.sparse_attention(&q, dim, &keys, &sink, scale, out.slice_mut()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let (h, d, nf) = (heads as f64, dim as f64, n as f64);
    Case::new(
        Op::SparseAttention,
        class,
        format!("h{heads}.d{dim}.n{n}{}", if hot { ".hot" } else { "" }),
        None,
        (4.0 * h * nf * d, 4.0 * (nf * d + 2.0 * h * d + h)),
        build,
    )
}

/// `[0, n0, n0+n1, …]`.
pub(super) fn starts_of(ns: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(ns.iter().scan(0, |acc, &n| {
            *acc += n;
            Some(*acc)
        }))
        .collect()
}

fn indexer_rows_case(class: SizeClass, heads: usize, dim: usize, ns: &'static [usize]) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let rows = ns.len();
        let starts = starts_of(ns);
        let q = uniform_std(rng, rows * heads * dim, 1.0);
        let w = uniform(rng, rows * heads, 1.0 / (heads as f32).sqrt());
        let keys = uniform_std(rng, starts[rows] * dim, 1.0);
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(starts[rows]);
            let ((), elapsed) =
                call(|| be.indexer_scores_rows(&q, &w, dim, &keys, &starts, out.slice_mut()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let (h, d, nf) = (heads as f64, dim as f64, ns.iter().sum::<usize>() as f64);
    let r = ns.len() as f64;
    Case::new(
        Op::IndexerScoresRows,
        class,
        format!("h{heads}.d{dim}.n{}", label_of(ns)),
        None,
        (
            2.0 * nf * h * (d + 1.0),
            4.0 * (nf * d + r * (h * d + h) + nf),
        ),
        build,
    )
}

fn topk_rows_case(class: SizeClass, ns: &'static [usize], k: usize) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let starts = starts_of(ns);
        // Multiples of 1/4: ties, so the lower-index rule decides within each range.
        let s: Vec<f32> = uniform(rng, starts[ns.len()], 2.0)
            .into_iter()
            .map(|v| (v * 4.0).round() / 4.0)
            .collect();
        Ok(Box::new(move |be| {
            let (per_row, elapsed) = call(|| be.topk_rows(&s, &starts, k))?;
            if per_row.len() != ns.len() {
                return Err(Problem::OpError(format!(
                    "{} results for {} ranges",
                    per_row.len(),
                    ns.len()
                )));
            }
            let mut all = Vec::new();
            for (r, idx) in per_row.iter().enumerate() {
                let n = ns[r];
                if idx.iter().any(|&i| i >= n) || idx.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(Problem::OpError(format!(
                        "range {r}: indices not strictly ascending inside {n} scores"
                    )));
                }
                all.extend(idx.iter().map(|&i| i + starts[r]));
            }
            Ok(Ran {
                out: Produced::Indices(all),
                elapsed,
            })
        }))
    });
    Case::new(
        Op::TopkRows,
        class,
        format!("n{}.k{k}", label_of(ns)),
        None,
        (0.0, 4.0 * ns.iter().sum::<usize>() as f64),
        build,
    )
}

/// Values in {-1, -0.5, 0, 0.5, 1}: with them the indexer's scores are exact in f32 whatever
/// the order of the sums (a few bits each), so every backend ranks the same scores and only the
/// tie rule (lower index first) decides between equal ones.
pub(super) fn halves(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.below(5) as f32 * 0.5 - 1.0).collect()
}

/// The indices each query chose (min(k, its keys) strictly ascending indices inside its own
/// range), as positions in all the keys, query after query; a problem names a query that broke
/// that.
pub(super) fn selection(
    per_row: &[Vec<usize>],
    ns: &[usize],
    k: usize,
) -> Result<Vec<usize>, Problem> {
    if per_row.len() != ns.len() {
        return Err(Problem::OpError(format!(
            "{} results for {} queries",
            per_row.len(),
            ns.len()
        )));
    }
    let starts = starts_of(ns);
    let mut all = Vec::new();
    for (r, idx) in per_row.iter().enumerate() {
        let n = ns[r];
        if idx.len() != n.min(k)
            || idx.iter().any(|&i| i >= n)
            || idx.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(Problem::OpError(format!(
                "query {r}: not min(k, {n}) strictly ascending indices inside its keys"
            )));
        }
        all.extend(idx.iter().map(|&i| i + starts[r]));
    }
    Ok(all)
}

fn indexer_topk_rows_case(
    class: SizeClass,
    heads: usize,
    dim: usize,
    ns: &'static [usize],
    k: usize,
) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let rows = ns.len();
        let starts = starts_of(ns);
        let q = halves(rng, rows * heads * dim);
        let w = halves(rng, rows * heads);
        let keys = halves(rng, starts[rows] * dim);
        Ok(Box::new(move |be| {
            let (per_row, elapsed) = call(|| be.indexer_topk_rows(&q, &w, dim, &keys, &starts, k))?;
            Ok(Ran {
                out: Produced::Indices(selection(&per_row, ns, k)?),
                elapsed,
            })
        }))
    });
    let (h, d, nf) = (heads as f64, dim as f64, ns.iter().sum::<usize>() as f64);
    let r = ns.len() as f64;
    Case::new(
        Op::IndexerTopkRows,
        class,
        format!("h{heads}.d{dim}.n{}.k{k}", label_of(ns)),
        None,
        (2.0 * nf * h * (d + 1.0), 4.0 * (nf * d + r * (h * d + h))),
        build,
    )
}

/// `indexer_topk_ranges` of `counts.len()` queries over one list of key rows, query r over the
/// prefix `0 .. counts[r]` (nested prefixes, as a prefill chunk's rows of one sequence score
/// theirs), each second query's range starting one row later.
fn indexer_ranges_case(
    class: SizeClass,
    heads: usize,
    dim: usize,
    counts: &'static [usize],
    k: usize,
) -> Case {
    let ranges: Vec<(usize, usize)> = counts
        .iter()
        .enumerate()
        .map(|(r, &c)| (usize::from(r % 2 == 1 && c > 0), c))
        .collect();
    let ns: Vec<usize> = ranges.iter().map(|&(lo, hi)| hi - lo).collect();
    let n = counts.iter().copied().max().unwrap_or(0);
    let nf = ns.iter().sum::<usize>() as f64;
    let label = format!("h{heads}.d{dim}.n{}.k{k}", label_of(counts));
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let rows = counts.len();
        let q = halves(rng, rows * heads * dim);
        let w = halves(rng, rows * heads);
        let keys = halves(rng, n * dim);
        let (ranges, ns) = (ranges.clone(), ns.clone());
        Ok(Box::new(move |be| {
            let (per_row, elapsed) =
                call(|| be.indexer_topk_ranges(&q, &w, dim, &keys, &ranges, k))?;
            Ok(Ran {
                out: Produced::Indices(selection(&per_row, &ns, k)?),
                elapsed,
            })
        }))
    });
    let (h, d, r) = (heads as f64, dim as f64, counts.len() as f64);
    Case::new(
        Op::IndexerTopkRanges,
        class,
        label,
        None,
        (
            2.0 * nf * h * (d + 1.0),
            4.0 * (n as f64 * d + r * (h * d + h)),
        ),
        build,
    )
}

/// "a+b+c" of a list of counts.
fn label_of(ns: &[usize]) -> String {
    ns.iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join("+")
}

fn attention_rows_case(class: SizeClass, heads: usize, dim: usize, ns: &'static [usize]) -> Case {
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let rows = ns.len();
        let q = uniform_std(rng, rows * heads * dim, 1.0);
        let starts = starts_of(ns);
        let keys = uniform_std(rng, starts[rows] * dim, 1.0);
        let sink = uniform(rng, heads, 2.0);
        let scale = 1.0 / (dim as f32).sqrt();
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(rows * heads * dim);
            let ((), elapsed) = call(|| {
                be.sparse_attention_rows(&q, dim, &keys, &starts, &sink, scale, out.slice_mut())
            })?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let (h, d, nf) = (heads as f64, dim as f64, ns.iter().sum::<usize>() as f64);
    let r = ns.len() as f64;
    Case::new(
        Op::SparseAttentionRows,
        class,
        format!("h{heads}.d{dim}.n{}", label_of(ns)),
        None,
        (4.0 * h * nf * d, 4.0 * (nf * d + r * (2.0 * h * d + h))),
        build,
    )
}

/// `sparse_attention_indexed` of `counts.len()` queries over one list of key rows: query r
/// over rows `r + 1 .. r + 1 + counts[r]` (sliding windows, as a prefill chunk's rows of one
/// sequence read theirs; row 0 is read by none), every second query's first and last id
/// swapped (ids need not ascend).
fn attention_indexed_case(
    class: SizeClass,
    heads: usize,
    dim: usize,
    counts: &'static [usize],
) -> Case {
    let n = counts
        .iter()
        .enumerate()
        .map(|(r, c)| r + 1 + c)
        .max()
        .unwrap_or(1);
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let rows = counts.len();
        let q = uniform_std(rng, rows * heads * dim, 1.0);
        let keys = uniform_std(rng, n * dim, 1.0);
        let sink = uniform(rng, heads, 2.0);
        let scale = 1.0 / (dim as f32).sqrt();
        let starts = starts_of(counts);
        let mut ids = Vec::with_capacity(starts[rows]);
        for (r, &c) in counts.iter().enumerate() {
            let mut window: Vec<usize> = (r + 1..r + 1 + c).collect();
            if r % 2 == 1 && c > 1 {
                window.swap(0, c - 1);
            }
            ids.extend(window);
        }
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(rows * heads * dim);
            let ((), elapsed) = call(|| {
                let o = out.slice_mut();
                be.sparse_attention_indexed(&q, dim, &keys, &ids, &starts, &sink, scale, o)
            })?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let (h, d, nf) = (
        heads as f64,
        dim as f64,
        counts.iter().sum::<usize>() as f64,
    );
    let r = counts.len() as f64;
    Case::new(
        Op::SparseAttentionIndexed,
        class,
        format!("h{heads}.d{dim}.n{}", label_of(counts)),
        None,
        (
            4.0 * h * nf * d,
            4.0 * (n as f64 * d + r * (2.0 * h * d + h)),
        ),
        build,
    )
}

/// Every case of this module.
pub(crate) fn cases() -> Vec<Case> {
    use SizeClass::*;
    vec![
        softmax_pool_case(Tiny, None, 8, 128, Mask::FirstHalf),
        softmax_pool_case(Tiny, None, 8, 128, Mask::None),
        softmax_pool_case(Tiny, None, 128, 128, Mask::None),
        softmax_pool_case(Odd, None, 5, 33, Mask::Scattered),
        softmax_pool_case(Odd, None, 1, 3, Mask::None),
        softmax_pool_case(Flash, None, 8, 512, Mask::None),
        softmax_pool_case(Flash, None, 128, 512, Mask::None),
        softmax_pool_case(Flash, None, 8, 128, Mask::FirstHalf),
        softmax_pool_case(Tiny, Some(16), 8, 128, Mask::FirstHalf),
        softmax_pool_case(Tiny, Some(3), 128, 128, Mask::None),
        softmax_pool_case(Odd, Some(5), 5, 33, Mask::Scattered),
        softmax_pool_case(Flash, Some(64), 8, 512, Mask::None),
        softmax_pool_case(Flash, Some(16), 128, 512, Mask::Scattered),
        indexer_case(Tiny, 4, 128, 16),
        indexer_case(Odd, 3, 32, 37),
        indexer_case(Odd, 1, 1, 1),
        indexer_case(Flash, 64, 128, 4096),
        indexer_case(Flash, 64, 128, 16384).full_only(),
        topk_case(Tiny, 16, 16, false),
        topk_case(Tiny, 37, 16, false),
        topk_case(Odd, 10, 16, false),
        topk_case(Odd, 0, 4, false),
        topk_case(Odd, 1000, 100, true),
        topk_case(Flash, 4096, 512, false),
        topk_case(Flash, 4096, 512, true),
        topk_case(Flash, 16384, 512, false).full_only(),
        attention_case(Tiny, 4, 128, 32, false),
        attention_case(Tiny, 4, 128, 17, false),
        attention_case(Odd, 3, 72, 1, false),
        attention_case(Odd, 2, 5, 7, true),
        attention_case(Flash, 64, 512, 640, false),
        attention_case(Flash, 64, 512, 192, false),
        attention_case(Flash, 64, 512, 4224, false).full_only(),
        indexer_rows_case(Tiny, 4, 128, &[16, 0, 37, 5]),
        indexer_rows_case(Odd, 3, 32, &[1, 9]),
        indexer_rows_case(Flash, 64, 128, &[4096, 1024, 2048]),
        topk_rows_case(Tiny, &[16, 0, 37, 40], 16),
        topk_rows_case(Odd, &[10, 1, 3], 4),
        topk_rows_case(Flash, &[4096, 1000, 4096], 512),
        indexer_topk_rows_case(Tiny, 4, 128, &[16, 0, 37, 5], 16),
        indexer_topk_rows_case(Odd, 3, 32, &[1, 9, 40], 4),
        indexer_topk_rows_case(Flash, 64, 128, &[4096, 1024, 2048], 512),
        indexer_ranges_case(Tiny, 4, 128, &[16, 0, 37, 5], 16),
        indexer_ranges_case(Odd, 3, 32, &[1, 9, 40, 40], 4),
        indexer_ranges_case(Flash, 64, 128, &[1024, 2048, 3072, 4096], 512),
        attention_rows_case(Tiny, 4, 128, &[32, 17, 1, 40]),
        attention_rows_case(Odd, 3, 72, &[1, 9, 2]),
        attention_rows_case(Flash, 64, 512, &[640, 192, 640]),
        attention_indexed_case(Tiny, 4, 128, &[32, 17, 0, 40]),
        attention_indexed_case(Odd, 3, 72, &[1, 9, 2, 9]),
        attention_indexed_case(Flash, 64, 512, &[256, 256, 256, 256]),
    ]
}

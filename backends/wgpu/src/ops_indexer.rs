//! Host glue of the indexer's kernels (attention.wgsl): scores of queries over their key ranges,
//! top-k of score ranges, and both in one submission (the selection), the scores kept on the
//! device.

use crate::gpu::{Gpu, Step, copy_f32, grid};
use crate::ops::{scratch, upload_f32};
use crate::ops_attn::upload_starts;
use crate::ops_cache::{encode_decode, gather_rows};
use crate::setup::Bind;
use dsv4_core::cache::CacheLayoutError;
use dsv4_kernels::{IndexerRows, RowFormat};

pub fn indexer_scores(gpu: &Gpu, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
    let n = keys.len().checked_div(dim).unwrap_or(0);
    if n == 0 {
        return;
    }
    scores_rows(gpu, q, w, dim, &keys[..n * dim], &[0, n], &mut out[..n]);
}

/// Indexer scores of several queries, each over its own key range (see
/// `Backend::indexer_scores_rows`), in one submission. Panics where the default per-row loop
/// would (a key range outside `keys` or `out`, a query row outside `q`).
pub fn indexer_scores_rows(
    gpu: &Gpu,
    q: &[f32],
    w: &[f32],
    dim: usize,
    keys: &[f32],
    key_starts: &[usize],
    out: &mut [f32],
) {
    let Some(r) = indexer_rows(
        "indexer_scores_rows",
        q,
        w,
        dim,
        keys.len(),
        key_starts,
        Some(out.len()),
    ) else {
        return;
    };
    if dim == 0 || r.first == r.last {
        return;
    }
    scores_rows(
        gpu,
        r.q,
        r.w,
        dim,
        r.keys(keys, dim),
        &r.starts,
        &mut out[r.first..r.last],
    );
}

/// [`IndexerRows::cut`]; panics where it refuses (where the row-by-row indexer would).
fn indexer_rows<'a>(
    what: &str,
    q: &'a [f32],
    w: &'a [f32],
    dim: usize,
    key_values: usize,
    key_starts: &[usize],
    out_len: Option<usize>,
) -> Option<IndexerRows<'a>> {
    IndexerRows::cut(what, q, w, dim, key_values, key_starts, out_len)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The indexer's selection (see `Backend::indexer_topk_rows`): the scores and the top-k of each
/// query's range in one submission, only the selection flags read back. Panics where
/// `indexer_scores_rows` or `topk_rows` would.
pub fn indexer_topk_rows(
    gpu: &Gpu,
    q: &[f32],
    w: &[f32],
    dim: usize,
    keys: &[f32],
    key_starts: &[usize],
    k: usize,
) -> Vec<Vec<usize>> {
    let what = "indexer_topk_rows";
    let Some(r) = indexer_rows(what, q, w, dim, keys.len(), key_starts, None) else {
        return Vec::new();
    };
    let starts = &r.starts;
    let longest = starts.windows(2).map(|s| s[1] - s[0]).max().unwrap_or(0);
    let k = k.min(longest);
    if dim == 0 || k == 0 {
        // Zero scores (zero-width keys) or nothing to choose: no scores to compute here.
        return topk_ranges(gpu, &vec![0f32; r.last - r.first], starts, k);
    }
    let kb = upload_f32(gpu, "indexer keys", r.keys(keys, dim));
    select(gpu, gpu.step(), &r, dim, &kb, k)
}

/// [`indexer_topk_rows`] over keys still in their cache pages (see
/// `Backend::paged_indexer_topk_rows`): the used rows' bytes uploaded once, decoded, scored and
/// ranked in one submission, only the selection flags read back. Layout errors are the
/// composition's, found before anything runs; panics where `indexer_topk_rows` would.
#[allow(clippy::too_many_arguments)]
pub fn paged_indexer_topk_rows(
    gpu: &Gpu,
    q: &[f32],
    w: &[f32],
    fmt: &RowFormat,
    pages: &[&[u8]],
    rows: &[(usize, usize)],
    key_starts: &[usize],
    k: usize,
) -> Result<Vec<Vec<usize>>, CacheLayoutError> {
    let dim = fmt.width();
    let n = rows.len();
    fmt.checked_rows(pages, rows, n * dim)?;
    let what = "paged_indexer_topk_rows";
    let Some(r) = indexer_rows(what, q, w, dim, n * dim, key_starts, None) else {
        return Ok(Vec::new());
    };
    let longest = r.starts.windows(2).map(|s| s[1] - s[0]).max().unwrap_or(0);
    if dim == 0 || k.min(longest) == 0 {
        return Ok(topk_ranges(
            gpu,
            &vec![0f32; r.last - r.first],
            &r.starts,
            k.min(longest),
        ));
    }
    let mut step = gpu.step();
    let Some(used) = gather_rows(
        gpu,
        fmt,
        pages,
        &rows[r.first..r.last],
        (r.last - r.first) * dim,
    )?
    else {
        return Ok(vec![Vec::new(); r.starts.len() - 1]);
    };
    let decoded = encode_decode(gpu, &mut step, fmt, &used);
    Ok(select(gpu, step, &r, dim, &decoded.values, k))
}

/// Encode the scores of `r`'s queries over the keys in `kb` (rows `r.first .. r.last`, `dim`
/// wide, at least one) and the top-k of each range into `step`, submit it and read back only
/// the selection flags; the chosen indices, relative to each range.
fn select(
    gpu: &Gpu,
    mut step: Step<'_>,
    r: &IndexerRows<'_>,
    dim: usize,
    kb: &wgpu::Buffer,
    k: usize,
) -> Vec<Vec<usize>> {
    let starts = &r.starts;
    let longest = starts.windows(2).map(|s| s[1] - s[0]).max().unwrap_or(0);
    let n = r.last - r.first;
    let scored = encode_scores(gpu, &mut step, r.q, r.w, dim, kb, starts);
    let fb = encode_topk(
        gpu,
        &mut step,
        &scored.scores,
        &scored.starts,
        starts,
        k.min(longest),
    );
    let mut flags = vec![0f32; n];
    copy_f32(&step.finish(&[(&fb, n * 4)])[0], &mut flags);
    selected(&flags, starts)
}

/// Indexer scores of `starts.len() - 1` queries (q [rows, heads, dim], w [rows, heads]), query r
/// over keys `starts[r] .. starts[r+1]` of `keys` [starts[rows], dim] (starts[0] = 0,
/// non-decreasing, at least one key), into `out[.. starts[rows]]`: one dispatch, one read-back.
fn scores_rows(
    gpu: &Gpu,
    q: &[f32],
    w: &[f32],
    dim: usize,
    keys: &[f32],
    starts: &[usize],
    out: &mut [f32],
) {
    let n = starts[starts.len() - 1];
    let kb = upload_f32(gpu, "indexer keys", keys);
    let mut step = gpu.step();
    let scored = encode_scores(gpu, &mut step, q, w, dim, &kb, starts);
    copy_f32(&step.finish(&[(&scored.scores, n * 4)])[0], &mut out[..n]);
}

/// The buffers of an encoded indexer dispatch (kept until its step is submitted).
struct Scored {
    _operands: wgpu::Buffer,
    starts: wgpu::Buffer,
    scores: wgpu::Buffer,
}

/// Upload the operands of [`scores_rows`] but the keys (already on the device in `kb`) and
/// encode its `indexer_scores` dispatch into `step`.
fn encode_scores(
    gpu: &Gpu,
    step: &mut Step<'_>,
    q: &[f32],
    w: &[f32],
    dim: usize,
    kb: &wgpu::Buffer,
    starts: &[usize],
) -> Scored {
    let rows = starts.len() - 1;
    let n = starts[rows];
    let mut qw = q.to_vec();
    qw.extend_from_slice(w);
    let qb = upload_f32(gpu, "indexer queries", &qw);
    let stb = upload_starts(gpu, "indexer key ranges", starts);
    let ob = scratch(gpu, "indexer scores", n * 4);
    step.dispatch(
        "indexer_scores",
        &[
            n as u32,
            dim as u32,
            (w.len() / rows) as u32,
            0,
            rows as u32,
        ],
        &[
            (1, Bind::whole(&qb)),
            (2, Bind::whole(kb)),
            (3, Bind::whole(&ob)),
            (5, Bind::whole(&stb)),
        ],
        grid(n, 64),
    );
    Scored {
        _operands: qb,
        starts: stb,
        scores: ob,
    }
}

/// Encode the `topk` dispatch flagging the `k` best of each range `starts[r] .. starts[r+1]`
/// (uploaded as `stb`) of the scores in `sb` into `step`; the flags buffer (one f32 per score).
fn encode_topk(
    gpu: &Gpu,
    step: &mut Step<'_>,
    sb: &wgpu::Buffer,
    stb: &wgpu::Buffer,
    starts: &[usize],
    k: usize,
) -> wgpu::Buffer {
    let rows = starts.len() - 1;
    let n = starts[rows];
    let fb = scratch(gpu, "top-k flags", n * 4);
    step.dispatch(
        "topk",
        &[n as u32, k as u32, 0, 0, rows as u32],
        &[
            (1, Bind::whole(sb)),
            (3, Bind::whole(&fb)),
            (5, Bind::whole(stb)),
        ],
        grid(n, 64),
    );
    fb
}

pub fn topk(gpu: &Gpu, scores: &[f32], k: usize) -> Vec<usize> {
    topk_ranges(gpu, scores, &[0, scores.len()], k)
        .pop()
        .unwrap_or_default()
}

/// Top-k of several score ranges (see `Backend::topk_rows`) in one submission. Panics where the
/// default per-row loop would (a range outside `scores`).
pub fn topk_rows(gpu: &Gpu, scores: &[f32], starts: &[usize], k: usize) -> Vec<Vec<usize>> {
    for (r, s) in starts.windows(2).enumerate() {
        assert!(
            s[0] <= s[1] && s[1] <= scores.len(),
            "topk_rows: range {r} is {}..{} of {} scores",
            s[0],
            s[1],
            scores.len()
        );
    }
    let rows = starts.len().saturating_sub(1);
    if rows == 0 {
        return Vec::new();
    }
    let first = starts[0];
    let rel: Vec<usize> = starts.iter().map(|&s| s - first).collect();
    topk_ranges(gpu, &scores[first..starts[rows]], &rel, k)
}

/// Top-k of each range `starts[r] .. starts[r+1]` of `scores` [starts[rows]] (starts[0] = 0,
/// non-decreasing), indices relative to the range: one dispatch, one read-back (none when no
/// range selects anything).
fn topk_ranges(gpu: &Gpu, scores: &[f32], starts: &[usize], k: usize) -> Vec<Vec<usize>> {
    let rows = starts.len() - 1;
    let longest = starts.windows(2).map(|s| s[1] - s[0]).max().unwrap_or(0);
    // Capping at the longest range changes no range's selection (rank < len ≤ k selects all).
    let k = k.min(longest);
    if k == 0 {
        return vec![Vec::new(); rows];
    }
    let n = starts[rows];
    let sb = upload_f32(gpu, "top-k scores", scores);
    let stb = upload_starts(gpu, "top-k ranges", starts);
    let mut step = gpu.step();
    let fb = encode_topk(gpu, &mut step, &sb, &stb, starts, k);
    let mut flags = vec![0f32; n];
    copy_f32(&step.finish(&[(&fb, n * 4)])[0], &mut flags);
    selected(&flags, starts)
}

/// The flagged indices of each range `starts[r] .. starts[r+1]`, relative to the range.
fn selected(flags: &[f32], starts: &[usize]) -> Vec<Vec<usize>> {
    starts
        .windows(2)
        .map(|s| {
            (s[0]..s[1])
                .filter(|&i| flags[i] != 0.0)
                .map(|i| i - s[0])
                .collect()
        })
        .collect()
}

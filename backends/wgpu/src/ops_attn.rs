//! Host glue of the attention-side and mHC kernels (see attention.wgsl, mhc.wgsl; the indexer's
//! scores and top-k are in ops_indexer.rs). Multi-pass
//! ops (sparse attention, mHC pre) encode all their passes into one command buffer; the
//! intermediate `acc` scratch never leaves the device.

use crate::gpu::{Gpu, Step, copy_f32, grid};
use crate::ops::{scratch, upload_bytes, upload_f32};
use crate::ops_cache::{encode_decode, gather_rows};
use crate::setup::Bind;
use dsv4_core::cache::CacheLayoutError;
use dsv4_kernels::{AttentionRows, HcParams, MhcPre, RowFormat};

/// Largest stream count the Sinkhorn kernel holds (an 8×8 matrix per thread).
const MAX_STREAMS: usize = 8;

/// Bytes of one `acc` value (f64 with SHADER_F64, else f32).
pub(crate) fn acc_bytes(gpu: &Gpu) -> usize {
    if gpu.report().f64_accumulation { 8 } else { 4 }
}

pub fn softmax_pool(gpu: &Gpu, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
    softmax_pool_rows(gpu, a, z, 1, rows, width, out)
}

/// Compressor pooling of several windows (see `Backend::softmax_pool_rows`) in one submission.
/// Panics where the default per-window loop would (operands shorter than the windows need).
pub fn softmax_pool_rows(
    gpu: &Gpu,
    a: &[f32],
    z: &[f32],
    windows: usize,
    rows: usize,
    width: usize,
    out: &mut [f32],
) {
    let n = windows * rows * width;
    assert!(
        a.len() >= n && z.len() >= n && out.len() >= windows * width,
        "softmax_pool_rows: {windows} windows of {rows}×{width} need {n} values and logits and \
         {} outputs, got {}, {} and {}",
        windows * width,
        a.len(),
        z.len(),
        out.len()
    );
    let cols = windows * width;
    if cols == 0 {
        return;
    }
    let ab = upload_f32(gpu, "pool values", &a[..n]);
    let zb = upload_f32(gpu, "pool logits", &z[..n]);
    let ob = scratch(gpu, "pool output", cols * 4);
    let mut step = gpu.step();
    step.dispatch(
        "softmax_pool",
        &[rows as u32, width as u32, windows as u32],
        &[
            (1, Bind::whole(&ab)),
            (2, Bind::whole(&zb)),
            (3, Bind::whole(&ob)),
        ],
        grid(cols, 64),
    );
    copy_f32(&step.finish(&[(&ob, cols * 4)])[0], &mut out[..cols]);
}

/// Row boundaries as the u32 `starts` table of attention.wgsl.
pub(crate) fn upload_starts(gpu: &Gpu, what: &str, starts: &[usize]) -> wgpu::Buffer {
    let starts: Vec<u32> = starts.iter().map(|&k| k as u32).collect();
    upload_bytes(gpu, what, bytemuck::cast_slice(&starts))
}

pub fn sparse_attention(
    gpu: &Gpu,
    q: &[f32],
    dim: usize,
    keys: &[f32],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    if sink.is_empty() || dim == 0 {
        return;
    }
    let n = keys.len() / dim;
    attention_rows(gpu, q, dim, &keys[..n * dim], &[0, n], sink, scale, out);
}

/// Sparse attention of several queries, each over its own key range (see
/// `Backend::sparse_attention_rows`), in one submission. Panics where the default per-row loop
/// would (a key range or a query/output row outside its slice).
#[allow(clippy::too_many_arguments)]
pub fn sparse_attention_rows(
    gpu: &Gpu,
    q: &[f32],
    dim: usize,
    keys: &[f32],
    key_starts: &[usize],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let hd = sink.len() * dim;
    let what = "sparse_attention_rows";
    let Some(r) = check_rows(what, q, out, keys.len(), dim, hd, key_starts) else {
        return;
    };
    let (rows, starts) = (r.starts.len() - 1, r.starts);
    let keys = &keys[r.first * dim..r.last * dim];
    let kb = upload_f32(gpu, "attention keys", keys);
    let mut step = gpu.step();
    let attended = encode_attention(
        gpu,
        &mut step,
        &q[..rows * hd],
        dim,
        &kb,
        &starts,
        sink,
        scale,
    );
    let len = rows * hd;
    copy_f32(
        &step.finish(&[(&attended.out, len * 4)])[0],
        &mut out[..len],
    );
}

/// Sparse attention over keys still in their cache pages (see `Backend::paged_attention_rows`):
/// the used rows' bytes uploaded once, decoded and attended over in one submission, only the
/// output read back. Layout errors are the composition's, found before anything runs; panics
/// where `sparse_attention_rows` would.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_rows(
    gpu: &Gpu,
    q: &[f32],
    fmt: &RowFormat,
    pages: &[&[u8]],
    rows: &[(usize, usize)],
    key_starts: &[usize],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) -> Result<(), CacheLayoutError> {
    let dim = fmt.width();
    let n = rows.len();
    fmt.checked_rows(pages, rows, n * dim)?;
    let hd = sink.len() * dim;
    let what = "paged_attention_rows";
    let Some(r) = check_rows(what, q, out, n * dim, dim, hd, key_starts) else {
        return Ok(());
    };
    let (queries, first, last, starts) = (r.starts.len() - 1, r.first, r.last, r.starts);
    let mut step = gpu.step();
    // Only the rows the queries attend over are uploaded and decoded (none: an empty key buffer).
    let used = gather_rows(gpu, fmt, pages, &rows[first..last], (last - first) * dim)?;
    let decoded = used.map(|g| encode_decode(gpu, &mut step, fmt, &g));
    let empty;
    let kb = match &decoded {
        Some(d) => &d.values,
        None => {
            empty = scratch(gpu, "attention keys", 0);
            &empty
        }
    };
    let len = queries * hd;
    let attended = encode_attention(gpu, &mut step, &q[..len], dim, kb, &starts, sink, scale);
    copy_f32(
        &step.finish(&[(&attended.out, len * 4)])[0],
        &mut out[..len],
    );
    Ok(())
}

/// [`AttentionRows::cut`]; panics where it refuses (where the per-row loop of sparse attention
/// would).
fn check_rows(
    what: &str,
    q: &[f32],
    out: &[f32],
    key_values: usize,
    dim: usize,
    hd: usize,
    key_starts: &[usize],
) -> Option<AttentionRows> {
    AttentionRows::cut(what, q.len(), out.len(), key_values, dim, hd, key_starts)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Attention of `starts.len() - 1` queries (q [rows, heads, dim]), query r over keys
/// `starts[r] .. starts[r+1]` of `keys` [starts[rows], dim] (starts[0] = 0, non-decreasing), into
/// `out[.. rows·heads·dim]`: the three passes in one command buffer, one read-back.
#[allow(clippy::too_many_arguments)]
fn attention_rows(
    gpu: &Gpu,
    q: &[f32],
    dim: usize,
    keys: &[f32],
    starts: &[usize],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let kb = upload_f32(gpu, "attention keys", keys);
    let mut step = gpu.step();
    let attended = encode_attention(gpu, &mut step, q, dim, &kb, starts, sink, scale);
    let len = (starts.len() - 1) * sink.len() * dim;
    copy_f32(
        &step.finish(&[(&attended.out, len * 4)])[0],
        &mut out[..len],
    );
}

/// The buffers of encoded attention passes (kept until their step is submitted); the output,
/// [rows, heads, dim] f32, in `out`.
struct Attended {
    _operands: [wgpu::Buffer; 4],
    out: wgpu::Buffer,
}

/// Upload the operands of [`attention_rows`] but the keys (already on the device in `kb`) and
/// encode its three passes into `step`.
#[allow(clippy::too_many_arguments)]
fn encode_attention(
    gpu: &Gpu,
    step: &mut Step<'_>,
    q: &[f32],
    dim: usize,
    kb: &wgpu::Buffer,
    starts: &[usize],
    sink: &[f32],
    scale: f32,
) -> Attended {
    let heads = sink.len();
    let rows = starts.len() - 1;
    let n = starts[rows];
    let params = [
        n as u32,
        dim as u32,
        heads as u32,
        scale.to_bits(),
        rows as u32,
    ];
    let qb = upload_f32(gpu, "attention queries", q);
    let sinkb = upload_f32(gpu, "attention sinks", sink);
    let stb = upload_starts(gpu, "attention key ranges", starts);
    let sb = scratch(
        gpu,
        "attention weights",
        (heads * n + rows * heads) * acc_bytes(gpu),
    );
    let len = rows * heads * dim;
    let ob = scratch(gpu, "attention output", len * 4);
    let st = Bind::whole(&stb);
    if n > 0 {
        step.dispatch(
            "attn_logits",
            &params,
            &[
                (1, Bind::whole(&qb)),
                (2, Bind::whole(kb)),
                (4, Bind::whole(&sb)),
                (5, st),
            ],
            grid(n * heads, 64),
        );
    }
    step.dispatch(
        "attn_weights",
        &params,
        &[(1, Bind::whole(&sinkb)), (4, Bind::whole(&sb)), (5, st)],
        grid(rows * heads, 64),
    );
    step.dispatch(
        "attn_out",
        &params,
        &[
            (2, Bind::whole(kb)),
            (3, Bind::whole(&ob)),
            (4, Bind::whole(&sb)),
            (5, st),
        ],
        grid(len, 64),
    );
    Attended {
        _operands: [qb, sinkb, stb, sb],
        out: ob,
    }
}

/// `base` followed by `scale`: the coefficient table of mhc.wgsl.
pub(crate) fn coef_table(p: &HcParams<'_>) -> Vec<f32> {
    let mut v = p.base.to_vec();
    v.extend_from_slice(p.scale);
    v
}

/// Whether the mHC kernels take `m` streams.
pub(crate) fn check_streams(m: usize) -> Result<(), String> {
    if (1..=MAX_STREAMS).contains(&m) {
        Ok(())
    } else {
        Err(format!(
            "wgpu mHC: {m} residual streams; the kernels hold 1 to {MAX_STREAMS}"
        ))
    }
}

/// Mixing outputs of mHC pre: (2 + M)·M.
pub(crate) fn mhc_nout(m: usize) -> usize {
    (2 + m) * m
}

pub fn mhc_pre(gpu: &Gpu, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre {
    let (m, d) = (p.m, p.d);
    check_streams(m).unwrap_or_else(|e| panic!("{e}"));
    let nout = mhc_nout(m);
    let mut pre = MhcPre {
        u: vec![0.0; t * d],
        post: vec![0.0; t * m],
        comb: vec![0.0; t * m * m],
    };
    if t == 0 {
        return pre;
    }
    let xb = upload_f32(gpu, "mhc streams", x);
    let fb = upload_f32(gpu, "mhc fn", p.fn_w);
    let cb = upload_f32(gpu, "mhc base/scale", &coef_table(p));
    let mixb = scratch(gpu, "mhc mix", t * nout * acc_bytes(gpu));
    let ub = scratch(gpu, "mhc u", t * d * 4);
    let postb = scratch(gpu, "mhc post", t * m * 4);
    let combb = scratch(gpu, "mhc comb", t * m * m * 4);
    let mut step = gpu.step();
    let w = |b| Bind::whole(b);
    let binds = [
        w(&xb),
        w(&fb),
        w(&cb),
        w(&mixb),
        w(&ub),
        w(&postb),
        w(&combb),
    ];
    enc_mhc_pre(&mut step, p, t, binds);
    let r = step.finish(&[
        (&ub, t * d * 4),
        (&postb, t * m * 4),
        (&combb, t * m * m * 4),
    ]);
    copy_f32(&r[0], &mut pre.u);
    copy_f32(&r[1], &mut pre.post);
    copy_f32(&r[2], &mut pre.comb);
    pre
}

/// Encode mHC pre of `t` tokens: `[x, fn, coef table, mix scratch, u, post, comb]`.
pub(crate) fn enc_mhc_pre(
    step: &mut Step<'_>,
    p: &HcParams<'_>,
    t: usize,
    [x, f, coef, mix, u, post, comb]: [Bind<'_>; 7],
) {
    let (m, d) = (p.m, p.d);
    let nout = mhc_nout(m);
    step.dispatch(
        "mhc_mix",
        &[t as u32, (m * d) as u32, nout as u32, p.norm_eps.to_bits()],
        &[(1, x), (2, f), (4, mix)],
        grid(t * nout, 64),
    );
    let cparams = [
        t as u32,
        m as u32,
        nout as u32,
        p.sinkhorn_iters as u32,
        p.hc_eps.to_bits(),
    ];
    step.dispatch(
        "mhc_coef",
        &cparams,
        &[(2, coef), (3, post), (4, mix), (5, comb)],
        [t.div_ceil(64) as u32, 1, 1],
    );
    let wparams = [
        t as u32,
        m as u32,
        nout as u32,
        d as u32,
        p.hc_eps.to_bits(),
        nout as u32,
    ];
    step.dispatch(
        "mhc_weighted",
        &wparams,
        &[(1, x), (2, coef), (3, u), (4, mix)],
        grid(t * d, 64),
    );
}

pub fn mhc_post(
    gpu: &Gpu,
    x: &[f32],
    y: &[f32],
    pre: &MhcPre,
    m: usize,
    d: usize,
    out: &mut [f32],
) {
    if d == 0 || y.is_empty() {
        return;
    }
    let t = y.len() / d;
    let xb = upload_f32(gpu, "mhc streams", &x[..t * m * d]);
    let yb = upload_f32(gpu, "mhc block output", &y[..t * d]);
    let pb = upload_f32(gpu, "mhc post", &pre.post[..t * m]);
    let cb = upload_f32(gpu, "mhc comb", &pre.comb[..t * m * m]);
    let ob = scratch(gpu, "mhc post output", t * m * d * 4);
    let mut step = gpu.step();
    let w = |b| Bind::whole(b);
    enc_mhc_post(&mut step, t, m, d, [w(&xb), w(&yb), w(&pb), w(&cb), w(&ob)]);
    copy_f32(&step.finish(&[(&ob, t * m * d * 4)])[0], out);
}

/// Encode mHC post of `t` tokens: `[x, y, post, comb, out]`.
pub(crate) fn enc_mhc_post(
    step: &mut Step<'_>,
    t: usize,
    m: usize,
    d: usize,
    [x, y, post, comb, out]: [Bind<'_>; 5],
) {
    step.dispatch(
        "mhc_post",
        &[t as u32, m as u32, d as u32],
        &[(1, x), (2, post), (3, out), (6, y), (7, comb)],
        grid(t * m * d, 64),
    );
}

pub fn hc_head(gpu: &Gpu, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]) {
    check_streams(p.m).unwrap_or_else(|e| panic!("{e}"));
    if t == 0 {
        return;
    }
    let xb = upload_f32(gpu, "head streams", x);
    let fb = upload_f32(gpu, "head fn", p.fn_w);
    let cb = upload_f32(gpu, "head base/scale", &coef_table(p));
    let mixb = scratch(gpu, "head mix", t * p.m * acc_bytes(gpu));
    let ob = scratch(gpu, "head output", t * p.d * 4);
    let mut step = gpu.step();
    let w = |b| Bind::whole(b);
    enc_hc_head(&mut step, p, t, [w(&xb), w(&fb), w(&cb), w(&mixb), w(&ob)]);
    copy_f32(&step.finish(&[(&ob, t * p.d * 4)])[0], out);
}

/// Encode the head's stream merge of `t` tokens: `[x, fn, coef table, mix scratch, out]`.
pub(crate) fn enc_hc_head(
    step: &mut Step<'_>,
    p: &HcParams<'_>,
    t: usize,
    [x, f, coef, mix, out]: [Bind<'_>; 5],
) {
    let (m, d) = (p.m, p.d);
    step.dispatch(
        "mhc_mix",
        &[t as u32, (m * d) as u32, m as u32, p.norm_eps.to_bits()],
        &[(1, x), (2, f), (4, mix)],
        grid(t * m, 64),
    );
    let wparams = [
        t as u32,
        m as u32,
        m as u32,
        d as u32,
        p.hc_eps.to_bits(),
        m as u32,
    ];
    step.dispatch(
        "mhc_weighted",
        &wparams,
        &[(1, x), (2, coef), (3, out), (4, mix)],
        grid(t * d, 64),
    );
}

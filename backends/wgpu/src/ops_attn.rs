//! Host glue of the attention-side and mHC kernels (see attention.wgsl, mhc.wgsl). Multi-pass
//! ops (sparse attention, mHC pre) encode all their passes into one command buffer; the
//! intermediate `acc` scratch never leaves the device.

use crate::gpu::{Gpu, Step, copy_f32, grid};
use crate::ops::{scratch, upload_f32};
use crate::setup::Bind;
use dsv4_kernels::{HcParams, MhcPre};

/// Largest stream count the Sinkhorn kernel holds (an 8×8 matrix per thread).
const MAX_STREAMS: usize = 8;

/// Bytes of one `acc` value (f64 with SHADER_F64, else f32).
pub(crate) fn acc_bytes(gpu: &Gpu) -> usize {
    if gpu.report().f64_accumulation { 8 } else { 4 }
}

pub fn softmax_pool(gpu: &Gpu, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]) {
    if width == 0 {
        return;
    }
    let ab = upload_f32(gpu, "pool values", a);
    let zb = upload_f32(gpu, "pool logits", z);
    let ob = scratch(gpu, "pool output", width * 4);
    let mut step = gpu.step();
    step.dispatch(
        "softmax_pool",
        &[rows as u32, width as u32],
        &[
            (1, Bind::whole(&ab)),
            (2, Bind::whole(&zb)),
            (3, Bind::whole(&ob)),
        ],
        [width.div_ceil(64) as u32, 1, 1],
    );
    copy_f32(&step.finish(&[(&ob, width * 4)])[0], out);
}

pub fn indexer_scores(gpu: &Gpu, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]) {
    let n = keys.len().checked_div(dim).unwrap_or(0);
    if n == 0 {
        return;
    }
    let mut qw = q.to_vec();
    qw.extend_from_slice(w);
    let qb = upload_f32(gpu, "indexer queries", &qw);
    let kb = upload_f32(gpu, "indexer keys", keys);
    let ob = scratch(gpu, "indexer scores", n * 4);
    let mut step = gpu.step();
    step.dispatch(
        "indexer_scores",
        &[n as u32, dim as u32, w.len() as u32],
        &[
            (1, Bind::whole(&qb)),
            (2, Bind::whole(&kb)),
            (3, Bind::whole(&ob)),
        ],
        grid(n, 64),
    );
    copy_f32(&step.finish(&[(&ob, n * 4)])[0], &mut out[..n]);
}

pub fn topk(gpu: &Gpu, scores: &[f32], k: usize) -> Vec<usize> {
    let n = scores.len();
    let k = k.min(n);
    if k == 0 {
        return Vec::new();
    }
    let sb = upload_f32(gpu, "top-k scores", scores);
    let ob = scratch(gpu, "top-k flags", n * 4);
    let mut step = gpu.step();
    step.dispatch(
        "topk",
        &[n as u32, k as u32],
        &[(1, Bind::whole(&sb)), (3, Bind::whole(&ob))],
        grid(n, 64),
    );
    let mut flags = vec![0f32; n];
    copy_f32(&step.finish(&[(&ob, n * 4)])[0], &mut flags);
    flags
        .iter()
        .enumerate()
        .filter(|(_, f)| **f != 0.0)
        .map(|(i, _)| i)
        .collect()
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
    let heads = sink.len();
    if heads == 0 || dim == 0 {
        return;
    }
    let n = keys.len() / dim;
    let params = [n as u32, dim as u32, heads as u32, scale.to_bits()];
    let qb = upload_f32(gpu, "attention queries", q);
    let kb = upload_f32(gpu, "attention keys", keys);
    let sinkb = upload_f32(gpu, "attention sinks", sink);
    let sb = scratch(
        gpu,
        "attention weights",
        (heads * n + heads) * acc_bytes(gpu),
    );
    let ob = scratch(gpu, "attention output", heads * dim * 4);
    let mut step = gpu.step();
    if n > 0 {
        step.dispatch(
            "attn_logits",
            &params,
            &[
                (1, Bind::whole(&qb)),
                (2, Bind::whole(&kb)),
                (4, Bind::whole(&sb)),
            ],
            grid(n * heads, 64),
        );
    }
    step.dispatch(
        "attn_weights",
        &params,
        &[(1, Bind::whole(&sinkb)), (4, Bind::whole(&sb))],
        [heads.div_ceil(64) as u32, 1, 1],
    );
    step.dispatch(
        "attn_out",
        &params,
        &[
            (2, Bind::whole(&kb)),
            (3, Bind::whole(&ob)),
            (4, Bind::whole(&sb)),
        ],
        grid(heads * dim, 64),
    );
    copy_f32(&step.finish(&[(&ob, heads * dim * 4)])[0], out);
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

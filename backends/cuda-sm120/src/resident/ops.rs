//! The resident ops: check the slices against the op's definition (wrong lengths, overlapping
//! operands and out-of-range indices are `KernelError::Device`, never a panic or a bad
//! launch), resolve them to device addresses and call the `launch_*` functions of `ops/`.

use super::{Ctx, op_err, overlap};
use crate::device::{DevPtr, f32_bytes, f64_bytes};
use crate::ops::{linear as lin, mhc, resident as res, rows};
use dsv4_core::IndexKDtype;
use dsv4_kernels::device::{Copy2d, check_len, check_mhc_pre};
use dsv4_kernels::{DevSlice, HcParams, KernelError, Linear, RopeTable};
use std::sync::Arc;

/// Rows of `len` words at width `dim`, as the host op computes them.
fn rows_of(cx: &Ctx<'_>, len: usize, dim: usize) -> Result<usize, KernelError> {
    rows::rows_of(cx.op, len, dim).map_err(|e| op_err(format!("{}: {e}", cx.op)))
}

/// An error unless `out` is disjoint from every input (`same_ok`: or exactly equal to it, for
/// the element-wise kernels, whose threads read their element before writing it).
pub(super) fn disjoint(
    cx: &Ctx<'_>,
    out: DevPtr,
    ins: &[DevPtr],
    same_ok: bool,
) -> Result<(), KernelError> {
    for &i in ins {
        if overlap(out, i) && !(same_ok && out == i) {
            return Err(op_err(format!(
                "{}: the output overlaps an input (the op does not work in place)",
                cx.op
            )));
        }
    }
    Ok(())
}

pub(super) fn copy2d(
    cx: &mut Ctx<'_>,
    src: DevSlice,
    dst: DevSlice,
    shape: Copy2d,
) -> Result<(), KernelError> {
    let (s, d) = (cx.slice("src", src)?, cx.slice("dst", dst)?);
    let Copy2d {
        rows,
        width,
        src_stride,
        src_col,
        dst_stride,
        dst_col,
    } = shape;
    if rows == 0 || width == 0 {
        return Ok(());
    }
    if !shape.fits(src.len, dst.len) {
        return Err(op_err(format!(
            "copy2d: {shape:?} reaches outside a source of {} words or a destination of {}",
            src.len, dst.len
        )));
    }
    if rows > 1 && dst_stride < width {
        return Err(op_err(format!(
            "copy2d: destination rows of {width} words overlap at stride {dst_stride}"
        )));
    }
    // The words each side spans, from its first column.
    let span = |p: DevPtr, stride: usize, col: usize| DevPtr {
        ptr: p.ptr + 4 * col as u64,
        bytes: 4 * res::extent(rows, stride, width),
    };
    let (s, d) = (span(s, src_stride, src_col), span(d, dst_stride, dst_col));
    if overlap(s, d)
        && (src_stride != dst_stride || rows_meet(s.ptr, d.ptr, src_stride, rows, width))
    {
        return Err(op_err(
            "copy2d: the destination overlaps the source".to_string(),
        ));
    }
    let r = res::launch_copy2d(cx.core, s, src_stride, d, dst_stride, rows, width, width);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

/// Whether two blocks of `rows` rows of `width` words, both at row stride `stride`, starting
/// at byte addresses `a` and `b`, share a word.
fn rows_meet(a: u64, b: u64, stride: usize, rows: usize, width: usize) -> bool {
    // Word distance delta = (a - b) / 4; they meet iff |delta + k·stride| < width for some
    // row difference k in [-(rows - 1), rows - 1].
    let delta = (i128::from(a) - i128::from(b)) / 4;
    let (s, w, r) = (stride as i128, width as i128, rows as i128 - 1);
    if s == 0 {
        return delta.abs() < w;
    }
    // |delta + k·stride| is convex in k: its least value over the range is at the clamped
    // floor or ceiling of -delta / stride.
    let k0 = (-delta).div_euclid(s);
    [k0, k0 + 1]
        .into_iter()
        .any(|k| (delta + k.clamp(-r, r) * s).abs() < w)
}

/// gather_rows (`scatter` false) or scatter_add_rows (true).
pub(super) fn by_index(
    cx: &mut Ctx<'_>,
    scatter: bool,
    src: DevSlice,
    idx: &[u32],
    width: usize,
    dst: DevSlice,
) -> Result<(), KernelError> {
    let op = cx.op;
    let (s, d) = (cx.slice("src", src)?, cx.slice("dst", dst)?);
    let (rows_side, table) = if scatter { (src, dst) } else { (dst, src) };
    check_len(
        op,
        if scatter { "src" } else { "dst" },
        rows_side,
        idx.len() * width,
    )?;
    if width == 0 {
        return if table.len == 0 {
            Ok(())
        } else {
            Err(op_err(format!(
                "{op}: rows of width 0 in a slice of {} words",
                table.len
            )))
        };
    }
    if !table.len.is_multiple_of(width) {
        return Err(op_err(format!(
            "{op}: {} words are not rows of width {width}",
            table.len
        )));
    }
    let table_rows = table.len / width;
    if let Some(&bad) = idx.iter().find(|&&i| i as usize >= table_rows) {
        return Err(op_err(format!(
            "{op}: row index {bad} of {table_rows} rows"
        )));
    }
    if scatter {
        let mut sorted = idx.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(op_err(format!("{op}: row index {} given twice", w[0])));
        }
    }
    disjoint(cx, d, &[s], false)?;
    if idx.is_empty() {
        return Ok(());
    }
    let bytes: Vec<u8> = idx.iter().flat_map(|i| i.to_le_bytes()).collect();
    let ip = cx.param(&bytes)?;
    let r = res::launch_rows_by_index(cx.core, scatter, s, ip, d, idx.len(), table_rows, width);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

pub(super) fn add(
    cx: &mut Ctx<'_>,
    a: DevSlice,
    b: DevSlice,
    out: DevSlice,
) -> Result<(), KernelError> {
    check_len("add", "b", b, a.len)?;
    check_len("add", "out", out, a.len)?;
    let (ap, bp, op) = (cx.slice("a", a)?, cx.slice("b", b)?, cx.slice("out", out)?);
    disjoint(cx, op, &[ap, bp], true)?;
    if a.len == 0 {
        return Ok(());
    }
    let r = res::launch_add(cx.core, ap, bp, op, a.len);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

/// Several slices read back with one wait: each is copied (`copy2d`, on the stream) into one
/// arena chunk, `out` [Σ len], which is then downloaded once.
pub(super) fn read_many(
    cx: &mut Ctx<'_>,
    srcs: &[DevSlice],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let ptrs = srcs
        .iter()
        .map(|&s| cx.slice("src", s))
        .collect::<Result<Vec<_>, _>>()?;
    let packed = cx.scratch(out.len() * 4)?;
    let mut at = packed.ptr;
    for (&p, s) in ptrs.iter().zip(srcs) {
        if s.len > 0 {
            let dst = DevPtr {
                ptr: at,
                bytes: s.len * 4,
            };
            let r = res::launch_copy2d(cx.core, p, s.len, dst, s.len, 1, s.len, s.len);
            cx.run(r)?;
            cx.dispatched(1);
        }
        at += 4 * s.len as u64;
    }
    cx.download(packed, out)
}

pub(super) fn router_scores(
    cx: &mut Ctx<'_>,
    logits: DevSlice,
    out: DevSlice,
) -> Result<(), KernelError> {
    check_len("router_scores", "out", out, logits.len)?;
    let (xp, op) = (cx.slice("logits", logits)?, cx.slice("out", out)?);
    disjoint(cx, op, &[xp], true)?;
    if logits.len == 0 {
        return Ok(());
    }
    let r = rows::launch_router_scores(cx.core, xp, op, logits.len);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

pub(super) fn scale(cx: &mut Ctx<'_>, x: DevSlice, s: f64) -> Result<(), KernelError> {
    let xp = cx.slice("x", x)?;
    if x.len == 0 {
        return Ok(());
    }
    let r = res::launch_scale(cx.core, xp, x.len, s);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

pub(super) fn linear(
    cx: &mut Ctx<'_>,
    w: &Linear,
    x: DevSlice,
    rows: usize,
    out: DevSlice,
) -> Result<(), KernelError> {
    let (i, o) = (w.in_dim, w.out_dim);
    check_len("linear", "x", x, rows * i)?;
    check_len("linear", "out", out, rows * o)?;
    let (xp, op) = (cx.slice("x", x)?, cx.slice("out", out)?);
    disjoint(cx, op, &[xp], false)?;
    if rows == 0 || o == 0 {
        return Ok(());
    }
    let rw = resident_weight(cx, w)?;
    let input = padded_input(cx, xp, rows, i, rw.xpitch())?;
    let r = lin::launch(cx.core, cx.core.linear, &rw, input, op, rows, &w.name);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

/// The resident copy of `w` (uploaded on its first use).
pub(super) fn resident_weight(
    cx: &Ctx<'_>,
    w: &Linear,
) -> Result<Arc<lin::ResidentWeight>, KernelError> {
    let rw = cx.core.weights.get(&cx.core.dev, w);
    rw.map_err(|e| op_err(format!("{} {}: {e}", cx.op, w.name)))
}

/// A linear input of `rows` rows of `i` values at `xp` as the kernels read it: itself when
/// its rows already have the weight's pitch `xpitch` and it is 16-byte aligned, else a copy
/// with each row zero-padded to `xpitch` (as the host op pads them).
pub(super) fn padded_input(
    cx: &mut Ctx<'_>,
    xp: DevPtr,
    rows: usize,
    i: usize,
    xpitch: usize,
) -> Result<DevPtr, KernelError> {
    if xpitch == i && xp.ptr.is_multiple_of(16) {
        return Ok(xp);
    }
    let padded = cx.scratch(rows * xpitch * 4)?;
    let r = res::launch_copy2d(cx.core, xp, i, padded, xpitch, rows, i, xpitch);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(padded)
}

pub(super) fn act_quant_fp8(cx: &mut Ctx<'_>, x: DevSlice, dim: usize) -> Result<(), KernelError> {
    let xp = cx.slice("x", x)?;
    if x.len == 0 {
        return Ok(());
    }
    let rows = rows_of(cx, x.len, dim)?;
    let r = rows::launch_act_quant(cx.core, xp, rows, dim);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

pub(super) fn rms_norm(
    cx: &mut Ctx<'_>,
    x: DevSlice,
    weight: Option<&[f32]>,
    dim: usize,
    eps: f32,
    out: DevSlice,
) -> Result<(), KernelError> {
    check_len("rms_norm", "out", out, x.len)?;
    let (xp, op) = (cx.slice("x", x)?, cx.slice("out", out)?);
    disjoint(cx, op, &[xp], false)?;
    if x.len == 0 {
        return Ok(());
    }
    let rows = rows_of(cx, x.len, dim)?;
    let r = rows::check_norm_weight(weight, dim);
    cx.run(r)?;
    let wp = match weight {
        Some(w) => cx.cached(f32_bytes(&w[..dim]))?,
        None => op,
    };
    let r = rows::launch_rms_norm(cx.core, xp, wp, op, rows, dim, eps, weight.is_some());
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

pub(super) fn rope(
    cx: &mut Ctx<'_>,
    x: DevSlice,
    dim: usize,
    positions: &[usize],
    table: &RopeTable,
    inverse: bool,
) -> Result<(), KernelError> {
    let xp = cx.slice("x", x)?;
    if x.len == 0 || table.freqs.is_empty() {
        return Ok(());
    }
    let rows = rows_of(cx, x.len, dim)?;
    let params = rows::rope_params(rows, dim, positions, table);
    let params = params.map_err(|e| op_err(format!("rope: {e}")))?;
    let Some(rows::RopeParams { pos, .. }) = params else {
        return Ok(());
    };
    // θ is the table's own array (cached by its address); the bytes are the ones rope_params
    // encodes (f64, little endian).
    let tp = cx.cached(f64_bytes(&table.freqs))?;
    let pp = cx.param(&pos)?;
    let r = rows::launch_rope(cx.core, xp, pp, tp, rows, dim, table, inverse);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

pub(super) fn hadamard(cx: &mut Ctx<'_>, x: DevSlice, dim: usize) -> Result<(), KernelError> {
    let xp = cx.slice("x", x)?;
    let r = rows::check_hadamard(dim);
    cx.run(r)?;
    if x.len == 0 {
        return Ok(());
    }
    let rows = rows_of(cx, x.len, dim)?;
    let r = rows::launch_hadamard(cx.core, xp, rows, dim);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

pub(super) fn round_index_rows(
    cx: &mut Ctx<'_>,
    dtype: IndexKDtype,
    x: DevSlice,
    dim: usize,
) -> Result<(), KernelError> {
    let xp = cx.slice("x", x)?;
    if x.len == 0 {
        return Ok(());
    }
    let rows = rows_of(cx, x.len, dim)?;
    let r = rows::launch_round_index(cx.core, dtype, xp, rows, dim);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

/// The mixing of `t` tokens at `xp` (`full`: a sublayer) into `out` (and post / comb).
#[allow(clippy::too_many_arguments)]
fn mixing(
    cx: &mut Ctx<'_>,
    p: &HcParams<'_>,
    xp: DevPtr,
    t: usize,
    full: bool,
    out: DevPtr,
    post: DevPtr,
    comb: DevPtr,
) -> Result<(), KernelError> {
    let ops = mhc::hc_operands(p, full).map_err(|e| op_err(format!("{}: {e}", cx.op)))?;
    let fb = cx.cached(f32_bytes(ops.fn_w))?;
    let cb = cx.cached_pair(f32_bytes(ops.base), f32_bytes(ops.scale))?;
    let scratch = cx.scratch(mhc::mixing_scratch_bytes(t, p.m, full))?;
    let r = mhc::launch_mixing(cx.core, p, xp, fb, cb, scratch, t, full, out, post, comb);
    cx.run(r)?;
    cx.dispatched(3);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(super) fn mhc_pre(
    cx: &mut Ctx<'_>,
    p: &HcParams<'_>,
    x: DevSlice,
    t: usize,
    u: DevSlice,
    post: DevSlice,
    comb: DevSlice,
) -> Result<(), KernelError> {
    let (m, d) = (p.m, p.d);
    check_mhc_pre(x, t, (m, d), u, post, comb)?;
    let xp = cx.slice("x", x)?;
    let (up, pp, kp) = (
        cx.slice("u", u)?,
        cx.slice("post", post)?,
        cx.slice("comb", comb)?,
    );
    for o in [up, pp, kp] {
        disjoint(cx, o, &[xp], false)?;
    }
    if overlap(up, pp) || overlap(up, kp) || overlap(pp, kp) {
        return Err(op_err("mhc_pre: u, post and comb overlap".into()));
    }
    let r = mhc::hc_operands(p, true).map(|_| ());
    cx.run(r)?;
    if t == 0 {
        return Ok(());
    }
    mixing(cx, p, xp, t, true, up, pp, kp)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn mhc_post(
    cx: &mut Ctx<'_>,
    x: DevSlice,
    y: DevSlice,
    post: DevSlice,
    comb: DevSlice,
    m: usize,
    d: usize,
    out: DevSlice,
) -> Result<(), KernelError> {
    let ins = [
        cx.slice("x", x)?,
        cx.slice("y", y)?,
        cx.slice("post", post)?,
        cx.slice("comb", comb)?,
    ];
    let op = cx.slice("out", out)?;
    if m == 0 || d == 0 {
        return Ok(());
    }
    if !y.len.is_multiple_of(d) {
        return Err(op_err(format!(
            "mhc_post: y of {} words is not rows of {d}",
            y.len
        )));
    }
    let t = y.len / d;
    check_len("mhc_post", "x", x, t * m * d)?;
    check_len("mhc_post", "post", post, t * m)?;
    check_len("mhc_post", "comb", comb, t * m * m)?;
    check_len("mhc_post", "out", out, t * m * d)?;
    disjoint(cx, op, &ins, false)?;
    if t == 0 {
        return Ok(());
    }
    let [xp, yp, pp, kp] = ins;
    let r = mhc::launch_post(cx.core, xp, yp, pp, kp, op, t, m, d);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

pub(super) fn hc_head(
    cx: &mut Ctx<'_>,
    p: &HcParams<'_>,
    x: DevSlice,
    t: usize,
    out: DevSlice,
) -> Result<(), KernelError> {
    check_len("hc_head", "x", x, t * p.m * p.d)?;
    check_len("hc_head", "out", out, t * p.d)?;
    let (xp, op) = (cx.slice("x", x)?, cx.slice("out", out)?);
    disjoint(cx, op, &[xp], false)?;
    let r = mhc::hc_operands(p, false).map(|_| ());
    cx.run(r)?;
    if t == 0 {
        return Ok(());
    }
    mixing(cx, p, xp, t, false, op, op, op)
}

pub(super) fn swiglu_rows(
    cx: &mut Ctx<'_>,
    g: DevSlice,
    u: DevSlice,
    limit: f32,
    weights: &[f32],
    width: usize,
    out: DevSlice,
) -> Result<(), KernelError> {
    let n = weights.len() * width;
    check_len("swiglu_rows", "g", g, n)?;
    check_len("swiglu_rows", "u", u, n)?;
    check_len("swiglu_rows", "out", out, n)?;
    let (gp, up, op) = (cx.slice("g", g)?, cx.slice("u", u)?, cx.slice("out", out)?);
    disjoint(cx, op, &[gp, up], true)?;
    if n == 0 {
        return Ok(());
    }
    let wp = cx.param(f32_bytes(weights))?;
    let r = rows::launch_swiglu_rows(cx.core, gp, up, op, wp, weights.len(), width, limit);
    cx.run(r)?;
    cx.dispatched(1);
    Ok(())
}

//! mHC ops (`kernels/mhc.cu`): `mhc_pre` as three launches (mixing logits, per-token
//! coefficients with Sinkhorn, the pre-weighted stream sum), `mhc_post` as one, and the head's
//! merge `hc_head` reusing the mixing and weighting kernels. Mixing logits and pre coefficients
//! stay on the device (f64 scratch) between launches.

use crate::device::{DevPtr, blocks_for};
use crate::ops::rows::fits;
use crate::{Core, CudaError, KArg};
use dsv4_kernels::{HcParams, MhcPre};

/// Largest stream count the Sinkhorn kernel holds (`MHC_MAX_M` in mhc.cu).
const MAX_STREAMS: usize = 8;
/// Threads per block of `mhc_mix` (`MHC_MIX_THREADS` in mhc.cu).
const MIX_THREADS: u32 = 256;
/// Mixing outputs per `mhc_mix` block (`MHC_MIX_OUTS` in mhc.cu).
const MIX_OUTS: usize = 8;
/// Tokens per `mhc_mix` block (`MHC_MIX_TOKENS` in mhc.cu).
const MIX_TOKENS: usize = 4;
/// Threads per block of the element-wise kernels.
const THREADS: u32 = 256;
/// Tokens per block of `mhc_coef`.
const COEF_THREADS: u32 = 64;

/// `Err(BadOperands)` unless `what` holds at least `len` values.
pub(super) fn need(what: &str, have: usize, len: usize) -> Result<(), CudaError> {
    if have < len {
        return Err(CudaError::BadOperands(format!(
            "{what}: {have} values, expected {len}"
        )));
    }
    Ok(())
}

/// `v` as a u32 kernel argument, or `Err(BadOperands)` naming `what`.
pub(super) fn u32_arg(what: &str, v: usize) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| CudaError::BadOperands(format!("{what} = {v} exceeds u32")))
}

fn check_streams(m: usize) -> Result<(), CudaError> {
    if !(1..=MAX_STREAMS).contains(&m) {
        return Err(CudaError::BadOperands(format!(
            "mHC with {m} residual streams; the kernels take 1 to {MAX_STREAMS}"
        )));
    }
    Ok(())
}

/// The host operands of an mHC mixing, checked: the `fn` rows [nout, M·D] `mhc_mix` reads and
/// the `base` [nout] and `scale` values whose concatenation is the table `mhc_coef` reads.
pub(crate) struct HcOperands<'a> {
    pub(crate) fn_w: &'a [f32],
    pub(crate) base: &'a [f32],
    pub(crate) scale: &'a [f32],
}

impl HcOperands<'_> {
    /// `base` then `scale`: the coefficient table.
    pub(crate) fn coef(&self) -> Vec<f32> {
        [self.base, self.scale].concat()
    }
}

/// The operands of `p` for a sublayer (`full`: pre, post and comb) or the head.
pub(crate) fn hc_operands<'a>(p: &HcParams<'a>, full: bool) -> Result<HcOperands<'a>, CudaError> {
    check_streams(p.m)?;
    let m = p.m;
    let (nout, scales) = if full { ((2 + m) * m, 3) } else { (m, 1) };
    let len = nout * p.m * p.d;
    need("mHC fn", p.fn_w.len(), len)?;
    need("mHC base", p.base.len(), nout)?;
    need("mHC scale", p.scale.len(), scales)?;
    Ok(HcOperands {
        fn_w: &p.fn_w[..len],
        base: &p.base[..nout],
        scale: &p.scale[..scales],
    })
}

/// The mixing logits [t, nout] (f64) of the t tokens at `x` ([t, M·D]) into `mixb`; `fb`
/// holds the `fn` rows [nout, M·D].
fn mix(
    c: &Core,
    p: &HcParams<'_>,
    x: DevPtr,
    fb: DevPtr,
    mixb: DevPtr,
    t: usize,
    nout: usize,
) -> Result<(), CudaError> {
    let md = p.m * p.d;
    fits("mHC streams", x, t * md)?;
    fits("mHC fn", fb, nout * md)?;
    fits("mHC mixing scratch", mixb, 2 * t * nout)?;
    let dev = &c.dev;
    let args = [
        KArg::Ptr(x),
        KArg::Ptr(fb),
        KArg::Ptr(mixb),
        KArg::U32(u32_arg("M·D", md)?),
        KArg::U32(u32_arg("mixing outputs", nout)?),
        KArg::F32(p.norm_eps),
        KArg::U32(u32_arg("tokens", t)?),
    ];
    let grid = (
        u32_arg("token groups", t.div_ceil(MIX_TOKENS))?,
        u32_arg("mixing output groups", nout.div_ceil(MIX_OUTS))?,
        1,
    );
    // SAFETY: x holds t·M·D floats, fn nout·M·D, mix t·nout doubles, as the kernel reads.
    unsafe { dev.launch("mhc_mix", grid, (MIX_THREADS, 1, 1), &args) }
}

/// `mhc_coef`: pre [t, M] (f64, into `pre`) always; post [t, M] and comb [t, M, M] (f32) when
/// `full`. `cb` holds the coefficient table of [`hc_operands`].
#[allow(clippy::too_many_arguments)]
fn coefs(
    c: &Core,
    p: &HcParams<'_>,
    mixb: DevPtr,
    cb: DevPtr,
    pre: DevPtr,
    t: usize,
    full: bool,
    post: DevPtr,
    comb: DevPtr,
) -> Result<(), CudaError> {
    let m = p.m;
    let (nout, scales) = if full { ((2 + m) * m, 3) } else { (m, 1) };
    fits("mHC coefficients", cb, nout + scales)?;
    if full {
        fits("mHC post", post, t * m)?;
        fits("mHC comb", comb, t * m * m)?;
    }
    fits("mHC pre scratch", pre, 2 * t * m)?;
    let dev = &c.dev;
    let args = [
        KArg::Ptr(mixb),
        KArg::Ptr(cb),
        KArg::Ptr(pre),
        KArg::Ptr(post),
        KArg::Ptr(comb),
        KArg::U32(u32_arg("tokens", t)?),
        KArg::U32(m as u32),
        KArg::U32(nout as u32),
        KArg::U32(u32_arg("Sinkhorn iterations", p.sinkhorn_iters)?),
        KArg::F32(p.hc_eps),
        KArg::U32(u32::from(full)),
    ];
    let grid = (blocks_for(t, COEF_THREADS as usize), 1, 1);
    // SAFETY: mix holds t·nout doubles, coef nout + scales floats; the outputs are sized above
    // (post and comb are only written when full).
    unsafe { dev.launch("mhc_coef", grid, (COEF_THREADS, 1, 1), &args) }
}

/// Σ_j pre_j·x[t, j] for the t tokens at `x`, into `out` [t, D].
fn weighted(
    c: &Core,
    x: DevPtr,
    pre: DevPtr,
    out: DevPtr,
    t: usize,
    m: usize,
    d: usize,
) -> Result<(), CudaError> {
    fits("mHC output", out, t * d)?;
    let args = [
        KArg::Ptr(x),
        KArg::Ptr(pre),
        KArg::Ptr(out),
        KArg::U32(u32_arg("tokens", t)?),
        KArg::U32(m as u32),
        KArg::U32(u32_arg("hidden size", d)?),
    ];
    let grid = (blocks_for(t * d, THREADS as usize), 1, 1);
    // SAFETY: x holds t·M·D floats (checked by mix), pre t·M doubles, out t·D floats.
    unsafe { c.dev.launch("mhc_weighted", grid, (THREADS, 1, 1), &args) }
}

/// Bytes of f64 scratch (mixing logits and pre coefficients) an mHC mixing of `t` tokens over
/// `m` streams needs; `full` = a sublayer.
pub(crate) fn mixing_scratch_bytes(t: usize, m: usize, full: bool) -> usize {
    let nout = if full { (2 + m) * m } else { m };
    8 * t * (nout + m)
}

/// The launches (three) of an mHC mixing of `t` tokens at `x` [t, M, D] (operands from
/// [`hc_operands`] at `fb` and `cb`; `scratch` of [`mixing_scratch_bytes`], 8-byte aligned):
/// u or the head's merge into `out` [t, D], and post / comb when `full`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_mixing(
    c: &Core,
    p: &HcParams<'_>,
    x: DevPtr,
    fb: DevPtr,
    cb: DevPtr,
    scratch: DevPtr,
    t: usize,
    full: bool,
    out: DevPtr,
    post: DevPtr,
    comb: DevPtr,
) -> Result<(), CudaError> {
    check_streams(p.m)?;
    let nout = if full { (2 + p.m) * p.m } else { p.m };
    if scratch.bytes < mixing_scratch_bytes(t, p.m, full) || !scratch.ptr.is_multiple_of(8) {
        return Err(CudaError::BadOperands(format!(
            "mHC: {} bytes of scratch at {:#x} for {t} tokens",
            scratch.bytes, scratch.ptr
        )));
    }
    let mixb = DevPtr {
        ptr: scratch.ptr,
        bytes: 8 * t * nout,
    };
    let pre = DevPtr {
        ptr: scratch.ptr + 8 * (t * nout) as u64,
        bytes: 8 * t * p.m,
    };
    mix(c, p, x, fb, mixb, t, nout)?;
    coefs(c, p, mixb, cb, pre, t, full, post, comb)?;
    weighted(c, x, pre, out, t, p.m, p.d)
}

/// mHC pre step of `t` tokens of streams `x` [t, M, D].
pub fn mhc_pre(c: &Core, p: &HcParams<'_>, x: &[f32], t: usize) -> Result<MhcPre, CudaError> {
    let (m, d) = (p.m, p.d);
    check_streams(m)?;
    let mut out = MhcPre {
        u: vec![0.0; t * d],
        post: vec![0.0; t * m],
        comb: vec![0.0; t * m * m],
    };
    if t == 0 {
        return Ok(out);
    }
    need("mhc_pre streams", x.len(), t * m * d)?;
    let ops = hc_operands(p, true)?;
    let dev = &c.dev;
    let xb = dev.temp_f32(&x[..t * m * d])?;
    let fb = dev.temp_f32(ops.fn_w)?;
    let cb = dev.temp_f32(&ops.coef())?;
    let ub = dev.temp(t * d * 4)?;
    let pb = dev.temp(t * m * 4)?;
    let kb = dev.temp(t * m * m * 4)?;
    let sb = dev.temp(mixing_scratch_bytes(t, m, true))?;
    let (x, s) = (xb.at(), sb.at());
    launch_mixing(
        c,
        p,
        x,
        fb.at(),
        cb.at(),
        s,
        t,
        true,
        ub.at(),
        pb.at(),
        kb.at(),
    )?;
    dev.download_f32(&ub, &mut out.u)?;
    dev.download_f32(&pb, &mut out.post)?;
    dev.download_f32(&kb, &mut out.comb)?;
    Ok(out)
}

/// mhc_post of `t` tokens on device operands: x, out [t, M, D], y [t, D], post [t, M], comb
/// [t, M, M].
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_post(
    c: &Core,
    x: DevPtr,
    y: DevPtr,
    post: DevPtr,
    comb: DevPtr,
    out: DevPtr,
    t: usize,
    m: usize,
    d: usize,
) -> Result<(), CudaError> {
    let n = t * m * d;
    fits("mhc_post streams", x, n)?;
    fits("mhc_post y", y, t * d)?;
    fits("mhc_post post", post, t * m)?;
    fits("mhc_post comb", comb, t * m * m)?;
    fits("mhc_post output", out, n)?;
    let args = [
        KArg::Ptr(x),
        KArg::Ptr(y),
        KArg::Ptr(post),
        KArg::Ptr(comb),
        KArg::Ptr(out),
        KArg::U32(u32_arg("tokens", t)?),
        KArg::U32(u32_arg("streams", m)?),
        KArg::U32(u32_arg("hidden size", d)?),
    ];
    let grid = (blocks_for(n, THREADS as usize), 1, 1);
    // SAFETY: every operand holds what the kernel reads or writes for t tokens (checked above).
    unsafe { c.dev.launch("mhc_post", grid, (THREADS, 1, 1), &args) }
}

/// mHC post step: out[t, k] = post_k·y[t] + Σ_j C_jk·x[t, j]; t = y.len() / D.
pub fn mhc_post(
    c: &Core,
    x: &[f32],
    y: &[f32],
    pre: &MhcPre,
    m: usize,
    d: usize,
    out: &mut [f32],
) -> Result<(), CudaError> {
    if d == 0 || m == 0 {
        return Ok(());
    }
    let t = y.len() / d;
    if t == 0 {
        return Ok(());
    }
    let n = t * m * d;
    need("mhc_post streams", x.len(), n)?;
    need("mhc_post post", pre.post.len(), t * m)?;
    need("mhc_post comb", pre.comb.len(), t * m * m)?;
    need("mhc_post output", out.len(), n)?;
    let dev = &c.dev;
    let xb = dev.temp_f32(&x[..n])?;
    let yb = dev.temp_f32(&y[..t * d])?;
    let pb = dev.temp_f32(&pre.post[..t * m])?;
    let cb = dev.temp_f32(&pre.comb[..t * m * m])?;
    let ob = dev.temp(n * 4)?;
    launch_post(c, xb.at(), yb.at(), pb.at(), cb.at(), ob.at(), t, m, d)?;
    dev.download_f32(&ob, &mut out[..n])
}

/// The head's merge h[t] = Σ_j (σ(m_j·s + b_j) + hc_eps)·x[t, j] into out [t, D].
pub fn hc_head(
    c: &Core,
    p: &HcParams<'_>,
    x: &[f32],
    t: usize,
    out: &mut [f32],
) -> Result<(), CudaError> {
    let (m, d) = (p.m, p.d);
    check_streams(m)?;
    if t == 0 {
        return Ok(());
    }
    need("hc_head streams", x.len(), t * m * d)?;
    need("hc_head output", out.len(), t * d)?;
    let ops = hc_operands(p, false)?;
    let dev = &c.dev;
    let xb = dev.temp_f32(&x[..t * m * d])?;
    let fb = dev.temp_f32(ops.fn_w)?;
    let cb = dev.temp_f32(&ops.coef())?;
    let ob = dev.temp(t * d * 4)?;
    let sb = dev.temp(mixing_scratch_bytes(t, m, false))?;
    let (x, o) = (xb.at(), ob.at());
    launch_mixing(c, p, x, fb.at(), cb.at(), sb.at(), t, false, o, o, o)?;
    dev.download_f32(&ob, &mut out[..t * d])
}

/// Median seconds of `mhc_mix` (a sublayer's (2 + M)·M mixing logits) for `t` tokens of `m`
/// streams of width `d` on device-resident seeded operands, for the device bench.
pub fn time_mix(
    backend: &crate::CudaBackend,
    t: usize,
    m: usize,
    d: usize,
    batches: usize,
) -> Result<f64, CudaError> {
    let c = &backend.core;
    let nout = (2 + m) * m;
    let g = &mut dsv4_core::SplitMix64::new(0x3c1);
    let fn_w = crate::bench::seeded(g, nout * m * d);
    let p = HcParams {
        fn_w: &fn_w,
        base: &[],
        scale: &[],
        m,
        d,
        norm_eps: 1e-6,
        hc_eps: 1e-6,
        sinkhorn_iters: 0,
    };
    let xb = c.dev.upload_f32(&crate::bench::seeded(g, t * m * d))?;
    let fb = c.dev.upload_f32(&fn_w)?;
    let mixb = c.dev.alloc(t * nout * 8)?;
    crate::bench::time_op(&c.dev, batches, || {
        mix(c, &p, xb.at(), fb.at(), mixb.at(), t, nout)
    })
}

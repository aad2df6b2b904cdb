//! mHC ops (`kernels/mhc.cu`): `mhc_pre` as three launches (mixing logits, per-token
//! coefficients with Sinkhorn, the pre-weighted stream sum), `mhc_post` as one, and the head's
//! merge `hc_head` reusing the mixing and weighting kernels. Mixing logits and pre coefficients
//! stay on the device (f64 scratch) between launches.

use crate::device::{DevBuf, blocks_for};
use crate::{Core, CudaError, KArg};
use dsv4_kernels::{HcParams, MhcPre};

/// Largest stream count the Sinkhorn kernel holds (`MHC_MAX_M` in mhc.cu).
const MAX_STREAMS: usize = 8;
/// Threads per block of `mhc_mix` (`MHC_MIX_THREADS` in mhc.cu).
const MIX_THREADS: u32 = 256;
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

/// `base` then `scale`: the coefficient table `mhc_coef` reads.
fn coef_table(p: &HcParams<'_>, nout: usize, scales: usize) -> Result<Vec<f32>, CudaError> {
    need("mHC base", p.base.len(), nout)?;
    need("mHC scale", p.scale.len(), scales)?;
    let mut v = p.base[..nout].to_vec();
    v.extend_from_slice(&p.scale[..scales]);
    Ok(v)
}

/// The mixing logits [t, nout] (f64) of the t tokens in `xb` ([t, M·D]).
fn mix(
    c: &Core,
    p: &HcParams<'_>,
    xb: &DevBuf,
    t: usize,
    nout: usize,
) -> Result<DevBuf, CudaError> {
    let md = p.m * p.d;
    need("mHC fn", p.fn_w.len(), nout * md)?;
    let dev = &c.dev;
    let fb = dev.upload_f32(&p.fn_w[..nout * md])?;
    let mixb = dev.alloc(t * nout * 8)?;
    let args = [
        KArg::Buf(xb),
        KArg::Buf(&fb),
        KArg::Buf(&mixb),
        KArg::U32(u32_arg("M·D", md)?),
        KArg::U32(u32_arg("mixing outputs", nout)?),
        KArg::F32(p.norm_eps),
    ];
    let grid = (u32_arg("tokens × mixing outputs", t * nout)?, 1, 1);
    // SAFETY: x holds t·M·D floats, fn nout·M·D, mix t·nout doubles, as the kernel reads.
    unsafe { dev.launch("mhc_mix", grid, (MIX_THREADS, 1, 1), &args)? };
    Ok(mixb)
}

/// The coefficients of `mhc_coef`: pre [t, M] (f64) always; post and comb when `full`.
struct Coefs {
    pre: DevBuf,
    post: DevBuf,
    comb: DevBuf,
}

fn coefs(
    c: &Core,
    p: &HcParams<'_>,
    mixb: &DevBuf,
    t: usize,
    full: bool,
) -> Result<Coefs, CudaError> {
    let m = p.m;
    let (nout, scales) = if full { ((2 + m) * m, 3) } else { (m, 1) };
    let dev = &c.dev;
    let cb = dev.upload_f32(&coef_table(p, nout, scales)?)?;
    let out = Coefs {
        pre: dev.alloc(t * m * 8)?,
        post: dev.alloc(if full { t * m * 4 } else { 0 })?,
        comb: dev.alloc(if full { t * m * m * 4 } else { 0 })?,
    };
    let args = [
        KArg::Buf(mixb),
        KArg::Buf(&cb),
        KArg::Buf(&out.pre),
        KArg::Buf(&out.post),
        KArg::Buf(&out.comb),
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
    unsafe { dev.launch("mhc_coef", grid, (COEF_THREADS, 1, 1), &args)? };
    Ok(out)
}

/// Σ_j pre_j·x[t, j] for the t tokens of `xb`, as a [t, D] device buffer.
fn weighted(
    c: &Core,
    xb: &DevBuf,
    pre: &DevBuf,
    t: usize,
    m: usize,
    d: usize,
) -> Result<DevBuf, CudaError> {
    let dev = &c.dev;
    let ob = dev.alloc(t * d * 4)?;
    let args = [
        KArg::Buf(xb),
        KArg::Buf(pre),
        KArg::Buf(&ob),
        KArg::U32(u32_arg("tokens", t)?),
        KArg::U32(m as u32),
        KArg::U32(u32_arg("hidden size", d)?),
    ];
    let grid = (blocks_for(t * d, THREADS as usize), 1, 1);
    // SAFETY: x holds t·M·D floats, pre t·M doubles, out t·D floats.
    unsafe { dev.launch("mhc_weighted", grid, (THREADS, 1, 1), &args)? };
    Ok(ob)
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
    let nout = (2 + m) * m;
    let dev = &c.dev;
    let xb = dev.upload_f32(&x[..t * m * d])?;
    let mixb = mix(c, p, &xb, t, nout)?;
    let k = coefs(c, p, &mixb, t, true)?;
    let ub = weighted(c, &xb, &k.pre, t, m, d)?;
    dev.download_f32(&ub, &mut out.u)?;
    dev.download_f32(&k.post, &mut out.post)?;
    dev.download_f32(&k.comb, &mut out.comb)?;
    Ok(out)
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
    let xb = dev.upload_f32(&x[..n])?;
    let yb = dev.upload_f32(&y[..t * d])?;
    let pb = dev.upload_f32(&pre.post[..t * m])?;
    let cb = dev.upload_f32(&pre.comb[..t * m * m])?;
    let ob = dev.alloc(n * 4)?;
    let args = [
        KArg::Buf(&xb),
        KArg::Buf(&yb),
        KArg::Buf(&pb),
        KArg::Buf(&cb),
        KArg::Buf(&ob),
        KArg::U32(u32_arg("tokens", t)?),
        KArg::U32(u32_arg("streams", m)?),
        KArg::U32(u32_arg("hidden size", d)?),
    ];
    let grid = (blocks_for(n, THREADS as usize), 1, 1);
    // SAFETY: every buffer holds what the kernel reads or writes for t tokens.
    unsafe { dev.launch("mhc_post", grid, (THREADS, 1, 1), &args)? };
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
    let xb = c.dev.upload_f32(&x[..t * m * d])?;
    let mixb = mix(c, p, &xb, t, m)?;
    let k = coefs(c, p, &mixb, t, false)?;
    let ob = weighted(c, &xb, &k.pre, t, m, d)?;
    c.dev.download_f32(&ob, &mut out[..t * d])
}

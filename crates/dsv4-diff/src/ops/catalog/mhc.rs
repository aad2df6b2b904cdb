//! Cases of the mHC ops: `mhc_pre` (mixing logits, Sinkhorn, stream merge), `mhc_post` and
//! `hc_head`.

use crate::Op;
use crate::ops::case::{Case, Runner, SizeClass, uniform, uniform_std};
use crate::ops::harness::{GuardedF32, Produced, Ran, call, check_finite, check_len};
use dsv4_core::SplitMix64;
use dsv4_kernels::{HcParams, MhcPre};

/// Owned mHC parameters for `n_out` mixing outputs (24 for a sublayer at M = 4, M for the head).
struct HcOwned {
    fn_w: Vec<f32>,
    base: Vec<f32>,
    scale: Vec<f32>,
    m: usize,
    d: usize,
}

impl HcOwned {
    fn random(rng: &mut SplitMix64, m: usize, d: usize, head: bool) -> Self {
        let n_out = if head { m } else { (2 + m) * m };
        let scales = if head { 1 } else { 3 };
        HcOwned {
            // Mixing logits of roughly unit size: the streams are normalised to unit RMS.
            fn_w: uniform_std(rng, n_out * m * d, 1.0 / ((m * d) as f32).sqrt()),
            base: uniform(rng, n_out, 1.0),
            scale: (0..scales).map(|_| 1.25 + rng.uniform_sym(0.75)).collect(),
            m,
            d,
        }
    }

    fn params(&self) -> HcParams<'_> {
        HcParams {
            fn_w: &self.fn_w,
            base: &self.base,
            scale: &self.scale,
            m: self.m,
            d: self.d,
            norm_eps: 1e-6,
            hc_eps: 1e-6,
            sinkhorn_iters: 20,
        }
    }
}

/// Residual streams [T, M, D] with per-token magnitudes in 10^[-1, 1].
fn streams(rng: &mut SplitMix64, t: usize, m: usize, d: usize) -> Vec<f32> {
    let mut x = uniform(rng, t * m * d, 1.0);
    for tok in x.chunks_mut(m * d) {
        let mag = 10f32.powf(rng.uniform_sym(1.0));
        tok.iter_mut().for_each(|v| *v *= mag);
    }
    x
}

fn shape(t: usize, m: usize, d: usize) -> String {
    format!("t{t}.m{m}.d{d}")
}

fn mhc_pre_case(class: SizeClass, t: usize, m: usize, d: usize) -> Case {
    let n_out = (2 + m) * m;
    let md = (m * d) as f64;
    let cost = (
        t as f64 * (2.0 * n_out as f64 * md + 2.0 * md),
        4.0 * (n_out as f64 * md + t as f64 * (md + d as f64)),
    );
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let p = HcOwned::random(rng, m, d, false);
        let x = streams(rng, t, m, d);
        Ok(Box::new(move |be| {
            let (pre, elapsed) = call(|| be.mhc_pre(&p.params(), &x, t))?;
            let parts = [
                ("u", pre.u, t * d),
                ("post", pre.post, t * m),
                ("comb", pre.comb, t * m * m),
            ];
            let mut out = Vec::new();
            for (name, values, len) in parts {
                check_len(name, len, values.len())?;
                check_finite(name, &values)?;
                out.push((name, values));
            }
            Ok(Ran {
                out: Produced::Parts(out),
                elapsed,
            })
        }))
    });
    Case::new(Op::MhcPre, class, shape(t, m, d), None, cost, build)
}

fn mhc_post_case(class: SizeClass, t: usize, m: usize, d: usize) -> Case {
    let n = (t * m * d) as f64;
    let cost = (n * (2.0 * m as f64 + 2.0), 4.0 * (2.0 * n + (t * d) as f64));
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let x = streams(rng, t, m, d);
        let y = uniform(rng, t * d, 1.0);
        let pre = MhcPre {
            u: vec![0.0; t * d],
            post: uniform(rng, t * m, 1.0).iter().map(|v| 1.0 + v).collect(),
            comb: uniform(rng, t * m * m, 0.25)
                .iter()
                .map(|v| 0.25 + v)
                .collect(),
        };
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(t * m * d);
            let ((), elapsed) = call(|| be.mhc_post(&x, &y, &pre, m, d, out.slice_mut()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    Case::new(Op::MhcPost, class, shape(t, m, d), None, cost, build)
}

fn hc_head_case(class: SizeClass, t: usize, m: usize, d: usize) -> Case {
    let md = (m * d) as f64;
    let cost = (
        t as f64 * (2.0 * m as f64 * md + 2.0 * md),
        4.0 * (m as f64 * md + t as f64 * (md + d as f64)),
    );
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let p = HcOwned::random(rng, m, d, true);
        let x = streams(rng, t, m, d);
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(t * d);
            let ((), elapsed) = call(|| be.hc_head(&p.params(), &x, t, out.slice_mut()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    Case::new(Op::HcHead, class, shape(t, m, d), None, cost, build)
}

/// Every case of this module.
pub(crate) fn cases() -> Vec<Case> {
    use SizeClass::*;
    vec![
        mhc_pre_case(Tiny, 3, 4, 256),
        mhc_pre_case(Odd, 2, 4, 97),
        mhc_pre_case(Odd, 1, 2, 33),
        mhc_pre_case(Flash, 2, 4, 4096),
        mhc_pre_case(Flash, 16, 4, 4096).full_only(),
        mhc_post_case(Tiny, 3, 4, 256),
        mhc_post_case(Odd, 2, 3, 33),
        mhc_post_case(Flash, 2, 4, 4096),
        hc_head_case(Tiny, 3, 4, 256),
        hc_head_case(Odd, 1, 2, 33),
        hc_head_case(Flash, 2, 4, 4096),
    ]
}

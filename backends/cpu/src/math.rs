//! Scalar building blocks written only with exactly rounded operations (so vectorised and scalar
//! code agree bitwise): a single-precision exp, e4m3 rounding, and the macro that compiles a
//! loop body twice (AVX2+FMA and portable).

/// Define `fn $name(isa: Isa, args…)` whose body is compiled once with AVX2+FMA enabled (so the
/// loops auto-vectorise and `mul_add` becomes `vfmadd`) and once for the baseline target. Both
/// copies compute the same bits because the body only uses exactly rounded operations.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name(isa: $crate::exec::Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            fn fast($($arg: $ty),*) $body
            fn portable($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            if isa == $crate::exec::Isa::Avx2Fma {
                // SAFETY: Isa::Avx2Fma is only selected when the CPU has AVX2 and FMA.
                unsafe { fast($($arg),*) };
                return;
            }
            let _ = isa;
            portable($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// e^x in f32 (≤ 2 ulp on the normal range): Cody–Waite reduction by ln 2 and a degree-6
/// polynomial. Returns +0 below −87.3 (including −∞), +∞ above 88.7, NaN for NaN.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.clamp(-87.3, 88.7);
    let n = (xc * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, xc));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let e = (r * r).mul_add(p, r) + 1.0;
    // 2^n with n in [-126, 128): scale in two steps so n = 128 stays finite before the multiply.
    let half = (n * 0.5).floor();
    let s1 = f32::from_bits((((half as i32) + 127) as u32) << 23);
    let s2 = f32::from_bits((((n - half) as i32 + 127) as u32) << 23);
    let y = e * s1 * s2;
    if x.is_nan() {
        x
    } else if x < -87.3 {
        0.0
    } else if x > 88.7 {
        f32::INFINITY
    } else {
        y
    }
}

/// The e4m3 value nearest to `y` (ties to even), saturating at ±448; NaN stays NaN (the codec's
/// NaN of that sign). Equals `e4m3_to_f32(f32_to_e4m3(y))`.
#[inline(always)]
pub(crate) fn round_e4m3(y: f32) -> f32 {
    let a = y.abs();
    // Normal range (≥ 2^-6): keep 3 mantissa bits, ties to even, carries into the exponent.
    let bits = a.to_bits();
    let normal = f32::from_bits((bits + 0x7_FFFF + ((bits >> 20) & 1)) & !0xF_FFFF);
    // Subnormal range: multiples of 2^-9 (ulp of 2^14 in f32), may round up to 2^-6.
    let sub = (a + 16384.0) - 16384.0;
    let r = if a < 0.015_625 { sub } else { normal }.min(448.0);
    if y.is_nan() {
        if y.is_sign_negative() {
            -f32::NAN
        } else {
            f32::NAN
        }
    } else {
        r.copysign(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_core::codec::{e4m3_to_f32, f32_to_e4m3};

    #[test]
    fn exp_is_accurate_and_saturates() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let e = f64::from(x).exp();
            let rel = ((f64::from(exp_f32(x)) - e) / e).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-1000.0), 0.0);
        assert_eq!(exp_f32(1000.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn e4m3_rounding_matches_the_codec() {
        let check = |y: f32| {
            let want = e4m3_to_f32(f32_to_e4m3(y));
            let got = round_e4m3(y);
            assert!(
                got.to_bits() == want.to_bits(),
                "{y:e} ({:#x}): got {got:e}, codec {want:e}",
                y.to_bits()
            );
        };
        // Every code, the midpoints between neighbours, and one ulp either side of them.
        let mut vals: Vec<f32> = (0..=0x7Eu8).map(e4m3_to_f32).collect();
        vals.push(480.0);
        for w in vals.windows(2) {
            let mid = (w[0] + w[1]) / 2.0;
            for v in [w[0], mid, mid.next_down(), mid.next_up()] {
                check(v);
                check(-v);
            }
        }
        // A sweep over the f32 bit patterns (all exponents, strided mantissas).
        let mut b = 0u32;
        while b < 0x7F80_0000 {
            check(f32::from_bits(b));
            check(-f32::from_bits(b));
            b += 0x1_0001;
        }
        for v in [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, 1e-45] {
            check(v);
        }
        assert!(round_e4m3(f32::NAN).is_nan());
    }
}

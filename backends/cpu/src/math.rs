//! Scalar building blocks written only with exactly rounded operations (so vectorised and scalar
//! code agree bitwise): a single-precision exp, e4m3 rounding, and the macro that compiles a
//! loop body twice (AVX2+FMA and portable).

/// Define `fn $name(isa: Isa, args…)` whose body is compiled three times: with AVX-512, with
/// AVX2+FMA (so the loops auto-vectorise and `mul_add` becomes `vfmadd`) and for the baseline
/// target. All copies compute the same bits because the body only uses exactly rounded
/// operations.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name(isa: $crate::exec::Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma,f16c")]
            fn wide($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            fn fast($($arg: $ty),*) $body
            fn portable($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            match isa {
                // SAFETY: an Isa is only selected when the CPU has its features.
                $crate::exec::Isa::Avx512 => return unsafe { wide($($arg),*) },
                // SAFETY: as above.
                $crate::exec::Isa::Avx2Fma => return unsafe { fast($($arg),*) },
                $crate::exec::Isa::Portable => {}
            }
            let _ = isa;
            portable($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// e^x in f64 (within a few ulp): Cody–Waite reduction by ln 2 and the Taylor polynomial of
/// degree 13 on |r| ≤ ln 2 / 2. Returns +0 below −745.2 (including −∞), +∞ above 709.8, NaN for
/// NaN. Only exactly rounded operations, so vectorised and scalar copies agree bitwise.
#[inline(always)]
pub(crate) fn exp_f64(x: f64) -> f64 {
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    // 1/k! for k = 13 down to 2.
    const C: [f64; 12] = [
        1.0 / 6_227_020_800.0,
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
    ];
    let xc = x.clamp(-745.2, 709.8);
    let n = (xc * std::f64::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, xc));
    let mut p = C[0];
    for &c in &C[1..] {
        p = p.mul_add(r, c);
    }
    let e = (p * r).mul_add(r, r) + 1.0;
    // 2^n for n in [-1075, 1024] in two normal factors.
    let half = (n * 0.5).floor();
    let s1 = f64::from_bits(((half as i64 + 1023) as u64) << 52);
    let s2 = f64::from_bits((((n - half) as i64 + 1023) as u64) << 52);
    let y = e * s1 * s2;
    if x.is_nan() {
        x
    } else if x < -745.2 {
        0.0
    } else if x > 709.8 {
        f64::INFINITY
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
        let mut x = -708.0f64; // results below are f64 subnormals
        while x < 709.0 {
            let e = x.exp();
            worst = worst.max(((exp_f64(x) - e) / e).abs());
            x += 0.0137;
        }
        assert!(worst < 1e-15, "worst relative error {worst}");
        for x in [-1e-300, 0.0, 1e-17, 0.5, -0.3465, 0.3466] {
            assert!(
                (exp_f64(x) - x.exp()).abs() <= 2.0 * f64::EPSILON * x.exp(),
                "{x}"
            );
        }
        assert_eq!(exp_f64(0.0), 1.0);
        assert_eq!(exp_f64(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_f64(-1000.0), 0.0);
        assert_eq!(exp_f64(1000.0), f64::INFINITY);
        assert!(exp_f64(f64::NAN).is_nan());
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

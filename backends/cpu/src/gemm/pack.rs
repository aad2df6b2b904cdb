//! Panel decoding: W[n0..n0+8, k0..k0+kb] into a panel of the sum type (row-major, rows past the
//! last output repeat it, columns past kb are zero), each element exactly as `Linear::dequantized`
//! gives it (element × block scale, one f32 multiply) and then widened exactly (f64) or kept (f32). The AVX2 path decodes 8
//! or 16 elements of a row at a time; it falls back to the scalar path for tails and for fp8
//! scale blocks holding a NaN code (`Linear::fp8_nan_blocks`).

use super::{Acc, KB, NB, Panel, View, Weights};
use crate::exec::Isa;
use dsv4_core::codec::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, ue8m0_to_f32};
use dsv4_kernels::linear::{FP8_BLOCK, MXFP4_BLOCK};

/// Fill `panel` with W[min(n0 + j, n − 1), k0 + kk] at [j][kk] for kk < kb, zeros for kb ≤ kk
/// up to the next multiple of 8.
pub(crate) fn pack<T: Acc>(
    isa: Isa,
    w: &Weights<'_>,
    n0: usize,
    k0: usize,
    kb: usize,
    panel: &mut Panel<T>,
) {
    debug_assert!(kb <= KB && n0 < w.n && k0 + kb <= w.k);
    let kb8 = kb.div_ceil(8) * 8;
    for j in 0..NB {
        panel.0[j * KB + kb..j * KB + kb8].fill(T::ZERO);
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2Fma {
        // SAFETY: AVX2, FMA and F16C are present (an Isa is only selected when detected).
        let done = unsafe { avx2::pack(w, n0, k0, kb, panel) };
        if done < kb {
            pack_scalar(w, n0, k0, done, kb, panel);
        }
        return;
    }
    let _ = isa;
    pack_scalar(w, n0, k0, 0, kb, panel);
}

/// The exact f32 value of W[o, i].
#[inline]
pub(crate) fn element(w: &Weights<'_>, o: usize, i: usize) -> f32 {
    let k = w.k;
    match w.view {
        View::F32Bytes(d) => {
            let b = &d[(o * k + i) * 4..(o * k + i) * 4 + 4];
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }
        View::F32Rows(d) => d[o * k + i],
        View::Bf16(d) => bf16_to_f32(u16::from_le_bytes([
            d[(o * k + i) * 2],
            d[(o * k + i) * 2 + 1],
        ])),
        View::Fp8 { data, scale, .. } => {
            let s = scale[(o / FP8_BLOCK) * k.div_ceil(FP8_BLOCK) + i / FP8_BLOCK];
            e4m3_to_f32(data[o * k + i]) * ue8m0_to_f32(s)
        }
        View::Mxfp4 { data, scale } => {
            let byte = data[o * (k / 2) + i / 2];
            let code = if i.is_multiple_of(2) {
                byte & 0xF
            } else {
                byte >> 4
            };
            e2m1_to_f32(code) * ue8m0_to_f32(scale[o * (k / MXFP4_BLOCK) + i / MXFP4_BLOCK])
        }
    }
}

/// Scalar decoding of columns `from..kb` of the panel.
pub(super) fn pack_scalar<T: Acc>(
    w: &Weights<'_>,
    n0: usize,
    k0: usize,
    from: usize,
    kb: usize,
    panel: &mut Panel<T>,
) {
    for j in 0..NB {
        let o = (n0 + j).min(w.n - 1);
        for (kk, v) in panel.0[j * KB + from..j * KB + kb].iter_mut().enumerate() {
            *v = T::from(element(w, o, k0 + from + kk));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode one panel with the detected kernels and with the scalar decoder; the bits of the
    /// valid rows (rows past the last output are never read back), zero padding included. The
    /// f32 panels of both decoders widen to the f64 panel's bits (checked here).
    fn both(w: &Weights<'_>, n0: usize, k0: usize) -> (Vec<u64>, Vec<u64>) {
        let kb = KB.min(w.k - k0);
        let nv = NB.min(w.n - n0);
        let mut fast = Panel([1.0f64; NB * KB]);
        let mut slow = Panel([2.0f64; NB * KB]);
        pack(Isa::detect(), w, n0, k0, kb, &mut fast);
        pack(Isa::Portable, w, n0, k0, kb, &mut slow);
        let valid = |p: &Panel<f64>| -> Vec<f64> {
            p.0.chunks(KB)
                .take(nv)
                .flat_map(|row| row[..kb.div_ceil(8) * 8].iter().copied())
                .collect()
        };
        for isa in [Isa::detect(), Isa::Portable] {
            let mut p32 = Panel([3.0f32; NB * KB]);
            pack(isa, w, n0, k0, kb, &mut p32);
            let mut widened = Panel([4.0f64; NB * KB]);
            for (d, &v) in widened.0.iter_mut().zip(&p32.0) {
                *d = f64::from(v);
            }
            let (a, b) = (valid(&widened), valid(&slow));
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_same(
                &bits(&a),
                &bits(&b),
                &format!("f32 panel ({isa:?}), ({n0}, {k0})"),
            );
        }
        let bits = |p: &Panel<f64>| valid(p).iter().map(|v| v.to_bits()).collect();
        (bits(&fast), bits(&slow))
    }

    fn assert_same(a: &[u64], b: &[u64], what: &str) {
        if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
            panic!("{what}: element {i}: {:#x} vs scalar {:#x}", a[i], b[i]);
        }
    }

    #[test]
    fn every_fp8_code_and_scale_decodes_exactly() {
        let (n, k) = (168, 256);
        // Every byte value appears in every 128-column block; NaN codes only in rows 128..168
        // (the second row block, which the scalar decoder does).
        let data: Vec<u8> = (0..n * k)
            .map(|i| {
                let b = ((i / k) * 7 + i % k) as u8;
                if i / k < 128 && b & 0x7F == 0x7F {
                    0x00
                } else {
                    b
                }
            })
            .collect();
        let nan = dsv4_kernels::linear::e4m3_nan_blocks(&data, n, k);
        assert_eq!(nan, [false, false, true, true]);
        for sc in [0u8, 1, 100, 127, 200, 246, 247, 254, 255] {
            let scale = vec![sc, 127, 127, sc];
            let w = Weights {
                view: View::Fp8 {
                    data: &data,
                    scale: &scale,
                    nan: &nan,
                },
                n,
                k,
            };
            for (n0, k0) in [(0, 0), (0, 128), (8, 128), (120, 0), (128, 0), (160, 128)] {
                let (a, b) = both(&w, n0, k0);
                assert_same(&a, &b, &format!("scale code {sc}, panel ({n0}, {k0})"));
            }
        }
    }

    #[test]
    fn every_mxfp4_byte_bf16_pattern_and_f32_decodes_exactly() {
        let (n, k) = (33, 512);
        let data: Vec<u8> = (0..n * k / 2).map(|i| (i * 13 + i / 256) as u8).collect();
        let scale: Vec<u8> = (0..n * k / 32)
            .map(|i| [0u8, 1, 127, 200, 254, 255][i % 6])
            .collect();
        let w = Weights {
            view: View::Mxfp4 {
                data: &data,
                scale: &scale,
            },
            n,
            k,
        };
        for (n0, k0) in [(0, 0), (0, 384), (24, 256), (32, 128)] {
            let (a, b) = both(&w, n0, k0);
            assert_same(&a, &b, &format!("mxfp4 panel ({n0}, {k0})"));
        }
        // All 65536 bf16 patterns in a 64×1024 weight; odd K exercises the scalar tail.
        let (n, k) = (64, 1027);
        let data: Vec<u8> = (0..n * k).flat_map(|i| (i as u16).to_le_bytes()).collect();
        let w = Weights {
            view: View::Bf16(&data),
            n,
            k,
        };
        for n0 in [0, 8, 56] {
            for k0 in (0..k).step_by(KB) {
                let (a, b) = both(&w, n0, k0);
                assert_same(&a, &b, &format!("bf16 panel ({n0}, {k0})"));
            }
        }
        let vals: Vec<f32> = (0..50 * 77)
            .map(|i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761)))
            .collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f32_bytes = Weights {
            view: View::F32Bytes(&bytes),
            n: 50,
            k: 77,
        };
        for (name, w) in [
            ("f32 bytes", f32_bytes),
            ("f32 rows", Weights::rows(&vals, 50, 77)),
        ] {
            for n0 in [0, 32, 48] {
                let (a, b) = both(&w, n0, 0);
                assert_same(&a, &b, &format!("{name} panel {n0}"));
            }
        }
    }
}

//! Panel packing: decode W[n0..n0+32, k0..k0+kb] into the k-major panel, exactly as
//! `Linear::dequantized` would (element × block scale, one f32 multiply), zeros past the last
//! output. The AVX2 path decodes 8 outputs × 8 inputs at a time and transposes in registers; it
//! falls back to the scalar path for tails and for fp8 panels holding a NaN code.

use super::{KB, NR, Panel, View, Weights};
use crate::exec::Isa;
use dsv4_core::codec::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, ue8m0_to_f32};
use dsv4_kernels::linear::{FP8_BLOCK, MXFP4_BLOCK};

/// Fill `panel` with W[n0 + j, k0 + kk] at [kk][j] for kk < kb, j < NR.
pub(crate) fn pack(isa: Isa, w: &Weights<'_>, n0: usize, k0: usize, kb: usize, panel: &mut Panel) {
    debug_assert!(kb <= KB && n0 < w.n && k0 + kb <= w.k);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        // SAFETY: AVX2 and FMA are present (Isa is only Avx2Fma when detected).
        if unsafe { avx2::pack(w, n0, k0, kb, panel) } {
            return;
        }
    }
    let _ = isa;
    pack_scalar(w, n0, k0, 0, kb, panel);
}

/// Ask the cache for W[n0..n0+32, k0..k0+KB] ahead of its packing (row-major weights are read
/// 32 rows at a time, a pattern the hardware prefetchers follow poorly). A no-op elsewhere.
#[inline]
pub(crate) fn prefetch(w: &Weights<'_>, n0: usize, k0: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        if n0 >= w.n || k0 >= w.k {
            return;
        }
        let kb = KB.min(w.k - k0);
        let touch = |bytes: &[u8], start: usize, len: usize| {
            let end = (start + len).min(bytes.len());
            let mut at = start;
            while at < end {
                // SAFETY: a prefetch of an in-bounds address; it never faults or writes.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(at).cast()) };
                at += 64;
            }
        };
        for o in n0..w.n.min(n0 + NR) {
            match w.view {
                View::F32Bytes(d) => touch(d, (o * w.k + k0) * 4, kb * 4),
                View::Bf16(d) => touch(d, (o * w.k + k0) * 2, kb * 2),
                View::Fp8 { data, .. } => touch(data, o * w.k + k0, kb),
                View::Mxfp4 { data, scale } => {
                    touch(data, o * (w.k / 2) + k0 / 2, kb / 2);
                    touch(scale, o * (w.k / MXFP4_BLOCK) + k0 / MXFP4_BLOCK, 1);
                }
                View::F32Rows(_) | View::F32Cols(_) => return,
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, n0, k0);
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
        View::F32Cols(d) => d[i * w.n + o],
        View::Bf16(d) => bf16_to_f32(u16::from_le_bytes([
            d[(o * k + i) * 2],
            d[(o * k + i) * 2 + 1],
        ])),
        View::Fp8 { data, scale } => {
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

/// Scalar packing of rows kk in `from..kb` of the panel.
fn pack_scalar(w: &Weights<'_>, n0: usize, k0: usize, from: usize, kb: usize, panel: &mut Panel) {
    let nv = NR.min(w.n - n0);
    if let View::F32Cols(d) = w.view {
        for kk in from..kb {
            let src = &d[(k0 + kk) * w.n + n0..(k0 + kk) * w.n + n0 + nv];
            let dst = &mut panel.0[kk * NR..(kk + 1) * NR];
            dst[..nv].copy_from_slice(src);
            dst[nv..].fill(0.0);
        }
        return;
    }
    for kk in from..kb {
        let dst = &mut panel.0[kk * NR..(kk + 1) * NR];
        for (j, v) in dst.iter_mut().enumerate() {
            *v = if j < nv {
                element(w, n0 + j, k0 + kk)
            } else {
                0.0
            };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{FP8_BLOCK, MXFP4_BLOCK, NR, Panel, View, Weights, pack_scalar};
    use dsv4_core::codec::ue8m0_to_f32;
    use std::arch::x86_64::*;
    use std::sync::LazyLock;

    /// ue8m0 code → f32 scale, all 256 codes.
    static UE8M0: LazyLock<[f32; 256]> =
        LazyLock::new(|| std::array::from_fn(|b| ue8m0_to_f32(b as u8)));

    /// Transposed decode of the panel; false when the scalar path must do it (fp8 NaN codes).
    ///
    /// # Safety
    /// AVX2 and FMA are available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn pack(
        w: &Weights<'_>,
        n0: usize,
        k0: usize,
        kb: usize,
        panel: &mut Panel,
    ) -> bool {
        let nv = NR.min(w.n - n0);
        let k = w.k;
        // SAFETY (all arms): AVX2 and FMA are available (caller).
        unsafe {
            match w.view {
                View::F32Cols(_) => {
                    pack_scalar(w, n0, k0, 0, kb, panel);
                    return true;
                }
                View::F32Bytes(d) => transposed(&Plain::<4>(d, k), w.n, n0, k0, kb, panel),
                View::F32Rows(d) => {
                    let bytes = std::slice::from_raw_parts(d.as_ptr().cast::<u8>(), d.len() * 4);
                    transposed(&Plain::<4>(bytes, k), w.n, n0, k0, kb, panel)
                }
                View::Bf16(d) => transposed(&Plain::<2>(d, k), w.n, n0, k0, kb, panel),
                View::Fp8 { data, scale } => {
                    let rows = (0..nv).map(|j| &data[(n0 + j) * k + k0..(n0 + j) * k + k0 + kb]);
                    let code = scale[(n0 / FP8_BLOCK) * k.div_ceil(FP8_BLOCK) + k0 / FP8_BLOCK];
                    // 2^8·scale must stay finite (codes ≤ 246); NaN codes need the scalar decode.
                    if code > 246 || rows.into_iter().any(|r| has_e4m3_nan(r)) {
                        return false;
                    }
                    transposed(
                        &Fp8(data, k, UE8M0[usize::from(code)] * 256.0),
                        w.n,
                        n0,
                        k0,
                        kb,
                        panel,
                    )
                }
                View::Mxfp4 { data, scale } => transposed(
                    &Mxfp4 {
                        data,
                        scale,
                        k,
                        lut: &UE8M0,
                    },
                    w.n,
                    n0,
                    k0,
                    kb,
                    panel,
                ),
            }
        }
        if kb / 8 * 8 < kb {
            pack_scalar(w, n0, k0, kb / 8 * 8, kb, panel);
        }
        true
    }

    /// Decoding of 8 consecutive elements of one row through a cursor at the block start.
    trait Row8 {
        /// Where row `o` starts at column `k0`.
        type Cursor: Copy;
        /// The cursor of row o (< n) at column k0 (a multiple of 8).
        fn cursor(&self, o: usize, k0: usize) -> Self::Cursor;
        /// Elements c..c+8 after the cursor as f32 lanes.
        ///
        /// # Safety
        /// AVX2 and FMA are available; the 8 elements lie inside the row.
        unsafe fn load8(&self, at: Self::Cursor, c: usize) -> __m256;
    }

    /// Uncompressed elements of `B` bytes (f32 or bf16), [n, k].
    struct Plain<'a, const B: usize>(&'a [u8], usize);
    /// e4m3 elements [n, k] with the panel's block scale.
    struct Fp8<'a>(&'a [u8], usize, f32);
    /// Packed e2m1 pairs [n, k/2] with ue8m0 scales [n, k/32].
    struct Mxfp4<'a> {
        data: &'a [u8],
        scale: &'a [u8],
        k: usize,
        lut: &'a [f32; 256],
    }

    impl<const B: usize> Row8 for Plain<'_, B> {
        type Cursor = *const u8;
        #[inline(always)]
        fn cursor(&self, o: usize, k0: usize) -> *const u8 {
            self.0[(o * self.1 + k0) * B..].as_ptr()
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(&self, at: *const u8, c: usize) -> __m256 {
            // SAFETY: 8·B bytes inside the row (caller).
            unsafe {
                if B == 4 {
                    _mm256_loadu_ps(at.add(4 * c).cast())
                } else {
                    let h = _mm_loadu_si128(at.add(2 * c).cast());
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
                }
            }
        }
    }

    impl Row8 for Fp8<'_> {
        type Cursor = *const u8;
        #[inline(always)]
        fn cursor(&self, o: usize, k0: usize) -> *const u8 {
            self.0[o * self.1 + k0..].as_ptr()
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(&self, at: *const u8, c: usize) -> __m256 {
            // SAFETY: 8 bytes inside the row (caller).
            let b = _mm_cvtepu8_epi16(unsafe { _mm_loadl_epi64(at.add(c).cast()) });
            // As binary16, s.eeee.mmm placed at bits 15, 13..10, 9..7 is exactly 2^-8 times
            // the e4m3 value, subnormals included; F16C widens it exactly, without the cost of
            // f32 subnormal arithmetic. Then one multiply by 2^8·scale (exact when finite),
            // the same single rounding as the scalar decode.
            let h = _mm_and_si128(
                _mm_srai_epi16::<1>(_mm_slli_epi16::<8>(b)),
                _mm_set1_epi16(0xBF80_u16 as i16),
            );
            _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(self.2))
        }
    }

    impl Row8 for Mxfp4<'_> {
        type Cursor = (*const u8, *const u8);
        #[inline(always)]
        fn cursor(&self, o: usize, k0: usize) -> (*const u8, *const u8) {
            let half = self.k / 2;
            let per = self.k / MXFP4_BLOCK;
            (
                self.data[o * half + k0 / 2..].as_ptr(),
                self.scale[o * per + k0 / MXFP4_BLOCK..].as_ptr(),
            )
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(&self, at: (*const u8, *const u8), c: usize) -> __m256 {
            // SAFETY: 4 data bytes and their scale inside the row (caller).
            let (word, sc) = unsafe {
                (
                    at.0.add(c / 2).cast::<u32>().read_unaligned(),
                    *at.1.add(c / MXFP4_BLOCK),
                )
            };
            let sc = self.lut[usize::from(sc)];
            let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
            let codes = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_set1_epi32(u32::from_le(word) as i32), shifts),
                _mm256_set1_epi32(0xF),
            );
            let lut = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
            let mag = _mm256_permutevar8x32_ps(lut, codes);
            let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(codes, _mm256_set1_epi32(8)));
            let v = _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
            _mm256_mul_ps(v, _mm256_set1_ps(sc))
        }
    }

    /// Decode rows n0.. (8 at a time) over the first kb/8·8 columns of the block and store them
    /// transposed. Rows past the last output repeat it: their columns are never written out.
    ///
    /// # Safety
    /// AVX2 and FMA are available; k0 + kb ≤ k.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn transposed<D: Row8>(
        d: &D,
        n: usize,
        n0: usize,
        k0: usize,
        kb: usize,
        panel: &mut Panel,
    ) {
        let dst = panel.0.as_mut_ptr();
        for g in 0..NR / 8 {
            let cur: [D::Cursor; 8] =
                std::array::from_fn(|r| d.cursor((n0 + 8 * g + r).min(n - 1), k0));
            for c in (0..kb / 8 * 8).step_by(8) {
                // SAFETY: columns k0+c..k0+c+8 ≤ k (caller).
                let v: [__m256; 8] = std::array::from_fn(|r| unsafe { d.load8(cur[r], c) });
                let t = transpose8(v);
                for (r, tr) in t.iter().enumerate() {
                    // SAFETY: c + r < KB rows of NR floats, 8g + 8 ≤ NR; the panel is aligned.
                    unsafe { _mm256_store_ps(dst.add((c + r) * NR + 8 * g), *tr) };
                }
            }
        }
    }

    /// Whether any byte is an e4m3 NaN code (0x7F or 0xFF).
    ///
    /// # Safety
    /// AVX2 is available.
    #[target_feature(enable = "avx2")]
    unsafe fn has_e4m3_nan(bytes: &[u8]) -> bool {
        let mut chunks = bytes.chunks_exact(32);
        let mask7f = _mm256_set1_epi8(0x7F);
        let mut hit = _mm256_setzero_si256();
        for c in &mut chunks {
            // SAFETY: 32 readable bytes.
            let v = unsafe { _mm256_loadu_si256(c.as_ptr().cast()) };
            hit = _mm256_or_si256(hit, _mm256_cmpeq_epi8(_mm256_and_si256(v, mask7f), mask7f));
        }
        _mm256_testz_si256(hit, hit) == 0 || chunks.remainder().iter().any(|&b| b & 0x7F == 0x7F)
    }

    /// 8×8 transpose: out[c] lane r = v[r] lane c.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn transpose8(v: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(v[0], v[1]);
        let t1 = _mm256_unpackhi_ps(v[0], v[1]);
        let t2 = _mm256_unpacklo_ps(v[2], v[3]);
        let t3 = _mm256_unpackhi_ps(v[2], v[3]);
        let t4 = _mm256_unpacklo_ps(v[4], v[5]);
        let t5 = _mm256_unpackhi_ps(v[4], v[5]);
        let t6 = _mm256_unpacklo_ps(v[6], v[7]);
        let t7 = _mm256_unpackhi_ps(v[6], v[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pack one 32×128 panel with the detected kernels and with the scalar decoder; the bits of
    /// the valid columns (columns past the last output are never read back).
    fn both(w: &Weights<'_>, n0: usize, k0: usize) -> (Vec<u32>, Vec<u32>) {
        let kb = KB.min(w.k - k0);
        let nv = NR.min(w.n - n0);
        let mut fast = Panel([1.0; KB * NR]);
        let mut slow = Panel([2.0; KB * NR]);
        pack(Isa::detect(), w, n0, k0, kb, &mut fast);
        pack_scalar(w, n0, k0, 0, kb, &mut slow);
        let bits = |p: &Panel| {
            p.0[..kb * NR]
                .chunks(NR)
                .flat_map(|row| row[..nv].iter().map(|v| v.to_bits()))
                .collect()
        };
        (bits(&fast), bits(&slow))
    }

    fn assert_same(a: &[u32], b: &[u32], what: &str) {
        if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
            panic!("{what}: element {i}: {:#x} vs scalar {:#x}", a[i], b[i]);
        }
    }

    #[test]
    fn every_fp8_code_and_scale_decodes_exactly() {
        let (n, k) = (40, 256);
        // Every byte value appears in every 128-column block; NaN codes only in rows 32..40.
        let data: Vec<u8> = (0..n * k)
            .map(|i| {
                let b = ((i / k) * 7 + i % k) as u8;
                if i / k < 32 && b & 0x7F == 0x7F {
                    0x00
                } else {
                    b
                }
            })
            .collect();
        for sc in [0u8, 1, 100, 127, 200, 246, 247, 254, 255] {
            let scale = vec![sc, 127, 127, sc];
            let w = Weights {
                view: View::Fp8 {
                    data: &data,
                    scale: &scale,
                },
                n,
                k,
            };
            for (n0, k0) in [(0, 0), (0, 128), (32, 0), (32, 128)] {
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
        for (n0, k0) in [(0, 0), (0, 384), (32, 128)] {
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
        for n0 in [0, 32] {
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
            ("f32 columns", Weights::cols(&vals, 50, 77)),
        ] {
            for n0 in [0, 32] {
                let (a, b) = both(&w, n0, 0);
                assert_same(&a, &b, &format!("{name} panel {n0}"));
            }
        }
    }
}

//! AVX2 panel packing. f32 and bf16 rows are decoded 8 elements at a time and transposed 8×8 in
//! f32. e4m3 and e2m1 rows are first turned into exact binary16 patterns (16 elements of a row
//! per register), transposed 8×8 per 128-bit lane in 16-bit form (half the shuffles), then
//! widened by F16C and multiplied by their ue8m0 scale: one rounding, as the scalar decode.

use super::{FP8_BLOCK, KB, MXFP4_BLOCK, NR, Panel, View, Weights, pack_scalar};
use dsv4_core::codec::ue8m0_to_f32;
use std::arch::x86_64::*;
use std::sync::LazyLock;

/// ue8m0 code → f32 scale, all 256 codes.
static UE8M0: LazyLock<[f32; 256]> =
    LazyLock::new(|| std::array::from_fn(|b| ue8m0_to_f32(b as u8)));

/// Transposed decode of the panel; false when the scalar path must do it (fp8 NaN codes or a
/// scale too large to fold 2^8 into).
///
/// # Safety
/// AVX2, FMA and F16C are available.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn pack(w: &Weights<'_>, n0: usize, k0: usize, kb: usize, panel: &mut Panel) -> bool {
    debug_assert!(kb <= KB);
    let nv = NR.min(w.n - n0);
    let k = w.k;
    // SAFETY (the calls below): AVX2, FMA and F16C are available (caller); every panel row and
    // column read lies inside W (k0 + kb ≤ k, rows clamped to n − 1).
    let done = unsafe {
        match w.view {
            View::F32Cols(_) => 0,
            View::F32Bytes(d) => f32_rows(&Plain::<4>(d, k), w.n, n0, k0, kb, panel),
            View::F32Rows(d) => {
                // Reading f32 values as their bytes.
                let bytes = std::slice::from_raw_parts(d.as_ptr().cast::<u8>(), d.len() * 4);
                f32_rows(&Plain::<4>(bytes, k), w.n, n0, k0, kb, panel)
            }
            View::Bf16(d) => f32_rows(&Plain::<2>(d, k), w.n, n0, k0, kb, panel),
            View::Fp8 { data, scale } => {
                let code = scale[(n0 / FP8_BLOCK) * k.div_ceil(FP8_BLOCK) + k0 / FP8_BLOCK];
                // 2^8·scale must stay finite (codes ≤ 246); NaN codes need the scalar decode.
                if code > 246 {
                    return false;
                }
                for j in 0..nv {
                    if has_e4m3_nan(&data[(n0 + j) * k + k0..(n0 + j) * k + k0 + kb]) {
                        return false;
                    }
                }
                let s = _mm256_set1_ps(UE8M0[usize::from(code)] * 256.0);
                half_rows(&Fp8(data, k), w.n, n0, k0, kb, panel, |_, _| s)
            }
            View::Mxfp4 { data, scale } => {
                let lut: &[f32; 256] = &UE8M0;
                let per_row = k / MXFP4_BLOCK;
                let rows = |g: usize| -> [usize; 8] {
                    std::array::from_fn(|r| (n0 + 8 * g + r).min(w.n - 1))
                };
                half_rows(&Mxfp4(data, k), w.n, n0, k0, kb, panel, |g, c| {
                    let b = (k0 + c) / MXFP4_BLOCK;
                    let s = rows(g).map(|o| lut[usize::from(scale[o * per_row + b])]);
                    _mm256_loadu_ps(s.as_ptr())
                })
            }
        }
    };
    if done < kb {
        pack_scalar(w, n0, k0, done, kb, panel);
    }
    true
}

/// Rows decoded straight to f32, 8 elements at a time.
trait Row8 {
    /// Where row `o` starts at column `k0`.
    type Cursor: Copy;
    /// The cursor of row o (< n) at column k0.
    fn cursor(&self, o: usize, k0: usize) -> Self::Cursor;
    /// Elements c..c+8 after the cursor as f32 lanes.
    ///
    /// # Safety
    /// AVX2 is available; the 8 elements lie inside the row.
    unsafe fn load8(&self, at: Self::Cursor, c: usize) -> __m256;
}

/// Rows decoded to binary16 patterns, 16 elements at a time.
trait Row16 {
    /// The cursor of row o (< n) at column k0.
    fn cursor(&self, o: usize, k0: usize) -> *const u8;
    /// Elements c..c+16 after the cursor as binary16 bits (lane 0: c..c+8, lane 1: c+8..c+16).
    ///
    /// # Safety
    /// AVX2 is available; the 16 elements lie inside the row.
    unsafe fn load16(&self, at: *const u8, c: usize) -> __m256i;
}

/// Uncompressed elements of `B` bytes (f32 or bf16), [n, k].
struct Plain<'a, const B: usize>(&'a [u8], usize);
/// e4m3 elements [n, k].
struct Fp8<'a>(&'a [u8], usize);
/// Packed e2m1 pairs [n, k/2].
struct Mxfp4<'a>(&'a [u8], usize);

impl<const B: usize> Row8 for Plain<'_, B> {
    type Cursor = *const u8;
    #[inline(always)]
    fn cursor(&self, o: usize, k0: usize) -> *const u8 {
        self.0[(o * self.1 + k0) * B..].as_ptr()
    }
    #[inline]
    #[target_feature(enable = "avx2")]
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

impl Row16 for Fp8<'_> {
    #[inline(always)]
    fn cursor(&self, o: usize, k0: usize) -> *const u8 {
        self.0[o * self.1 + k0..].as_ptr()
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load16(&self, at: *const u8, c: usize) -> __m256i {
        // SAFETY: 16 bytes inside the row (caller).
        let b = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(at.add(c).cast()) });
        // s.eeee.mmm placed at bits 15, 13..10, 9..7 is a binary16 exactly 2^-8 times the e4m3
        // value, subnormals included (the 2^8 is folded into the scale).
        let t = _mm256_srai_epi16::<1>(_mm256_slli_epi16::<8>(b));
        _mm256_and_si256(t, _mm256_set1_epi16(0xBF80_u16 as i16))
    }
}

impl Row16 for Mxfp4<'_> {
    #[inline(always)]
    fn cursor(&self, o: usize, k0: usize) -> *const u8 {
        self.0[o * (self.1 / 2) + k0 / 2..].as_ptr()
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load16(&self, at: *const u8, c: usize) -> __m256i {
        // SAFETY: 8 bytes (16 codes) inside the row (caller).
        let x = unsafe { _mm_loadl_epi64(at.add(c / 2).cast()) };
        let low = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(x, low);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), low);
        // Low nibble first: codes in element order.
        let codes = _mm_unpacklo_epi8(lo, hi);
        // The high byte of each e2m1 value as binary16 (low bytes are all zero), sign included.
        let table = _mm_setr_epi8(
            0x00,
            0x38,
            0x3C,
            0x3E,
            0x40,
            0x42,
            0x44,
            0x46, //
            0x80_u8 as i8,
            0xB8_u8 as i8,
            0xBC_u8 as i8,
            0xBE_u8 as i8, //
            0xC0_u8 as i8,
            0xC2_u8 as i8,
            0xC4_u8 as i8,
            0xC6_u8 as i8,
        );
        let high = _mm_shuffle_epi8(table, codes);
        _mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(high))
    }
}

/// Decode rows n0.. (8 at a time) over the first kb/8·8 columns and store them transposed; the
/// number of columns done. Rows past the last output repeat it: their columns are never read.
///
/// # Safety
/// AVX2 is available; k0 + kb ≤ k.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn f32_rows<D: Row8>(
    d: &D,
    n: usize,
    n0: usize,
    k0: usize,
    kb: usize,
    panel: &mut Panel,
) -> usize {
    let dst = panel.0.as_mut_ptr();
    let done = kb / 8 * 8;
    for g in 0..NR / 8 {
        let cur: [D::Cursor; 8] =
            std::array::from_fn(|r| d.cursor((n0 + 8 * g + r).min(n - 1), k0));
        for c in (0..done).step_by(8) {
            // SAFETY: columns k0+c..k0+c+8 ≤ k (caller).
            let v: [__m256; 8] = std::array::from_fn(|r| unsafe { d.load8(cur[r], c) });
            for (r, tr) in transpose8(v).iter().enumerate() {
                // SAFETY: c + r < KB rows of NR floats, 8g + 8 ≤ NR; the panel is aligned.
                unsafe { _mm256_store_ps(dst.add((c + r) * NR + 8 * g), *tr) };
            }
        }
    }
    done
}

/// Decode rows n0.. (8 at a time) to binary16 over the first kb/16·16 columns, transpose, widen,
/// multiply by `scale(group, column)` (the 8 rows' scales of that column) and store; the number
/// of columns done.
///
/// # Safety
/// AVX2 and F16C are available; k0 + kb ≤ k; `scale` may only be asked for columns at
/// multiples of 16.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn half_rows<D: Row16>(
    d: &D,
    n: usize,
    n0: usize,
    k0: usize,
    kb: usize,
    panel: &mut Panel,
    scale: impl Fn(usize, usize) -> __m256,
) -> usize {
    let dst = panel.0.as_mut_ptr();
    let done = kb / 16 * 16;
    for g in 0..NR / 8 {
        let cur: [*const u8; 8] =
            std::array::from_fn(|r| d.cursor((n0 + 8 * g + r).min(n - 1), k0));
        for c in (0..done).step_by(16) {
            // SAFETY: columns k0+c..k0+c+16 ≤ k (caller).
            let v: [__m256i; 8] = std::array::from_fn(|r| unsafe { d.load16(cur[r], c) });
            let s = scale(g, c);
            for (j, t) in transpose8x16(v).iter().enumerate() {
                let lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(*t)), s);
                let hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256::<1>(*t)), s);
                // SAFETY: c + 8 + j < KB rows of NR floats, 8g + 8 ≤ NR; the panel is aligned.
                unsafe {
                    _mm256_store_ps(dst.add((c + j) * NR + 8 * g), lo);
                    _mm256_store_ps(dst.add((c + 8 + j) * NR + 8 * g), hi);
                }
            }
        }
    }
    done
}

/// Whether any byte is an e4m3 NaN code (0x7F or 0xFF).
#[target_feature(enable = "avx2")]
fn has_e4m3_nan(bytes: &[u8]) -> bool {
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

/// 8×8 transpose of 16-bit elements within each 128-bit lane: out[j] lane h holds element j of
/// every input's lane h (so out[j] = column j in lane 0 and column 8 + j in lane 1).
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8x16(v: [__m256i; 8]) -> [__m256i; 8] {
    let a0 = _mm256_unpacklo_epi16(v[0], v[1]);
    let a1 = _mm256_unpackhi_epi16(v[0], v[1]);
    let a2 = _mm256_unpacklo_epi16(v[2], v[3]);
    let a3 = _mm256_unpackhi_epi16(v[2], v[3]);
    let a4 = _mm256_unpacklo_epi16(v[4], v[5]);
    let a5 = _mm256_unpackhi_epi16(v[4], v[5]);
    let a6 = _mm256_unpacklo_epi16(v[6], v[7]);
    let a7 = _mm256_unpackhi_epi16(v[6], v[7]);
    let b0 = _mm256_unpacklo_epi32(a0, a2);
    let b1 = _mm256_unpackhi_epi32(a0, a2);
    let b2 = _mm256_unpacklo_epi32(a1, a3);
    let b3 = _mm256_unpackhi_epi32(a1, a3);
    let b4 = _mm256_unpacklo_epi32(a4, a6);
    let b5 = _mm256_unpackhi_epi32(a4, a6);
    let b6 = _mm256_unpacklo_epi32(a5, a7);
    let b7 = _mm256_unpackhi_epi32(a5, a7);
    [
        _mm256_unpacklo_epi64(b0, b4),
        _mm256_unpackhi_epi64(b0, b4),
        _mm256_unpacklo_epi64(b1, b5),
        _mm256_unpackhi_epi64(b1, b5),
        _mm256_unpacklo_epi64(b2, b6),
        _mm256_unpackhi_epi64(b2, b6),
        _mm256_unpacklo_epi64(b3, b7),
        _mm256_unpackhi_epi64(b3, b7),
    ]
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

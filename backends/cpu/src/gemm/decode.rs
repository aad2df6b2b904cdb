//! x86 decoding of weight rows, 16 elements at a time, to f32 values exactly equal to
//! `Linear::dequantized` (element × block scale, one f32 multiply). e4m3 elements go through
//! exact binary16 patterns widened by F16C, so f32 subnormal arithmetic never occurs; e2m1
//! elements (all normal or zero) are looked up as f32 and multiplied by their scale, as the
//! reference does (AVX-512 still takes them through binary16).

use super::{FP8_BLOCK, MXFP4_BLOCK, NB};
use dsv4_core::codec::ue8m0_to_f32;
use std::arch::x86_64::*;
use std::sync::LazyLock;

/// ue8m0 code → f32 scale, all 256 codes.
static UE8M0: LazyLock<[f32; 256]> =
    LazyLock::new(|| std::array::from_fn(|b| ue8m0_to_f32(b as u8)));

/// Where one weight row's block starts: its elements, and for MXFP4 its scales.
#[derive(Clone, Copy)]
pub(super) struct Cursor {
    data: *const u8,
    scale: *const u8,
}

/// A vector decoder of one weight format, 16 elements of a row at a time.
pub(super) trait Dec16: Copy {
    /// The cursor of row o (< n) at column k0 (a multiple of 16).
    fn cursor(&self, o: usize, k0: usize) -> Cursor;

    /// Elements c..c+16 after the cursor (c a multiple of 16) as f32 values.
    ///
    /// # Safety
    /// AVX2 and F16C are available; the 16 elements lie inside the row.
    unsafe fn load16(&self, at: Cursor, c: usize) -> (__m256, __m256);

    /// [`Dec16::load16`] as one 16-lane vector (the same values).
    ///
    /// # Safety
    /// AVX-512F, AVX2 and F16C are available; the 16 elements lie inside the row.
    unsafe fn load16z(&self, at: Cursor, c: usize) -> __m512;
}

/// f32 (B = 4) or bf16 (B = 2) elements, [n, k].
#[derive(Clone, Copy)]
pub(super) struct Plain<'a, const B: usize>(pub &'a [u8], pub usize);

/// e4m3 elements [n, k] and 2^8·scale of the block's two 128-column halves.
#[derive(Clone, Copy)]
pub(super) struct Fp8<'a>(&'a [u8], usize, [f32; 2]);

/// e2m1 pairs [n, k/2], ue8m0 scales [n, k/32] and the scale table.
#[derive(Clone, Copy)]
pub(super) struct Mxfp4<'a>(pub &'a [u8], pub &'a [u8], pub usize, pub &'a [f32; 256]);

impl<const B: usize> Dec16 for Plain<'_, B> {
    #[inline(always)]
    fn cursor(&self, o: usize, k0: usize) -> Cursor {
        let data = self.0[(o * self.1 + k0) * B..].as_ptr();
        Cursor { data, scale: data }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load16(&self, at: Cursor, c: usize) -> (__m256, __m256) {
        // SAFETY: 16·B bytes inside the row (caller).
        unsafe {
            let p = at.data.add(c * B);
            if B == 4 {
                (_mm256_loadu_ps(p.cast()), _mm256_loadu_ps(p.add(32).cast()))
            } else {
                let widen = |h: __m128i| {
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
                };
                (
                    widen(_mm_loadu_si128(p.cast())),
                    widen(_mm_loadu_si128(p.add(16).cast())),
                )
            }
        }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16z(&self, at: Cursor, c: usize) -> __m512 {
        // SAFETY: 16·B bytes inside the row (caller).
        unsafe {
            let p = at.data.add(c * B);
            if B == 4 {
                _mm512_loadu_ps(p.cast())
            } else {
                let h = _mm256_loadu_si256(p.cast());
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
        }
    }
}

impl Dec16 for Fp8<'_> {
    #[inline(always)]
    fn cursor(&self, o: usize, k0: usize) -> Cursor {
        let data = self.0[o * self.1 + k0..].as_ptr();
        Cursor { data, scale: data }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load16(&self, at: Cursor, c: usize) -> (__m256, __m256) {
        // SAFETY: 16 bytes inside the row (caller).
        let h = unsafe { fp8_16(at.data.add(c)) };
        halves(h, _mm256_set1_ps(self.2[c / FP8_BLOCK]))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16z(&self, at: Cursor, c: usize) -> __m512 {
        // SAFETY: 16 bytes inside the row (caller).
        let h = unsafe { fp8_16(at.data.add(c)) };
        _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(self.2[c / FP8_BLOCK]))
    }
}

impl Dec16 for Mxfp4<'_> {
    #[inline(always)]
    fn cursor(&self, o: usize, k0: usize) -> Cursor {
        let k = self.2;
        Cursor {
            data: self.0[o * (k / 2) + k0 / 2..].as_ptr(),
            scale: self.1[o * (k / MXFP4_BLOCK) + k0 / MXFP4_BLOCK..].as_ptr(),
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load16(&self, at: Cursor, c: usize) -> (__m256, __m256) {
        // SAFETY: 8 bytes and one scale inside the row (caller).
        let (lo, hi, sc) = unsafe {
            let p = at.data.add(c / 2);
            (
                p.cast::<i32>().read_unaligned(),
                p.add(4).cast::<i32>().read_unaligned(),
                *at.scale.add(c / MXFP4_BLOCK),
            )
        };
        let s = _mm256_set1_ps(self.3[usize::from(sc)]);
        (e2m1_8(lo, s), e2m1_8(hi, s))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16z(&self, at: Cursor, c: usize) -> __m512 {
        // SAFETY: 8 bytes and one scale inside the row (caller).
        let (h, sc) = unsafe { (e2m1_16(at.data.add(c / 2)), *at.scale.add(c / MXFP4_BLOCK)) };
        _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(self.3[usize::from(sc)]))
    }
}

/// Run `$body` with `$d` bound to the vector decoder of W's block at ($n0, $k0) of width $kb,
/// or evaluate `$none` when the scalar decoder must do it (fp8 NaN codes, or a scale too large
/// to fold 2^8 into).
macro_rules! with_decoder {
    ($w:expr, $n0:expr, $k0:expr, $kb:expr, |$d:ident| $body:expr, $none:expr) => {{
        use $crate::gemm::decode::{Fp8, Mxfp4, Plain, scales};
        let (w, n0, k0, kb) = ($w, $n0, $k0, $kb);
        let k = w.k;
        match w.view {
            $crate::gemm::View::F32Bytes(data) => {
                let $d = Plain::<4>(data, k);
                $body
            }
            $crate::gemm::View::F32Rows(data) => {
                // SAFETY: reading initialised f32 values as their bytes.
                let bytes = unsafe {
                    std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len() * 4)
                };
                let $d = Plain::<4>(bytes, k);
                $body
            }
            $crate::gemm::View::Bf16(data) => {
                let $d = Plain::<2>(data, k);
                $body
            }
            $crate::gemm::View::Fp8 { data, scale, nan } => {
                match Fp8::new(data, scale, nan, k, n0, k0, kb) {
                    Some($d) => $body,
                    None => $none,
                }
            }
            $crate::gemm::View::Mxfp4 { data, scale } => {
                let $d = Mxfp4(data, scale, k, scales());
                $body
            }
        }
    }};
}
pub(super) use with_decoder;

/// The ue8m0 scale table.
pub(super) fn scales() -> &'static [f32; 256] {
    &UE8M0
}

impl<'a> Fp8<'a> {
    /// The decoder of the block at (n0, k0) of width kb (≤ 2 scale blocks, k0 a multiple of
    /// 128), or None when a scale block it spans holds NaN codes (`nan`, one flag per block)
    /// or has a scale code above 246.
    pub fn new(
        data: &'a [u8],
        scale: &[u8],
        nan: &[bool],
        k: usize,
        n0: usize,
        k0: usize,
        kb: usize,
    ) -> Option<Self> {
        debug_assert!(k0.is_multiple_of(FP8_BLOCK) && kb <= 2 * FP8_BLOCK);
        debug_assert!(
            n0 % FP8_BLOCK + NB <= FP8_BLOCK,
            "a panel spans one row block"
        );
        let row = (n0 / FP8_BLOCK) * k.div_ceil(FP8_BLOCK);
        let blocks = [
            row + k0 / FP8_BLOCK,
            row + ((k0 + kb - 1) / FP8_BLOCK).min(k0 / FP8_BLOCK + 1),
        ];
        let codes = blocks.map(|b| scale[b]);
        if codes.iter().any(|&c| c > 246) || blocks.iter().any(|&b| nan[b]) {
            return None;
        }
        Some(Fp8(data, k, codes.map(|c| UE8M0[usize::from(c)] * 256.0)))
    }
}

/// 16 binary16 patterns widened to f32 and multiplied by `s`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn halves(h: __m256i, s: __m256) -> (__m256, __m256) {
    (
        _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s),
        _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)), s),
    )
}

/// 16 e4m3 bytes as binary16 bits exactly 2^-8 times their values, subnormals included
/// (s.eeee.mmm placed at bits 15, 13..10, 9..7; the 2^8 is folded into the scale).
///
/// # Safety
/// AVX2 is available; 16 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fp8_16(p: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes (caller).
    let b = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(p.cast()) });
    let t = _mm256_srai_epi16::<1>(_mm256_slli_epi16::<8>(b));
    _mm256_and_si256(t, _mm256_set1_epi16(0xBF80_u16 as i16))
}

/// 8 e2m1 codes (the nibbles of `w`, lowest first) times `s`: the code's value looked up, its
/// sign set, then one f32 multiply, the reference's `e2m1_to_f32(code) * scale` exactly.
#[inline]
#[target_feature(enable = "avx2")]
fn e2m1_8(w: i32, s: __m256) -> __m256 {
    let t = _mm256_srlv_epi32(
        _mm256_set1_epi32(w),
        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
    );
    // The magnitudes of codes 0..8; the lookup reads each lane's low three bits.
    let table = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    let magnitude = _mm256_permutevar8x32_ps(table, t);
    let sign = _mm256_and_si256(_mm256_slli_epi32::<28>(t), _mm256_set1_epi32(i32::MIN));
    _mm256_mul_ps(_mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign)), s)
}

/// 16 e2m1 codes (8 bytes, low nibble first) as binary16 bits of their exact values.
///
/// # Safety
/// AVX2 is available; 8 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn e2m1_16(p: *const u8) -> __m256i {
    // SAFETY: 8 readable bytes (caller).
    let x = unsafe { _mm_loadl_epi64(p.cast()) };
    let low = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(x, low);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), low);
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
        0x46,
        0x80_u8 as i8,
        0xB8_u8 as i8,
        0xBC_u8 as i8,
        0xBE_u8 as i8,
        0xC0_u8 as i8,
        0xC2_u8 as i8,
        0xC4_u8 as i8,
        0xC6_u8 as i8,
    );
    let high = _mm_shuffle_epi8(table, codes);
    _mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(high))
}

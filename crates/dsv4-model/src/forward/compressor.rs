//! The compressor (spec §3.4): per-token (a, z) rows pooled into one entry per window of `ratio`
//! tokens; overlapping windows for ratio 4.

use super::state::CompressorRing;
use dsv4_kernels::Backend;

/// Store token `pos`'s rows (`a`, `z`, each coff·dim wide, z already including `ape`); when `pos`
/// completes window w = pos / ratio, return (w, pooled entry of width `dim`) before norm and RoPE.
pub fn push_and_pool(
    backend: &dyn Backend,
    ring: &mut CompressorRing,
    ratio: usize,
    dim: usize,
    pos: usize,
    a: &[f32],
    z: &[f32],
) -> Option<(usize, Vec<f32>)> {
    ring.put(pos, a, z);
    if !(pos + 1).is_multiple_of(ratio) {
        return None;
    }
    let w = pos / ratio;
    let mut out = vec![0f32; dim];
    if ratio == 4 {
        // Rows 0..3: the previous window's first halves (absent for w = 0: a = 0, z = −∞);
        // rows 4..7: the current window's second halves.
        let mut pa = vec![0f32; 8 * dim];
        let mut pz = vec![f32::NEG_INFINITY; 8 * dim];
        for r in 0..4 {
            if w > 0 {
                let (ra, rz) = ring.row(4 * (w - 1) + r);
                pa[r * dim..(r + 1) * dim].copy_from_slice(&ra[..dim]);
                pz[r * dim..(r + 1) * dim].copy_from_slice(&rz[..dim]);
            }
            let (ra, rz) = ring.row(4 * w + r);
            pa[(4 + r) * dim..(5 + r) * dim].copy_from_slice(&ra[dim..]);
            pz[(4 + r) * dim..(5 + r) * dim].copy_from_slice(&rz[dim..]);
        }
        backend.softmax_pool(&pa, &pz, 8, dim, &mut out);
    } else {
        // The ring holds exactly this window's `ratio` rows, slot = position mod ratio.
        let (a, z) = ring.window();
        backend.softmax_pool(&a, &z, ratio, dim, &mut out);
    }
    Some((w, out))
}

//! Attention-side ops (`kernels/attention.cu`, `kernels/topk.cu`): compressor softmax pooling,
//! indexer scores, top-k by radix select in one block, and sparse attention with a sink as three
//! launches (logits, per-head max and weights, weighted sum with its denominator).

use super::mhc::{need, u32_arg};
use crate::device::blocks_for;
use crate::{Core, CudaError, KArg};

/// Threads per block of the element-wise kernels.
const THREADS: u32 = 256;
/// Keys (threads) per block of the thread-per-key kernels.
const KEY_THREADS: u32 = 128;
/// Heads one thread of `attn_logits` handles (`ATTN_HT` in attention.cu).
const HEADS_PER_THREAD: usize = 8;
/// Threads of the one `topk_select` block (`TOPK_THREADS` in topk.cu).
const TOPK_THREADS: u32 = 512;
/// Most scores `topk_select` takes (its u32 index arithmetic stays below 2^32).
const MAX_TOPK: usize = 1 << 31;
/// Largest grid y dimension (heads of sparse attention).
const MAX_GRID_Y: usize = 65_535;

/// Compressor pooling: out[c] = Σ_r softmax_r(z[·, c])·a[r, c]; a, z are [rows, width].
pub fn softmax_pool(
    c: &Core,
    a: &[f32],
    z: &[f32],
    rows: usize,
    width: usize,
    out: &mut [f32],
) -> Result<(), CudaError> {
    if width == 0 {
        return Ok(());
    }
    let n = rows * width;
    need("softmax_pool values", a.len(), n)?;
    need("softmax_pool logits", z.len(), n)?;
    need("softmax_pool output", out.len(), width)?;
    let dev = &c.dev;
    let ab = dev.upload_f32(&a[..n])?;
    let zb = dev.upload_f32(&z[..n])?;
    let ob = dev.alloc(width * 4)?;
    let args = [
        KArg::Buf(&ab),
        KArg::Buf(&zb),
        KArg::Buf(&ob),
        KArg::U32(u32_arg("rows", rows)?),
        KArg::U32(u32_arg("width", width)?),
    ];
    let grid = (blocks_for(width, THREADS as usize), 1, 1);
    // SAFETY: a and z hold rows·width floats, out width.
    unsafe { dev.launch("attn_softmax_pool", grid, (THREADS, 1, 1), &args)? };
    dev.download_f32(&ob, &mut out[..width])
}

/// Indexer scores of one query: out[j] = Σ_h w[h]·ReLU(q[h]·K[j]); q [heads, dim], keys [n, dim].
pub fn indexer_scores(
    c: &Core,
    q: &[f32],
    w: &[f32],
    dim: usize,
    keys: &[f32],
    out: &mut [f32],
) -> Result<(), CudaError> {
    let n = keys.len().checked_div(dim).unwrap_or(0);
    if n == 0 {
        return Ok(());
    }
    let heads = w.len();
    need("indexer queries", q.len(), heads * dim)?;
    need("indexer output", out.len(), n)?;
    let dev = &c.dev;
    let qb = dev.upload_f32(&q[..heads * dim])?;
    let wb = dev.upload_f32(w)?;
    let kb = dev.upload_f32(&keys[..n * dim])?;
    let ob = dev.alloc(n * 4)?;
    let args = [
        KArg::Buf(&qb),
        KArg::Buf(&wb),
        KArg::Buf(&kb),
        KArg::Buf(&ob),
        KArg::U32(u32_arg("keys", n)?),
        KArg::U32(u32_arg("dim", dim)?),
        KArg::U32(u32_arg("heads", heads)?),
    ];
    let grid = (blocks_for(n, KEY_THREADS as usize), 1, 1);
    // SAFETY: q holds heads·dim floats, w heads, keys n·dim, out n.
    unsafe { dev.launch("attn_indexer_scores", grid, (KEY_THREADS, 1, 1), &args)? };
    dev.download_f32(&ob, &mut out[..n])
}

/// Indices of the `k` largest scores (ties to the lower index, NaN last), ascending.
pub fn topk(c: &Core, s: &[f32], k: usize) -> Result<Vec<usize>, CudaError> {
    let n = s.len();
    let k = k.min(n);
    if k == 0 {
        return Ok(Vec::new());
    }
    if n > MAX_TOPK {
        return Err(CudaError::BadOperands(format!(
            "topk over {n} scores; the kernel takes up to {MAX_TOPK}"
        )));
    }
    let dev = &c.dev;
    let sb = dev.upload_f32(s)?;
    let ob = dev.alloc(k * 4)?;
    let args = [
        KArg::Buf(&sb),
        KArg::Buf(&ob),
        KArg::U32(n as u32),
        KArg::U32(k as u32),
    ];
    // SAFETY: scores holds n floats, out k u32 (1 ≤ k ≤ n).
    unsafe { dev.launch("topk_select", (1, 1, 1), (TOPK_THREADS, 1, 1), &args)? };
    let mut bytes = vec![0u8; k * 4];
    dev.download(&ob, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect())
}

/// Attention of one query over `keys` [n, dim] (K = V) with a per-head sink; q, out [heads, dim].
pub fn sparse_attention(
    c: &Core,
    q: &[f32],
    dim: usize,
    keys: &[f32],
    sink: &[f32],
    scale: f32,
    out: &mut [f32],
) -> Result<(), CudaError> {
    let heads = sink.len();
    if heads == 0 || dim == 0 {
        return Ok(());
    }
    if heads > MAX_GRID_Y {
        return Err(CudaError::BadOperands(format!(
            "sparse_attention with {heads} heads; the kernels take up to {MAX_GRID_Y}"
        )));
    }
    let n = keys.len() / dim;
    need("attention queries", q.len(), heads * dim)?;
    need("attention output", out.len(), heads * dim)?;
    let dev = &c.dev;
    let qb = dev.upload_f32(&q[..heads * dim])?;
    let kb = dev.upload_f32(&keys[..n * dim])?;
    let sb = dev.upload_f32(sink)?;
    let lb = dev.alloc(heads * n * 8)?;
    let swb = dev.alloc(heads * 8)?;
    let ob = dev.alloc(heads * dim * 4)?;
    let (n32, dim32) = (u32_arg("keys", n)?, u32_arg("dim", dim)?);
    let h32 = heads as u32;
    // SAFETY (all three): q holds heads·dim floats, keys n·dim, sink heads; the logits/weights
    // scratch heads·n doubles, sinkw heads doubles, out heads·dim floats.
    unsafe {
        dev.launch(
            "attn_logits",
            (
                blocks_for(n, KEY_THREADS as usize),
                blocks_for(heads, HEADS_PER_THREAD),
                1,
            ),
            (KEY_THREADS, 1, 1),
            &[
                KArg::Buf(&qb),
                KArg::Buf(&kb),
                KArg::Buf(&lb),
                KArg::U32(n32),
                KArg::U32(dim32),
                KArg::U32(h32),
                KArg::F32(scale),
            ],
        )?;
        dev.launch(
            "attn_softmax",
            (h32, 1, 1),
            (THREADS, 1, 1),
            &[
                KArg::Buf(&lb),
                KArg::Buf(&sb),
                KArg::Buf(&swb),
                KArg::U32(n32),
            ],
        )?;
        dev.launch(
            "attn_out",
            (blocks_for(dim, THREADS as usize), h32, 1),
            (THREADS, 1, 1),
            &[
                KArg::Buf(&lb),
                KArg::Buf(&swb),
                KArg::Buf(&kb),
                KArg::Buf(&ob),
                KArg::U32(n32),
                KArg::U32(dim32),
            ],
        )?;
    }
    dev.download_f32(&ob, &mut out[..heads * dim])
}

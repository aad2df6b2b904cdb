//! The op set of the forward pass. Every backend implements [`Backend`]; the `reference` backend
//! defines what each op computes (spec §5) and every faster backend is diffed against it.
//!
//! Activations are host f32 slices, row-major; `rows` counts independent rows (tokens, or
//! token×head pairs). An op never mixes rows, which is what makes prefill and decode agree.

use crate::{DeviceOps, EntryOrigin, Linear, PageTag, RopeTable, RowFormat};
use dsv4_core::IndexKDtype;
use dsv4_core::cache::CacheLayoutError;

/// Parameters of one mHC mixing (spec §3.1): a sublayer's `hc_*_{fn,base,scale}` or the head's.
#[derive(Debug, Clone, Copy)]
pub struct HcParams<'a> {
    /// `hc_*_fn`, [n_out, M·D] with n_out = (2+M)·M for a sublayer, M for the head.
    pub fn_w: &'a [f32],
    /// `hc_*_base`, `[n_out]`.
    pub base: &'a [f32],
    /// `hc_*_scale`: `[3]` for a sublayer (pre, post, comb), `[1]` for the head.
    pub scale: &'a [f32],
    /// Residual streams M.
    pub m: usize,
    /// Hidden size D.
    pub d: usize,
    /// `rms_norm_eps` (for the 1/rms factor of the flattened streams).
    pub norm_eps: f32,
    /// `hc_eps`.
    pub hc_eps: f32,
    /// `hc_sinkhorn_iters`.
    pub sinkhorn_iters: usize,
}

/// The result of the mHC pre step for T tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct MhcPre {
    /// u = Σ_j pre_j·X_j, [T, D].
    pub u: Vec<f32>,
    /// post_k, [T, M].
    pub post: Vec<f32>,
    /// The doubly-stochastic mixing C_{jk}, [T, M, M] (row j = source stream, column k = target).
    pub comb: Vec<f32>,
}

/// The op set of a DSV4 forward pass. Implementations must be deterministic and row-independent.
pub trait Backend: Send + Sync {
    /// The registry name ("reference", "cpu", …).
    fn name(&self) -> &'static str;

    /// `out[r, o] = Σ_i W[o, i]·x[r, i]` for `rows` rows; x is [rows, in], out [rows, out].
    fn linear(&self, w: &Linear, x: &[f32], rows: usize, out: &mut [f32]);

    /// Quantize-dequantize each 1×128 block of every row of width `dim` to e4m3 with a
    /// power-of-two scale (spec §5 `act_quant = fp8`), in place.
    fn act_quant_fp8(&self, x: &mut [f32], dim: usize);

    /// RMSNorm of each row: x / sqrt(mean(x²) + eps), times `weight` when given.
    fn rms_norm(&self, x: &[f32], weight: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]);

    /// Rotate the last `table.rd` dims of each row of width `dim` by angle ±p·θ_i on interleaved
    /// pairs; `positions[r]` is row r's position; `inverse` uses −p.
    fn rope(
        &self,
        x: &mut [f32],
        dim: usize,
        positions: &[usize],
        table: &RopeTable,
        inverse: bool,
    );

    /// mHC pre step for T tokens of streams `x` [T, M, D].
    fn mhc_pre(&self, p: &HcParams<'_>, x: &[f32], t: usize) -> MhcPre;

    /// mHC post step: `out[t, k] = post_k·y[t] + Σ_j C_{jk}·x[t, j]`; x, out are [T, M, D], y [T, D].
    fn mhc_post(&self, x: &[f32], y: &[f32], pre: &MhcPre, m: usize, d: usize, out: &mut [f32]);

    /// The head's stream merge: `h[t] = Σ_j (σ(m_j·s + b_j) + hc_eps)·x[t, j]`, out [T, D].
    fn hc_head(&self, p: &HcParams<'_>, x: &[f32], t: usize, out: &mut [f32]);

    /// Compressor pooling: `a`, `z` are [rows, width]; `out[c] = Σ_r softmax_r(z[·, c])·a[r, c]`.
    /// Rows with z = −∞ get weight 0.
    fn softmax_pool(&self, a: &[f32], z: &[f32], rows: usize, width: usize, out: &mut [f32]);

    /// [`Backend::softmax_pool`] of `windows` windows at once: window w pools
    /// `a[w·rows·width ..]`, `z[w·rows·width ..]` ([rows, width] each) into `out[w·width ..]`.
    /// Window for window equal to `softmax_pool`; a GPU backend runs them in one submission.
    fn softmax_pool_rows(
        &self,
        a: &[f32],
        z: &[f32],
        windows: usize,
        rows: usize,
        width: usize,
        out: &mut [f32],
    ) {
        let n = rows * width;
        for w in 0..windows {
            self.softmax_pool(
                &a[w * n..(w + 1) * n],
                &z[w * n..(w + 1) * n],
                rows,
                width,
                &mut out[w * width..(w + 1) * width],
            );
        }
    }

    /// Multiply each row of width `dim` (a power of two) by the Sylvester Hadamard matrix / sqrt(dim).
    fn hadamard(&self, x: &mut [f32], dim: usize);

    /// Indexer scores of one query: `out[j] = Σ_h w[h]·ReLU(q[h]·K[j])`; heads = `w.len()`,
    /// q [heads, dim], keys [n, dim], out `[n]`.
    fn indexer_scores(&self, q: &[f32], w: &[f32], dim: usize, keys: &[f32], out: &mut [f32]);

    /// Indices of the `k` largest scores (k capped at the length), ties to the lower index, in
    /// ascending index order.
    fn topk(&self, scores: &[f32], k: usize) -> Vec<usize>;

    /// Attention of one query over `keys` [n, dim] (K = V), heads = `sink.len()`, with a per-head
    /// sink in the denominator: `out[h] = Σ_s e^{l_s}·K_s / (Σ_s e^{l_s} + e^{sink_h})`,
    /// l_s = scale·q_h·K_s; q and out are [heads, dim].
    fn sparse_attention(
        &self,
        q: &[f32],
        dim: usize,
        keys: &[f32],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    );

    /// [`Backend::indexer_scores`] of several queries at once, each over its own keys: query r
    /// (`q[r·heads·dim ..]`, head weights `w[r·heads ..]`) scores key rows
    /// `key_starts[r] .. key_starts[r+1]` of `keys` [n, dim] into the same range of `out` `[n]`.
    /// Row for row equal to `indexer_scores`; a GPU backend runs them in one submission.
    fn indexer_scores_rows(
        &self,
        q: &[f32],
        w: &[f32],
        dim: usize,
        keys: &[f32],
        key_starts: &[usize],
        out: &mut [f32],
    ) {
        let heads = w.len() / key_starts.len().saturating_sub(1).max(1);
        for (r, k) in key_starts.windows(2).enumerate() {
            self.indexer_scores(
                &q[r * heads * dim..(r + 1) * heads * dim],
                &w[r * heads..(r + 1) * heads],
                dim,
                &keys[k[0] * dim..k[1] * dim],
                &mut out[k[0]..k[1]],
            );
        }
    }

    /// [`Backend::topk`] of several score ranges at once: range r is
    /// `scores[starts[r] .. starts[r+1]]`; each result is as `topk` gives it.
    fn topk_rows(&self, scores: &[f32], starts: &[usize], k: usize) -> Vec<Vec<usize>> {
        starts
            .windows(2)
            .map(|s| self.topk(&scores[s[0]..s[1]], k))
            .collect()
    }

    /// The indexer's selection for several queries at once: [`Backend::indexer_scores_rows`]
    /// over `key_starts`, then [`Backend::topk_rows`] of those scores over the same ranges —
    /// the indices (relative to each query's range) of its `k` best-scoring keys. The scores
    /// stay on the device of a GPU backend, which runs both in one submission.
    #[allow(clippy::too_many_arguments)]
    fn indexer_topk_rows(
        &self,
        q: &[f32],
        w: &[f32],
        dim: usize,
        keys: &[f32],
        key_starts: &[usize],
        k: usize,
    ) -> Vec<Vec<usize>> {
        let mut scores = vec![0f32; key_starts.last().copied().unwrap_or(0)];
        self.indexer_scores_rows(q, w, dim, keys, key_starts, &mut scores);
        self.topk_rows(&scores, key_starts, k)
    }

    /// [`Backend::indexer_topk_rows`] with keys shared between queries: query r scores key
    /// rows `key_ranges[r].0 .. key_ranges[r].1` of `keys` [n, dim], and ranges may overlap (a
    /// prefill chunk's rows of one sequence score nested prefixes of the same entries, which
    /// a host backend then reads in place). Exactly `indexer_topk_rows` over the rows laid out
    /// range after range (its default). A decreasing range or one past the keys panics, as
    /// other operands that do not fit.
    fn indexer_topk_ranges(
        &self,
        q: &[f32],
        w: &[f32],
        dim: usize,
        keys: &[f32],
        key_ranges: &[(usize, usize)],
        k: usize,
    ) -> Vec<Vec<usize>> {
        let all: Vec<usize> = (0..keys.len() / dim.max(1)).collect();
        let (order, starts) = crate::operands::expand_ranges(&all, key_ranges);
        let mut laid = Vec::new();
        crate::operands::extend_rows_by_id(&mut laid, keys, dim, &order);
        self.indexer_topk_rows(q, w, dim, &laid, &starts, k)
    }

    /// [`Backend::indexer_topk_rows`] over keys still in their cache pages: key row i is slot
    /// `rows[i].1` of page `pages[rows[i].0]` in format `fmt` (dim = `fmt.width()`),
    /// dequantized as [`Backend::cache_load_rows`] does. Exactly that composition (its
    /// default); a GPU backend decodes the rows into device memory and scores them there, so
    /// neither the keys nor the scores come back to the host. A layout error is returned before
    /// anything runs; indexer operands that do not fit panic as in `indexer_topk_rows`.
    #[allow(clippy::too_many_arguments)]
    fn paged_indexer_topk_rows(
        &self,
        q: &[f32],
        w: &[f32],
        fmt: &RowFormat,
        pages: &[&[u8]],
        rows: &[(usize, usize)],
        key_starts: &[usize],
        k: usize,
    ) -> Result<Vec<Vec<usize>>, CacheLayoutError> {
        let dim = fmt.width();
        let mut keys = vec![0f32; rows.len() * dim];
        self.cache_load_rows(fmt, pages, rows, &mut keys)?;
        Ok(self.indexer_topk_rows(q, w, dim, &keys, key_starts, k))
    }

    /// [`Backend::paged_indexer_topk_rows`] with keys shared between queries: query r scores
    /// key rows `key_ranges[r].0 .. key_ranges[r].1` of `rows`, and ranges may overlap (a
    /// prefill chunk's rows of one sequence score nested prefixes of the same index-K entries;
    /// DeepGEMM's `fp8_mqa_logits` takes per-query key starts and ends for the same reason).
    /// Exactly `paged_indexer_topk_rows` over the rows laid out range after range (its
    /// default), after a layout check of every row; a GPU backend uploads each row once. A
    /// decreasing range or one past `rows` panics, as other operands that do not fit.
    /// `page_tags` are the pages' content tags, as [`Backend::paged_attention_indexed`] takes.
    #[allow(clippy::too_many_arguments)]
    fn paged_indexer_topk_ranges(
        &self,
        q: &[f32],
        w: &[f32],
        fmt: &RowFormat,
        pages: &[&[u8]],
        page_tags: &[PageTag],
        rows: &[(usize, usize)],
        key_ranges: &[(usize, usize)],
        k: usize,
    ) -> Result<Vec<Vec<usize>>, CacheLayoutError> {
        let _ = page_tags;
        fmt.checked_rows(pages, rows, rows.len() * fmt.width())?;
        let (picks, starts) = crate::operands::expand_ranges(rows, key_ranges);
        self.paged_indexer_topk_rows(q, w, fmt, pages, &picks, &starts, k)
    }

    /// [`Backend::sparse_attention`] of several queries at once, each over its own keys: query
    /// r (`q[r·heads·dim ..]`) attends over key rows `key_starts[r] .. key_starts[r+1]` of
    /// `keys` [n, dim], into `out[r·heads·dim ..]`. Row for row equal to `sparse_attention`; a
    /// GPU backend runs them in one submission. `key_starts` has one more entry than queries.
    #[allow(clippy::too_many_arguments)]
    fn sparse_attention_rows(
        &self,
        q: &[f32],
        dim: usize,
        keys: &[f32],
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = sink.len() * dim;
        for (r, w) in key_starts.windows(2).enumerate() {
            self.sparse_attention(
                &q[r * hd..(r + 1) * hd],
                dim,
                &keys[w[0] * dim..w[1] * dim],
                sink,
                scale,
                &mut out[r * hd..(r + 1) * hd],
            );
        }
    }

    /// [`Backend::sparse_attention_rows`] with key rows shared between queries: key i is row
    /// `key_ids[i]` of `keys` [n, dim], and query r attends over keys `key_starts[r] ..
    /// key_starts[r+1]` in that order (a prefill chunk's rows of one sequence read mostly the
    /// same window rows, which a host backend then decodes once). Bitwise
    /// `sparse_attention_rows` over the rows laid out id by id (its default). An id past the
    /// keys panics, as other operands that do not fit.
    #[allow(clippy::too_many_arguments)]
    fn sparse_attention_indexed(
        &self,
        q: &[f32],
        dim: usize,
        keys: &[f32],
        key_ids: &[usize],
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) {
        let mut laid = Vec::new();
        crate::operands::extend_rows_by_id(&mut laid, keys, dim, key_ids);
        self.sparse_attention_rows(q, dim, &laid, key_starts, sink, scale, out);
    }

    /// [`Backend::sparse_attention_rows`] over keys still in their cache pages: key row i is
    /// slot `rows[i].1` of page `pages[rows[i].0]` in format `fmt` (dim = `fmt.width()`),
    /// dequantized as [`Backend::cache_load_rows`] does. Bitwise that composition (its default);
    /// a GPU backend decodes the rows into device memory and attends there, so the keys never
    /// come back to the host and the call is one submission. A layout error is returned before
    /// anything runs; attention operands that do not fit panic as in `sparse_attention_rows`.
    #[allow(clippy::too_many_arguments)]
    fn paged_attention_rows(
        &self,
        q: &[f32],
        fmt: &RowFormat,
        pages: &[&[u8]],
        rows: &[(usize, usize)],
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        let dim = fmt.width();
        let mut keys = vec![0f32; rows.len() * dim];
        self.cache_load_rows(fmt, pages, rows, &mut keys)?;
        self.sparse_attention_rows(q, dim, &keys, key_starts, sink, scale, out);
        Ok(())
    }

    /// [`Backend::paged_attention_rows`] with key rows shared between queries: key i is row
    /// `rows[key_ids[i]]`, and query r attends over keys `key_starts[r] .. key_starts[r+1]` in
    /// that order (a prefill chunk's rows of one sequence read most of the same window and, on
    /// ratio-128 layers, nested prefixes of the same compressed entries). Bitwise
    /// `paged_attention_rows` over the rows laid out id by id (its default), after a layout
    /// check of every row; a GPU backend uploads each row once. An id past `rows` panics, as
    /// other operands that do not fit.
    ///
    /// `page_tags` holds each page's content tag ([`PageTag`]), or is empty: under one
    /// lineage a page's settled entries never change and its others are unwritten, so a GPU
    /// backend may keep a page's copy from an earlier call and upload only the entries written
    /// since; [`PageTag::UNTAGGED`] promises nothing. `page_origins` is empty, or holds for
    /// each page the origins ([`EntryOrigin`]) of its first entries, in slot order (empty for a
    /// page not packed from others): a GPU backend may read such an entry from its copy of the
    /// source page. Tags and origins never change the result.
    #[allow(clippy::too_many_arguments)]
    fn paged_attention_indexed(
        &self,
        q: &[f32],
        fmt: &RowFormat,
        pages: &[&[u8]],
        page_tags: &[PageTag],
        page_origins: &[&[EntryOrigin]],
        rows: &[(usize, usize)],
        key_ids: &[usize],
        key_starts: &[usize],
        sink: &[f32],
        scale: f32,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        let _ = (page_tags, page_origins);
        fmt.checked_rows(pages, rows, rows.len() * fmt.width())?;
        let picks: Vec<(usize, usize)> = key_ids.iter().map(|&i| rows[i]).collect();
        self.paged_attention_rows(q, fmt, pages, &picks, key_starts, sink, scale, out)
    }

    /// Router scores sqrt(softplus(x)) element-wise.
    fn router_scores(&self, logits: &[f32], out: &mut [f32]);

    /// Clamped SwiGLU: out = silu(min(g, L))·clamp(u, −L, L)·weight.
    fn swiglu(&self, g: &[f32], u: &[f32], limit: f32, weight: f32, out: &mut [f32]);

    /// Quantize one cache row into `slot` of `page` in the format's exact byte layout (spec §4);
    /// only that slot's bytes change. The default is the host codec, [`RowFormat::write`]; a GPU
    /// backend runs its kernel.
    fn cache_store(
        &self,
        fmt: &RowFormat,
        page: &mut [u8],
        slot: usize,
        values: &[f32],
    ) -> Result<(), CacheLayoutError> {
        fmt.write(page, slot, values)
    }

    /// Quantize whole cache rows into their entry bytes: `values` holds rows of `fmt.width()`
    /// values, and row r's entry — its slot's data bytes, then its scale bytes: exactly what
    /// [`Backend::cache_store`] writes into a slot ([`RowFormat::put_entry`] puts it there) — is
    /// at `[r·e, (r+1)·e)` of the result, e = [`RowFormat::entry_bytes`]. A GPU backend encodes
    /// them in one submission instead of one per row.
    fn cache_encode_rows(
        &self,
        fmt: &RowFormat,
        values: &[f32],
    ) -> Result<Vec<u8>, CacheLayoutError> {
        let (rows, at) = fmt.checked_encode(values.len())?;
        let mut page = vec![0u8; fmt.page_bytes()];
        let mut out = Vec::with_capacity(rows * fmt.entry_bytes());
        for row in values.chunks_exact(fmt.width()) {
            self.cache_store(fmt, &mut page, 0, row)?;
            out.extend_from_slice(&page[at.data.clone()]);
            out.extend_from_slice(&page[at.scale.clone()]);
        }
        Ok(out)
    }

    /// Dequantize `slot` of `page` (exactly) into `out`. The default is the host codec,
    /// [`RowFormat::read`]; a GPU backend runs its kernel.
    fn cache_load(
        &self,
        fmt: &RowFormat,
        page: &[u8],
        slot: usize,
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        fmt.read(page, slot, out)
    }

    /// Dequantize many rows at once: row r is slot `rows[r].1` of page `pages[rows[r].0]`,
    /// written to `out[r·width .. (r+1)·width]` (width = `fmt.width()`). Row for row equal to
    /// [`Backend::cache_load`]; a GPU backend decodes them in one submission instead of one per
    /// row.
    fn cache_load_rows(
        &self,
        fmt: &RowFormat,
        pages: &[&[u8]],
        rows: &[(usize, usize)],
        out: &mut [f32],
    ) -> Result<(), CacheLayoutError> {
        let width = fmt.width();
        fmt.checked_rows(pages, rows, out.len())?;
        for (&(page, slot), o) in rows.iter().zip(out.chunks_mut(width.max(1))) {
            self.cache_load(fmt, pages[page], slot, o)?;
        }
        Ok(())
    }

    /// Round each row of width `dim` of indexer queries as index-K entries are rounded (spec §5:
    /// bf16; fp8 with one f32 scale per row; fp4 per 32 values), in place.
    fn round_index_rows(&self, dtype: IndexKDtype, x: &mut [f32], dim: usize);

    /// The backend's device-resident op set, when it keeps activations in its own memory
    /// (GPU backends); host backends have none and run every op on host slices.
    fn device(&self) -> Option<&dyn DeviceOps> {
        None
    }
}

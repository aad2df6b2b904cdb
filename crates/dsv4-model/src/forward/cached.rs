//! Launches that touch the cache pools: SWA stores, the compressors (ring rows and finished
//! entries) and the indexer's top-k over index-K rows (sparse attention is `attention.rs`).
//!
//! Writes go to the locations in the block's `loc` buffer (page id × entries + slot), as a
//! device kernel writes where its location tensor points. A location that does not name a
//! page of the store (only a corrupted `loc` buffer has one) is wrapped into the store, so the
//! damage stays inside the pool where the canary can see it. Reads follow each sequence's own
//! page tables; an indexer selection beyond the valid entries (again only from corrupted
//! buffers) is wrapped into them.

use super::ForwardError;
use super::build::loc_width;
use super::compressor::{PhysicalRing, WindowPool};
use super::dense::no_weights;
use super::gather::RowGather;
use super::op::{BlockRef, Chain};
use super::pages::PageStore;
use super::resident::{Scratch, Tmp};
use super::run::{BoundBlock, Run, lock};
use super::state::{CompressorState, NO_LOCATION, PagedRows};
use crate::weights::CompressorWeights;
use dsv4_kernels::attention_device::{encoded_words, words_bytes};
use dsv4_kernels::{DevSlice, DeviceOps, RowFormat};

type Res = Result<Vec<f32>, ForwardError>;

/// The end of a compressor launch: the completed windows' pool, the compressor, each entry's
/// position and the entry format in, the encoded entries out.
type Finish<'a> = dyn FnMut(WindowPool, &CompressorWeights, &[usize], &RowFormat) -> Result<Vec<u8>, ForwardError>
    + 'a;

/// The indexer's selection of one chunk of rows: given their index-K rows' gather, the first
/// row and each row's range of the gathered rows, each row's chosen ids.
type Select<'a> = dyn FnMut(RowGather<'_>, usize, &[(usize, usize)]) -> Result<Vec<Vec<usize>>, ForwardError>
    + 'a;

/// Rows whose attention (or indexer scoring) runs in one call: bounds the keys gathered for
/// one call to this many rows' windows and selections (or index-K rows).
pub(super) const ATTENTION_CHUNK: usize = 16;

/// Put one encoded entry (see [`dsv4_kernels::Backend::cache_encode_rows`]) into the row at
/// location `loc` of `store` (nothing for [`NO_LOCATION`]).
pub(super) fn store_entry(
    store: &dyn PageStore,
    fmt: &RowFormat,
    loc: u32,
    entry: &[u8],
) -> Result<(), ForwardError> {
    if loc == NO_LOCATION {
        return Ok(());
    }
    let per = fmt.page_entries();
    let cap = store.capacity().max(1);
    let page = ((loc as usize / per) % cap) as u32;
    let slot = loc as usize % per;
    let mut r = Ok(());
    store.write_entry(page, slot, &mut |b| r = fmt.put_entry(b, slot, entry));
    Ok(r?)
}

pub(super) fn missing(what: &str) -> ForwardError {
    ForwardError::Plan {
        message: format!("a sequence of the step has no {what} in its page stores"),
    }
}

impl Run<'_> {
    pub(super) fn row_state<'s>(
        &self,
        bb: &'s BoundBlock<'_>,
        i: usize,
    ) -> &'s super::state::LayerState {
        bb.states[self.bound.row_seq[i]]
    }

    /// The SWA entries of the step's rows of `kv`, encoded in one call: the format every row's
    /// SWA store shares, and the entries (one per row).
    pub(super) fn encode_swa(
        &self,
        bb: &BoundBlock<'_>,
        kv: &[f32],
    ) -> Result<(RowFormat, Vec<u8>), ForwardError> {
        let t = self.bound.rows;
        let fmt = self.swa_format(bb)?;
        let hd = self.model.cfg.head_dim;
        let entries = self.model.backend.cache_encode_rows(&fmt, &kv[..t * hd])?;
        Ok((fmt, entries))
    }

    /// The SWA entries of the step's rows of `kv` in `dev`'s memory, encoded there in one call
    /// into a buffer of `scratch` (for plan stream `stream`), as [`Run::encode_swa`] encodes
    /// host rows: the format, the buffer (the entries packed into its first words) and the
    /// entries' bytes. The caller reads them back with whatever else it reads.
    pub(super) fn encode_swa_into<'s>(
        &self,
        dev: &dyn DeviceOps,
        (scratch, stream): (&'s Scratch, usize),
        bb: &BoundBlock<'_>,
        kv: DevSlice,
    ) -> Result<(RowFormat, Tmp<'s>, usize), ForwardError> {
        let fmt = self.swa_format(bb)?;
        let t = self.bound.rows;
        let words = dsv4_kernels::attention_device::encoded_words(&fmt, t);
        let out = scratch.take(dev, stream, words)?;
        let x = kv.prefix(t * self.model.cfg.head_dim);
        dev.cache_encode_into(&fmt, x, out.s.prefix(words))?;
        Ok((fmt, out, t * fmt.entry_bytes()))
    }

    /// The SWA entry format every sequence of the step shares.
    fn swa_format(&self, bb: &BoundBlock<'_>) -> Result<RowFormat, ForwardError> {
        let fmt = *self.row_state(bb, 0).swa.layout();
        if (1..self.bound.rows).any(|i| *self.row_state(bb, i).swa.layout() != fmt) {
            return Err(ForwardError::Plan {
                message: "the step's sequences have SWA stores of different formats".into(),
            });
        }
        Ok(fmt)
    }

    /// `[kv, loc] → []`: each row's SWA entry into its location.
    pub(crate) fn swa_store(
        &self,
        b: Option<BlockRef>,
        kv: &[f32],
        loc: &[f32],
    ) -> Result<(), ForwardError> {
        let (fmt, entries) = self.encode_swa(self.bound_block(b)?, kv)?;
        self.store_swa(b, &fmt, &entries, loc)
    }

    /// Each row's encoded SWA entry (`entries`, one per row) into its location.
    pub(super) fn store_swa(
        &self,
        b: Option<BlockRef>,
        fmt: &RowFormat,
        entries: &[u8],
        loc: &[f32],
    ) -> Result<(), ForwardError> {
        let (fmt, bb) = (*fmt, self.bound_block(b)?);
        let w = loc_width(self.weights(b)?.ratio);
        let e = fmt.entry_bytes();
        for i in 0..self.bound.rows {
            let swa = &self.row_state(bb, i).swa;
            let store = swa.store().ok_or_else(|| missing("SWA store"))?;
            let entry = &entries[i * e..(i + 1) * e];
            store_entry(store.as_ref(), &fmt, loc[i * w].to_bits(), entry)?;
        }
        Ok(())
    }

    /// Block `b`'s compressor weights of `chain`.
    fn compressor_weights(
        &self,
        b: Option<BlockRef>,
        chain: Chain,
    ) -> Result<&CompressorWeights, ForwardError> {
        let attn = &self.weights(b)?.attn;
        match chain {
            Chain::Attn => attn.compressor.as_ref(),
            Chain::Indexer => attn.indexer.as_ref().map(|i| &i.compressor),
        }
        .ok_or_else(|| no_weights(b, "compressor"))
    }

    /// The compressor state of `chain` of row `i`'s sequence.
    fn compressor_of<'s>(
        &self,
        bb: &'s BoundBlock<'_>,
        i: usize,
        chain: Chain,
    ) -> Result<&'s CompressorState, ForwardError> {
        let st = self.row_state(bb, i);
        match chain {
            Chain::Attn => st.compressor.as_ref(),
            Chain::Indexer => st.indexer.as_ref(),
        }
        .ok_or_else(|| missing("compressor state"))
    }

    /// `[a, z, loc] → []`: push each row into its ring, pooling the windows that complete;
    /// then normalise, rotate (Hadamard for the indexer), encode and store all the step's
    /// completed entries at once (nothing in the loop reads them).
    pub(crate) fn compress(
        &self,
        b: Option<BlockRef>,
        chain: Chain,
        a: &[f32],
        z: &[f32],
        loc: &[f32],
    ) -> Result<(), ForwardError> {
        let m = self.model;
        let be = m.backend.as_ref();
        self.compress_with(b, chain, (a, z, loc), &mut |pool, cw, positions, fmt| {
            let raw = pool.finish(be);
            let mut c = vec![0f32; raw.len()];
            be.rms_norm(&raw, Some(&cw.norm), cw.dim, m.eps(), &mut c);
            be.rope(&mut c, cw.dim, positions, &m.rope_compress, false);
            if chain == Chain::Indexer {
                be.hadamard(&mut c, cw.dim);
            }
            Ok(be.cache_encode_rows(fmt, &c)?)
        })
    }

    /// [`Run::compress`] with the completed windows pooled, normalised, rotated and encoded
    /// in `dev`'s memory (`scratch` lends its buffers, for plan stream `stream`): the windows'
    /// rows go up, only the entries come back.
    pub(super) fn compress_dev(
        &self,
        dev: &dyn DeviceOps,
        (scratch, stream): (&Scratch, usize),
        b: Option<BlockRef>,
        chain: Chain,
        ins: (&[f32], &[f32], &[f32]),
    ) -> Result<(), ForwardError> {
        let m = self.model;
        // Buffers for the most windows a step completes (one a row), taken whether or not any
        // completes, so a captured plan takes them at its first step and its replays take the
        // same ones whatever they complete.
        let cw = self.compressor_weights(b, chain)?;
        let (ring, t) = (super::state::ring_rows(cw.ratio), self.bound.rows);
        let (wa, wz) = (
            scratch.take(dev, stream, t * ring * cw.dim)?,
            scratch.take(dev, stream, t * ring * cw.dim)?,
        );
        let (wraw, wc) = (
            scratch.take(dev, stream, t * cw.dim)?,
            scratch.take(dev, stream, t * cw.dim)?,
        );
        let fmt0 = *self
            .compressor_of(self.bound_block(b)?, 0, chain)?
            .entries
            .layout();
        let went = scratch.take(dev, stream, encoded_words(&fmt0, t))?;
        self.compress_with(b, chain, ins, &mut |pool, cw, positions, fmt| {
            let (a, z, windows, rows) = pool.into_parts();
            let (da, dz) = (wa.s.prefix(a.len()), wz.s.prefix(z.len()));
            dev.write(da, &a)?;
            dev.write(dz, &z)?;
            let n = windows * cw.dim;
            let (raw, c) = (wraw.s.prefix(n), wc.s.prefix(n));
            dev.softmax_pool_rows(da, dz, windows, rows, cw.dim, raw)?;
            dev.rms_norm(raw, Some(&cw.norm), cw.dim, m.eps(), c)?;
            dev.rope(c, cw.dim, positions, &m.rope_compress, false)?;
            if chain == Chain::Indexer {
                dev.hadamard(c, cw.dim)?;
            }
            let words = encoded_words(fmt, windows);
            let out = went.s.prefix(words);
            dev.cache_encode_into(fmt, c, out)?;
            Ok(words_bytes(&dev.read(out)?, windows * fmt.entry_bytes()))
        })
    }

    /// The ring pushes of [`Run::compress`], then `finish` (the completed windows' pool, the
    /// compressor, each entry's position, the entry format) encodes the entries, which are
    /// stored.
    fn compress_with(
        &self,
        b: Option<BlockRef>,
        chain: Chain,
        (a, z, loc): (&[f32], &[f32], &[f32]),
        finish: &mut Finish<'_>,
    ) -> Result<(), ForwardError> {
        let bw = self.weights(b)?;
        let cw = self.compressor_weights(b, chain)?;
        let bb = self.bound_block(b)?;
        let (w, col) = (
            loc_width(bw.ratio),
            if chain == Chain::Attn { 1 } else { 3 },
        );
        let width = cw.coff * cw.dim;
        // (row, window) of each completed entry; the windows pool in one call after the loop.
        let (mut done, mut pool) = (Vec::new(), WindowPool::new(cw.ratio, cw.dim));
        for (i, &p) in self.bound.positions[..self.bound.rows].iter().enumerate() {
            let cs = self.compressor_of(bb, i, chain)?;
            let ring_pages = cs.ring.pooled_pages().ok_or_else(|| missing("ring page"))?;
            ring_pages.wait_loaded();
            let ring_store = ring_pages.store();
            let ring_page = loc[i * w + col].to_bits() % ring_store.capacity().max(1) as u32;
            let mut ring = PhysicalRing {
                store: ring_store.as_ref(),
                page: ring_page,
                rows: cs.ring.rows,
                width: cs.ring.width,
            };
            let span = i * width..(i + 1) * width;
            if let Some(win) = pool.push(&mut ring, p, &a[span.clone()], &z[span]) {
                done.push((i, win));
            }
        }
        let Some(&(first, _)) = done.first() else {
            return Ok(());
        };
        let positions: Vec<usize> = done.iter().map(|&(_, win)| cw.ratio * win).collect();
        let fmt = *self.compressor_of(bb, first, chain)?.entries.layout();
        let entries = finish(pool, cw, &positions, &fmt)?;
        let e = fmt.entry_bytes();
        for (k, &(i, _)) in done.iter().enumerate() {
            let cs = self.compressor_of(bb, i, chain)?;
            if *cs.entries.layout() != fmt {
                return Err(ForwardError::Plan {
                    message: "the step's sequences have compressed-entry stores of different \
                              formats"
                        .into(),
                });
            }
            let store = cs.entries.store().ok_or_else(|| missing("entry store"))?;
            let l = loc[i * w + col + 1].to_bits();
            store_entry(store.as_ref(), &fmt, l, &entries[k * e..(k + 1) * e])?;
        }
        Ok(())
    }

    /// `[qi, hw] → [topk]`: for each row, scores of its sequence's index-K rows 0..⌊(p+1)/4⌋
    /// and the ids of the top index_topk (padded with [`NO_LOCATION`]). The rows' own choices
    /// are what the step reports; under [`super::ChoiceControl::pinned`] the output holds the
    /// pinned selections instead, and with `record_scores` the scores are reported too.
    pub(crate) fn indexer_topk(&self, b: Option<BlockRef>, qi: &[f32], hw: &[f32]) -> Res {
        let cfg = &self.model.cfg;
        let (inh, id, k) = (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk);
        let be = self.model.backend.as_ref();
        let record = self.choices.record_scores && main_layer(b).is_some();
        let mut scores = Vec::new();
        let out = self.indexer_select(b, &mut |taken, first, ranges| {
            let c = ranges.len();
            let (q, w) = (
                &qi[first * inh * id..(first + c) * inh * id],
                &hw[first * inh..(first + c) * inh],
            );
            if record {
                let (s, starts) = taken.indexer_scores(q, w, id, ranges)?;
                scores.extend(starts.windows(2).map(|r| s[r[0]..r[1]].to_vec()));
                Ok(be.topk_rows(&s, &starts, k))
            } else {
                taken.indexer_topk(q, w, id, ranges, k)
            }
        })?;
        if let (Some(l), true) = (main_layer(b), record) {
            lock(&self.out.scores).insert(l, scores);
        }
        Ok(out)
    }

    /// [`Run::indexer_topk`] with the queries `qi` and head weights `hw` in `dev`'s memory
    /// (not recording scores): only each chunk's chosen ids come back.
    pub(super) fn indexer_topk_dev(
        &self,
        dev: &dyn DeviceOps,
        b: Option<BlockRef>,
        qi: DevSlice,
        hw: DevSlice,
    ) -> Res {
        let cfg = &self.model.cfg;
        let (inh, id, k) = (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk);
        self.indexer_select(b, &mut |taken, first, ranges| {
            let c = ranges.len();
            let (q, w) = (
                qi.sub(first * inh * id, c * inh * id),
                hw.sub(first * inh, c * inh),
            );
            taken.indexer_topk_on(dev, q, w, id, ranges, k)
        })
    }

    /// The indexer launch's output: each row's index-K rows gathered a chunk of rows at a
    /// time and handed to `select` (the gather, the chunk's first row, each row's range of the
    /// gathered rows), which returns each row's chosen ids; pins applied, the own choices
    /// reported.
    fn indexer_select(&self, b: Option<BlockRef>, select: &mut Select<'_>) -> Res {
        let bb = self.bound_block(b)?;
        let k = self.model.cfg.index_topk;
        let be = self.model.backend.as_ref();
        let rows = self.bound.rows;
        let layer = main_layer(b);
        let pins = layer.and_then(|l| Some((l, self.choices.pinned?.get(&l)?)));
        if let Some((l, p)) = pins
            && p.len() != rows
        {
            return Err(ForwardError::Plan {
                message: format!(
                    "layer {l}'s pinned selections cover {} tokens, the step has {rows}",
                    p.len()
                ),
            });
        }
        let mut out = vec![f32::from_bits(NO_LOCATION); rows * k];
        let mut own = Vec::with_capacity(rows);
        // Rows in chunks: a chunk's index-K rows are gathered, then decoded, scored and ranked
        // in one call (the keys and scores stay on a GPU backend's device). Consecutive rows
        // of one sequence (a prefill chunk) score nested prefixes of the same entries: those
        // are gathered once, each row's range reaching further (an append-only store keeps
        // its written rows, and nothing writes index-K entries during this launch).
        let (mut gather, mut ranges, mut first) = (RowGather::new(be), Vec::new(), 0usize);
        // The store gathered last, where its rows start in the gather and how many it holds.
        let mut shared: Option<(&PagedRows, usize, usize)> = None;
        for (i, &p) in self.bound.positions[..rows].iter().enumerate() {
            let is = self.row_state(bb, i).indexer.as_ref();
            let is = is.ok_or_else(|| missing("indexer state"))?;
            let n = (p + 1) / 4;
            let (base, have) = match shared {
                Some((s, base, have)) if std::ptr::eq(s, &is.entries) && have <= n => (base, have),
                _ => (gather.len(), 0),
            };
            // The `skip-index-k-transfer-wait` fault reads without waiting for a load-back.
            gather.add(&is.entries, have..n, self.skip_index_k_wait)?;
            shared = Some((&is.entries, base, n));
            ranges.push((base, base + n));
            if ranges.len() >= ATTENTION_CHUNK || i + 1 == rows {
                let c = ranges.len();
                let taken = std::mem::replace(&mut gather, RowGather::new(be));
                let chosen = select(taken, first, &ranges)?;
                for (r, chosen) in chosen.into_iter().enumerate() {
                    let row = first + r;
                    let ids: Vec<u32> = chosen.into_iter().map(|j| j as u32).collect();
                    let n = ranges[r].1 - ranges[r].0;
                    let used = match pins {
                        Some((l, p)) => pinned_row(l, row, &p[row], n, k)?,
                        None => &ids,
                    };
                    for (slot, &j) in out[row * k..(row + 1) * k].iter_mut().zip(used) {
                        *slot = f32::from_bits(j);
                    }
                    own.push(ids);
                }
                (first, shared) = (first + c, None);
                ranges.clear();
            }
        }
        if let Some(l) = layer {
            lock(&self.out.selected).insert(l, own);
        }
        Ok(out)
    }
}

/// The main layer `b` names, if it names one (not the MTP block).
fn main_layer(b: Option<BlockRef>) -> Option<usize> {
    match b {
        Some(BlockRef::Main(l)) => Some(l),
        _ => None,
    }
}

/// Row `row`'s pinned selection of layer `layer`, checked against the row's `n` entries and
/// the indexer's `k`.
fn pinned_row(
    layer: usize,
    row: usize,
    ids: &[u32],
    n: usize,
    k: usize,
) -> Result<&[u32], ForwardError> {
    if ids.len() > k {
        return Err(ForwardError::Plan {
            message: format!(
                "layer {layer}, token {row}: {} pinned entries, the indexer selects {k}",
                ids.len()
            ),
        });
    }
    if let Some(&j) = ids.iter().find(|&&j| j as usize >= n) {
        return Err(ForwardError::Plan {
            message: format!(
                "layer {layer}, token {row}: pinned entry {j} is past the {n} compressed entries"
            ),
        });
    }
    Ok(ids)
}

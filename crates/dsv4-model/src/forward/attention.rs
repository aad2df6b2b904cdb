//! The attention sublayer (spec §3.3) with its compressor (§3.4) and lightning indexer (§3.5):
//! projections batched over the T tokens, then one token at a time through the caches, so a
//! prefill of T tokens and T decode steps run the same per-token code.

use super::compressor::push_and_pool;
use super::state::{CompressorState, LayerState};
use super::{ForwardError, Model, RowMap, Taps};
use crate::weights::{AttentionWeights, CompressorWeights};

/// What one attention call hands back besides its output.
pub(crate) struct AttentionOut {
    /// y [T, D].
    pub y: Vec<f32>,
    /// For ratio-4 layers: the selected compressed entries of each token.
    pub selected: Option<Vec<Vec<u32>>>,
}

/// Per-token compressor inputs (a, z with ape added), [T, coff·d] each.
struct CompressorInput {
    a: Vec<f32>,
    z: Vec<f32>,
}

impl Model {
    fn compressor_input(
        &self,
        cw: &CompressorWeights,
        x: &[f32],
        positions: &[usize],
    ) -> CompressorInput {
        let t = positions.len();
        let width = cw.coff * cw.dim;
        let mut a = vec![0f32; t * width];
        let mut z = vec![0f32; t * width];
        self.backend.linear(&cw.wkv, x, t, &mut a);
        self.backend.linear(&cw.wgate, x, t, &mut z);
        for (i, &p) in positions.iter().enumerate() {
            let ape = &cw.ape[(p % cw.ratio) * width..(p % cw.ratio + 1) * width];
            for (zv, av) in z[i * width..(i + 1) * width].iter_mut().zip(ape) {
                *zv += av;
            }
        }
        CompressorInput { a, z }
    }

    /// Push token i's compressor rows; when a window completes, normalise, rotate (and for the
    /// indexer, Hadamard-rotate) the entry and append it to the store.
    fn compress_step(
        &self,
        cw: &CompressorWeights,
        st: &mut CompressorState,
        input: &CompressorInput,
        i: usize,
        pos: usize,
        hadamard: bool,
    ) -> Result<(), ForwardError> {
        let width = cw.coff * cw.dim;
        let span = i * width..(i + 1) * width;
        st.ring.make_exclusive()?;
        let pooled = push_and_pool(
            self.backend.as_ref(),
            &mut st.ring,
            cw.ratio,
            cw.dim,
            pos,
            &input.a[span.clone()],
            &input.z[span],
        );
        if let Some((w, raw)) = pooled {
            debug_assert_eq!(
                w,
                st.entries.len(),
                "compressed entries are appended in order"
            );
            let mut c = vec![0f32; cw.dim];
            self.backend
                .rms_norm(&raw, Some(&cw.norm), cw.dim, self.eps(), &mut c);
            self.backend
                .rope(&mut c, cw.dim, &[cw.ratio * w], &self.rope_compress, false);
            if hadamard {
                self.backend.hadamard(&mut c, cw.dim);
            }
            st.entries.push(self.backend.as_ref(), &c)?;
        }
        Ok(())
    }

    /// Attention for T rows of normalised input `x` [T, D] (row i of sequence `rows.seq[i]` at
    /// position `rows.positions[i]`), updating each sequence's layer state.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention(
        &self,
        layer: &str,
        w: &AttentionWeights,
        ratio: usize,
        x: &[f32],
        rows: &RowMap,
        states: &mut [&mut LayerState],
        taps: &mut Taps<'_>,
    ) -> Result<AttentionOut, ForwardError> {
        let cfg = &self.cfg;
        let positions = &rows.positions[..];
        let t = positions.len();
        let (h, hd, rd) = (cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim);
        let rope = if ratio == 0 {
            &self.rope_plain
        } else {
            &self.rope_compress
        };
        let head_positions: Vec<usize> = positions
            .iter()
            .flat_map(|&p| std::iter::repeat_n(p, h))
            .collect();

        // Queries: low-rank, normed, per-head RMS-normalised, rotated.
        let cq_raw = self.project(&w.wq_a, x, t);
        let mut cq = vec![0f32; cq_raw.len()];
        self.backend.rms_norm(
            &cq_raw,
            Some(&w.q_norm),
            cfg.q_lora_rank,
            self.eps(),
            &mut cq,
        );
        let q_raw = self.project(&w.wq_b, &cq, t);
        let mut q = vec![0f32; q_raw.len()];
        self.backend.rms_norm(&q_raw, None, hd, self.eps(), &mut q);
        self.backend.rope(&mut q, hd, &head_positions, rope, false);
        taps.record(layer, "attn.q", &q);

        // The single KV head (K = V).
        let kv_raw = self.project(&w.wkv, x, t);
        let mut kv = vec![0f32; kv_raw.len()];
        self.backend
            .rms_norm(&kv_raw, Some(&w.kv_norm), hd, self.eps(), &mut kv);
        self.backend.rope(&mut kv, hd, positions, rope, false);
        taps.record(layer, "attn.kv", &kv);

        let comp_in = w
            .compressor
            .as_ref()
            .map(|cw| self.compressor_input(cw, x, positions));
        // Indexer queries and head weights.
        let idx_in = w.indexer.as_ref().map(|iw| {
            let (inh, id) = (cfg.index_n_heads, cfg.index_head_dim);
            let mut qi = self.project(&iw.wq_b, &cq, t);
            let ipos: Vec<usize> = positions
                .iter()
                .flat_map(|&p| std::iter::repeat_n(p, inh))
                .collect();
            self.backend
                .rope(&mut qi, id, &ipos, &self.rope_compress, false);
            self.backend.hadamard(&mut qi, id);
            self.backend
                .round_index_rows(self.numerics.index_k_dtype, &mut qi, id);
            let mut hw = vec![0f32; t * inh];
            self.backend.linear(&iw.weights_proj, x, t, &mut hw);
            let s = 1.0 / ((id as f64).sqrt() * (inh as f64).sqrt());
            hw.iter_mut().for_each(|v| *v = (f64::from(*v) * s) as f32);
            (qi, hw, self.compressor_input(&iw.compressor, x, positions))
        });
        if let Some((qi, hw, _)) = &idx_in {
            taps.record(layer, "indexer.q", qi);
            taps.record(layer, "indexer.weights", hw);
        }

        let window = cfg.sliding_window;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut o = vec![0f32; t * h * hd];
        let mut selected = (ratio == 4).then(Vec::new);
        let be = self.backend.as_ref();
        for (i, &p) in positions.iter().enumerate() {
            let st = &mut *states[rows.seq[i]];
            st.swa.push(be, &kv[i * hd..(i + 1) * hd])?;
            debug_assert_eq!(st.swa.len(), p + 1);
            if let (Some(cw), Some(cs), Some(ci)) = (&w.compressor, &mut st.compressor, &comp_in) {
                self.compress_step(cw, cs, ci, i, p, false)?;
            }
            if let (Some(iw), Some(is), Some((_, _, ci))) = (&w.indexer, &mut st.indexer, &idx_in) {
                self.compress_step(&iw.compressor, is, ci, i, p, true)?;
            }
            let mut keys = st.swa.gather(be, (p + 1).saturating_sub(window)..=p)?;
            match ratio {
                0 => {}
                4 => {
                    let (qi, hw, _) = idx_in.as_ref().expect("ratio-4 layers have an indexer");
                    let is = st
                        .indexer
                        .as_ref()
                        .expect("ratio-4 layers have indexer state");
                    let n = (p + 1) / 4;
                    let (inh, id) = (cfg.index_n_heads, cfg.index_head_dim);
                    let ikeys = is.entries.gather(be, 0..n)?;
                    let mut scores = vec![0f32; n];
                    self.backend.indexer_scores(
                        &qi[i * inh * id..(i + 1) * inh * id],
                        &hw[i * inh..(i + 1) * inh],
                        id,
                        &ikeys,
                        &mut scores,
                    );
                    let chosen = self.backend.topk(&scores, cfg.index_topk);
                    let cs = st
                        .compressor
                        .as_ref()
                        .expect("ratio-4 layers have a compressor");
                    keys.extend(cs.entries.gather(be, chosen.iter().copied())?);
                    if let Some(sel) = selected.as_mut() {
                        sel.push(chosen.iter().map(|&j| j as u32).collect());
                    }
                }
                _ => {
                    let cs = st
                        .compressor
                        .as_ref()
                        .expect("compressed layers have a compressor");
                    keys.extend(cs.entries.gather(be, 0..(p + 1) / ratio)?);
                }
            }
            self.backend.sparse_attention(
                &q[i * h * hd..(i + 1) * h * hd],
                hd,
                &keys,
                &w.sink,
                scale,
                &mut o[i * h * hd..(i + 1) * h * hd],
            );
        }
        self.backend.rope(&mut o, hd, &head_positions, rope, true);
        taps.record(layer, "attn.o", &o);
        debug_assert!(rd <= hd);

        // Grouped low-rank output: u_g = W_oa^(g)·o_g (dequantized, no activation quantization).
        let groups = w.wo_a.len();
        let gw = h * hd / groups;
        let ol = cfg.o_lora_rank;
        let mut u = vec![0f32; t * groups * ol];
        for (g, wg) in w.wo_a.iter().enumerate() {
            let og: Vec<f32> = (0..t)
                .flat_map(|i| {
                    o[i * h * hd + g * gw..i * h * hd + (g + 1) * gw]
                        .iter()
                        .copied()
                })
                .collect();
            let mut ug = vec![0f32; t * ol];
            self.backend.linear(wg, &og, t, &mut ug);
            for i in 0..t {
                u[i * groups * ol + g * ol..i * groups * ol + (g + 1) * ol]
                    .copy_from_slice(&ug[i * ol..(i + 1) * ol]);
            }
        }
        let y = self.project(&w.wo_b, &u, t);
        taps.record(layer, "attn.out", &y);
        Ok(AttentionOut { y, selected })
    }
}

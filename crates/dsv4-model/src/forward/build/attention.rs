//! The attention half of a block's plan: the query's low-rank projections on the main stream;
//! the KV chain, the compressor and the C4 indexer on side streams after `fork` (see the
//! module above for the events); attention over the window and the compressed entries once the
//! main stream has joined them; then the output projections and the residual post-mix.

use super::{Builder, MAIN, Pre, StepKind, Streams, loc_width};
use crate::forward::op::{BlockRef, Chain, OpKind, Sub};
use dsv4_plan::BufferId;

impl Builder<'_> {
    /// The attention half of a block: x → x1.
    pub(super) fn attention(
        &mut self,
        b: BlockRef,
        ratio: usize,
        x: BufferId,
        st: &Streams,
    ) -> BufferId {
        let c = self.cfg;
        let s = b.scope();
        let blk = Some(b);
        let (d, hd) = (c.hidden_size, c.head_dim);
        let loc = self.t(&s, "loc", loc_width(ratio));
        let sl = self.all(loc);
        self.launch(OpKind::Locate, blk, MAIN, vec![], vec![sl], &[], &[]);
        let Pre { sxn, fork, post } = self.hc_pre_norm(b, Sub::Attn, x);

        let cq = self.t(&s, "cq", c.q_lora_rank);
        let q_ready = if ratio == 4 {
            self.event(&s, "q_lora_ready")
        } else {
            None
        };
        let (w, scq) = (self.weight(&s, "attn.wq_a"), self.all(cq));
        self.launch(
            OpKind::QA,
            blk,
            MAIN,
            vec![sxn, w],
            vec![scq],
            &[],
            &[q_ready],
        );
        let q = self.t(&s, "q", c.num_attention_heads * hd);
        let (w, sq) = (self.weight(&s, "attn.wq_b"), self.all(q));
        self.launch(OpKind::QB, blk, MAIN, vec![scq, w], vec![sq], &[], &[]);

        let kv = self.t(&s, "kv", hd);
        let kv_done = self.event(&s, "kv_done");
        let decode = self.spec.kind == StepKind::Decode;
        let (w, skv) = (self.weight(&s, "attn.wkv"), self.all(kv));
        let kv_rec = if decode { None } else { kv_done };
        self.launch(
            OpKind::Kv,
            blk,
            st.kv,
            vec![sxn, w],
            vec![skv],
            &[fork],
            &[kv_rec],
        );
        let swa = self.pool(&s, "swa_kv");
        if decode {
            let r = vec![skv, sl];
            self.launch(OpKind::SwaStore, blk, st.kv, r, vec![swa], &[], &[kv_done]);
        }
        let mut join = vec![kv_done];
        let mut att_reads = vec![sq];
        let mut att_writes = Vec::new();
        let mut pool_reads = vec![swa];
        if !decode {
            att_reads.extend([skv, sl]);
            att_writes.push(swa);
        }
        if ratio > 0 {
            let width = if ratio == 4 { 2 * hd } else { hd };
            let (a, z) = (self.t(&s, "a", width), self.t(&s, "z", width));
            let (sa, sz) = (self.all(a), self.all(z));
            let (wk, wg) = (
                self.weight(&s, "attn.compressor.wkv"),
                self.weight(&s, "attn.compressor.wgate"),
            );
            let ci = OpKind::CompressorIn(Chain::Attn);
            self.launch(
                ci,
                blk,
                st.comp,
                vec![sxn, wk, wg],
                vec![sa, sz],
                &[fork],
                &[],
            );
            let done = self.event(&s, "compressor_done");
            let (ring, kvp) = if ratio == 4 {
                ("c4_state", "c4_kv")
            } else {
                ("c128_state", "c128_kv")
            };
            let (pr, pk) = (self.pool(&s, ring), self.pool(&s, kvp));
            let cp = OpKind::Compress(Chain::Attn);
            self.launch(
                cp,
                blk,
                st.comp,
                vec![sa, sz, sl, pr],
                vec![pr, pk],
                &[],
                &[done],
            );
            join.push(done);
            pool_reads.push(pk);
        }
        if ratio == 4 {
            let id = c.index_head_dim;
            let (a, z) = (self.t(&s, "ia", 2 * id), self.t(&s, "iz", 2 * id));
            let (sa, sz) = (self.all(a), self.all(z));
            let (wk, wg) = (
                self.weight(&s, "attn.indexer.compressor.wkv"),
                self.weight(&s, "attn.indexer.compressor.wgate"),
            );
            let ci = OpKind::CompressorIn(Chain::Indexer);
            self.launch(
                ci,
                blk,
                st.idx,
                vec![sxn, wk, wg],
                vec![sa, sz],
                &[fork],
                &[],
            );
            let (pr, pk) = (self.pool(&s, "c4_index_state"), self.pool(&s, "c4_index_k"));
            let cp = OpKind::Compress(Chain::Indexer);
            self.launch(
                cp,
                blk,
                st.idx,
                vec![sa, sz, sl, pr],
                vec![pr, pk],
                &[],
                &[],
            );
            let qi = self.t(&s, "qi", c.index_n_heads * id);
            let (iq_ready, w_ready) = (
                self.event(&s, "indexer_q_ready"),
                self.event(&s, "weights_ready"),
            );
            let (w, sqi) = (self.weight(&s, "attn.indexer.wq_b"), self.all(qi));
            let waits = [fork, q_ready];
            self.launch(
                OpKind::IndexerQ,
                blk,
                st.idx_q,
                vec![scq, w],
                vec![sqi],
                &waits,
                &[iq_ready],
            );
            let hw = self.t(&s, "hw", c.index_n_heads);
            let (w, shw) = (self.weight(&s, "attn.indexer.weights_proj"), self.all(hw));
            let wr = OpKind::IndexerWeights;
            self.launch(
                wr,
                blk,
                st.idx_w,
                vec![sxn, w],
                vec![shw],
                &[fork],
                &[w_ready],
            );
            let topk = self.t(&s, "topk", c.index_topk);
            let done = self.event(&s, "indexer_done");
            let stk = self.all(topk);
            let tk = OpKind::IndexerTopk;
            let waits = [iq_ready, w_ready];
            self.launch(
                tk,
                blk,
                st.idx,
                vec![sqi, shw, pk],
                vec![stk],
                &waits,
                &[done],
            );
            join.push(done);
            att_reads.push(stk);
        }
        let o = self.t(&s, "o", c.num_attention_heads * hd);
        let so = self.all(o);
        att_reads.extend(pool_reads);
        att_writes.insert(0, so);
        let w = self.weight(&s, "attn.attn_sink");
        att_reads.push(w);
        let att = OpKind::Attention { stores: !decode };
        self.launch(att, blk, MAIN, att_reads, att_writes, &join, &[]);
        let ou = self.t(&s, "ou", c.o_groups * c.o_lora_rank);
        let (w, sou) = (self.weight(&s, "attn.wo_a"), self.all(ou));
        self.launch(OpKind::OutA, blk, MAIN, vec![so, w], vec![sou], &[], &[]);
        let y = self.t(&s, "y", d);
        let (w, sy) = (self.weight(&s, "attn.wo_b"), self.all(y));
        self.launch(OpKind::OutB, blk, MAIN, vec![sou, w], vec![sy], &[], &[]);
        self.hc_post(b, Sub::Attn, post, sy)
    }
}

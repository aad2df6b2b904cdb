//! Builders of DSV4 step plans: the launches of one prefill or decode step of a batch, from the
//! model's config alone (no weights), so `dsv4 plan show` works for any config.json.
//!
//! Serial plans put every launch on the main stream. Multi-stream overlap plans follow
//! SGLang's DeepSeek-V4 attention (`MQALayer._forward_prepare_multi_stream` and the C4
//! indexer's): after the attention norm the main stream records `fork`; the KV chain, the
//! compressor and the indexer run on side streams that wait for it; the indexer's query
//! waits for `q_lora_ready` (recorded after wq_a) and its head weights run on a fourth
//! stream; the indexer's top-k waits for both (`indexer_q_ready`, `weights_ready`); the
//! main stream joins all side streams before attention. The shared expert runs on its own
//! stream after the FFN norm and is joined before the MoE sum. Launches are listed in the
//! serial order in every mode, so observers see the same tap order.

mod attention;

use super::exec::{ExecOptions, Fault};
use super::op::{BlockRef, Op, OpKind, Sub};
use crate::ModelConfig;
use dsv4_plan::{BufferClass, BufferId, EventId, Launch, Plan, PlanBuilder, Slice, StreamId};
use serde::Serialize;

/// What a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Any mix of prompt chunks and decode tokens (attention stores each SWA row itself).
    Prefill,
    /// One token per sequence (SWA rows are stored by the KV chain before attention).
    Decode,
}

/// The shape of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct PlanSpec {
    /// Prefill or decode.
    pub kind: StepKind,
    /// Rows (tokens) the buffers hold: the batch, or its bucket for captured plans.
    pub rows: usize,
    /// Rows the head computes logits for (0 ..= `rows`): fewer than `rows` gathers them first
    /// (a prefill step needs only each sequence's last rows, unless it scores its prompt);
    /// none leaves the head out (a step of prompt chunks that end no prompt).
    pub head_rows: usize,
    /// KV, compressor, indexer and shared-expert chains on side streams.
    pub overlap: bool,
    /// The MTP draft layer instead of the main model.
    pub mtp: bool,
}

/// Words per row of a block's location table (SWA; + ring, entry; + indexer ring, entry).
pub fn loc_width(ratio: usize) -> usize {
    match ratio {
        0 => 1,
        4 => 5,
        _ => 3,
    }
}

/// Nominal size of a pool region in a plan (pools live outside the arena).
const POOL_REGION: u64 = 1 << 40;

struct Builder<'c> {
    pb: PlanBuilder<Op>,
    cfg: &'c ModelConfig,
    spec: PlanSpec,
}

/// The side streams of an overlap plan.
struct Streams {
    kv: StreamId,
    comp: StreamId,
    idx: StreamId,
    idx_q: StreamId,
    idx_w: StreamId,
    shared: StreamId,
}

/// What [`Builder::hc_pre_norm`] leaves for the rest of a block half.
struct Pre {
    /// The normed input the half's chains read.
    sxn: Slice,
    /// Recorded after the norm; side streams wait for it (overlap plans only).
    fork: Option<EventId>,
    /// What [`Builder::hc_post`] needs.
    post: Post,
}

/// The residual streams and mixing weights a block half's post-mix reads.
struct Post {
    sx: Slice,
    sp: Slice,
    sc: Slice,
}

/// The plan names of a block half's mHC buffers, weights and event.
struct HalfNames {
    u: &'static str,
    post: &'static str,
    comb: &'static str,
    xn: &'static str,
    out: &'static str,
    hc: &'static str,
    norm: &'static str,
    fork: &'static str,
}

impl HalfNames {
    fn of(sub: Sub) -> Self {
        match sub {
            Sub::Attn => HalfNames {
                u: "u",
                post: "post",
                comb: "comb",
                xn: "xn",
                out: "x1",
                hc: "hc_attn",
                norm: "attn_norm",
                fork: "fork",
            },
            Sub::Ffn => HalfNames {
                u: "u2",
                post: "post2",
                comb: "comb2",
                xn: "xn2",
                out: "x2",
                hc: "hc_ffn",
                norm: "ffn_norm",
                fork: "ffn_fork",
            },
        }
    }
}

const MAIN: StreamId = StreamId(0);

impl Builder<'_> {
    fn t(&mut self, scope: &str, name: &str, width: usize) -> BufferId {
        self.t_rows(scope, name, self.spec.rows, width)
    }

    /// A transient buffer of `rows` rows (the head's, when it gathers fewer rows).
    fn t_rows(&mut self, scope: &str, name: &str, rows: usize, width: usize) -> BufferId {
        let bytes = (rows * width * 4) as u64;
        self.pb.buffer(BufferClass::Transient, scope, name, bytes)
    }

    fn all(&self, b: BufferId) -> Slice {
        self.pb.all(b)
    }

    fn weight(&mut self, scope: &str, name: &str) -> Slice {
        let b = self.pb.persistent(BufferClass::Weight, scope, name, 0);
        self.pb.all(b)
    }

    fn pool(&mut self, scope: &str, name: &str) -> Slice {
        let b = self
            .pb
            .persistent(BufferClass::Pool, scope, name, POOL_REGION);
        self.pb.all(b)
    }

    fn event(&mut self, scope: &str, name: &str) -> Option<EventId> {
        self.spec
            .overlap
            .then(|| self.pb.event(format!("{scope}.{name}")))
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        kind: OpKind,
        block: Option<BlockRef>,
        stream: StreamId,
        reads: Vec<Slice>,
        writes: Vec<Slice>,
        waits: &[Option<EventId>],
        records: &[Option<EventId>],
    ) {
        let stream = if self.spec.overlap { stream } else { MAIN };
        self.pb.push(Launch {
            op: Op { kind, block },
            scope: block.map_or(String::new(), BlockRef::scope),
            name: kind.name().to_string(),
            stream,
            reads,
            writes,
            waits: waits.iter().flatten().copied().collect(),
            records: records.iter().flatten().copied().collect(),
        });
    }

    fn streams(&mut self) -> Streams {
        if !self.spec.overlap {
            return Streams {
                kv: MAIN,
                comp: MAIN,
                idx: MAIN,
                idx_q: MAIN,
                idx_w: MAIN,
                shared: MAIN,
            };
        }
        Streams {
            kv: self.pb.stream("kv"),
            comp: self.pb.stream("compressor"),
            idx: self.pb.stream("indexer"),
            idx_q: self.pb.stream("indexer_q"),
            idx_w: self.pb.stream("indexer_weights"),
            shared: self.pb.stream("shared_expert"),
        }
    }

    /// The mHC pre-mix and the norm that open a block half: the normed input, the event
    /// side streams wait for, and what the closing [`Self::hc_post`] mixes with.
    fn hc_pre_norm(&mut self, b: BlockRef, sub: Sub, x: BufferId) -> Pre {
        let c = self.cfg;
        let s = b.scope();
        let blk = Some(b);
        let (d, m) = (c.hidden_size, c.hc_mult);
        let n = HalfNames::of(sub);
        let (u, post, comb) = (
            self.t(&s, n.u, d),
            self.t(&s, n.post, m),
            self.t(&s, n.comb, m * m),
        );
        let w = self.weight(&s, n.hc);
        let (sx, su, sp, sc) = (self.all(x), self.all(u), self.all(post), self.all(comb));
        self.launch(
            OpKind::HcPre(sub),
            blk,
            MAIN,
            vec![sx, w],
            vec![su, sp, sc],
            &[],
            &[],
        );
        let xn = self.t(&s, n.xn, d);
        let fork = self.event(&s, n.fork);
        let (w, sxn) = (self.weight(&s, n.norm), self.all(xn));
        self.launch(
            OpKind::Norm(sub),
            blk,
            MAIN,
            vec![su, w],
            vec![sxn],
            &[],
            &[fork],
        );
        let post = Post { sx, sp, sc };
        Pre { sxn, fork, post }
    }

    /// The mHC post-mix that closes a block half: the half's output `sy` back into the
    /// residual streams, as a new buffer.
    fn hc_post(&mut self, b: BlockRef, sub: Sub, post: Post, sy: Slice) -> BufferId {
        let c = self.cfg;
        let s = b.scope();
        let out = self.t(&s, HalfNames::of(sub).out, c.hc_mult * c.hidden_size);
        let so = self.all(out);
        let reads = vec![post.sx, sy, post.sp, post.sc];
        self.launch(
            OpKind::HcPost(sub),
            Some(b),
            MAIN,
            reads,
            vec![so],
            &[],
            &[],
        );
        out
    }

    /// The MoE half of a block: x1 → x2.
    fn moe(
        &mut self,
        b: BlockRef,
        hash: bool,
        x1: BufferId,
        tokens: BufferId,
        st: &Streams,
    ) -> BufferId {
        let c = self.cfg;
        let s = b.scope();
        let blk = Some(b);
        let d = c.hidden_size;
        let Pre { sxn, fork, post } = self.hc_pre_norm(b, Sub::Ffn, x1);
        let k = c.num_experts_per_tok;
        let routes = self.t(&s, "routes", 2 * k);
        let mut reads = vec![sxn];
        if hash {
            reads.push(self.all(tokens));
        }
        reads.push(self.weight(&s, "ffn.gate"));
        let sr = self.all(routes);
        self.launch(OpKind::Router, blk, MAIN, reads, vec![sr], &[], &[]);
        let ys = self.t(&s, "ys", d);
        let done = self.event(&s, "shared_done");
        let (w, sys) = (self.weight(&s, "ffn.shared_experts"), self.all(ys));
        self.launch(
            OpKind::SharedExpert,
            blk,
            st.shared,
            vec![sxn, w],
            vec![sys],
            &[fork],
            &[done],
        );
        let yr = self.t(&s, "yr", d);
        let (w, syr) = (self.weight(&s, "ffn.experts"), self.all(yr));
        self.launch(
            OpKind::RoutedExperts,
            blk,
            MAIN,
            vec![sxn, sr, w],
            vec![syr],
            &[],
            &[],
        );
        let y = self.t(&s, "y2", d);
        let sy = self.all(y);
        self.launch(
            OpKind::MoeSum,
            blk,
            MAIN,
            vec![syr, sys],
            vec![sy],
            &[done],
            &[],
        );
        self.hc_post(b, Sub::Ffn, post, sy)
    }

    fn head(&mut self, blk: Option<BlockRef>, x: BufferId) {
        let c = self.cfg;
        let s = blk.map_or(String::new(), BlockRef::scope);
        let (d, m) = (c.hidden_size, c.hc_mult);
        let rows = self.spec.head_rows.min(self.spec.rows);
        if rows == 0 {
            return;
        }
        let x = if rows < self.spec.rows {
            let xs = self.t_rows(&s, "x_head", rows, m * d);
            let (sx, sxs) = (self.all(x), self.all(xs));
            self.launch(OpKind::HeadRows, blk, MAIN, vec![sx], vec![sxs], &[], &[]);
            xs
        } else {
            x
        };
        let (h, hn, logits) = (
            self.t_rows(&s, "h", rows, d),
            self.t_rows(&s, "hn", rows, d),
            self.t_rows(&s, "logits", rows, c.vocab_size),
        );
        let (sx, sh, shn, sl) = (self.all(x), self.all(h), self.all(hn), self.all(logits));
        let w = self.weight(&s, "hc_head");
        self.launch(OpKind::HcHead, blk, MAIN, vec![sx, w], vec![sh], &[], &[]);
        let w = self.weight(&s, "norm");
        self.launch(
            OpKind::FinalNorm,
            blk,
            MAIN,
            vec![sh, w],
            vec![shn],
            &[],
            &[],
        );
        let w = self.weight("", "head");
        self.launch(OpKind::Logits, blk, MAIN, vec![shn, w], vec![sl], &[], &[]);
        self.pb.host_read(logits);
    }
}

/// The plan of one step of `spec` for a model of config `cfg`, with fresh (eager) buffers.
/// [`build_plan`] with the plan-level faults of `exec` applied: under `missing-stream-event`
/// no launch waits for a block's `shared_done` event, so in an overlap plan the MoE sum on the
/// main stream may read the shared expert's output (written on its side stream) before it is
/// written. Serial issue order hides that; the verifier, the threaded executor and device
/// streams do not.
pub fn build_plan_under(cfg: &ModelConfig, spec: PlanSpec, exec: &ExecOptions) -> Plan<Op> {
    let mut plan = build_plan(cfg, spec);
    if exec.has(Fault::MissingStreamEvent) {
        let dropped: Vec<EventId> = (0..plan.events.len())
            .filter(|&i| plan.events[i].ends_with(".shared_done"))
            .map(|i| EventId(i as u32))
            .collect();
        for l in &mut plan.launches {
            l.waits.retain(|e| !dropped.contains(e));
        }
    }
    plan
}

/// The plan of one step (fault-free; see [`build_plan_under`] for a profile's faults).
pub fn build_plan(cfg: &ModelConfig, spec: PlanSpec) -> Plan<Op> {
    let mut b = Builder {
        pb: PlanBuilder::new(),
        cfg,
        spec,
    };
    let st = b.streams();
    let (m, d) = (cfg.hc_mult, cfg.hidden_size);
    let tokens = b.t("", "tokens", 1);
    let stok = b.all(tokens);
    let x0 = b.t("", "x", m * d);
    let sx0 = b.all(x0);
    if spec.mtp {
        let resid = b.t("", "residual_in", m * d);
        let sr = b.all(resid);
        b.launch(OpKind::Upload, None, MAIN, vec![], vec![stok, sr], &[], &[]);
        let mtp = Some(BlockRef::Mtp);
        let (we, wh) = (b.weight("mtp.0", "e_proj"), b.weight("mtp.0", "h_proj"));
        b.launch(
            OpKind::MtpInput,
            mtp,
            MAIN,
            vec![stok, sr, we, wh],
            vec![sx0],
            &[],
            &[],
        );
        let ratio = cfg.compress_ratio(cfg.num_hidden_layers);
        let x1 = b.attention(BlockRef::Mtp, ratio, x0, &st);
        let x2 = b.moe(BlockRef::Mtp, false, x1, tokens, &st);
        b.head(mtp, x2);
        return b.pb.finish();
    }
    b.launch(OpKind::Upload, None, MAIN, vec![], vec![stok], &[], &[]);
    let w = b.weight("", "embed");
    b.launch(
        OpKind::Embed,
        None,
        MAIN,
        vec![stok, w],
        vec![sx0],
        &[],
        &[],
    );
    let mut x = x0;
    for i in 0..cfg.num_hidden_layers {
        let blk = BlockRef::Main(i);
        let x1 = b.attention(blk, cfg.compress_ratio(i), x, &st);
        x = b.moe(blk, cfg.is_hash_layer(i), x1, tokens, &st);
    }
    b.pb.host_read(x);
    b.head(None, x);
    b.pb.finish()
}

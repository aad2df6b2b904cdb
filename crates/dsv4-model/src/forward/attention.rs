//! The attention launch: per row, (store its SWA entry,) gather the window and the compressed
//! entries, attend, then inverse RoPE. On host slices ([`Run::attention`]); or, where the
//! device attends ([`dsv4_kernels::DeviceOps::attends_on_device`]), with the queries and the
//! output in device memory ([`Run::attention_side_resident`], which also runs the indexer's
//! top-k on its device-resident queries and head weights): the stores and the gathers run on
//! the host as before (they deal in pages), only the small operands come back (the SWA rows
//! to store; the locations and the top-k have host copies), and the queries never do.

use super::ForwardError;
use super::build::loc_width;
use super::cached::{ATTENTION_CHUNK, missing, store_entry};
use super::gather::RowGather;
use super::op::{BlockRef, OpKind};
use super::resident::DeviceMemory;
use super::run::{Run, lock};
use super::state::NO_LOCATION;
use dsv4_kernels::{DevSlice, DeviceOps, RopeTable};
use dsv4_plan::{BufferClass, Slice};

/// A chunk of rows ready to attend: the gather of their keys, the first row, and each row's
/// range of the gathered keys (one more start than rows).
type Chunk<'g, 'b> = (RowGather<'b>, usize, &'g [usize]);

impl Run<'_> {
    /// `[q, (kv, loc), (topk)] → [o]` on host slices: see the module docs.
    pub(crate) fn attention(
        &self,
        b: Option<BlockRef>,
        stores: bool,
        ins: &[Vec<f32>],
    ) -> Result<Vec<f32>, ForwardError> {
        let cfg = &self.model.cfg;
        let hhd = cfg.num_attention_heads * cfg.head_dim;
        let q = &ins[0];
        let mut o = vec![0f32; self.bound.rows * hhd];
        let sink = &self.weights(b)?.attn.sink;
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        self.attend_rows(b, stores, &ins[1..], &mut |(gather, first, starts)| {
            let rows = starts.len() - 1;
            let span = first * hhd..(first + rows) * hhd;
            gather.attend(
                &q[span.clone()],
                cfg.head_dim,
                starts,
                sink,
                scale,
                &mut o[span],
            )
        })?;
        let (rope, hp) = self.attention_rope(b)?;
        self.model
            .backend
            .rope(&mut o, cfg.head_dim, &hp, rope, true);
        Ok(o)
    }

    /// [`Run::attention`] with the queries `q` and the output `out` in device memory; `rest`
    /// holds the launch's other operands, `[(kv, loc), (topk)]`.
    fn attention_dev(
        &self,
        dev: &dyn DeviceOps,
        b: Option<BlockRef>,
        stores: bool,
        q: DevSlice,
        rest: &[Vec<f32>],
        out: DevSlice,
    ) -> Result<(), ForwardError> {
        let cfg = &self.model.cfg;
        let hhd = cfg.num_attention_heads * cfg.head_dim;
        let sink = &self.weights(b)?.attn.sink;
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        self.attend_rows(b, stores, rest, &mut |(gather, first, starts)| {
            let rows = starts.len() - 1;
            let (qs, os) = (
                q.sub(first * hhd, rows * hhd),
                out.sub(first * hhd, rows * hhd),
            );
            gather.attend_on(dev, qs, cfg.head_dim, starts, sink, scale, os)
        })?;
        let (rope, hp) = self.attention_rope(b)?;
        Ok(dev.rope(out, cfg.head_dim, &hp, rope, true)?)
    }

    /// The inverse RoPE of a layer's attention output: its table, and each output row's
    /// position (a row per head).
    fn attention_rope(
        &self,
        b: Option<BlockRef>,
    ) -> Result<(&RopeTable, Vec<usize>), ForwardError> {
        let h = self.model.cfg.num_attention_heads;
        let hp: Vec<usize> = self.bound.positions[..self.bound.rows]
            .iter()
            .flat_map(|&p| std::iter::repeat_n(p, h))
            .collect();
        let rope = if self.weights(b)?.ratio == 0 {
            &self.model.rope_plain
        } else {
            &self.model.rope_compress
        };
        Ok((rope, hp))
    }

    /// Every row's keys gathered and handed to `attend` a chunk of rows at a time. `rest` is
    /// `[(kv, loc), (topk)]`. Each row's keys — its window rows, then its compressed entries
    /// (SWA and compressed stores share one KV format) — are gathered right after its own SWA
    /// store (a later row's store may overwrite a ring slot this row reads; the gather copies
    /// the pages then), and a chunk's rows attend in one call that decodes their keys where it
    /// attends (on a GPU the keys never come back to the host). The gather shares rows: a
    /// chunk's rows of one sequence read mostly the same window rows and compressed entries,
    /// copied (and uploaded) once. That is sound because a ring keeps at least the window: a
    /// row is overwritten only by a store `window` or more positions on, and the rows from
    /// then on no longer read it.
    fn attend_rows(
        &self,
        b: Option<BlockRef>,
        stores: bool,
        rest: &[Vec<f32>],
        attend: &mut dyn for<'g> FnMut(Chunk<'g, '_>) -> Result<(), ForwardError>,
    ) -> Result<(), ForwardError> {
        let bw = self.weights(b)?;
        let bb = self.bound_block(b)?;
        let cfg = &self.model.cfg;
        let (window, k) = (cfg.sliding_window, cfg.index_topk);
        let ratio = bw.ratio;
        let (kv, loc) = if stores {
            (Some(&rest[0]), Some(&rest[1]))
        } else {
            (None, None)
        };
        let topk = (ratio == 4).then(|| &rest[if stores { 2 } else { 0 }]);
        let lw = loc_width(ratio);
        let be = self.model.backend.as_ref();
        let t = self.bound.rows;
        let mut gather = RowGather::sharing(be);
        let (mut starts, mut first) = (vec![0usize], 0usize);
        // Every row's SWA entry is encoded up front in one call (the encoding does not depend
        // on the pages); each is put into its page right before the row's gather.
        let encoded = match kv {
            Some(kv) => Some(self.encode_swa(bb, kv)?),
            None => None,
        };
        for (i, &p) in self.bound.positions[..t].iter().enumerate() {
            let st = self.row_state(bb, i);
            if let (Some((fmt, entries)), Some(loc)) = (&encoded, loc) {
                let store = st.swa.store().ok_or_else(|| missing("SWA store"))?;
                let e = fmt.entry_bytes();
                let entry = &entries[i * e..(i + 1) * e];
                store_entry(store.as_ref(), fmt, loc[i * lw].to_bits(), entry)?;
            }
            let mut keys_of_row = gather.add(&st.swa, (p + 1).saturating_sub(window)..=p, false)?;
            if let Some(cs) = st.compressor.as_ref() {
                let n = (p + 1) / ratio;
                if let Some(topk) = topk {
                    let chosen: Vec<usize> = topk[i * k..(i + 1) * k]
                        .iter()
                        .map(|v| v.to_bits())
                        .take_while(|&j| j != NO_LOCATION)
                        .map(|j| j as usize % n.max(1))
                        .collect();
                    keys_of_row += gather.add(&cs.entries, chosen.iter().copied(), false)?;
                } else {
                    keys_of_row += gather.add(&cs.entries, 0..n, false)?;
                }
            }
            starts.push(starts[starts.len() - 1] + keys_of_row);
            if starts.len() > ATTENTION_CHUNK || i + 1 == t {
                let rows = starts.len() - 1;
                let taken = std::mem::replace(&mut gather, RowGather::sharing(be));
                attend((taken, first, &starts))?;
                (first, starts) = (first + rows, vec![0]);
            }
        }
        Ok(())
    }

    /// How many of a launch of `kind`'s leading transient reads stay in device memory, run as
    /// [`Run::attention_side_resident`]: where the step's memory is on a device that attends,
    /// attention's queries (1), and the indexer's queries and head weights (2) unless the step
    /// records the indexer's scores (read on the host); else none.
    pub(crate) fn device_reads(&self, kind: OpKind) -> usize {
        let super::run::Memory::Device(dm) = &self.mem else {
            return 0;
        };
        if !dm.dev.attends_on_device() {
            return 0;
        }
        match kind {
            OpKind::Attention { .. } => 1,
            OpKind::IndexerTopk if !self.choices.record_scores => 2,
            _ => 0,
        }
    }

    /// Run attention or indexer launch `i` with its queries in device memory (where
    /// [`Run::device_reads`] says so): its other operands come from their host copies or one
    /// read (with those of the host launches after it in `next`, as any host launch's do);
    /// attention writes its output in device memory, the indexer its ids from the host.
    pub(crate) fn attention_side_resident(
        &self,
        dm: &DeviceMemory<'_>,
        i: usize,
        next: &[usize],
    ) -> Result<(), ForwardError> {
        let l = &self.plan.launches[i];
        let on_device = self.device_reads(l.op.kind);
        let transient = |s: &&Slice| self.plan.buffer(s.buffer).class == BufferClass::Transient;
        let reads: Vec<&Slice> = l.reads.iter().filter(transient).collect();
        let writes: Vec<&Slice> = l.writes.iter().filter(transient).collect();
        let (Some(o), true) = (writes.first(), on_device > 0 && reads.len() >= on_device) else {
            return Err(ForwardError::Plan {
                message: format!(
                    "launch `{}` has no device-resident queries or no output",
                    l.op.kind.name()
                ),
            });
        };
        let n = |b| self.words_per_row(b) * self.bound.rows;
        let dev_ins = reads[..on_device]
            .iter()
            .map(|s| dm.input(self.plan, s.buffer, n(s.buffer)))
            .collect::<Result<Vec<_>, _>>()?;
        let host = &reads[on_device..];
        let mut wanted: Vec<_> = host.iter().map(|s| (s.buffer, n(s.buffer))).collect();
        wanted.extend(self.host_run_reads(i, next).into_iter().map(|b| (b, n(b))));
        let mut rest = if wanted.is_empty() {
            Vec::new()
        } else {
            dm.read_many(self.plan, &wanted)?
        };
        rest.truncate(host.len());
        match l.op.kind {
            OpKind::Attention { stores } => {
                let os = dm.output(self.plan, o.buffer, n(o.buffer))?;
                dm.written_on_device(os);
                self.attention_dev(dm.dev, l.op.block, stores, dev_ins[0], &rest, os)?;
                if let (Some(taps), Some(_)) = (&self.out.taps, l.op.kind.tap()) {
                    lock(taps)[i] = Some(dm.dev.read(os)?);
                }
            }
            OpKind::IndexerTopk => {
                let out = self.indexer_topk_dev(dm.dev, l.op.block, dev_ins[0], dev_ins[1])?;
                dm.write(self.plan, o.buffer, &out)?;
            }
            other => {
                return Err(ForwardError::Plan {
                    message: format!("launch `{}` is not attention-side", other.name()),
                });
            }
        }
        Ok(())
    }
}

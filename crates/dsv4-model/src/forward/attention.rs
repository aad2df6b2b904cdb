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
use dsv4_kernels::attention_device::words_bytes;
use dsv4_kernels::{DevSlice, DeviceOps, RopeTable, RowFormat};
use dsv4_plan::{BufferClass, Slice};

/// A chunk of rows ready to attend: the gather of their keys, the first row, and each row's
/// range of the gathered keys (one more start than rows).
type Chunk<'g, 'b> = (RowGather<'b>, usize, &'g [usize]);

/// The rows an attention launch that stores them (prefill) puts into the SWA stores: on the
/// host (encoded by the backend), or already encoded (on the device).
enum KvRows<'a> {
    Host(&'a [f32]),
    Encoded(RowFormat, Vec<u8>),
}

/// An attention launch's operands besides the queries: the SWA rows and their locations when
/// it stores them, and the indexer's top-k on a ratio-4 layer.
struct Stored<'a> {
    kv: Option<KvRows<'a>>,
    loc: Option<&'a [f32]>,
    topk: Option<&'a [f32]>,
}

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
        let rest = &ins[1..];
        let ops = match stores {
            true => Stored {
                kv: Some(KvRows::Host(&rest[0])),
                loc: Some(&rest[1]),
                topk: rest.get(2).map(Vec::as_slice),
            },
            false => Stored {
                kv: None,
                loc: None,
                topk: rest.first().map(Vec::as_slice),
            },
        };
        self.attend_rows(b, ops, &mut |(gather, first, starts)| {
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

    /// [`Run::attention`] with the queries `q` and the output `out` in device memory, and the
    /// SWA rows to store already encoded (`kv`: their format and entries) when it stores them;
    /// `rest` holds the launch's host operands, `[(loc), (topk)]`.
    fn attention_dev(
        &self,
        dev: &dyn DeviceOps,
        b: Option<BlockRef>,
        (q, kv): (DevSlice, Option<(RowFormat, Vec<u8>)>),
        rest: &[Vec<f32>],
        out: DevSlice,
    ) -> Result<(), ForwardError> {
        let cfg = &self.model.cfg;
        let hhd = cfg.num_attention_heads * cfg.head_dim;
        let sink = &self.weights(b)?.attn.sink;
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        let ops = match kv {
            Some((fmt, entries)) => Stored {
                kv: Some(KvRows::Encoded(fmt, entries)),
                loc: Some(&rest[0]),
                topk: rest.get(1).map(Vec::as_slice),
            },
            None => Stored {
                kv: None,
                loc: None,
                topk: rest.first().map(Vec::as_slice),
            },
        };
        self.attend_rows(b, ops, &mut |(gather, first, starts)| {
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

    /// Every row's keys gathered and handed to `attend` a chunk of rows at a time, after each
    /// row's SWA entry is stored when `ops` has the rows. Each row's keys — its window rows, then its compressed entries
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
        ops: Stored<'_>,
        attend: &mut dyn for<'g> FnMut(Chunk<'g, '_>) -> Result<(), ForwardError>,
    ) -> Result<(), ForwardError> {
        let bw = self.weights(b)?;
        let bb = self.bound_block(b)?;
        let cfg = &self.model.cfg;
        let (window, k) = (cfg.sliding_window, cfg.index_topk);
        let ratio = bw.ratio;
        let loc = ops.loc;
        let topk = match (ratio == 4, ops.topk) {
            (true, Some(t)) => Some(t),
            (true, None) => {
                return Err(ForwardError::Plan {
                    message: "a ratio-4 layer's attention without the indexer's top-k".into(),
                });
            }
            (false, _) => None,
        };
        let lw = loc_width(ratio);
        let be = self.model.backend.as_ref();
        let t = self.bound.rows;
        let mut gather = RowGather::sharing(be);
        let (mut starts, mut first) = (vec![0usize], 0usize);
        // Every row's SWA entry is encoded up front in one call (the encoding does not depend
        // on the pages); each is put into its page right before the row's gather.
        let encoded = match ops.kv {
            Some(KvRows::Host(kv)) => Some(self.encode_swa(bb, kv)?),
            Some(KvRows::Encoded(fmt, entries)) => Some((fmt, entries)),
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

    /// Whether a launch of `kind` runs as [`Run::attention_side_resident`], and then how many
    /// of its leading transient reads stay in device memory: where the step's memory is on a
    /// device that attends, attention (its queries, and the SWA rows it stores), the SWA store
    /// (its rows), the indexer's top-k (its queries and head weights; not when the step
    /// records the indexer's scores, read on the host) and the compressors (none: their rows
    /// go into the host's rings, but the completed windows are pooled and encoded on the
    /// device); else None.
    pub(crate) fn attention_side(&self, kind: OpKind) -> Option<usize> {
        let super::run::Memory::Device(dm) = &self.mem else {
            return None;
        };
        if !dm.dev.attends_on_device() {
            return None;
        }
        match kind {
            OpKind::Attention { stores } => Some(1 + usize::from(stores)),
            OpKind::SwaStore => Some(1),
            OpKind::IndexerTopk if !self.choices.record_scores => Some(2),
            OpKind::Compress(_) => Some(0),
            _ => None,
        }
    }

    /// Run an attention-side launch `i` (where [`Run::attention_side`] says so) with its
    /// leading operands in device memory: its other operands come from their host copies or
    /// one read (with those of the host launches after it in `next`, as any host launch's do);
    /// attention writes its output in device memory, the indexer its ids from the host.
    pub(crate) fn attention_side_resident(
        &self,
        dm: &DeviceMemory<'_>,
        i: usize,
        next: &[usize],
    ) -> Result<(), ForwardError> {
        let l = &self.plan.launches[i];
        let on_device = self.attention_side(l.op.kind).unwrap_or(0);
        let transient = |s: &&Slice| self.plan.buffer(s.buffer).class == BufferClass::Transient;
        let reads: Vec<&Slice> = l.reads.iter().filter(transient).collect();
        let writes: Vec<&Slice> = l.writes.iter().filter(transient).collect();
        if reads.len() < on_device {
            return Err(ForwardError::Plan {
                message: format!(
                    "launch `{}` reads {} transient buffers, {on_device} of them on the device",
                    l.op.kind.name(),
                    reads.len()
                ),
            });
        }
        let output = || {
            writes.first().ok_or_else(|| ForwardError::Plan {
                message: format!("launch `{}` has no output", l.op.kind.name()),
            })
        };
        let n = |b| self.live_words(b);
        let dev_ins = reads[..on_device]
            .iter()
            .map(|s| dm.input(self.plan, s.buffer, n(s.buffer)))
            .collect::<Result<Vec<_>, _>>()?;
        let (b, stream) = (l.op.block, l.stream.0 as usize);
        // The SWA rows a launch stores are encoded on the device first, and their entries
        // come back in the same read as the launch's host operands.
        let kv = match l.op.kind {
            OpKind::SwaStore => Some(dev_ins[0]),
            OpKind::Attention { stores: true } => Some(dev_ins[1]),
            _ => None,
        };
        let encoded = match kv {
            Some(kv) => {
                let scratch = (dm.scratch(), stream);
                Some(self.encode_swa_into(dm.dev, scratch, self.bound_block(b)?, kv)?)
            }
            None => None,
        };
        let extra: Vec<DevSlice> = encoded
            .iter()
            .map(|(_, tmp, bytes)| tmp.s.prefix(bytes.div_ceil(4)))
            .collect();
        let host = &reads[on_device..];
        let mut wanted: Vec<_> = host.iter().map(|s| (s.buffer, n(s.buffer))).collect();
        let (run, across) = self.host_run_reads(i, next);
        wanted.extend(run.into_iter().map(|b| (b, n(b))));
        let (mut rest, words) = if wanted.is_empty() && extra.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            self.read_for_run(dm, (&wanted, &extra), across)?
        };
        rest.truncate(host.len());
        let entries = match (encoded, words.first()) {
            (Some((fmt, _, bytes)), Some(w)) => Some((fmt, words_bytes(w, bytes))),
            _ => None,
        };
        match l.op.kind {
            OpKind::Attention { stores } => {
                let o = output()?;
                let os = dm.output(self.plan, o.buffer, n(o.buffer))?;
                dm.written_on_device(os);
                if stores && entries.is_none() {
                    return Err(ForwardError::Plan {
                        message: "a storing attention launch without its encoded rows".into(),
                    });
                }
                self.attention_dev(dm.dev, b, (dev_ins[0], entries), &rest, os)?;
                if let (Some(taps), Some(_)) = (&self.out.taps, l.op.kind.tap()) {
                    lock(taps)[i] = Some(dm.dev.read(os)?);
                }
            }
            OpKind::IndexerTopk => {
                let out = self.indexer_topk_dev(dm.dev, b, dev_ins[0], dev_ins[1])?;
                dm.write(self.plan, output()?.buffer, &out)?;
            }
            OpKind::SwaStore => {
                let (fmt, entries) = entries.ok_or_else(|| ForwardError::Plan {
                    message: "an SWA store without its encoded rows".into(),
                })?;
                self.store_swa(b, &fmt, &entries, &rest[0])?;
            }
            OpKind::Compress(chain) => {
                let scratch = (dm.scratch(), stream);
                let ins = (&rest[0][..], &rest[1][..], &rest[2][..]);
                self.compress_dev(dm.dev, scratch, b, chain, ins)?;
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

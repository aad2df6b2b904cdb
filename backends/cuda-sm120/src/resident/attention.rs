//! The attention-side ops on device-resident queries. `DeviceOps::paged_attention`: sparse
//! attention from queries in device memory into device memory, the keys still in their cache
//! pages (`ops::attention`'s paged path, its launches unchanged, so bitwise the host op's
//! output); nothing is read back and nothing waits: the page cache's slots the launches read
//! are released by an event on the calling stream. `DeviceOps::paged_indexer_topk`: the
//! indexer's selection from queries and head weights in device memory (`ops::indexer`'s paged
//! path); only the chosen ids come back.
//!
//! Both run the host ops' code paths, which use the device's temporaries and page cache, not
//! the op set's state: their slices are resolved under the state lock, and the ops run after
//! it is released, so a blocking read-back here does not hold up other threads' resident ops.

use super::{Resident, dev_err, op_err};
use crate::Core;
use crate::device::DevPtr;
use crate::ops::attention::launch_pool;
use crate::ops::cache::encode_at;
use crate::ops::indexer::{IndexerInput, paged_indexer_io};
use crate::ops::paged_attention::{QueryIo, paged_attention_io};
use dsv4_kernels::attention_device::{check_encode, check_pool, layout_error};
use dsv4_kernels::{DevSlice, KernelError, PagedAttention, PagedIndexer, RowFormat};
use std::sync::Arc;

impl Resident {
    /// `DeviceOps::paged_attention`.
    pub(super) fn attend(
        &self,
        k: &PagedAttention<'_>,
        q: DevSlice,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        let op = "paged_attention";
        self.attention_offered(op)?;
        k.check_call(q, out)?;
        let [qp, outp] = self.resolve(op, [("q", q), ("out", out)])?;
        let io = QueryIo::Device { q: qp, out: outp };
        match paged_attention_io(&self.counted(), op, k, io) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(layout_error(&e)),
            Err(e) => Err(dev_err(op, e)),
        }
    }

    /// `DeviceOps::paged_indexer_topk`.
    pub(super) fn select(
        &self,
        k: &PagedIndexer<'_>,
        q: DevSlice,
        w: DevSlice,
    ) -> Result<Vec<Vec<usize>>, KernelError> {
        let op = "paged_indexer_topk";
        self.attention_offered(op)?;
        k.check_call(q, w)?;
        let [qp, wp] = self.resolve(op, [("q", q), ("w", w)])?;
        let input = IndexerInput::Device { q: qp, w: wp };
        match paged_indexer_io(&self.counted(), op, k, input) {
            Ok(Ok(chosen)) => Ok(chosen),
            Ok(Err(e)) => Err(op_err(format!("{op}: the keys' pages: {e}"))),
            Err(e) => Err(dev_err(op, e)),
        }
    }

    /// `DeviceOps::cache_encode_into`: the encoder's launches, nothing read back.
    pub(super) fn encode_into(
        &self,
        fmt: &RowFormat,
        x: DevSlice,
        out: DevSlice,
    ) -> Result<(), KernelError> {
        let op = "cache_encode_into";
        self.attention_offered(op)?;
        check_encode(fmt, x, out)?;
        self.resident_op(op, |cx| {
            let (xp, outp) = (cx.slice("x", x)?, cx.slice("out", out)?);
            match encode_at(cx.core, fmt, xp, x.len, outp) {
                Ok(Ok(())) => {
                    cx.dispatched(1);
                    Ok(())
                }
                Ok(Err(e)) => Err(op_err(format!("{op}: {e}"))),
                Err(e) => Err(dev_err(op, e)),
            }
        })
    }

    /// `DeviceOps::softmax_pool_rows`: one launch, nothing read back.
    pub(super) fn pool(
        &self,
        (a, z, out): (DevSlice, DevSlice, DevSlice),
        windows: usize,
        rows: usize,
        width: usize,
    ) -> Result<(), KernelError> {
        let op = "softmax_pool_rows";
        self.attention_offered(op)?;
        check_pool(a, z, windows, rows, width, out)?;
        self.resident_op(op, |cx| {
            let (ap, zp, op_) = (cx.slice("a", a)?, cx.slice("z", z)?, cx.slice("out", out)?);
            let r = launch_pool(cx.core, ap, zp, op_, windows, rows, width);
            cx.run(r)?;
            cx.dispatched(1);
            Ok(())
        })
    }

    /// Err unless the op set attends on the device (`backend.cuda_attention`).
    fn attention_offered(&self, op: &str) -> Result<(), KernelError> {
        if self.attends {
            Ok(())
        } else {
            Err(op_err(format!(
                "{op}: this backend attends from host copies (backend.cuda_attention = host)"
            )))
        }
    }

    /// The device address ranges of `slices`, checked as every op checks its slices.
    fn resolve<const N: usize>(
        &self,
        op: &'static str,
        slices: [(&str, DevSlice); N],
    ) -> Result<[DevPtr; N], KernelError> {
        let mut out = [DevPtr { ptr: 0, bytes: 0 }; N];
        self.resident_op(op, |cx| {
            for (o, (what, s)) in out.iter_mut().zip(slices) {
                *o = cx.slice(what, s)?;
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The op set's core with its device handle counting into the host ops' counters (these
    /// ops run the host ops' code paths).
    fn counted(&self) -> Core {
        Core {
            dev: self.core.dev.counted(Arc::clone(&self.host_traffic)),
            ..self.core.clone()
        }
    }
}

//! `DeviceOps::paged_attention`: sparse attention from queries in device memory into device
//! memory, the keys still in their cache pages (`ops::attention`'s paged path, its launches
//! unchanged, so bitwise the host op's output). Nothing is read back and nothing waits: the
//! page cache's slots the launches read are released by an event on the calling stream.

use super::{Ctx, dev_err};
use crate::Core;
use crate::ops::attention::{PagedKeys, PagedSelection, QueryIo, paged_attention_io};
use dsv4_kernels::attention_device::layout_error;
use dsv4_kernels::{DevSlice, DeviceStats, KernelError, PagedAttention};
use std::sync::{Arc, Mutex};

/// `DeviceOps::paged_attention`; the uploads and launches count into `traffic` (the host ops'
/// counters, which share these code paths).
pub(super) fn paged_attention(
    cx: &mut Ctx<'_>,
    k: &PagedAttention<'_>,
    q: DevSlice,
    out: DevSlice,
    traffic: &Arc<Mutex<DeviceStats>>,
) -> Result<(), KernelError> {
    k.check_call(q, out)?;
    let (qp, op) = (cx.slice("q", q)?, cx.slice("out", out)?);
    let core = Core {
        dev: cx.core.dev.counted(Arc::clone(traffic)),
        ..cx.core.clone()
    };
    let paged = PagedKeys {
        pages: k.pages,
        tags: k.tags,
        origins: k.origins,
    };
    let keys = PagedSelection {
        fmt: k.fmt,
        paged: &paged,
        rows: k.rows,
        key_ids: k.key_ids,
        key_starts: k.key_starts,
    };
    let io = QueryIo::Device { q: qp, out: op };
    match paged_attention_io(&core, cx.op, &keys, k.sink, k.scale, io) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(layout_error(&e)),
        Err(e) => Err(dev_err(cx.op, e)),
    }
}

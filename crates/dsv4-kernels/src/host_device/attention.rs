//! [`HostDevice`]'s attention-side ops (with [`HostDevice::with_device_attention`]): the
//! executable specification of `DeviceOps::paged_attention`, `paged_indexer_topk`,
//! `cache_encode_into` and `softmax_pool_rows`, the host ops over the device's buffers.

use super::{HostDevice, R, err};
use crate::attention_device::{bytes_words, check_encode, check_pool};
use crate::device::{DevSlice, ensure};
use crate::{PagedAttention, PagedIndexer, RowFormat};
use std::sync::atomic::Ordering;

/// `DeviceOps::paged_attention`: [`PagedAttention::host`] of the queries.
pub(super) fn paged_attention(
    dev: &HostDevice,
    keys: &PagedAttention<'_>,
    q: DevSlice,
    out: DevSlice,
) -> R<()> {
    let op = "paged_attention";
    ensure(dev.attends, op, || "not supported on this device".into())?;
    keys.check_call(q, out)?;
    let [qv] = dev.load(op, [("q", q)])?;
    dev.check_out(op, &[("out", out)])?;
    let o = dev.host(op, |be| keys.host(be, &qv))??;
    dev.store(op, &[(out, &o)])
}

/// `DeviceOps::paged_indexer_topk`: [`PagedIndexer::host`] of the queries and weights; the
/// ids come back (one dispatch and one read).
pub(super) fn paged_indexer_topk(
    dev: &HostDevice,
    keys: &PagedIndexer<'_>,
    q: DevSlice,
    w: DevSlice,
) -> R<Vec<Vec<usize>>> {
    let op = "paged_indexer_topk";
    ensure(dev.attends, op, || "not supported on this device".into())?;
    keys.check_call(q, w)?;
    let [qv, wv] = dev.load(op, [("q", q), ("w", w)])?;
    let chosen = dev.host(op, |be| keys.host(be, &qv, &wv))??;
    dev.count(|st| {
        st.dispatches += 1;
        st.submissions += 1;
        st.reads += 1;
        st.read_bytes += 4 * chosen.iter().map(Vec::len).sum::<usize>() as u64;
    });
    dev.pending.store(0, Ordering::Relaxed);
    Ok(chosen)
}

/// `DeviceOps::cache_encode_into`: the host encoder's bytes, packed into `out`'s words.
pub(super) fn cache_encode_into(
    dev: &HostDevice,
    fmt: &RowFormat,
    x: DevSlice,
    out: DevSlice,
) -> R<()> {
    let op = "cache_encode_into";
    ensure(dev.attends, op, || "not supported on this device".into())?;
    check_encode(fmt, x, out)?;
    let [xv] = dev.load(op, [("x", x)])?;
    dev.check_out(op, &[("out", out)])?;
    let bytes = dev
        .host(op, |be| be.cache_encode_rows(fmt, &xv))?
        .map_err(|e| err(format!("{op}: {e}")))?;
    dev.store(op, &[(out, &bytes_words(&bytes))])
}

/// `DeviceOps::softmax_pool_rows`: the host pooling of the windows' rows.
pub(super) fn softmax_pool_rows(
    dev: &HostDevice,
    (a, z, out): (DevSlice, DevSlice, DevSlice),
    windows: usize,
    rows: usize,
    width: usize,
) -> R<()> {
    let op = "softmax_pool_rows";
    ensure(dev.attends, op, || "not supported on this device".into())?;
    check_pool(a, z, windows, rows, width, out)?;
    let [av, zv] = dev.load(op, [("a", a), ("z", z)])?;
    dev.check_out(op, &[("out", out)])?;
    let mut o = vec![0f32; out.len];
    dev.host(op, |be| {
        be.softmax_pool_rows(&av, &zv, windows, rows, width, &mut o)
    })?;
    dev.store(op, &[(out, &o)])
}

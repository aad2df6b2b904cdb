//! Operand checks of the [`super::DeviceOps`] implementations: each names the op and says what
//! does not fit, as a [`KernelError::Device`], before anything is queued.

use super::DevSlice;
use crate::{KernelError, Linear, RopeTable};

/// The error of a slice whose length does not match what an op needs.
pub fn check_len(op: &str, what: &str, s: DevSlice, want: usize) -> Result<(), KernelError> {
    if s.len == want {
        Ok(())
    } else {
        Err(KernelError::Device {
            message: format!("{op}: {what} has {} words, the op needs {want}", s.len),
        })
    }
}

/// The operands of [`super::DeviceOps::grouped_linear`] checked: at least one weight, all of one
/// format and shape, `starts` as documented there, x and out of that many rows. Returns
/// (rows, in, out).
pub fn check_groups(
    weights: &[&Linear],
    x: DevSlice,
    starts: &[usize],
    out: DevSlice,
) -> Result<(usize, usize, usize), KernelError> {
    let op = "grouped_linear";
    let first = weights.first().ok_or_else(|| KernelError::Device {
        message: format!("{op}: no weights"),
    })?;
    let (i, o) = (first.in_dim, first.out_dim);
    if let Some(w) = weights
        .iter()
        .find(|w| (w.in_dim, w.out_dim, w.format) != (i, o, first.format))
    {
        return Err(KernelError::Device {
            message: format!(
                "{op}: weight `{}` is {:?} [{}, {}], `{}` is {:?} [{o}, {i}]: one shape and format only",
                w.name, w.format, w.out_dim, w.in_dim, first.name, first.format
            ),
        });
    }
    let rows = x.len / i.max(1);
    check_starts(op, starts, weights.len(), rows)?;
    check_len(op, "x", x, rows * i)?;
    check_len(op, "out", out, rows * o)?;
    Ok((rows, i, o))
}

/// Row-group starts checked: one more than `groups`, beginning at 0, never decreasing, ending
/// at `rows`.
pub fn check_starts(
    op: &str,
    starts: &[usize],
    groups: usize,
    rows: usize,
) -> Result<(), KernelError> {
    ensure(starts.len() == groups + 1, op, || {
        format!(
            "{} row starts for {groups} groups (one more than the groups)",
            starts.len()
        )
    })?;
    ensure(
        starts[0] == 0 && starts.windows(2).all(|w| w[0] <= w[1]) && starts[groups] == rows,
        op,
        || format!("row starts {starts:?} do not begin at 0, never decrease and end at {rows}"),
    )
}

/// The operands of [`super::DeviceOps::scatter_add_groups`] checked, but for the destination
/// (`scatter_add_rows` checks the indices against it): the starts, the source length, and no
/// row index twice in one group.
pub fn check_scatter_groups(
    src: DevSlice,
    idx: &[u32],
    starts: &[usize],
    width: usize,
) -> Result<(), KernelError> {
    let op = "scatter_add_groups";
    check_starts(op, starts, starts.len().saturating_sub(1), idx.len())?;
    check_len(op, "src", src, idx.len() * width)?;
    for k in starts.windows(2) {
        let mut g = idx[k[0]..k[1]].to_vec();
        g.sort_unstable();
        if let Some(w) = g.windows(2).find(|w| w[0] == w[1]) {
            return Err(KernelError::Device {
                message: format!("{op}: row index {} twice in the group of rows {k:?}", w[0]),
            });
        }
    }
    Ok(())
}

/// `Err` (a [`KernelError::Device`] naming `op`) with the message `what()` unless `ok`.
pub fn ensure(ok: bool, op: &str, what: impl FnOnce() -> String) -> Result<(), KernelError> {
    if ok {
        Ok(())
    } else {
        Err(KernelError::Device {
            message: format!("{op}: {}", what()),
        })
    }
}

/// Rows of `s` for rows of `dim` words (dim > 0 and dividing the length).
pub fn rows_of(op: &str, what: &str, s: DevSlice, dim: usize) -> Result<usize, KernelError> {
    ensure(dim > 0 && s.len.is_multiple_of(dim), op, || {
        format!("{what} has {} words, not rows of {dim}", s.len)
    })?;
    Ok(s.len / dim)
}

/// The operands of [`super::DeviceOps::rope`] checked: one position per row of `x`, and a table whose
/// rotated dims fit the rows. Returns the rows.
pub fn check_rope(
    x: DevSlice,
    dim: usize,
    positions: &[usize],
    table: &RopeTable,
) -> Result<usize, KernelError> {
    let rows = rows_of("rope", "x", x, dim)?;
    ensure(positions.len() == rows, "rope", || {
        format!("{} positions for {rows} rows", positions.len())
    })?;
    ensure(
        table.rd <= dim && table.rd.is_multiple_of(2) && table.freqs.len() >= table.rd / 2,
        "rope",
        || format!("a table of rd {} does not fit rows of {dim}", table.rd),
    )?;
    Ok(rows)
}

/// The slices of [`super::DeviceOps::mhc_pre`] for `t` tokens of M = `m` streams of D = `d`
/// checked: x [t, M, D], u [t, D], post [t, M], comb [t, M, M].
pub fn check_mhc_pre(
    x: DevSlice,
    t: usize,
    (m, d): (usize, usize),
    u: DevSlice,
    post: DevSlice,
    comb: DevSlice,
) -> Result<(), KernelError> {
    let op = "mhc_pre";
    check_len(op, "x", x, t * m * d)?;
    check_len(op, "u", u, t * d)?;
    check_len(op, "post", post, t * m)?;
    check_len(op, "comb", comb, t * m * m)
}

/// The operands of [`super::DeviceOps::mhc_post`] checked: y rows of `d` (t of them), x and out
/// [t, m, d], post [t, m], comb [t, m, m]. Returns t.
pub fn check_mhc_post(
    (x, y, post, comb): (DevSlice, DevSlice, DevSlice, DevSlice),
    m: usize,
    d: usize,
    out: DevSlice,
) -> Result<usize, KernelError> {
    let op = "mhc_post";
    let t = rows_of(op, "y", y, d)?;
    check_len(op, "x", x, t * m * d)?;
    check_len(op, "post", post, t * m)?;
    check_len(op, "comb", comb, t * m * m)?;
    check_len(op, "out", out, t * m * d)?;
    Ok(t)
}

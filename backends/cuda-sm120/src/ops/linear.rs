//! `linear` on the device: weights are uploaded once, in their stored format, into a
//! [`WeightCache`] and decoded by the `linear_*` kernels (kernels/linear.cu); each call uploads
//! its input rows and reads the output back.

use super::decode_shape::{DecodeShapes, format_key};
use crate::bench::CallTimes;
use crate::device::{DevBuf, DevPtr, KArg, blocks_for};
use crate::{Core, CudaError, Device};
use dsv4_kernels::{Linear, WeightFormat, WeightKey};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Threads per block of the batched linear kernels (LIN_THREADS, and LMMA_THREADS of the
/// tensor-core ones): four warps. The decode kernels' blocks have their shape's
/// ([`super::decode_shape::DecodeShape`]).
const THREADS: u32 = 128;
/// Warps per block.
const WARPS: usize = THREADS as usize / 32;
/// Rows one warp multiplies per weight pass in the batched (`_r8`) kernels.
const ROWS_PER_PASS: usize = 8;
/// Weight rows are stored with a pitch that is a multiple of this many bytes (one chunk).
const CHUNK: usize = 16;
/// Output columns one block of the tensor-core (`_mma`) kernels computes (one m16 tile).
const MMA_COLS: usize = 16;
/// Rows one block of the tensor-core kernels computes (LMMA_ROWS: eight n8 tiles).
const MMA_ROWS: usize = 64;

/// Which kernels run the linears. Each weight format takes one kernel family for every row
/// count (one row, a batch, a prefill, a grouped launch), so a row's bits never depend on the
/// call it is in (batch invariance) on either path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinearPath {
    /// The SIMT kernels (kernels/linear.cu): sums in the backend's `acc_t` (f64 sums are the
    /// reference's bits).
    #[default]
    Simt,
    /// Tensor cores (kernels/linear_mma.cu, sm_80+): mma.sync bf16 tiles with f32 sums for bf16,
    /// fp8 and MXFP4 weights (x split into three exact bf16 parts); f32 weights keep the SIMT
    /// kernels. Within f32 tolerance of the reference, not bitwise.
    Mma,
}

impl LinearPath {
    /// The path named `s` (`simt` or `mma`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" | "simt" => Ok(Self::Simt),
            "mma" => Ok(Self::Mma),
            other => Err(format!(
                "unknown linear path `{other}`: expected simt or mma"
            )),
        }
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            Self::Simt => "simt",
            Self::Mma => "mma",
        }
    }

    /// Whether weights of format `f` take the tensor-core kernels on this path.
    pub(crate) fn uses_mma(self, f: WeightFormat) -> bool {
        self == Self::Mma && f != WeightFormat::F32
    }
}

/// A weight resident on the device in its stored format.
#[derive(Debug)]
pub struct ResidentWeight {
    format: WeightFormat,
    out_dim: usize,
    in_dim: usize,
    /// Bytes per stored weight row on the device (a multiple of 16; zero padded).
    pitch: usize,
    /// Elements per stored weight row (in_dim rounded up to whole 16-byte chunks): the row
    /// pitch the kernels read inputs with.
    xpitch: usize,
    data: DevBuf,
    scale: DevBuf,
}

impl ResidentWeight {
    /// Elements per padded input row the kernels read (`in_dim` rounded up to whole chunks).
    pub fn xpitch(&self) -> usize {
        self.xpitch
    }

    /// Its stored format.
    pub(crate) fn format(&self) -> WeightFormat {
        self.format
    }

    /// The device addresses of its weight bytes and scale bytes (a grouped table's entry).
    pub(crate) fn addresses(&self) -> [u64; 2] {
        [self.data.ptr(), self.scale.ptr()]
    }

    /// Bytes this weight holds on the device.
    pub fn bytes(&self) -> usize {
        self.data.bytes() + self.scale.bytes()
    }

    fn upload(dev: &Device, w: &Linear) -> Result<Self, CudaError> {
        let (o, i) = (w.out_dim, w.in_dim);
        // Elements per 16-byte chunk.
        let per_chunk = match w.format {
            WeightFormat::F32 => 4,
            WeightFormat::Bf16 => 8,
            WeightFormat::Fp8Block => 16,
            WeightFormat::Mxfp4 => 32,
        };
        let row = i * CHUNK / per_chunk;
        let pitch = row.next_multiple_of(CHUNK);
        let xpitch = pitch / CHUNK * per_chunk;
        if u32::try_from(o).is_err()
            || u32::try_from(i).is_err()
            || u32::try_from(pitch).is_err()
            || u32::try_from(xpitch).is_err()
        {
            return Err(CudaError::TooLarge {
                what: format!("weight `{}` [{o}, {i}] has dimensions beyond 2^32", w.name),
            });
        }
        let data = if pitch == row {
            dev.upload(&w.data)?
        } else {
            let mut padded = vec![0u8; o * pitch];
            for (dst, src) in padded.chunks_exact_mut(pitch).zip(w.data.chunks_exact(row)) {
                dst[..row].copy_from_slice(src);
            }
            dev.upload(&padded)?
        };
        if data.ptr() % CHUNK as u64 != 0 {
            return Err(CudaError::BadOperands(format!(
                "weight `{}`: the device returned an address ({:#x}) that is not 16-byte aligned",
                w.name,
                data.ptr()
            )));
        }
        let scale = dev.upload(&w.scale)?;
        Ok(Self {
            format: w.format,
            out_dim: o,
            in_dim: i,
            pitch,
            xpitch,
            data,
            scale,
        })
    }
}

/// Linear weights resident on the device, uploaded on first use and kept for the backend's life.
#[derive(Default)]
pub struct WeightCache {
    map: Mutex<HashMap<WeightKey, Arc<ResidentWeight>>>,
}

impl WeightCache {
    /// The resident copy of `w`, uploading it on first use.
    pub fn get(&self, dev: &Device, w: &Linear) -> Result<Arc<ResidentWeight>, CudaError> {
        let key = WeightKey::of(w);
        // Held across the upload so concurrent first uses upload once.
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = map.get(&key) {
            return Ok(Arc::clone(r));
        }
        let r = Arc::new(ResidentWeight::upload(dev, w)?);
        map.insert(key, Arc::clone(&r));
        Ok(r)
    }

    /// Bytes of weights resident on the device.
    pub fn resident_bytes(&self) -> usize {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.values().map(|r| r.bytes()).sum()
    }
}

/// `out[r, o] = Σ_i W[o, i]·x[r, i]` for `rows` rows (x [rows, in], out [rows, out]).
pub fn linear(
    c: &Core,
    w: &Linear,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
) -> Result<(), CudaError> {
    let (o, i) = (w.out_dim, w.in_dim);
    if x.len() != rows * i {
        return Err(CudaError::BadOperands(format!(
            "linear {}: input of {} values is not [rows {rows}, in {i}]",
            w.name,
            x.len()
        )));
    }
    if out.len() != rows * o {
        return Err(CudaError::BadOperands(format!(
            "linear {}: output of {} values is not [rows {rows}, out {o}]",
            w.name,
            out.len()
        )));
    }
    if out.is_empty() {
        return Ok(());
    }
    let rw = c.weights.get(&c.dev, w)?;
    let xb = if rw.xpitch == i {
        c.dev.temp_f32(x)?
    } else {
        // Input rows padded to the weight's pitch, so every chunk's inputs are aligned.
        let mut padded = vec![0f32; rows * rw.xpitch];
        for (dst, src) in padded.chunks_exact_mut(rw.xpitch).zip(x.chunks_exact(i)) {
            dst[..i].copy_from_slice(src);
        }
        c.dev.temp_f32(&padded)?
    };
    let ob = c.dev.temp(out.len() * 4)?;
    launch(c, c.linear, &rw, xb.at(), ob.at(), rows, &w.name)?;
    c.dev.download_f32(&ob, out)
}

/// Launch the linear kernel of `path` for `rows` rows on device-resident operands: `xb` holds
/// rows·xpitch f32 (rows padded to the weight's pitch) at a 16-byte aligned address, `ob`
/// rows·out_dim f32.
pub(crate) fn launch(
    c: &Core,
    path: LinearPath,
    rw: &ResidentWeight,
    xb: DevPtr,
    ob: DevPtr,
    rows: usize,
    name: &str,
) -> Result<(), CudaError> {
    let o = rw.out_dim;
    let rows32 = u32::try_from(rows)
        .map_err(|_| CudaError::BadOperands(format!("linear {name}: {rows} rows")))?;
    let fmt = format_key(rw.format);
    let (cols_per_block, rows_per_block, kernel, threads) = if path.uses_mma(rw.format) {
        (MMA_COLS, MMA_ROWS, format!("linear_{fmt}_mma"), THREADS)
    } else if rows == 1 {
        let s = c.decode.of(rw.format);
        (
            s.block_cols(),
            1,
            s.kernel(rw.format, fmt, false),
            s.threads(),
        )
    } else {
        (WARPS, ROWS_PER_PASS, format!("linear_{fmt}_r8"), THREADS)
    };
    let gy = blocks_for(rows, rows_per_block);
    if gy as usize > MAX_GRID_Y {
        return Err(CudaError::BadOperands(format!(
            "linear {name}: {rows} rows exceed one launch (at most {} rows)",
            MAX_GRID_Y * rows_per_block
        )));
    }
    if xb.bytes < rows * rw.xpitch * 4 || ob.bytes < rows * o * 4 {
        return Err(CudaError::BadOperands(format!(
            "linear {name}: device operands of {} and {} bytes are too small for {rows} rows",
            xb.bytes, ob.bytes
        )));
    }
    if !xb.ptr.is_multiple_of(CHUNK as u64) {
        return Err(CudaError::BadOperands(format!(
            "linear {name}: the input at {:#x} is not 16-byte aligned",
            xb.ptr
        )));
    }
    let args = [
        KArg::Buf(&rw.data),
        KArg::Buf(&rw.scale),
        KArg::Ptr(xb),
        KArg::Ptr(ob),
        KArg::U32(rw.out_dim as u32),
        KArg::U32(rw.in_dim as u32),
        KArg::U32(rw.pitch as u32),
        KArg::U32(rw.xpitch as u32),
        KArg::U32(rows32),
    ];
    let grid = (blocks_for(o, cols_per_block), gy, 1);
    // SAFETY: the arguments follow the kernel's parameter list; the weight holds out_dim rows
    // of `pitch` bytes (and its scales as Linear::new checked them), and the operand sizes were
    // checked above.
    unsafe { c.dev.launch(&kernel, grid, (threads, 1, 1), &args) }
}

/// Bytes of one entry of a grouped launch's table (kernels/linear.cu, `lin_group`): weight
/// bytes and scale bytes (device addresses), first row, rows.
const GROUP_ENTRY: usize = 24;

/// The table of a grouped launch ([`launch_grouped`]) of weights `rws` over the row groups
/// `starts` (as `DeviceOps::grouped_linear` takes them): one entry per block row, and the
/// kernel variant: on the tensor-core path `mma_g` (up to 64 rows an entry), else `g1` (one
/// row an entry) when no group has more than one row, else `g8`.
pub(crate) struct GroupedTable {
    /// The entries' bytes, for the parameter arena.
    pub bytes: Vec<u8>,
    /// The launch's entries and kernel variant.
    pub layout: GroupedLayout,
}

/// What a grouped launch runs over: its table's entries (the grid rows), the rows one entry
/// covers at most, and the kernel variant those imply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupedLayout {
    /// Entries (the launch's grid rows).
    pub entries: usize,
    /// Rows one entry covers at most (1, ROWS_PER_PASS or MMA_ROWS).
    pub per_entry: usize,
    /// Whether the entries are for the tensor-core kernel.
    pub mma: bool,
}

impl GroupedLayout {
    /// The rows an entry covers for weights of `format` on the kernels of `path` when no group
    /// has more than `most` rows, and whether that is the tensor-core kernel.
    fn per_entry(path: LinearPath, format: WeightFormat, most: usize) -> (usize, bool) {
        if path.uses_mma(format) {
            (MMA_ROWS, true)
        } else if most <= 1 {
            (1, false)
        } else {
            (ROWS_PER_PASS, false)
        }
    }

    /// The layout of a table built on the device (`moe_table`, kernels/moe.cu) over `rows`
    /// rows in at most `groups` groups of at most `most` rows each: enough entries for any such
    /// grouping (every group's last entry may be partial), the unused ones running no rows.
    pub(crate) fn bound(
        path: LinearPath,
        format: WeightFormat,
        rows: usize,
        groups: usize,
        most: usize,
    ) -> Self {
        let (per_entry, mma) = Self::per_entry(path, format, most);
        Self {
            entries: rows.div_ceil(per_entry) + groups.min(rows),
            per_entry,
            mma,
        }
    }

    /// Bytes of the table.
    pub(crate) fn bytes(&self) -> usize {
        self.entries * GROUP_ENTRY
    }
}

impl GroupedTable {
    /// The table of `rws` (one weight per group, all of one format) over `starts` (one more
    /// entry, ascending) for the kernels of `path`.
    pub(crate) fn new(
        path: LinearPath,
        rws: &[Arc<ResidentWeight>],
        starts: &[usize],
    ) -> Result<Self, CudaError> {
        let most = starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let format = rws.first().map_or(WeightFormat::F32, |rw| rw.format);
        let (per_entry, mma) = GroupedLayout::per_entry(path, format, most);
        let mut bytes = Vec::new();
        for (rw, w) in rws.iter().zip(starts.windows(2)) {
            for row0 in (w[0]..w[1]).step_by(per_entry) {
                let rows = per_entry.min(w[1] - row0);
                let row0 = u32::try_from(row0).map_err(|_| {
                    CudaError::BadOperands(format!("grouped linear: row {row0} beyond 2^32"))
                })?;
                bytes.extend(rw.addresses().iter().flat_map(|a| a.to_le_bytes()));
                bytes.extend(row0.to_le_bytes());
                bytes.extend((rows as u32).to_le_bytes());
            }
        }
        let entries = bytes.len() / GROUP_ENTRY;
        Ok(Self {
            bytes,
            layout: GroupedLayout {
                entries,
                per_entry,
                mma,
            },
        })
    }
}

/// Most grid rows of one launch (CUDA's limit on gridDim.y).
const MAX_GRID_Y: usize = 65535;

/// The table entries each launch of a grouped linear covers: consecutive runs of at most `max`
/// (the entries are independent block rows, so any split gives the same bits).
fn entry_runs(entries: usize, max: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let max = max.max(1);
    (0..entries)
        .step_by(max)
        .map(move |a| a..(a + max).min(entries))
}

/// Launch the grouped linear kernel (`linear_*_g1` / `_g8`) for a table already on the device
/// at `table` (several launches past 65535 entries): its weights all have `first`'s format,
/// shape and pitch; `xb` holds rows·xpitch f32 at a 16-byte aligned address, `ob` rows·out_dim
/// f32.
pub(crate) fn launch_grouped(
    c: &Core,
    first: &ResidentWeight,
    t: GroupedLayout,
    table: DevPtr,
    xb: DevPtr,
    ob: DevPtr,
    rows: usize,
) -> Result<(), CudaError> {
    if t.entries == 0 {
        return Ok(());
    }
    if xb.bytes < rows * first.xpitch * 4 || ob.bytes < rows * first.out_dim * 4 {
        return Err(CudaError::BadOperands(format!(
            "grouped linear: device operands of {} and {} bytes are too small for {rows} rows",
            xb.bytes, ob.bytes
        )));
    }
    if !xb.ptr.is_multiple_of(CHUNK as u64) || table.bytes < t.bytes() {
        return Err(CudaError::BadOperands(format!(
            "grouped linear: the input at {:#x} is not 16-byte aligned, or the table's {} bytes \
             do not fit {}",
            xb.ptr,
            t.bytes(),
            table.bytes
        )));
    }
    let fmt = format_key(first.format);
    let (cols_per_block, kernel, threads) = if t.mma {
        (MMA_COLS, format!("linear_{fmt}_mma_g"), THREADS)
    } else if t.per_entry == 1 {
        let s = c.decode.of(first.format);
        (
            s.block_cols(),
            s.kernel(first.format, fmt, true),
            s.threads(),
        )
    } else {
        (WARPS, format!("linear_{fmt}_g8"), THREADS)
    };
    for run in entry_runs(t.entries, MAX_GRID_Y) {
        let part = DevPtr {
            ptr: table.ptr + (run.start * GROUP_ENTRY) as u64,
            bytes: run.len() * GROUP_ENTRY,
        };
        let args = [
            KArg::Ptr(part),
            KArg::Ptr(xb),
            KArg::Ptr(ob),
            KArg::U32(first.out_dim as u32),
            KArg::U32(first.in_dim as u32),
            KArg::U32(first.pitch as u32),
            KArg::U32(first.xpitch as u32),
        ];
        let grid = (
            blocks_for(first.out_dim, cols_per_block),
            run.len() as u32,
            1,
        );
        // SAFETY: the arguments follow the kernel's parameter list; every table entry names a
        // resident weight of first's shape and pitch (the caller checked the shapes and
        // formats) and rows inside [0, rows), whose operands were checked above.
        unsafe { c.dev.launch(&kernel, grid, (threads, 1, 1), &args)? };
    }
    Ok(())
}

/// Median seconds per grouped launch of `ws` (a layer's experts: group g is rows
/// `g·rows .. (g+1)·rows`, through `ws[g]`) on the kernels of `path` (one-row kernels of the
/// shapes `decode`), every operand resident on
/// the device, launched from the host and replayed as a graph ([`CallTimes`]): what
/// `dsv4 bench` reports for the grouped kernels. The launches take, in turn, `sets` separately
/// uploaded sets of the weights (at least one), each with its own table (the first set is the
/// backend's cached weights), so weights that fit the L2 cache are still read from memory.
pub fn time_grouped(
    backend: &crate::CudaBackend,
    path: LinearPath,
    decode: DecodeShapes,
    ws: &[Linear],
    rows: usize,
    batches: usize,
    sets: usize,
) -> Result<CallTimes, CudaError> {
    let c = &crate::Core {
        decode,
        ..backend.core.clone()
    };
    let Some(first) = ws.first() else {
        return Err(CudaError::BadOperands("grouped linear: no weights".into()));
    };
    if let Some(w) = ws
        .iter()
        .find(|w| (w.out_dim, w.in_dim, w.format) != (first.out_dim, first.in_dim, first.format))
    {
        return Err(CudaError::BadOperands(format!(
            "grouped linear: `{}` and `{}` differ in shape or format",
            w.name, first.name
        )));
    }
    let starts: Vec<usize> = (0..=ws.len()).map(|g| g * rows).collect();
    let mut runs = Vec::new();
    for set in 0..sets.max(1) {
        let rws = ws
            .iter()
            .map(|w| {
                if set == 0 {
                    c.weights.get(&c.dev, w)
                } else {
                    ResidentWeight::upload(&c.dev, w).map(Arc::new)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let table = GroupedTable::new(path, &rws, &starts)?;
        let at = c.dev.upload(&table.bytes)?;
        runs.push((rws, table, at));
    }
    let total = rows * ws.len();
    let xb = c.dev.temp(total * runs[0].0[0].xpitch * 4)?;
    let ob = c.dev.temp(total * first.out_dim * 4)?;
    let call = |i: usize| {
        let (rws, table, at) = &runs[i % runs.len()];
        launch_grouped(c, &rws[0], table.layout, at.at(), xb.at(), ob.at(), total)
    };
    let mut next = 0;
    let launched = crate::bench::time_op(&c.dev, batches, || {
        next += 1;
        call(next - 1)
    })?;
    // Every set once per graph (at least two calls, so the batch is a graph).
    let graphed = crate::bench::time_graphed(&c.dev, batches, runs.len().max(2), call)?;
    Ok(CallTimes { launched, graphed })
}

/// Median seconds per `linear` of `w` over `rows` rows on the kernels of `path` (one-row
/// kernels of the shapes `decode`), with weights,
/// inputs and outputs all resident on the device (no copies timed), launched from the host and
/// replayed as a graph ([`CallTimes`]): what `dsv4 bench` reports for the kernels. The
/// launches take, in turn, `copies` (at least 1) separately uploaded copies of the weight (the
/// first is the backend's cached one), so a weight smaller than the GPU's L2 cache is read from
/// device memory, as a model's many weights are, and not from the cache.
pub fn time_linear(
    backend: &crate::CudaBackend,
    path: LinearPath,
    decode: DecodeShapes,
    w: &Linear,
    rows: usize,
    batches: usize,
    copies: usize,
) -> Result<CallTimes, CudaError> {
    let c = &crate::Core {
        decode,
        ..backend.core.clone()
    };
    let mut ws = vec![c.weights.get(&c.dev, w)?];
    for _ in 1..copies {
        ws.push(Arc::new(ResidentWeight::upload(&c.dev, w)?));
    }
    let xb = c.dev.temp(rows * ws[0].xpitch * 4)?;
    let ob = c.dev.temp(rows * ws[0].out_dim * 4)?;
    let call = |i: usize| launch(c, path, &ws[i % ws.len()], xb.at(), ob.at(), rows, &w.name);
    let mut next = 0;
    let launched = crate::bench::time_op(&c.dev, batches, || {
        next += 1;
        call(next - 1)
    })?;
    // Every copy once per graph (at least two calls, so the batch is a graph).
    let graphed = crate::bench::time_graphed(&c.dev, batches, ws.len().max(2), call)?;
    Ok(CallTimes { launched, graphed })
}

#[cfg(test)]
mod tests {
    use super::entry_runs;

    #[test]
    fn grouped_launches_split_their_entries_into_runs_that_fit_a_grid() {
        let runs = |n, max| entry_runs(n, max).collect::<Vec<_>>();
        assert_eq!(runs(0, 4), []);
        assert_eq!(runs(3, 4), vec![0..3]);
        assert_eq!(runs(8, 4), [0..4, 4..8]);
        assert_eq!(runs(9, 4), [0..4, 4..8, 8..9]);
        assert_eq!(runs(65536, 65535), [0..65535, 65535..65536]);
    }
}

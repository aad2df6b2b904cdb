//! Host glue of the cache kernels: encode rows into their entries' exact bytes
//! (`cache_encode`, many rows per dispatch) and decode entries back (`cache_decode`), each op
//! one upload of its inputs, one dispatch, one submission and one read-back.

use crate::gpu::{Gpu, Step, copy_f32, grid};
use crate::ops::{index_kind, scratch, upload_bytes, upload_f32};
use crate::setup::Bind;
use dsv4_core::cache::CacheLayoutError;
use dsv4_kernels::RowFormat;

/// The cache kernels' description of a row format: (kind, nd or dim, rd, data row bytes).
fn cache_kind(fmt: &RowFormat) -> (u32, usize, usize, usize) {
    use dsv4_core::KvCacheDtype;
    match fmt {
        RowFormat::Kv(l) => {
            let kind = match l.dtype() {
                KvCacheDtype::Bf16 => 0,
                KvCacheDtype::Fp8 => 1,
            };
            (kind, l.nd(), l.rd(), l.data_row_bytes())
        }
        RowFormat::IndexK(l) => (index_kind(l.dtype()), l.dim(), 0, l.data_row_bytes()),
    }
}

/// Encode the entry on the device; the host places its data and scale bytes at the slot's
/// offsets of the page (which lives in host memory behind the trait).
pub fn cache_store(
    gpu: &Gpu,
    fmt: &RowFormat,
    page: &mut [u8],
    slot: usize,
    values: &[f32],
) -> Result<(), CacheLayoutError> {
    let at = fmt.checked_slot(page.len(), values.len(), slot)?;
    let bytes = encode_rows(gpu, fmt, values);
    let (d, s) = bytes.split_at(at.data.len());
    page[at.data].copy_from_slice(d);
    page[at.scale].copy_from_slice(s);
    Ok(())
}

/// Encode whole rows into their entries back to back (what the trait's default
/// `Backend::cache_encode_rows` gives): one upload of the values, one encode dispatch over all
/// rows, one read-back. Errors are the default's, found before anything runs; no rows → no
/// submission.
pub fn cache_encode_rows(
    gpu: &Gpu,
    fmt: &RowFormat,
    values: &[f32],
) -> Result<Vec<u8>, CacheLayoutError> {
    fmt.checked_encode(values.len())?;
    if values.is_empty() {
        return Ok(Vec::new());
    }
    Ok(encode_rows(gpu, fmt, values))
}

/// The entries of the rows of `values` (at least one row of `fmt.width()` values), encoded in
/// one submission: one dispatch per upload of values and one read-back per output buffer. Both
/// are as large as one binding allows, so a batch needs several only when it does not fit one;
/// values chunks inside one output buffer hold a multiple of 4 rows, so that no output word
/// straddles two dispatches.
fn encode_rows(gpu: &Gpu, fmt: &RowFormat, values: &[f32]) -> Vec<u8> {
    let (kind, nd, rd, data_row) = cache_kind(fmt);
    let (width, e) = (fmt.width(), fmt.entry_bytes());
    let max = gpu.max_binding_bytes() as usize;
    let (out_fit, val_fit) = (max / e, max / (4 * width));
    let (per_out, per_val) = if out_fit >= 4 && val_fit >= 4 {
        (out_fit, (val_fit / 4 * 4).min(out_fit))
    } else {
        let n = out_fit.min(val_fit).max(1);
        (n, n)
    };
    // The values buffers stay alive until the submission.
    let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
    let mut step = gpu.step();
    for out_rows in values.chunks(per_out * width) {
        let bytes = out_rows.len() / width * e;
        let ob = scratch(gpu, "cache entries", bytes);
        for (j, rows) in out_rows.chunks(per_val * width).enumerate() {
            let n = rows.len() / width;
            let vb = upload_f32(gpu, "cache values", rows);
            let first_word = j * per_val * e / 4;
            let params = [
                kind,
                nd as u32,
                rd as u32,
                e as u32,
                data_row as u32,
                n as u32,
                width as u32,
                first_word as u32,
            ];
            step.dispatch(
                "cache_encode",
                &params,
                &[(1, Bind::whole(&vb)), (4, Bind::whole(&ob))],
                grid((n * e).div_ceil(4), 64),
            );
            inputs.push(vb);
        }
        outputs.push((ob, bytes));
    }
    let reads: Vec<_> = outputs.iter().map(|(b, n)| (b, *n)).collect();
    step.finish(&reads).concat()
}

/// Upload the slot's data and scale bytes and decode them on the device.
pub fn cache_load(
    gpu: &Gpu,
    fmt: &RowFormat,
    page: &[u8],
    slot: usize,
    out: &mut [f32],
) -> Result<(), CacheLayoutError> {
    let at = fmt.checked_slot(page.len(), out.len(), slot)?;
    let mut entry = page[at.data.clone()].to_vec();
    entry.extend_from_slice(&page[at.scale.clone()]);
    let table = vec![0, at.data.len() as u32];
    decode(
        gpu,
        fmt,
        &Gathered {
            bytes: entry,
            table,
        },
        out,
    );
    Ok(())
}

/// Decode many rows in one submission: the pages the rows use are uploaded once, concatenated
/// (or, when they would not fit one binding, just the rows' entries), with one decode dispatch
/// over all rows and one read-back. Errors are those the per-row loop of the default
/// `Backend::cache_load_rows` returns, found before anything runs; `out` is then unchanged.
pub fn cache_load_rows(
    gpu: &Gpu,
    fmt: &RowFormat,
    pages: &[&[u8]],
    rows: &[(usize, usize)],
    out: &mut [f32],
) -> Result<(), CacheLayoutError> {
    if let Some(gathered) = gather_rows(gpu, fmt, pages, rows, out.len())? {
        decode(gpu, fmt, &gathered, out);
    }
    Ok(())
}

/// Decode the rows of `gathered` into `out`: one upload of each input, one dispatch, one
/// read-back.
fn decode(gpu: &Gpu, fmt: &RowFormat, gathered: &Gathered, out: &mut [f32]) {
    let n = gathered.table.len() / 2 * fmt.width();
    let mut step = gpu.step();
    let decoded = encode_decode(gpu, &mut step, fmt, gathered);
    copy_f32(&step.finish(&[(&decoded.values, n * 4)])[0], &mut out[..n]);
}

/// What `cache_decode` reads for some rows: the bytes (the used pages, or just the rows'
/// entries when the pages would not fit one binding) and each row's data and scale offsets.
pub(crate) struct Gathered {
    bytes: Vec<u8>,
    table: Vec<u32>,
}

/// `rows` (page, slot) of `pages` as [`Gathered`] bytes, after the per-row loop's checks of
/// every access and of an output of `out_len` values (its error, before anything runs); None
/// when there are no rows.
pub(crate) fn gather_rows(
    gpu: &Gpu,
    fmt: &RowFormat,
    pages: &[&[u8]],
    rows: &[(usize, usize)],
    out_len: usize,
) -> Result<Option<Gathered>, CacheLayoutError> {
    let at = fmt.checked_rows(pages, rows, out_len)?;
    if at.is_empty() {
        return Ok(None);
    }
    // The used pages in first-use order, and where each starts in their concatenation.
    let mut page_at: Vec<Option<usize>> = vec![None; pages.len()];
    let mut used = Vec::new();
    let mut total = 0;
    for &(page, _) in rows {
        if page_at[page].is_none() {
            page_at[page] = Some(total);
            used.push(page);
            total += pages[page].len();
        }
    }
    let entry_bytes = at
        .iter()
        .map(|a| a.data.len() + a.scale.len())
        .sum::<usize>();
    let (bytes, table) = if total <= gpu.max_binding_bytes() as usize {
        let mut bytes = Vec::with_capacity(total);
        for &p in &used {
            bytes.extend_from_slice(pages[p]);
        }
        let table = rows
            .iter()
            .zip(&at)
            .flat_map(|(&(page, _), a)| {
                let p0 = page_at[page].unwrap_or(0);
                [(p0 + a.data.start) as u32, (p0 + a.scale.start) as u32]
            })
            .collect::<Vec<_>>();
        (bytes, table)
    } else {
        let mut bytes = Vec::with_capacity(entry_bytes);
        let mut table = Vec::with_capacity(2 * rows.len());
        for (&(page, _), a) in rows.iter().zip(&at) {
            table.push(bytes.len() as u32);
            bytes.extend_from_slice(&pages[page][a.data.clone()]);
            table.push(bytes.len() as u32);
            bytes.extend_from_slice(&pages[page][a.scale.clone()]);
        }
        (bytes, table)
    };
    Ok(Some(Gathered { bytes, table }))
}

/// The buffers of an encoded decode (kept until its step is submitted): the rows' values,
/// [rows, width] f32, in `values`.
pub(crate) struct Decoded {
    _inputs: [wgpu::Buffer; 2],
    pub values: wgpu::Buffer,
}

/// Upload `gathered` and encode the `cache_decode` dispatch of its rows into `step`.
pub(crate) fn encode_decode(
    gpu: &Gpu,
    step: &mut Step<'_>,
    fmt: &RowFormat,
    gathered: &Gathered,
) -> Decoded {
    let rows = gathered.table.len() / 2;
    let (kind, nd, _, _) = cache_kind(fmt);
    let width = fmt.width();
    let n = rows * width;
    let eb = upload_bytes(gpu, "cache entries", &gathered.bytes);
    let tb = upload_bytes(
        gpu,
        "cache row offsets",
        bytemuck::cast_slice(&gathered.table),
    );
    let ob = scratch(gpu, "cache values", n * 4);
    let params = [kind, nd as u32, width as u32, rows as u32];
    step.dispatch(
        "cache_decode",
        &params,
        &[
            (2, Bind::whole(&eb)),
            (3, Bind::whole(&ob)),
            (5, Bind::whole(&tb)),
        ],
        grid(n, 64),
    );
    Decoded {
        _inputs: [eb, tb],
        values: ob,
    }
}

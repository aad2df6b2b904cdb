//! Cases of the cache ops: `cache_store` (exact page bytes; only the slot's bytes may change,
//! and every one of them must be written), `cache_encode_rows` (exact entry bytes of many rows),
//! `cache_load` and `cache_load_rows` (exact values), for every KV and index-K storage format;
//! `paged_attention_rows` and `paged_attention_indexed` (sparse attention over keys still in KV
//! pages, the second with key rows shared between queries) for every KV
//! storage dtype, `paged_indexer_topk_rows` and `paged_indexer_topk_ranges` (the indexer's
//! selection over index-K pages, each query over its own rows or over shared ones)
//! for the index-K dtypes that keep its scores exact.

use super::attention::{halves, selection, starts_of};
use crate::Op;
use crate::ops::case::{Case, Runner, SizeClass, uniform, uniform_std};
use crate::ops::harness::{GuardedBytes, GuardedF32, Problem, Produced, Ran, call, check_len};
use dsv4_core::cache::{IndexKLayout, KvLayout, SlotBytes};
use dsv4_core::{IndexKDtype, KvCacheDtype, SplitMix64};
use dsv4_kernels::RowFormat;

/// The byte ranges of `slot` in a page of `fmt`.
fn slot_bytes(fmt: &RowFormat, slot: usize) -> Result<SlotBytes, String> {
    fmt.slot_bytes(slot).map_err(|e| e.to_string())
}

/// A page with every slot written by the shared codec (not by either backend).
fn codec_page(rng: &mut SplitMix64, fmt: &RowFormat) -> Result<Vec<u8>, String> {
    let mut page = vec![0u8; fmt.page_bytes()];
    for slot in 0..fmt.page_entries() {
        let v = row_values(rng, fmt.width());
        fmt.write(&mut page, slot, &v).map_err(|e| e.to_string())?;
    }
    Ok(page)
}

/// `n` rows (page of three, slot of `per`) picked at random.
fn random_rows(rng: &mut SplitMix64, n: usize, per: usize) -> Vec<(usize, usize)> {
    (0..n)
        .map(|_| (rng.below(3) as usize, rng.below(per as u64) as usize))
        .collect()
}

/// One row of values whose 32-value blocks span 10^[-3, 2], with block 1 all zeros.
fn row_values(rng: &mut SplitMix64, width: usize) -> Vec<f32> {
    let mut v = uniform(rng, width, 1.0);
    for (b, block) in v.chunks_mut(32).enumerate() {
        let mag = if b == 1 {
            0.0
        } else {
            10f32.powf(rng.uniform_sym(2.5) - 0.5)
        };
        block.iter_mut().for_each(|x| *x *= mag);
    }
    v
}

/// The case's format label and numerics tag.
fn describe(fmt: &RowFormat) -> (String, String) {
    match fmt {
        RowFormat::Kv(l) => (
            format!("kv.hd{}.rd{}.p{}", l.head_dim(), l.rd(), l.page_entries()),
            format!("kv={}", l.dtype()),
        ),
        RowFormat::IndexK(l) => (
            format!("index_k.d{}.p{}", l.dim(), l.page_entries()),
            format!("index_k={}", l.dtype()),
        ),
    }
}

fn store_case(class: SizeClass, fmt: RowFormat, last_slot: bool) -> Case {
    let (label, numerics) = describe(&fmt);
    let width = fmt.width();
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let per = fmt.page_entries();
        let slot = if last_slot {
            per - 1
        } else {
            rng.below(per as u64) as usize
        };
        let at = slot_bytes(&fmt, slot)?;
        let before: Vec<u8> = (0..fmt.page_bytes())
            .map(|_| rng.next_u64() as u8)
            .collect();
        let values = row_values(rng, width);
        Ok(Box::new(move |be| {
            // Two runs over pages whose slot bytes start as 0x00 and as 0xFF: a slot byte that
            // differs between them was not written.
            let mut pages = Vec::with_capacity(2);
            let mut elapsed = None;
            for fill in [0x00u8, 0xFF] {
                let mut start = before.clone();
                for b in at.data.clone().chain(at.scale.clone()) {
                    start[b] = fill;
                }
                let mut page = GuardedBytes::with_bytes(&start);
                let (res, t) = call(|| be.cache_store(&fmt, page.slice_mut(), slot, &values))?;
                res.map_err(|e| Problem::OpError(e.to_string()))?;
                elapsed.get_or_insert(t);
                pages.push(page.into_bytes()?);
            }
            let (p0, p1) = (&pages[0], &pages[1]);
            for (b, (&x, &y)) in p0.iter().zip(p1).enumerate() {
                if at.contains(b) {
                    if x != y {
                        return Err(Problem::SlotByteNotWritten { byte: b });
                    }
                } else if x != before[b] || y != before[b] {
                    return Err(Problem::OutsideSlot { byte: b });
                }
            }
            Ok(Ran {
                out: Produced::Bytes(pages.swap_remove(0)),
                elapsed: elapsed.unwrap_or_default(),
            })
        }))
    });
    let shape = format!("{label}.s{}", if last_slot { "last" } else { "rand" });
    let cost = (0.0, (4 * width + fmt.entry_bytes()) as f64);
    Case::new(Op::CacheStore, class, shape, Some(numerics), cost, build)
}

fn load_case(class: SizeClass, fmt: RowFormat) -> Case {
    let (label, numerics) = describe(&fmt);
    let width = fmt.width();
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let page = codec_page(rng, &fmt)?;
        let slot = rng.below(fmt.page_entries() as u64) as usize;
        Ok(Box::new(move |be| {
            let mut out = GuardedF32::poisoned(width);
            let (res, elapsed) = call(|| be.cache_load(&fmt, &page, slot, out.slice_mut()))?;
            res.map_err(|e| Problem::OpError(e.to_string()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let cost = (0.0, (4 * width + fmt.entry_bytes()) as f64);
    Case::new(Op::CacheLoad, class, label, Some(numerics), cost, build)
}

/// The formats swept: (class, format), every storage dtype at tiny, odd and Flash sizes.
fn formats() -> Vec<(SizeClass, RowFormat)> {
    let mut v = Vec::new();
    for dtype in [KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
        for (class, hd, rd, per) in [
            (SizeClass::Tiny, 128, 64, 64),
            (SizeClass::Odd, 192, 64, 3),
            (SizeClass::Flash, 512, 64, 64),
        ] {
            if let Ok(l) = KvLayout::from_head_dims(dtype, hd, rd, per) {
                v.push((class, RowFormat::Kv(l)));
            }
        }
        if dtype == KvCacheDtype::Bf16
            && let Ok(l) = KvLayout::from_head_dims(dtype, 10, 4, 1)
        {
            v.push((SizeClass::Odd, RowFormat::Kv(l)));
        }
    }
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8, IndexKDtype::Fp4] {
        for (class, dim, per) in [(SizeClass::Flash, 128, 64), (SizeClass::Odd, 32, 3)] {
            if let Ok(l) = IndexKLayout::new(dtype, dim, per) {
                v.push((class, RowFormat::IndexK(l)));
            }
        }
    }
    v
}

fn load_rows_case(class: SizeClass, fmt: RowFormat) -> Case {
    let (label, numerics) = describe(&fmt);
    let width = fmt.width();
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        // Three pages fully written by the shared codec; eleven rows in scattered order, one
        // of them twice.
        let per = fmt.page_entries();
        let pages = (0..3)
            .map(|_| codec_page(rng, &fmt))
            .collect::<Result<Vec<_>, _>>()?;
        let mut rows = random_rows(rng, 10, per);
        rows.push(rows[3]);
        Ok(Box::new(move |be| {
            let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
            let mut out = GuardedF32::poisoned(rows.len() * width);
            let (res, elapsed) = call(|| be.cache_load_rows(&fmt, &refs, &rows, out.slice_mut()))?;
            res.map_err(|e| Problem::OpError(e.to_string()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let cost = (0.0, 11.0 * (4 * width + fmt.entry_bytes()) as f64);
    Case::new(Op::CacheLoadRows, class, label, Some(numerics), cost, build)
}

fn encode_rows_case(class: SizeClass, fmt: RowFormat) -> Case {
    let (label, numerics) = describe(&fmt);
    let width = fmt.width();
    const ROWS: usize = 9;
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let values: Vec<f32> = (0..ROWS).flat_map(|_| row_values(rng, width)).collect();
        Ok(Box::new(move |be| {
            let (res, elapsed) = call(|| be.cache_encode_rows(&fmt, &values))?;
            let bytes = res.map_err(|e| Problem::OpError(e.to_string()))?;
            check_len("entries", ROWS * fmt.entry_bytes(), bytes.len())?;
            Ok(Ran {
                out: Produced::Bytes(bytes),
                elapsed,
            })
        }))
    });
    let cost = (0.0, ROWS as f64 * (4 * width + fmt.entry_bytes()) as f64);
    Case::new(
        Op::CacheEncodeRows,
        class,
        label,
        Some(numerics),
        cost,
        build,
    )
}

/// Attention of `counts.len()` queries over KV rows in three pages, query r over
/// `counts[r]` rows picked at random (one row unused before the first range).
///
/// With `shared`, query r attends over rows `r + 1 .. r + 1 + counts[r]` of one list (sliding
/// windows, as a prefill chunk's rows of one sequence read theirs; row 0 is read by none),
/// through key ids (`paged_attention_indexed`).
fn paged_attention_case(
    class: SizeClass,
    fmt: RowFormat,
    heads: usize,
    counts: &'static [usize],
    shared: bool,
) -> Case {
    let (label, numerics) = describe(&fmt);
    let dim = fmt.width();
    let queries = counts.len();
    let n: usize = match shared {
        true => counts
            .iter()
            .enumerate()
            .map(|(r, c)| r + c)
            .max()
            .unwrap_or(0),
        false => counts.iter().sum(),
    };
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let per = fmt.page_entries();
        let pages = (0..3)
            .map(|_| codec_page(rng, &fmt))
            .collect::<Result<Vec<_>, _>>()?;
        let rows = random_rows(rng, n + 1, per);
        let mut starts = vec![usize::from(!shared)];
        for c in counts {
            starts.push(starts[starts.len() - 1] + c);
        }
        let ids: Vec<usize> = (0..queries)
            .flat_map(|r| r + 1..r + 1 + counts[r])
            .collect();
        let q = uniform_std(rng, queries * heads * dim, 1.0);
        let sink = uniform(rng, heads, 2.0);
        let scale = 1.0 / (dim as f32).sqrt();
        Ok(Box::new(move |be| {
            let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
            let mut out = GuardedF32::poisoned(queries * heads * dim);
            let out_values = out.slice_mut();
            let (res, elapsed) = call(|| match shared {
                true => be.paged_attention_indexed(
                    &q,
                    &fmt,
                    &refs,
                    &[],
                    &[],
                    &rows,
                    &ids,
                    &starts,
                    &sink,
                    scale,
                    out_values,
                ),
                false => be.paged_attention_rows(
                    &q, &fmt, &refs, &rows, &starts, &sink, scale, out_values,
                ),
            })?;
            res.map_err(|e| Problem::OpError(e.to_string()))?;
            Ok(Ran {
                out: Produced::Values(out.into_output("out")?),
                elapsed,
            })
        }))
    });
    let attended: usize = counts.iter().sum();
    let (h, d, r) = (heads as f64, dim as f64, queries as f64);
    let bytes = n as f64 * fmt.entry_bytes() as f64 + 4.0 * r * (2.0 * h * d + h);
    let op = match shared {
        true => Op::PagedAttentionIndexed,
        false => Op::PagedAttentionRows,
    };
    Case::new(
        op,
        class,
        format!("{label}.h{heads}.n{n}"),
        Some(numerics),
        (4.0 * h * attended as f64 * d, bytes),
        build,
    )
}

/// The indexer's selection of `counts.len()` queries over index-K rows in three pages, query r
/// over `counts[r]` rows picked at random (many twice: equal scores, where only the tie rule
/// decides). Queries, head weights and key values are halves (`super::attention::halves`);
/// bf16 and fp4 (a power-of-two block scale) store those exactly, so the scores are exact in
/// f32 and every backend must choose the same set. fp8's per-entry scale (amax/448) is not a
/// power of two, so near-ties could legitimately differ between backends: fp8 is checked
/// against the composition on each backend (`dsv4_kernels::row_check`) and by the model diffs.
///
/// With `shared`, the queries score nested prefixes of one list of max(counts) rows, as a
/// prefill chunk's rows of one sequence do (`paged_indexer_topk_ranges`).
fn paged_indexer_case(
    class: SizeClass,
    fmt: RowFormat,
    heads: usize,
    counts: &'static [usize],
    k: usize,
    shared: bool,
) -> Case {
    let (label, numerics) = describe(&fmt);
    let dim = fmt.width();
    let queries = counts.len();
    let n: usize = if shared {
        counts.iter().copied().max().unwrap_or(0)
    } else {
        counts.iter().sum()
    };
    let build = Box::new(move |rng: &mut SplitMix64| -> Result<Runner, String> {
        let per = fmt.page_entries();
        let mut pages = vec![vec![0u8; fmt.page_bytes()]; 3];
        for page in &mut pages {
            for slot in 0..per {
                let v = halves(rng, dim);
                fmt.write(page, slot, &v).map_err(|e| e.to_string())?;
            }
        }
        let rows = random_rows(rng, n, per);
        let starts = starts_of(counts);
        let q = halves(rng, queries * heads * dim);
        let w = halves(rng, queries * heads);
        Ok(Box::new(move |be| {
            let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
            let ranges: Vec<(usize, usize)> = counts.iter().map(|&c| (0, c)).collect();
            let (res, elapsed) = call(|| match shared {
                true => be.paged_indexer_topk_ranges(&q, &w, &fmt, &refs, &[], &rows, &ranges, k),
                false => be.paged_indexer_topk_rows(&q, &w, &fmt, &refs, &rows, &starts, k),
            })?;
            let per_row = res.map_err(|e| Problem::OpError(e.to_string()))?;
            Ok(Ran {
                out: Produced::Indices(selection(&per_row, counts, k)?),
                elapsed,
            })
        }))
    });
    let scored: usize = counts.iter().sum();
    let (h, d, r) = (heads as f64, dim as f64, queries as f64);
    let op = match shared {
        true => Op::PagedIndexerTopkRanges,
        false => Op::PagedIndexerTopkRows,
    };
    Case::new(
        op,
        class,
        format!("{label}.h{heads}.n{n}.k{k}"),
        Some(numerics),
        (
            2.0 * scored as f64 * h * (d + 1.0),
            n as f64 * fmt.entry_bytes() as f64 + 4.0 * r * (h * d + h),
        ),
        build,
    )
}

/// Every case of this module.
pub(crate) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (class, fmt) in formats() {
        v.push(store_case(class, fmt, false));
        if class == SizeClass::Odd {
            v.push(store_case(class, fmt, true));
        }
        v.push(load_case(class, fmt));
        v.push(load_rows_case(class, fmt));
        v.push(encode_rows_case(class, fmt));
        if let RowFormat::IndexK(l) = fmt
            && l.dtype() != IndexKDtype::Fp8
        {
            for shared in [false, true] {
                v.push(match class {
                    SizeClass::Odd => paged_indexer_case(class, fmt, 3, &[1, 9, 0, 4], 4, shared),
                    _ => paged_indexer_case(class, fmt, 64, &[2048, 1024], 512, shared),
                });
            }
        }
        if let RowFormat::Kv(l) = fmt {
            for shared in [false, true] {
                match (class, l.head_dim()) {
                    (SizeClass::Odd, 192) => {
                        v.push(paged_attention_case(class, fmt, 3, &[1, 9, 0, 4], shared))
                    }
                    (SizeClass::Flash, _) => {
                        v.push(paged_attention_case(class, fmt, 64, &[640, 192], shared))
                    }
                    _ => {}
                }
            }
        }
    }
    v
}

//! Op-level benchmarks at real (DeepSeek-V4-Flash) and tiny shapes: GEMM, GEMV over fp8 and
//! MXFP4 weights, sparse attention, indexer scores, and the indexer's selection over fp8 index-K
//! cache pages (what a decode step runs).

use crate::timing::median_secs;
use dsv4_core::cache::{INDEX_K_PAGE_ENTRIES, IndexKLayout};
use dsv4_core::{IndexKDtype, SplitMix64};
use dsv4_kernels::{Backend, Linear, RowFormat, WeightFormat};
use dsv4_model::tiny::{quantize_fp8_blocks, quantize_mxfp4};
use serde::Serialize;
use std::time::Duration;

/// One measured op case.
#[derive(Debug, Clone, Serialize)]
pub struct OpResult {
    /// Backend name.
    pub backend: String,
    /// Case name, e.g. "linear_fp8 gemv 4096x4096".
    pub case: String,
    /// Median milliseconds per call, or None when skipped.
    pub ms: Option<f64>,
    /// Arithmetic throughput, GFLOP/s.
    pub gflops: Option<f64>,
    /// Bytes of weights and activations moved per second, GB/s.
    pub gbs: Option<f64>,
    /// Why the case did not run, if it did not.
    pub skipped: Option<String>,
}

enum Kind {
    Linear {
        rows: usize,
        out: usize,
        inp: usize,
        fmt: WeightFormat,
    },
    Attention {
        heads: usize,
        dim: usize,
        keys: usize,
    },
    Indexer {
        heads: usize,
        dim: usize,
        keys: usize,
    },
    /// `paged_indexer_topk_rows` over fp8 index-K entries in cache pages, choosing `k`.
    PagedIndexer {
        heads: usize,
        dim: usize,
        keys: usize,
        k: usize,
    },
}

struct Case {
    name: &'static str,
    kind: Kind,
}

fn cases() -> Vec<Case> {
    use WeightFormat::*;
    let lin = |name, rows, out, inp, fmt| Case {
        name,
        kind: Kind::Linear {
            rows,
            out,
            inp,
            fmt,
        },
    };
    vec![
        lin("gemm_f32 prefill 512x1024x1024", 512, 1024, 1024, F32),
        lin("gemm_f32 prefill 512x4096x4096", 512, 4096, 4096, F32),
        lin(
            "gemm_fp8 prefill wq_a 512x4096->1024",
            512,
            1024,
            4096,
            Fp8Block,
        ),
        lin("gemv_fp8 decode 4096x4096", 1, 4096, 4096, Fp8Block),
        lin("gemv_fp8 decode wq_b 1024->32768", 1, 32768, 1024, Fp8Block),
        lin(
            "gemv_mxfp4 decode expert w1 4096->2048",
            1,
            2048,
            4096,
            Mxfp4,
        ),
        lin("gemv_bf16 decode tiny 256->256", 1, 256, 256, Bf16),
        Case {
            name: "attention flash 64x512 over 640 keys",
            kind: Kind::Attention {
                heads: 64,
                dim: 512,
                keys: 640,
            },
        },
        Case {
            name: "attention tiny 4x128 over 32 keys",
            kind: Kind::Attention {
                heads: 4,
                dim: 128,
                keys: 32,
            },
        },
        Case {
            name: "indexer flash 64x128 over 4096 keys",
            kind: Kind::Indexer {
                heads: 64,
                dim: 128,
                keys: 4096,
            },
        },
        Case {
            name: "indexer top-512 of 4096 fp8 paged keys",
            kind: Kind::PagedIndexer {
                heads: 64,
                dim: 128,
                keys: 4096,
                k: 512,
            },
        },
    ]
}

fn random(n: usize, g: &mut SplitMix64, a: f32) -> Vec<f32> {
    (0..n).map(|_| g.uniform_sym(a)).collect()
}

/// A weight of the given format with seeded values of std ≈ 1/sqrt(in).
pub fn random_linear(name: &str, out: usize, inp: usize, fmt: WeightFormat, seed: u64) -> Linear {
    let mut g = SplitMix64::for_name(seed, name);
    let w = random(out * inp, &mut g, (3.0 / inp as f32).sqrt());
    let (data, scale) = match fmt {
        WeightFormat::F32 => (w.iter().flat_map(|v| v.to_le_bytes()).collect(), Vec::new()),
        WeightFormat::Bf16 => (
            w.iter()
                .flat_map(|v| dsv4_core::codec::f32_to_bf16(*v).to_le_bytes())
                .collect(),
            Vec::new(),
        ),
        WeightFormat::Fp8Block => {
            quantize_fp8_blocks(&w, out, inp).expect("finite weights quantize")
        }
        WeightFormat::Mxfp4 => quantize_mxfp4(&w, out, inp).expect("finite weights quantize"),
    };
    Linear::new(name, out, inp, fmt, data, scale).expect("sizes match the format")
}

/// Work of a case: (flops, bytes moved).
fn work(kind: &Kind, stored: usize) -> (f64, f64) {
    match *kind {
        Kind::Linear { rows, out, inp, .. } => (
            2.0 * (rows * out * inp) as f64,
            (stored + 4 * rows * (inp + out)) as f64,
        ),
        Kind::Attention { heads, dim, keys } => {
            (4.0 * (heads * dim * keys) as f64, (4 * keys * dim) as f64)
        }
        Kind::Indexer { heads, dim, keys } => {
            (2.0 * (heads * dim * keys) as f64, (4 * keys * dim) as f64)
        }
        // The entries read: dim e4m3 codes and an f32 scale each.
        Kind::PagedIndexer {
            heads, dim, keys, ..
        } => (2.0 * (heads * dim * keys) as f64, ((dim + 4) * keys) as f64),
    }
}

/// The rows of `values` (`dim` each), stored by `backend` as fp8 index-K entries in whole pages,
/// row j at slot j % per of page j / per; the format, the pages, and each row's (page, slot).
fn index_k_pages(
    backend: &dyn Backend,
    dim: usize,
    values: &[f32],
) -> (RowFormat, Vec<Vec<u8>>, Vec<(usize, usize)>) {
    let per = INDEX_K_PAGE_ENTRIES;
    let keys = values.len() / dim;
    let layout =
        IndexKLayout::new(IndexKDtype::Fp8, dim, per).expect("the bench's index-K layout is valid");
    let fmt = RowFormat::IndexK(layout);
    let entries = backend
        .cache_encode_rows(&fmt, values)
        .expect("rows of the format's width encode");
    let mut pages = vec![vec![0u8; fmt.page_bytes()]; keys.div_ceil(per)];
    let rows: Vec<(usize, usize)> = (0..keys).map(|j| (j / per, j % per)).collect();
    for (entry, &(page, slot)) in entries.chunks_exact(fmt.entry_bytes()).zip(&rows) {
        fmt.put_entry(&mut pages[page], slot, entry)
            .expect("an entry of the format fits its slot");
    }
    (fmt, pages, rows)
}

/// Run every op case on `backend`. Backends named in `slow` skip cases above `slow_flops`.
pub fn run(backend: &dyn Backend, slow_flops: Option<f64>, budget: Duration) -> Vec<OpResult> {
    let mut out = Vec::new();
    for case in cases() {
        eprintln!("  op {:<45} on {}", case.name, backend.name());
        let mut g = SplitMix64::for_name(7, case.name);
        let result =
            |ms: Option<f64>, gf: Option<f64>, gb: Option<f64>, skipped: Option<String>| OpResult {
                backend: backend.name().to_string(),
                case: case.name.to_string(),
                ms,
                gflops: gf,
                gbs: gb,
                skipped,
            };
        let (flops, _) = work(&case.kind, 0);
        if let Some(limit) = slow_flops.filter(|l| flops > *l) {
            out.push(result(
                None,
                None,
                None,
                Some(format!(
                    "{:.1} GFLOP exceeds this backend's budget of {:.1}",
                    flops / 1e9,
                    limit / 1e9
                )),
            ));
            continue;
        }
        let (secs, stored) = match case.kind {
            Kind::Linear {
                rows,
                out: o,
                inp,
                fmt,
            } => {
                let w = random_linear(case.name, o, inp, fmt, 7);
                let x = random(rows * inp, &mut g, 1.0);
                let mut y = vec![0f32; rows * o];
                let s = median_secs(|| backend.linear(&w, &x, rows, &mut y), 3, 50, budget);
                (s, w.stored_bytes())
            }
            Kind::Attention { heads, dim, keys } => {
                let q = random(heads * dim, &mut g, 1.0);
                let k = random(keys * dim, &mut g, 1.0);
                let sink = random(heads, &mut g, 0.5);
                let mut o = vec![0f32; heads * dim];
                let scale = 1.0 / (dim as f32).sqrt();
                (
                    median_secs(
                        || backend.sparse_attention(&q, dim, &k, &sink, scale, &mut o),
                        3,
                        50,
                        budget,
                    ),
                    0,
                )
            }
            Kind::Indexer { heads, dim, keys } => {
                let q = random(heads * dim, &mut g, 1.0);
                let w = random(heads, &mut g, 1.0);
                let k = random(keys * dim, &mut g, 1.0);
                let mut o = vec![0f32; keys];
                (
                    median_secs(
                        || backend.indexer_scores(&q, &w, dim, &k, &mut o),
                        3,
                        50,
                        budget,
                    ),
                    0,
                )
            }
            Kind::PagedIndexer {
                heads,
                dim,
                keys,
                k,
            } => {
                let q = random(heads * dim, &mut g, 1.0);
                let w = random(heads, &mut g, 1.0);
                let (fmt, pages, rows) =
                    index_k_pages(backend, dim, &random(keys * dim, &mut g, 1.0));
                let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
                let starts = [0, keys];
                let select = || {
                    let chosen = backend
                        .paged_indexer_topk_rows(&q, &w, &fmt, &refs, &rows, &starts, k)
                        .expect("rows inside their pages");
                    assert_eq!(chosen[0].len(), k.min(keys), "the selection's size");
                };
                (median_secs(select, 3, 50, budget), 0)
            }
        };
        let (flops, bytes) = work(&case.kind, stored);
        out.push(result(
            Some(secs * 1e3),
            Some(flops / secs / 1e9),
            Some(bytes / secs / 1e9),
            None,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_backend_reference::ReferenceBackend;

    /// The paged case's keys: row j decodes from its (page, slot) to what storing it alone in a
    /// page and loading it back gives, across a page boundary.
    #[test]
    fn index_k_pages_put_each_row_in_its_slot() {
        let be = ReferenceBackend;
        let (dim, keys) = (128, INDEX_K_PAGE_ENTRIES + 5);
        let values = random(keys * dim, &mut SplitMix64::new(3), 1.0);
        let (fmt, pages, rows) = index_k_pages(&be, dim, &values);
        assert_eq!(pages.len(), 2);
        let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
        let mut got = vec![0f32; keys * dim];
        be.cache_load_rows(&fmt, &refs, &rows, &mut got).unwrap();
        for (j, v) in values.chunks_exact(dim).enumerate() {
            let mut page = vec![0u8; fmt.page_bytes()];
            be.cache_store(&fmt, &mut page, 0, v).unwrap();
            let mut want = vec![0f32; dim];
            be.cache_load(&fmt, &page, 0, &mut want).unwrap();
            assert_eq!(&got[j * dim..(j + 1) * dim], &want[..], "row {j}");
        }
    }
}
